//! State tests over the same scripted origin: the namespace saved for a mount that starts
//! disconnected, offline writes (staging, read-back, reintegration, conflict copies) and
//! the bound on objects kept by closed files.

use super::*;

#[test]
fn a_saved_namespace_lets_a_new_mount_start_offline_and_revalidate_once_back() {
    let data = content(9, 3 * MIB / 2);
    let r = Rig::new(
        &[("f", &data), ("g", b"never read")],
        true,
        true,
        config(Duration::ZERO),
    );
    std::fs::create_dir(r.export.join("sub")).unwrap();
    std::fs::write(r.export.join("sub/c"), b"in sub").unwrap();
    let reg = Registrar(AtomicUsize::new(0));
    let (f, _) = r.lookup("f");
    let (o, _) = open_read(&r, f, READ, &reg);
    r.fs.release(o.fh);
    r.fs.lookup(ROOT_INO, b"g").unwrap();
    let (sub, _) = r.lookup("sub");
    assert_eq!(r.fs.listing(sub).unwrap().entries.len(), 1);
    assert_eq!(r.fs.listing(ROOT_INO).unwrap().entries.len(), 3);
    let snap = r.fs.namespace_snapshot("the source").unwrap();
    assert_eq!(snap.len(), 3, "f, g and sub (sub/c was only listed)");
    let path = r._dir.path().join("namespace");
    snap.save(&path).unwrap();
    r.fs.shutdown();
    let Rig {
        _dir: dir,
        export,
        fs,
        ..
    } = r;
    drop(fs);

    // A new mount of the same cache, the origin unreachable from the start.
    let loaded = crate::NamespaceSnapshot::load(&path).unwrap().unwrap();
    assert_eq!(loaded.source, "the source");
    let origin = Arc::new(Scripted::new(&export, true));
    origin.offline.store(true, Ordering::SeqCst);
    let cache = CacheDir::open_unwatched(&dir.path().join("cache")).unwrap();
    let no_passthrough = FsConfig {
        passthrough: false,
        ..config(Duration::ZERO)
    };
    let fs = HoardFs::new(origin.clone(), Some(cache), no_passthrough).unwrap();
    assert_eq!(
        fs.restore_namespace(&loaded),
        4,
        "and sub/c from sub's listing"
    );
    let names = |l: &crate::Listing| {
        let mut v: Vec<Vec<u8>> = l.entries.iter().map(|e| e.name.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&fs.listing(ROOT_INO).unwrap()),
        vec![b"f".to_vec(), b"g".to_vec(), b"sub".to_vec()]
    );
    let f = fs.lookup(ROOT_INO, b"f").unwrap();
    assert_eq!(f.attr.size, data.len() as u64);
    let sub = fs.lookup(ROOT_INO, b"sub").unwrap().ino;
    assert_eq!(fs.lookup(sub, b"c").unwrap().attr.size, 6);
    let o = fs.open(f.ino, READ, &|f| reg.register(f)).unwrap();
    assert_eq!(
        fs.read(o.fh, 0, MIB as u32).unwrap()[..],
        data[..MIB],
        "cached bytes"
    );
    fs.release(o.fh);
    let g = fs.lookup(ROOT_INO, b"g").unwrap().ino;
    let o = fs.open(g, READ, &|f| reg.register(f)).unwrap();
    assert!(
        matches!(fs.read(o.fh, 0, 10), Err(FsError::Offline(_))),
        "never read"
    );
    fs.release(o.fh);
    assert!(matches!(
        fs.lookup(ROOT_INO, b"unknown"),
        Err(FsError::Offline(_))
    ));

    // The server is back, and f changed meanwhile: nothing restored is trusted unasked.
    std::fs::write(export.join("f"), b"changed").unwrap();
    origin.offline.store(false, Ordering::SeqCst);
    let before = origin.getattrs.load(Ordering::SeqCst);
    assert_eq!(fs.getattr(f.ino).unwrap().attr.size, 7);
    assert!(origin.getattrs.load(Ordering::SeqCst) > before);
    let o = fs.open(f.ino, READ, &|f| reg.register(f)).unwrap();
    assert_eq!(fs.read(o.fh, 0, 100).unwrap()[..], b"changed"[..]);
    fs.release(o.fh);
}

