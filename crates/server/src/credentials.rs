//! Client credentials: named, revocable tokens kept hashed in the state directory
//! (`STATE/tokens`), and optionally one shared token (`--token-file`).
//!
//! A token is `hoardfs1.NAME.SECRET` (SECRET: 32 random bytes, base64url). The file keeps,
//! per line, `NAME SHA256(token) CREATED [RIGHTS...]`, never the token itself, so reading
//! the file does not let anyone connect. The rights ([`Rights`]) say which users the
//! credential may act as (`user=UID:GID`, or `uids=A-B gids=C-D`; none: any, as an NFS
//! `AUTH_SYS` client) and whether it may modify anything (`ro`); a change of a name's
//! rights ends its connections as a revocation does. `hoardfs token add|list|revoke` edit it; a running server
//! notices a change (checked at every handshake and every second) and closes the
//! connections of revoked names.
//!
//! Authentication is required as soon as a shared token is configured or the tokens file
//! exists, even empty, and stays required if the file is later deleted: revoking the last
//! name, or removing the file, locks everybody out rather than opening the server.
//!
//! Lock: one mutex, a leaf, held for a stat and (on change) a small file read.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use parking_lot::Mutex;

/// Name of the tokens file in the state directory.
pub const TOKENS_FILE: &str = "tokens";
/// Prefix of every named token.
const PREFIX: &str = "hoardfs1.";
/// The name the shared `--token-file` credential is logged as.
pub const SHARED_NAME: &str = "(shared token)";

/// What a presented token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// No credential is required.
    Open,
    /// A valid credential with this name and these rights.
    Accepted(String, Rights),
    /// Not valid; the name it claimed, if it had the form of a named token.
    Refused(Option<String>),
}

/// The credentials a server accepts.
#[derive(Debug)]
pub struct Credentials {
    shared: Option<Vec<u8>>,
    file: Option<PathBuf>,
    loaded: Mutex<Loaded>,
}

#[derive(Debug, Default)]
struct Loaded {
    /// (inode, size, mtime ns) of the file as last read; `None`: absent.
    stamp: Option<(u64, u64, i128)>,
    /// Whether the file existed at some point since the server started.
    seen: bool,
    /// Name → SHA-256 of its token, and its rights.
    hashes: HashMap<String, ([u8; 32], Rights)>,
    /// When the file was last read (ns since the epoch): a file changed less than
    /// [`RACY`] before that is read again even if its stamp is the same, since a change
    /// within the file system's timestamp granularity need not change the stamp.
    read_at: i128,
    /// Credentials that went away since [`Credentials::take_revoked`] last asked.
    revoked: Vec<Gone>,
}

/// How close to its last read a file's change must be for the read to be repeated.
const RACY: i128 = 2_000_000_000;

/// A credential that went away: its name and the digest of the token it had. A name added
/// again with a new token is another credential, so its new connections stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    pub name: String,
    pub digest: [u8; 32],
}

impl Credentials {
    /// Accepts `shared` (if any) and the named tokens of `STATE/tokens` (if the state
    /// directory is given).
    pub fn new(shared: Option<Vec<u8>>, state_dir: Option<&Path>) -> io::Result<Credentials> {
        let c = Credentials {
            shared,
            file: state_dir.map(|d| d.join(TOKENS_FILE)),
            loaded: Mutex::new(Loaded::default()),
        };
        c.refresh()?;
        Ok(c)
    }

    /// Whether any credential is required.
    pub fn required(&self) -> bool {
        self.shared.is_some() || self.loaded.lock().seen
    }

    /// Rereads the tokens file if it changed and returns the credentials that went away
    /// since the last call (whether the change was noticed here or at a handshake). A
    /// failed reread is logged; what earlier rereads found is returned all the same.
    pub fn take_revoked(&self) -> Vec<Gone> {
        if let Err(e) = self.refresh() {
            tracing::warn!("cannot read the tokens file: {e}; keeping the tokens read before");
        }
        std::mem::take(&mut self.loaded.lock().revoked)
    }

