//! Tests of callbacks: changes made behind the origin's back (with `std::fs`) reach the sink
//! as breaks, and the watcher thread ends with the origin.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use super::super::*;
use super::writable;
use hoardfs_proto::Break;

/// Subscribes a sink that forwards every break into a channel.
fn subscribe(o: &LocalOrigin) -> Receiver<Break> {
    let (tx, rx) = channel();
    let tx = parking_lot::Mutex::new(tx);
    let sink: crate::BreakSink = Arc::new(move |breaks: Vec<Break>| {
        let tx = tx.lock();
        for b in breaks {
            let _ = tx.send(b);
        }
    });
    assert!(o.subscribe(sink));
    rx
}

/// Waits up to one second for a break matching `want`.
fn expect(rx: &Receiver<Break>, what: &str, want: impl Fn(&Break) -> bool) -> Break {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(b) if want(&b) => return b,
            Ok(b) => seen.push(b),
            Err(_) => break,
        }
    }
    panic!("no break for {what} within 1 s; got {seen:?}");
}

fn ino(p: &std::path::Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn modification_behind_the_origins_back_breaks_attr() {
    let (_d, o, root, path) = writable();
    let a = o.lookup(root, b"a.txt").unwrap();
    let rx = subscribe(&o);
    std::fs::write(path.join("a.txt"), b"changed in place").unwrap();
    let now = o.getattr(a.handle).unwrap();
    assert_ne!(now.version, a.attr.version);
    expect(&rx, "the modified file", |b| {
        *b == Break::Attr {
            file_id: a.attr.file_id,
            change_id: hoardfs_proto::change_id(&now),
        }
    });
}

#[test]
fn names_in_watched_directories_break_entries() {
    let (_d, o, root, path) = writable();
    // `sub` and `sub/early` are handed out before subscribe, `sub/late` after: all watched.
    std::fs::create_dir(path.join("sub/early")).unwrap();
    let sub = o.lookup(root, b"sub").unwrap();
    let early = o.lookup(sub.handle, b"early").unwrap();
    let rx = subscribe(&o);
    let late = o
        .mkdir(sub.handle, b"late", 0o755, Default::default())
        .unwrap();

    std::fs::write(path.join("sub/early/new"), b"x").unwrap();
    let new_id = ino(&path.join("sub/early/new"));
    expect(&rx, "create", |b| {
        *b == Break::Entry {
            dir_id: early.attr.file_id,
            name: b"new".to_vec(),
            file_id: Some(new_id),
        }
    });
    let dir_now = hoardfs_proto::change_id(&o.getattr(early.handle).unwrap());
    expect(&rx, "the directory's attributes", |b| {
        *b == Break::Attr {
            file_id: early.attr.file_id,
            change_id: dir_now,
        }
    });

    std::fs::rename(path.join("sub/early/new"), path.join("sub/late/moved")).unwrap();
    expect(&rx, "rename source", |b| {
        *b == Break::Entry {
            dir_id: early.attr.file_id,
            name: b"new".to_vec(),
            file_id: None,
        }
    });
    expect(&rx, "rename target", |b| {
        *b == Break::Entry {
            dir_id: late.attr.file_id,
            name: b"moved".to_vec(),
            file_id: Some(new_id),
        }
    });

    std::fs::remove_file(path.join("sub/late/moved")).unwrap();
    expect(&rx, "unlink", |b| {
        *b == Break::Entry {
            dir_id: late.attr.file_id,
            name: b"moved".to_vec(),
            file_id: None,
        }
    });

    // A directory's own attribute change, and its removal seen from its parent.
    std::fs::set_permissions(
        path.join("sub/late"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    expect(
        &rx,
        "chmod of a watched directory",
        |b| matches!(b, Break::Attr { file_id, .. } if *file_id == late.attr.file_id),
    );
    std::fs::remove_dir(path.join("sub/late")).unwrap();
    expect(&rx, "rmdir", |b| {
        *b == Break::Entry {
            dir_id: sub.attr.file_id,
            name: b"late".to_vec(),
            file_id: None,
        }
    });
}

#[test]
fn breaks_of_one_batch_are_deduplicated() {
    let (_d, o, root, path) = writable();
    let a = o.lookup(root, b"a.txt").unwrap();
    let (tx, rx) = channel::<Vec<Break>>();
    let tx = parking_lot::Mutex::new(tx);
    assert!(o.subscribe(Arc::new(move |b| {
        let _ = tx.lock().send(b);
    })));
    // Many modifications in a row; every batch lists each break at most once.
    for i in 0..50 {
        std::fs::write(path.join("a.txt"), format!("v{i}")).unwrap();
    }
    let want = hoardfs_proto::change_id(&o.getattr(a.handle).unwrap());
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let batch = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the final version is reported within 1 s");
        let unique: std::collections::HashSet<_> = batch.iter().collect();
        assert_eq!(unique.len(), batch.len(), "duplicates in {batch:?}");
        let done = Break::Attr {
            file_id: a.attr.file_id,
            change_id: want,
        };
        if batch.contains(&done) {
            break;
        }
    }
}

#[test]
fn watcher_thread_stops_with_the_origin() {
    let (_d, o, root, path) = writable();
    o.lookup(root, b"sub").unwrap();
    let token = Arc::new(());
    let held = token.clone();
    let (tx, rx) = channel::<()>();
    let tx = parking_lot::Mutex::new(tx);
    assert!(o.subscribe(Arc::new(move |_| {
        let _ = &held;
        let _ = tx.lock().send(());
    })));
    std::fs::write(path.join("sub/x"), b"x").unwrap();
    rx.recv_timeout(Duration::from_secs(1)).unwrap();
    assert_eq!(Arc::strong_count(&token), 2);
    drop(o);
    // Dropping the origin joined the thread, which released the watcher and its sink.
    assert_eq!(Arc::strong_count(&token), 1);
}

#[test]
fn failed_watches_break_everything_at_most_once_a_second() {
    let (_d, o, root, path) = writable();
    let rx = subscribe(&o);
    // A watch that cannot be added (here: a file posing as a directory, refused by
    // IN_ONLYDIR) means callbacks for it can no longer be promised.
    let a = o.lookup(root, b"a.txt").unwrap();
    let file = std::fs::File::open(path.join("a.txt")).unwrap();
    let bogus = Arc::new(handles::Node::new(
        file.into(),
        FileKind::Dir,
        0,
        a.attr.file_id,
    ));
    let sub = o.watch.get().unwrap();
    sub.watch_dir(&bogus);
    expect(&rx, "the first Break::All", |b| *b == Break::All);
    let t = Instant::now();
    sub.watch_dir(&bogus);
    sub.watch_dir(&bogus);
    assert_eq!(rx.recv_timeout(Duration::from_secs(2)), Ok(Break::All));
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "rate limit ignored"
    );
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "one All for both"
    );
}

