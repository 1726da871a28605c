//! Changes to the namespace through an S3 origin, as S3 can make them: a new file is
//! staged (uploaded at its first close); `mkdir` puts the `DIR/` marker; `unlink` and
//! `rmdir` delete; a file rename is a conditional server-side copy and a delete (not
//! atomic); a directory rename is refused with `EXDEV`.

use hoardfs_proto::{Entry, FileKind, Handle, RENAME_EXCHANGE, RENAME_NOREPLACE, WireError};

use super::nodes::S3Node;
use super::{S3Origin, client, io_error};
use crate::{OriginError, Result};

impl S3Origin {
    /// A new file (mode and owner are not stored in S3).
    pub(super) fn create_file(
        &self,
        parent: Handle,
        name: &[u8],
        exclusive: bool,
    ) -> Result<Entry> {
        self.writable()?;
        let path = self.child_path(parent, name)?;
        match self.resolve(&path) {
            Ok(e) if e.attr.kind == FileKind::Dir => return Err(WireError::IsDir.into()),
            Ok(_) if exclusive => return Err(WireError::Exists.into()),
            Ok(e) => return Ok(e),
            Err(OriginError::Fs(WireError::NotFound)) => {}
            Err(e) => return Err(e),
        }
        self.staging
            .create(&path)
            .map_err(|e| OriginError::Fs(io_error(&e)))?;
        self.changed(&path);
        self.report(&path, Some(FileKind::File));
        self.resolve(&path)
    }

    /// A directory: its marker object.
    pub(super) fn make_dir(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        self.writable()?;
        let path = self.child_path(parent, name)?;
        match self.resolve(&path) {
            Ok(_) => return Err(WireError::Exists.into()),
            Err(OriginError::Fs(WireError::NotFound)) => {}
            Err(e) => return Err(e),
        }
        let marker = self.opts.location.dir_prefix(&path);
        let r = self.client.put(&marker, &[], client::PutCondition::Absent);
        self.ok(r)?;
        self.changed(&path);
        self.report(&path, Some(FileKind::Dir));
        Ok(self.dir_entry(&path))
    }

    pub(super) fn remove_file(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.writable()?;
        let path = self.child_path(parent, name)?;
        let e = self.resolve(&path)?;
        if e.attr.kind == FileKind::Dir {
            return Err(WireError::IsDir.into());
        }
        let was_staged_only = self.staging.discard(&path);
        if !was_staged_only {
            let r = self.client.delete(&self.opts.location.key(&path));
            self.ok(r)?;
        }
        self.table.remove(&S3Node::key_of(&path, FileKind::File));
        self.changed(&path);
        self.report(&path, None);
        Ok(())
    }

    pub(super) fn remove_dir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.writable()?;
        let path = self.child_path(parent, name)?;
        match self.resolve(&path) {
            Ok(e) if e.attr.kind != FileKind::Dir => return Err(WireError::NotDir.into()),
            Ok(_) => {}
            // A directory that existed only through the keys under it vanished with the
            // last of them (`rm -r` removes the files first): removing it succeeds.
            Err(OriginError::Fs(WireError::NotFound))
                if self
                    .table
                    .find(&S3Node::key_of(&path, FileKind::Dir))
                    .is_some() =>
            {
                self.table.remove(&S3Node::key_of(&path, FileKind::Dir));
                self.changed(&path);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let prefix = self.opts.location.dir_prefix(&path);
        let page = self.client.list_page(&prefix, None, 2);
        let page = self.ok(page)?;
        let others = page.objects.iter().any(|(k, _)| *k != prefix) || !page.prefixes.is_empty();
        if others || !self.staging.new_files_in(&path).is_empty() {
            return Err(WireError::NotEmpty.into());
        }
        let r = self.client.delete(&prefix);
        self.ok(r)?;
        self.table.remove(&S3Node::key_of(&path, FileKind::Dir));
        self.changed(&path);
        self.listings.expire(&prefix);
        // A store's listing may show the marker for a moment after its delete (Garage
        // did, 4 ms after the DELETE returned, under CI load): this client knows the
        // directory is gone, for the metadata TTL like any lookup that found nothing.
        self.remember_missing(&path);
        self.report(&path, None);
        Ok(())
    }

    pub(super) fn rename_file(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.writable()?;
        if flags & RENAME_EXCHANGE != 0 {
            return Err(WireError::Unsupported.into());
        }
        let from = self.child_path(parent, name)?;
        let to = self.child_path(new_parent, new_name)?;
        let src = self.resolve(&from)?;
        if src.attr.kind == FileKind::Dir {
            // A directory is every key under it: no atomic way to move them.
            return Err(WireError::CrossDevice.into());
        }
        if from == to {
            return Ok(());
        }
        match self.resolve(&to) {
            Ok(e) if e.attr.kind == FileKind::Dir => return Err(WireError::IsDir.into()),
            Ok(_) if flags & RENAME_NOREPLACE != 0 => return Err(WireError::Exists.into()),
            Ok(_) | Err(OriginError::Fs(WireError::NotFound)) => {}
            Err(e) => return Err(e),
        }
        // Pending writes reach the store first, then copy + delete (not atomic).
        self.staging.upload(&from, self)?;
        let n = self.table.get(self.resolve(&from)?.handle)?;
        let info = self.current(&n)?;
        let r = self.client.copy(
            &self.opts.location.key(&from),
            &info.etag,
            &self.opts.location.key(&to),
        );
        self.ok(r)?;
        let r = self.client.delete(&self.opts.location.key(&from));
        self.ok(r)?;
        self.table.remove(&S3Node::key_of(&from, FileKind::File));
        self.table.remove(&S3Node::key_of(&to, FileKind::File));
        self.changed(&from);
        self.changed(&to);
        self.report(&from, None);
        self.report(&to, Some(FileKind::File));
        Ok(())
    }
}