    /// Rereads the tokens file if it changed, noting the names that disappeared.
    fn refresh(&self) -> io::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let stamp = match fs::metadata(path) {
            Ok(m) => Some((
                m.ino(),
                m.size(),
                m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let mut l = self.loaded.lock();
        // Unchanged, and not changed close to the last read (a time in the future is
        // safe too: any write since would have set it to the present).
        if let Some((_, _, mtime)) = stamp
            && l.stamp == stamp
            && (mtime < l.read_at - RACY || mtime > l.read_at + RACY)
        {
            return Ok(());
        }
        l.read_at = now_ns();
        let hashes = match stamp {
            Some(_) => parse(&fs::read_to_string(path)?),
            None => HashMap::new(),
        };
        if stamp.is_none() && l.stamp.is_some() {
            tracing::warn!(
                "{} was removed: every named credential is refused until it is back",
                path.display()
            );
        }
        // A name revoked and added again with a new secret is gone too: connections
        // made with the old token must end.
        let gone: Vec<Gone> = l
            .hashes
            .iter()
            .filter(|(n, h)| hashes.get(*n) != Some(*h))
            .map(|(n, (h, _))| Gone {
                name: n.clone(),
                digest: *h,
            })
            .collect();
        l.revoked.extend(gone);
        l.seen |= stamp.is_some();
        l.stamp = stamp;
        l.hashes = hashes;
        Ok(())
    }

    /// Checks a presented token against the tokens file as it is now.
    pub fn check(&self, token: &[u8]) -> Check {
        if let Err(e) = self.refresh() {
            tracing::warn!("cannot read the tokens file: {e}; keeping the tokens read before");
        }
        self.judge(token)
    }

    /// Checks a presented token against the tokens as last read, without rereading the
    /// file. A handshake judges its token again once its session is registered: a
    /// revocation read in between is then either seen here or finds the session (the
    /// periodic check revokes the names a reread found gone after that reread).
    pub fn judge(&self, token: &[u8]) -> Check {
        if !self.required() {
            return Check::Open;
        }
        // Compared as digests, so that the time taken tells nothing of the shared
        // token's length either.
        if let Some(shared) = &self.shared
            && constant_time_eq(&sha256(shared), &sha256(token))
        {
            return Check::Accepted(SHARED_NAME.to_owned(), Rights::default());
        }
        let Some(name) = token_name(token) else {
            return Check::Refused(None);
        };
        let hash = sha256(token);
        match self.loaded.lock().hashes.get(name) {
            Some((h, rights)) if constant_time_eq(h, &hash) => {
                Check::Accepted(name.to_owned(), rights.clone())
            }
            _ => Check::Refused(Some(name.to_owned())),
        }
    }
}

/// The NAME of a `hoardfs1.NAME.SECRET` token.
fn token_name(token: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(token).ok()?.strip_prefix(PREFIX)?;
    let (name, _) = s.split_once('.')?;
    valid_name(name).then_some(name)
}

/// Names are 1–64 of `A-Z a-z 0-9 _ -`: safe in logs, file lines and tokens.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn parse(text: &str) -> HashMap<String, ([u8; 32], Rights)> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(name), Some(hex)) = (f.next(), f.next()) else {
            continue;
        };
        // The creation time, then the rights: a line without a number there is not one
        // `token add` wrote, and its words are not read as rights (nor it as a credential).
        if f.next().and_then(|c| c.parse::<u64>().ok()).is_none() {
            tracing::warn!(
                credential = name,
                "ignoring a token line without its creation time"
            );
            continue;
        }
        let rights = match Rights::parse(f) {
            Ok(r) => r,
            Err(e) => {
                // A credential whose rights cannot be read is refused, not widened.
                tracing::warn!(
                    credential = name,
                    "ignoring a token whose rights are invalid: {e}"
                );
                continue;
            }
        };
        if let Some(h) = from_hex(hex)
            && valid_name(name)
        {
            out.insert(name.to_owned(), (h, rights));
        }
    }
    out
}