#[test]
fn a_damaged_namespace_file_is_refused_whole() {
    let r = Rig::new(&[("f", b"x")], true, false, config(Duration::ZERO));
    r.lookup("f");
    let path = r._dir.path().join("namespace");
    r.fs.namespace_snapshot("s").unwrap().save(&path).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let e = crate::NamespaceSnapshot::load(&path).unwrap_err();
    assert!(e.to_string().contains("damaged"), "{e}");
    bytes.truncate(bytes.len() - 3);
    std::fs::write(&path, &bytes).unwrap();
    assert!(crate::NamespaceSnapshot::load(&path).is_err());
    assert!(
        crate::NamespaceSnapshot::load(&r._dir.path().join("none"))
            .unwrap()
            .is_none()
    );
}

/// A mount with offline writes on (its log in the rig's directory) of an export holding
/// `f` (`data`), read whole so that it is cached.
pub(super) fn offline_rig(data: &[u8]) -> (Rig, Registrar, Ino) {
    // Writes through: each meets the origin in the state the test switched it to (queued
    // writes over the offline log: `state_tests::write_behind`).
    offline_rig_with(data, crate::WriteBack::Through)
}

/// [`offline_rig`] whose writes reach the origin as `write_back` says.
pub(super) fn offline_rig_with(data: &[u8], write_back: crate::WriteBack) -> (Rig, Registrar, Ino) {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), data).unwrap();
    let origin = Arc::new(Scripted::new(&export, true));
    let cache = CacheDir::open_unwatched(&dir.path().join("cache")).unwrap();
    let config = FsConfig {
        offline_log: Some(dir.path().join("cml")),
        offline_writes: true,
        host: "testhost".into(),
        passthrough: false,
        write_back,
        ..config(Duration::ZERO)
    };
    let fs = HoardFs::new(origin.clone(), Some(cache), config).unwrap();
    let notes = Arc::new(Notes::default());
    fs.set_notifier(notes.clone());
    let r = Rig {
        _dir: dir,
        export,
        origin,
        fs,
        notes,
    };
    let reg = Registrar(AtomicUsize::new(0));
    let (f, _) = r.lookup("f");
    let (o, _) = open_read(&r, f, READ, &reg);
    r.fs.release(o.fh);
    (r, reg, f)
}

pub(super) fn read_all(r: &Rig, fh: crate::FileHandle) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let got = r.fs.read(fh, out.len() as u64, MIB as u32).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend_from_slice(&got);
    }
}

#[test]
fn offline_writes_are_staged_read_back_and_sent_back_once_the_origin_returns() {
    let mut want = content(3, 2 * MIB);
    let (r, reg, f) = offline_rig(&want);
    r.origin.offline.store(true, Ordering::SeqCst);
    let o = r.fs.open(f, WRITE, &|f| reg.register(f)).unwrap();
    assert_eq!(r.fs.write(o.fh, 100, b"offline", 1).unwrap(), 7);
    want[100..107].copy_from_slice(b"offline");
    assert_eq!(r.fs.write(o.fh, 2 * MIB as u64, b"grown", 1).unwrap(), 5);
    want.extend_from_slice(b"grown");
    r.fs.flush(f, o.fh, 1).unwrap();
    assert_eq!(read_all(&r, o.fh), want, "read back from the staging file");
    r.fs.release(o.fh);
    assert_eq!(r.fs.getattr(f).unwrap().attr.size, want.len() as u64);
    assert_eq!(r.fs.pending_changes(), 1);
    // Still away: nothing is sent, nothing is lost.
    assert_eq!(r.fs.reintegrate().left, 1);
    assert_eq!(
        std::fs::read(r.export.join("f")).unwrap(),
        content(3, 2 * MIB)
    );

    r.origin.offline.store(false, Ordering::SeqCst);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (1, 0, 0));
    assert_eq!(std::fs::read(r.export.join("f")).unwrap(), want);
    assert_eq!(r.fs.pending_changes(), 0);
    // The node follows the origin again, and the file is cached again at its new
    // version: readable with the origin away.
    r.origin.offline.store(true, Ordering::SeqCst);
    let o = r.fs.open(f, READ, &|f| reg.register(f)).unwrap();
    assert_eq!(read_all(&r, o.fh), want);
    r.fs.release(o.fh);
}