#[test]
fn directories_beyond_the_watch_bound_break_everything_instead_of_holding_descriptors() {
    let d = tempfile::tempdir().unwrap();
    for n in ["d1", "d2", "d3"] {
        std::fs::create_dir(d.path().join(n)).unwrap();
    }
    // The root and d1 fit; d2 does not.
    let opts = LocalOptions {
        read_only: false,
        max_watches: 2,
        ..Default::default()
    };
    let o = LocalOrigin::new(d.path(), opts).unwrap();
    let root = o.info().unwrap().root.handle;
    let rx = subscribe(&o);
    o.lookup(root, b"d1").unwrap();
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "within the bound nothing is broken"
    );
    let d2 = o.lookup(root, b"d2").unwrap();
    expect(&rx, "a directory beyond the bound", |b| *b == Break::All);
    assert_eq!(o.watch.get().unwrap().watched(), 2);
    // Used again (a client revalidating it), it is refused again: clients keep being
    // told, rather than trust a callback on it that nobody keeps.
    while rx.try_recv().is_ok() {}
    o.getattr(d2.handle).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut again = false;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if let Ok(Break::All) = rx.recv_timeout(left) {
            again = true;
            break;
        }
    }
    assert!(
        again,
        "no Break::All for the unwatched directory used again"
    );
}