/// What a credential may do: which users it acts as and whether it may modify the export.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Rights {
    /// Which identities its requests may claim (`hoardfs_proto::Restrict::User`'s groups
    /// are those the server's user database gives the user, read when the tokens file
    /// is).
    pub restrict: hoardfs_proto::Restrict,
    /// Only requests that change nothing (`ro`).
    pub read_only: bool,
}

impl Rights {
    /// Reads the rights words of a tokens-file line: `user=UID[:GID]`, `uids=A-B`,
    /// `gids=A-B`, `ro`.
    pub fn parse<'a>(words: impl Iterator<Item = &'a str>) -> Result<Rights, String> {
        use hoardfs_proto::{Caller, IdRange, Restrict};
        let mut rights = Rights::default();
        let (mut user, mut uids, mut gids) = (None, None, None);
        for w in words {
            match w.split_once('=') {
                None if w == "ro" => rights.read_only = true,
                Some(("user", v)) => user = Some(parse_user(v)?),
                Some(("uids", v)) => uids = Some(parse_range(v)?),
                Some(("gids", v)) => gids = Some(parse_range(v)?),
                _ => return Err(format!("unknown right {w:?}")),
            }
        }
        rights.restrict = match (user, uids, gids) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err("user= cannot be combined with uids= or gids=".into());
            }
            (Some((uid, gid)), None, None) => {
                let gid = gid.or_else(|| primary_gid(uid)).unwrap_or(uid);
                Restrict::User(Caller {
                    uid,
                    gid,
                    groups: groups_of(uid, gid),
                })
            }
            (None, None, None) => Restrict::None,
            // A range of uids without one of gids keeps the gids to the same numbers
            // (the usual layout of user private groups).
            (None, uids, gids) => {
                let uids: IdRange = uids.or(gids).expect("one of them is set");
                Restrict::Ranges {
                    uids,
                    gids: gids.unwrap_or(uids),
                }
            }
        };
        Ok(rights)
    }

    /// The words [`Rights::parse`] reads back (empty for an unrestricted credential).
    pub fn words(&self) -> Vec<String> {
        use hoardfs_proto::Restrict;
        let mut w = Vec::new();
        match &self.restrict {
            Restrict::None => {}
            Restrict::User(c) => w.push(format!("user={}:{}", c.uid, c.gid)),
            Restrict::Ranges { uids, gids } => {
                w.push(format!("uids={}-{}", uids.first, uids.last));
                w.push(format!("gids={}-{}", gids.first, gids.last));
            }
        }
        if self.read_only {
            w.push("ro".into());
        }
        w
    }
}

fn parse_id(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(id) if id != u32::MAX => Ok(id),
        _ => Err(format!("{s:?} is not a user or group id")),
    }
}

fn parse_user(v: &str) -> Result<(u32, Option<u32>), String> {
    match v.split_once(':') {
        Some((u, g)) => Ok((parse_id(u)?, Some(parse_id(g)?))),
        None => Ok((parse_id(v)?, None)),
    }
}

fn parse_range(v: &str) -> Result<hoardfs_proto::IdRange, String> {
    let (a, b) = v
        .split_once('-')
        .ok_or_else(|| format!("{v:?} is not a range FIRST-LAST"))?;
    let (first, last) = (parse_id(a)?, parse_id(b)?);
    if first > last {
        return Err(format!("{v:?} is an empty range"));
    }
    Ok(hoardfs_proto::IdRange { first, last })
}

/// The primary group of `uid` in the server's user database.
fn primary_gid(uid: u32) -> Option<u32> {
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out = std::ptr::null_mut();
    // SAFETY: getpwuid_r with a buffer it may use and an out pointer.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some(pw.pw_gid)
}