/// Whether thread `tid` of this process is asleep (blocked on a lock, here).
fn asleep(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('S'))
        })
        .unwrap_or(false)
}

#[test]
fn a_truncation_that_waited_for_its_change_to_be_sent_back_goes_to_the_origin() {
    let (r, _reg, f) = offline_rig(&content(4, 64 << 10));
    r.origin.offline.store(true, Ordering::SeqCst);
    let to = |size| hoardfs_origin::SetAttrs {
        size: Some(size),
        ..Default::default()
    };
    r.fs.setattr(f, &to(1000)).unwrap();
    assert_eq!(r.fs.pending_changes(), 1);
    r.origin.offline.store(false, Ordering::SeqCst);
    // While reintegration sends the change (holding it), a truncation arrives and waits
    // for it: once sent, the change is gone, and the truncation must go to the origin.
    let (fs, tid) = (r.fs.clone(), Arc::new(AtomicUsize::new(0)));
    let (seen, truncation) = (tid.clone(), Arc::new(Mutex::new(None)));
    let result = truncation.clone();
    *r.origin.during_write.lock() = Some(Box::new(move || {
        let t = std::thread::spawn(move || {
            // ("PID/task/TID")
            let me = std::fs::read_link("/proc/thread-self").unwrap();
            let id = me.file_name().unwrap().to_str().unwrap().parse().unwrap();
            seen.store(id, Ordering::SeqCst);
            fs.setattr(f, &to(10))
        });
        wait_until("the truncation waits for the change", || {
            let id = tid.load(Ordering::SeqCst);
            id != 0 && asleep(id as i32)
        });
        *truncation.lock() = Some(t);
    }));
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.left), (1, 0));
    let t = result.lock().take().expect("reintegration wrote");
    let attr = t
        .join()
        .unwrap()
        .expect("the truncation, tried again on the origin");
    assert_eq!(attr.attr.size, 10);
    assert_eq!(std::fs::metadata(r.export.join("f")).unwrap().len(), 10);
    assert_eq!(r.fs.pending_changes(), 0);
}

#[test]
fn an_upload_whose_write_reply_was_lost_is_sent_again_whole_not_taken_for_a_conflict() {
    let base = content(6, 3 * MIB);
    let (r, reg, f) = offline_rig(&base);
    r.origin.offline.store(true, Ordering::SeqCst);
    let o = r.fs.open(f, WRITE, &|f| reg.register(f)).unwrap();
    let ours = content(7, 3 * MIB);
    for (i, piece) in ours.chunks(MIB).enumerate() {
        r.fs.write(o.fh, (i * MIB) as u64, piece, 1).unwrap();
    }
    r.fs.release(o.fh);
    // Back, but the reply to the upload's second piece is lost (the piece is applied)
    // and the server goes away again.
    r.origin.offline.store(false, Ordering::SeqCst);
    r.origin.lose_write_reply.store(2, Ordering::SeqCst);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (0, 0, 1));
    // Back for good: the whole file is sent over the same object, no conflict copy is
    // made of this client's own half upload, and the server ends with this client's bytes.
    r.origin.offline.store(false, Ordering::SeqCst);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (1, 0, 0));
    assert!(r.fs.conflicts().is_empty(), "{:?}", r.fs.conflicts());
    assert!(std::fs::read(r.export.join("f")).unwrap() == ours);
}

#[test]
fn a_file_open_for_writing_is_sent_back_once_its_writer_closes_it() {
    let base = content(8, 60_000);
    let (r, reg, f) = offline_rig(&base);
    r.origin.offline.store(true, Ordering::SeqCst);
    let o = r.fs.open(f, WRITE, &|f| reg.register(f)).unwrap();
    r.fs.write(o.fh, 0, b"ours", 1).unwrap();
    // Meanwhile on the server: a change of its own.
    std::fs::write(r.export.join("f"), b"theirs").unwrap();
    r.origin.offline.store(false, Ordering::SeqCst);
    // Still open for writing: not sent, so later writes cannot land in their version.
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (0, 0, 1));
    r.fs.write(o.fh, 4, b" too", 1).unwrap();
    r.fs.flush(f, o.fh, 1).unwrap();
    r.fs.release(o.fh);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (0, 1, 0));
    assert_eq!(std::fs::read(r.export.join("f")).unwrap(), b"theirs");
    let copy = &r.fs.conflicts()[0].copy;
    let mut ours = base.clone();
    ours[..8].copy_from_slice(b"ours too");
    assert!(std::fs::read(r.export.join(copy.trim_start_matches('/'))).unwrap() == ours);
}