/// The supplementary groups the server's user database gives `uid` (with primary group
/// `gid`), as a login of that user would get them; just `gid` for a user it does not
/// know.
fn groups_of(uid: u32, gid: u32) -> Vec<u32> {
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out = std::ptr::null_mut();
    // SAFETY: as in `primary_gid`.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if r != 0 || out.is_null() {
        return vec![gid];
    }
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let want = n;
        // SAFETY: the name from getpwuid_r, a buffer of `n` gids.
        let r = unsafe { libc::getgrouplist(pw.pw_name, gid, groups.as_mut_ptr(), &mut n) };
        if r >= 0 {
            groups.truncate(n.max(0) as usize);
            groups.sort_unstable();
            groups.dedup();
            groups.truncate(hoardfs_proto::ids::MAX_GROUPS);
            return groups;
        }
        if n <= want || n as usize > hoardfs_proto::ids::MAX_GROUPS * 64 {
            return vec![gid];
        }
    }
}

/// The time now in ns since the epoch, as file times count.
fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// The digest a token is known by (the tokens file keeps it, sessions are keyed by it).
pub fn sha256(b: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Compares secrets without an early exit on the first differing byte (the lengths are
/// not secret: compare digests where they are).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One line of `hoardfs token list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    /// Its name.
    pub name: String,
    /// When it was added (seconds since the Unix epoch).
    pub created: u64,
    /// Its rights as written in the file (`user=…`, `uids=…`, `ro`; empty: any user,
    /// read-write).
    pub rights: Vec<String>,
}

/// Editing the tokens file (the `hoardfs token` commands).
pub mod admin {
    use super::*;

    fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(TOKENS_FILE)
    }

    fn lines(state_dir: &Path) -> io::Result<Vec<String>> {
        match fs::read_to_string(path(state_dir)) {
            Ok(t) => Ok(t.lines().map(str::to_owned).collect()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    fn write(state_dir: &Path, lines: &[String]) -> io::Result<()> {
        let tmp = state_dir.join(format!(".{TOKENS_FILE}.{}.tmp", std::process::id()));
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        for l in lines {
            writeln!(f, "{l}")?;
        }
        f.sync_all()?;
        fs::rename(&tmp, path(state_dir))
    }

    /// Adds a credential named `name` and returns its token (shown once; only its hash is
    /// kept).
    pub fn add(state_dir: &Path, name: &str, rights: &Rights) -> Result<String, String> {
        if !valid_name(name) {
            return Err(format!(
                "invalid token name {name:?}: use 1 to 64 letters, digits, '_' or '-'"
            ));
        }
        hoardfs_tls::create_private_dir(state_dir).map_err(|e| e.to_string())?;
        let mut ls = lines(state_dir).map_err(|e| e.to_string())?;
        if ls.iter().any(|l| l.split_whitespace().next() == Some(name)) {
            return Err(format!(
                "a token named {name} exists already: revoke it first, or pick another name"
            ));
        }
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| "the system random number generator failed".to_owned())?;
        let token = format!("{PREFIX}{name}.{}", URL_SAFE_NO_PAD.encode(secret));
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut line = format!("{name} {} {created}", to_hex(&sha256(token.as_bytes())));
        for w in rights.words() {
            line.push(' ');
            line.push_str(&w);
        }
        ls.push(line);
        write(state_dir, &ls).map_err(|e| e.to_string())?;
        Ok(token)
    }

    /// The credentials in the file.
    pub fn list(state_dir: &Path) -> Result<Vec<TokenInfo>, String> {
        Ok(lines(state_dir)
            .map_err(|e| e.to_string())?
            .iter()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let name = f.next()?.to_owned();
                let _hash = f.next()?;
                let created = f.next().and_then(|c| c.parse().ok()).unwrap_or(0);
                let rights = f.map(str::to_owned).collect();
                Some(TokenInfo {
                    name,
                    created,
                    rights,
                })
            })
            .collect())
    }

    /// Removes the credential `name`; running servers close its connections.
    pub fn revoke(state_dir: &Path, name: &str) -> Result<(), String> {
        let ls = lines(state_dir).map_err(|e| e.to_string())?;
        let kept: Vec<String> = ls
            .iter()
            .filter(|l| l.split_whitespace().next() != Some(name))
            .cloned()
            .collect();
        if kept.len() == ls.len() {
            return Err(format!("no token named {name} (see `hoardfs token list`)"));
        }
        write(state_dir, &kept).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_tokens_are_checked_by_hash_and_revocation_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let c = Credentials::new(None, Some(state)).unwrap();
        assert!(!c.required());
        assert_eq!(c.check(b"anything"), Check::Open);
        let alice = admin::add(state, "alice", &Rights::default()).unwrap();
        let bob = admin::add(state, "bob", &Rights::default()).unwrap();
        assert!(admin::add(state, "alice", &Rights::default()).is_err());
        assert!(admin::add(state, "bad name", &Rights::default()).is_err());
        // The file holds hashes, never the tokens.
        let text = fs::read_to_string(state.join(TOKENS_FILE)).unwrap();
        assert!(!text.contains(&alice[PREFIX.len() + 6..]));
        assert_eq!(
            c.check(alice.as_bytes()),
            Check::Accepted("alice".into(), Rights::default())
        );
        assert_eq!(
            c.check(bob.as_bytes()),
            Check::Accepted("bob".into(), Rights::default())
        );
        let forged = format!("{}x", &alice[..alice.len() - 1]);
        assert_eq!(
            c.check(forged.as_bytes()),
            Check::Refused(Some("alice".into()))
        );
        assert_eq!(c.check(b"junk"), Check::Refused(None));
        let names: Vec<_> = admin::list(state)
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["alice", "bob"]);
        admin::revoke(state, "alice").unwrap();
        assert!(admin::revoke(state, "alice").is_err());
        assert_eq!(
            c.check(alice.as_bytes()),
            Check::Refused(Some("alice".into()))
        );
        assert_eq!(
            c.check(bob.as_bytes()),
            Check::Accepted("bob".into(), Rights::default())
        );
        // Revoking everybody locks everybody out; it does not open the server.
        admin::revoke(state, "bob").unwrap();
        assert!(c.required());
        assert_eq!(c.check(bob.as_bytes()), Check::Refused(Some("bob".into())));
    }

    #[test]
    fn the_names_that_went_away_are_reported_even_if_a_handshake_saw_it_first() {
        let dir = tempfile::tempdir().unwrap();
        admin::add(dir.path(), "a", &Rights::default()).unwrap();
        let b = admin::add(dir.path(), "b", &Rights::default()).unwrap();
        let c = Credentials::new(None, Some(dir.path())).unwrap();
        assert!(c.take_revoked().is_empty());
        admin::revoke(dir.path(), "a").unwrap();
        // A handshake notices the change before the periodic check does.
        assert_eq!(
            c.check(b.as_bytes()),
            Check::Accepted("b".into(), Rights::default())
        );
        assert_eq!(names(c.take_revoked()), ["a"]);
        assert!(c.take_revoked().is_empty());
    }

    fn names(gone: Vec<Gone>) -> Vec<String> {
        gone.into_iter().map(|g| g.name).collect()
    }

    #[test]
    fn a_name_added_again_with_a_new_secret_revokes_the_old_token() {
        let dir = tempfile::tempdir().unwrap();
        let old = admin::add(dir.path(), "a", &Rights::default()).unwrap();
        let c = Credentials::new(None, Some(dir.path())).unwrap();
        admin::revoke(dir.path(), "a").unwrap();
        let new = admin::add(dir.path(), "a", &Rights::default()).unwrap();
        // Both edits land between two rereads (and, likely, within one tick of the file
        // times): the name never looks absent, and the file's stamp may look unchanged.
        let gone = c.take_revoked();
        assert_eq!(
            gone,
            [Gone {
                name: "a".into(),
                digest: sha256(old.as_bytes())
            }]
        );
        assert_eq!(c.check(old.as_bytes()), Check::Refused(Some("a".into())));
        assert_eq!(
            c.check(new.as_bytes()),
            Check::Accepted("a".into(), Rights::default())
        );
    }

    #[test]
    fn deleting_the_tokens_file_locks_everybody_out() {
        let dir = tempfile::tempdir().unwrap();
        let t = admin::add(dir.path(), "a", &Rights::default()).unwrap();
        let c = Credentials::new(None, Some(dir.path())).unwrap();
        fs::remove_file(dir.path().join(TOKENS_FILE)).unwrap();
        assert!(c.required());
        assert_eq!(c.check(t.as_bytes()), Check::Refused(Some("a".into())));
        assert_eq!(c.check(b""), Check::Refused(None));
        assert_eq!(names(c.take_revoked()), ["a"]);
    }

    #[test]
    fn the_shared_token_works_alongside() {
        let c = Credentials::new(Some(b"s3cret".to_vec()), None).unwrap();
        assert!(c.required());
        assert_eq!(
            c.check(b"s3cret"),
            Check::Accepted(SHARED_NAME.into(), Rights::default())
        );
        assert_eq!(c.check(b"s3cre"), Check::Refused(None));
    }

    #[test]
    fn rights_are_kept_with_the_token_and_a_change_of_rights_ends_its_sessions() {
        use hoardfs_proto::{Caller, IdRange, Restrict};
        let dir = tempfile::tempdir().unwrap();
        let user = Rights::parse(["user=4321:4322"].into_iter()).unwrap();
        let t = admin::add(dir.path(), "laptop", &user).unwrap();
        let c = Credentials::new(None, Some(dir.path())).unwrap();
        let Check::Accepted(name, rights) = c.check(t.as_bytes()) else {
            panic!("refused");
        };
        assert_eq!(name, "laptop");
        // A uid unknown to this host's user database gets its gid as its only group.
        assert_eq!(
            rights.restrict,
            Restrict::User(Caller {
                uid: 4321,
                gid: 4322,
                groups: vec![4322]
            })
        );
        let listed = admin::list(dir.path()).unwrap();
        assert_eq!(listed[0].rights, ["user=4321:4322"]);
        // Rewriting the line with other rights counts as a revocation of the old ones.
        let text = fs::read_to_string(dir.path().join(TOKENS_FILE)).unwrap();
        let widened = text.replace(" user=4321:4322", "");
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(dir.path().join(TOKENS_FILE), widened).unwrap();
        assert_eq!(names(c.take_revoked()), ["laptop"]);
        // Ranges: gids default to the uid range; `ro` reads back.
        let r = Rights::parse(["uids=1000-1999", "ro"].into_iter()).unwrap();
        let range = IdRange {
            first: 1000,
            last: 1999,
        };
        assert_eq!(
            r.restrict,
            Restrict::Ranges {
                uids: range,
                gids: range
            }
        );
        assert!(r.read_only);
        assert_eq!(r.words(), ["uids=1000-1999", "gids=1000-1999", "ro"]);
        for bad in [
            "user=x",
            "uids=5-1",
            "user=1 uids=1-2",
            "admin",
            "user=4294967295",
        ] {
            assert!(Rights::parse(bad.split(' ')).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_token_with_rights_it_cannot_read_is_refused_not_widened() {
        let dir = tempfile::tempdir().unwrap();
        let t = admin::add(dir.path(), "a", &Rights::default()).unwrap();
        let path = dir.path().join(TOKENS_FILE);
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.trim_end().to_owned() + " sudo=yes\n").unwrap();
        let c = Credentials::new(None, Some(dir.path())).unwrap();
        assert_eq!(c.check(t.as_bytes()), Check::Refused(Some("a".into())));
    }

    #[test]
    fn a_hand_edited_line_without_its_creation_time_is_not_read_as_rights() {
        let dir = tempfile::tempdir().unwrap();
        let t = admin::add(dir.path(), "a", &Rights::default()).unwrap();
        let path = dir.path().join(TOKENS_FILE);
        let text = fs::read_to_string(&path).unwrap();
        let mut f = text.split_whitespace();
        let (name, hash) = (f.next().unwrap(), f.next().unwrap());
        // `ro` where the time belongs would leave the credential with no right at all.
        fs::write(&path, format!("{name} {hash} user=1000 ro\n")).unwrap();
        let c = Credentials::new(None, Some(dir.path())).unwrap();
        assert_eq!(c.check(t.as_bytes()), Check::Refused(Some("a".into())));
    }

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }
}