#[test]
fn an_upload_whose_first_write_was_never_sent_still_meets_a_change_made_meanwhile() {
    let base = content(9, 100_000);
    let (r, reg, f) = offline_rig(&base);
    r.origin.offline.store(true, Ordering::SeqCst);
    let o = r.fs.open(f, WRITE, &|f| reg.register(f)).unwrap();
    r.fs.write(o.fh, 0, b"ours", 1).unwrap();
    r.fs.release(o.fh);
    // Back, but the connection is gone before the upload's first write leaves.
    r.origin.offline.store(false, Ordering::SeqCst);
    r.origin.unsent_write.store(true, Ordering::SeqCst);
    assert_eq!(r.fs.reintegrate().left, 1);
    assert!(
        std::fs::read(r.export.join("f")).unwrap() == base,
        "nothing was written"
    );
    // Meanwhile on the server: a change of somebody else's, which must not be overwritten.
    std::fs::write(r.export.join("f"), b"theirs").unwrap();
    r.origin.offline.store(false, Ordering::SeqCst);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (0, 1, 0));
    assert_eq!(std::fs::read(r.export.join("f")).unwrap(), b"theirs");
}

#[test]
fn an_offline_change_meeting_a_change_on_the_origin_becomes_a_conflict_copy() {
    let base = content(4, 50_000);
    let (r, reg, f) = offline_rig(&base);
    r.origin.offline.store(true, Ordering::SeqCst);
    let o = r.fs.open(f, WRITE, &|f| reg.register(f)).unwrap();
    r.fs.write(o.fh, 0, b"ours", 1).unwrap();
    r.fs.release(o.fh);
    std::fs::write(r.export.join("f"), b"theirs").unwrap();
    r.origin.offline.store(false, Ordering::SeqCst);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (0, 1, 0));
    assert_eq!(std::fs::read(r.export.join("f")).unwrap(), b"theirs");
    let copy = std::fs::read_dir(&r.export)
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("f.conflict-testhost-")
        })
        .expect("a conflict copy");
    let mut ours = base.clone();
    ours[..4].copy_from_slice(b"ours");
    assert_eq!(std::fs::read(copy.path()).unwrap(), ours);
    let c = r.fs.conflicts();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].path, "/f");
    assert!(c[0].reason.contains("changed on the server"), "{:?}", c[0]);
    // The mount shows the origin's version again.
    let o = r.fs.open(f, READ, &|f| reg.register(f)).unwrap();
    assert_eq!(read_all(&r, o.fh), b"theirs");
    r.fs.release(o.fh);
}

#[test]
fn a_file_not_completely_cached_cannot_be_changed_offline() {
    let (r, reg, _) = offline_rig(b"cached");
    std::fs::write(r.export.join("g"), content(5, 3 * MIB)).unwrap();
    let (g, _) = r.lookup("g");
    let o = r.fs.open(g, WRITE, &|f| reg.register(f)).unwrap();
    r.origin.offline.store(true, Ordering::SeqCst);
    assert!(matches!(
        r.fs.write(o.fh, 0, b"x", 1),
        Err(FsError::Offline(_))
    ));
    r.fs.release(o.fh);
    assert_eq!(r.fs.pending_changes(), 0);
}

#[test]
fn closed_files_keep_their_objects_only_up_to_a_bound() {
    let _heavy = super::many_descriptors();
    let n = crate::objects::IDLE_OBJECTS + 50;
    let r = Rig::new(&[], true, true, config(Duration::from_secs(60)));
    for i in 0..n {
        std::fs::write(r.export.join(format!("f{i}")), b"small").unwrap();
    }
    let reg = Registrar(AtomicUsize::new(0));
    let mut inos = Vec::new();
    for i in 0..n {
        let (ino, _) = r.lookup(&format!("f{i}"));
        let (o, _) = open_read(&r, ino, READ, &reg);
        r.fs.release(o.fh);
        inos.push(ino);
    }
    let holding = |ino: &Ino| {
        r.fs.sb
            .nodes()
            .get(*ino)
            .is_some_and(|n| n.state.lock().opens.object().is_some())
    };
    let held = inos.iter().filter(|i| holding(i)).count();
    assert_eq!(
        held,
        crate::objects::IDLE_OBJECTS,
        "objects kept by closed files"
    );
    assert!(!holding(&inos[0]), "the first closed let go");
    assert!(holding(&inos[n - 1]), "the last closed keeps it");
    // Its object is found in the cache again: nothing is fetched.
    let fetched = r.fs.stats().chunk_fetches;
    let (o, _) = open_read(&r, inos[0], READ, &reg);
    r.fs.release(o.fh);
    assert!(holding(&inos[0]));
    assert_eq!(r.fs.stats().chunk_fetches, fetched);
}

#[test]
fn a_file_reopened_over_and_over_keeps_its_object_and_registration() {
    // More closes than the bound counts nodes: one file opened again and again (a header
    // a build reads thousands of times) is one idle node, not thousands.
    let r = Rig::new(
        &[("f", b"data"), ("g", b"other")],
        true,
        true,
        config(Duration::from_secs(60)),
    );
    let reg = Registrar(AtomicUsize::new(0));
    let (f, _) = r.lookup("f");
    let (g, _) = r.lookup("g");
    // Read whole once (daemon reads fill the cache), then g opened in passthrough.
    for ino in [f, g, g] {
        let (o, _) = open_read(&r, ino, READ, &reg);
        r.fs.release(o.fh);
    }
    for _ in 0..crate::objects::IDLE_OBJECTS + 100 {
        let (o, _) = open_read(&r, f, READ, &reg);
        assert!(matches!(o.mode, OpenMode::Passthrough(_)));
        r.fs.release(o.fh);
    }
    assert_eq!(
        reg.count(),
        2,
        "one registration per file, reused by every open"
    );
    let holding = |ino: Ino| {
        r.fs.sb
            .nodes()
            .get(ino)
            .is_some_and(|n| n.state.lock().opens.object().is_some())
    };
    assert!(
        holding(f) && holding(g),
        "two idle nodes are within the bound"
    );
}

/// Writes `data` into a new file `parent/name` through the fs.
pub(super) fn create(r: &Rig, reg: &Registrar, parent: Ino, name: &str, data: &[u8]) -> Ino {
    let (e, o) =
        r.fs.create(
            parent,
            name.as_bytes(),
            0o640,
            true,
            false,
            WRITE,
            hoardfs_origin::Owner { uid: 0, gid: 0 },
            &|f| reg.register(f),
        )
        .unwrap();
    assert_eq!(r.fs.write(o.fh, 0, data, 1).unwrap() as usize, data.len());
    r.fs.flush(e.ino, o.fh, 1).unwrap();
    r.fs.release(o.fh);
    e.ino
}

#[test]
fn fallocate_reaches_the_origin_and_is_unsupported_while_it_is_unreachable() {
    // (So that `posix_fallocate` writes zeros instead, which the offline log keeps.)
    let (r, reg, f) = offline_rig_with(b"0123", crate::WriteBack::Close);
    let o = r.fs.open(f, WRITE, &|file| reg.register(file)).unwrap();
    r.fs.fallocate(o.fh, 0, 8192, 0).unwrap();
    assert_eq!(std::fs::metadata(r.export.join("f")).unwrap().len(), 8192);
    assert_eq!(r.fs.getattr(f).unwrap().attr.size, 8192);
    r.origin.offline.store(true, Ordering::SeqCst);
    assert!(matches!(
        r.fs.fallocate(o.fh, 0, 16384, 0),
        Err(FsError::Origin(hoardfs_origin::WireError::Unsupported))
    ));
    r.fs.release(o.fh);
    assert_eq!(std::fs::metadata(r.export.join("f")).unwrap().len(), 8192);
}
