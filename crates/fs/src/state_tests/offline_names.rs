//! State tests of names changed offline (`--offline-writes`): directories made and
//! removed, symbolic links, renames (of objects made offline, of the origin's files and
//! directories, chains and swaps), permission bits and times, sent back in an order the
//! origin can take; and the conflicts when the origin's names changed meanwhile.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use hoardfs_origin::{Owner, SetAttrs, TimeSet, Timestamp};

use super::offline::{create, offline_rig, read_all};
use super::*;

const ME: Owner = Owner { uid: 0, gid: 0 };

fn offline(r: &Rig, away: bool) {
    r.origin.offline.store(away, Ordering::SeqCst);
}

fn dir_of(r: &Rig, path: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(r.export.join(path))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// The names the root's listing holds.
fn root_names(r: &Rig) -> Vec<Vec<u8>> {
    let listing = r.fs.listing(ROOT_INO).unwrap();
    listing.entries.iter().map(|e| e.name.clone()).collect()
}

#[test]
fn directories_links_renames_and_attributes_made_offline_reach_the_origin() {
    let (r, reg, f) = offline_rig(b"the original f");
    std::fs::create_dir(r.export.join("old")).unwrap();
    std::fs::write(r.export.join("gone"), b"to be removed").unwrap();
    std::fs::write(r.export.join("keep"), b"kept").unwrap();
    // Told as a server tells a change under a callback (the rig's lookup of "f" may have
    // had the root listed in the background already: `offline::lister`).
    let root_id = r.fs.cached_attr(ROOT_INO).unwrap().file_id;
    r.break_and_wait(attr_break(root_id), ROOT_INO);
    r.fs.listing(ROOT_INO).unwrap();
    let (old, _) = r.lookup("old");
    r.fs.listing(old).unwrap();
    r.lookup("gone");
    let (keep, _) = r.lookup("keep");

    offline(&r, true);
    let d = r.fs.mkdir(ROOT_INO, b"d", 0o750, ME).unwrap().ino;
    assert!(r.fs.listing(d).unwrap().entries.is_empty());
    create(&r, &reg, d, "new", b"made offline");
    let sub = r.fs.mkdir(d, b"sub", 0o700, ME).unwrap().ino;
    create(&r, &reg, sub, "deep", b"deeper");
    let link = r.fs.symlink(d, b"link", b"new", ME).unwrap();
    assert_eq!(r.fs.readlink(link.ino).unwrap(), b"new");
    // An origin file moved into the new directory, its mode and times changed.
    r.fs.rename(ROOT_INO, b"f", d, b"moved", 0).unwrap();
    let t = Timestamp {
        secs: 1_000_000_000,
        nanos: 5,
    };
    let set = SetAttrs {
        mode: Some(0o600),
        mtime: Some(TimeSet::At(t)),
        ..Default::default()
    };
    let a = r.fs.setattr(f, &set).unwrap().attr;
    assert_eq!((a.perm, a.mtime), (0o600, t), "seen here at once");
    let a = r.fs.setattr(
        keep,
        &SetAttrs {
            mode: Some(0o604),
            ..Default::default()
        },
    );
    assert_eq!(a.unwrap().attr.perm, 0o604);
    // The new directory renamed (its changes follow), an origin directory and file removed.
    r.fs.rename(ROOT_INO, b"d", ROOT_INO, b"e", 0).unwrap();
    r.fs.rmdir(ROOT_INO, b"old").unwrap();
    r.fs.unlink(ROOT_INO, b"gone").unwrap();
    let names = |ino| {
        let mut v: Vec<String> =
            r.fs.listing(ino)
                .unwrap()
                .entries
                .iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .collect();
        v.sort();
        v
    };
    assert_eq!(names(ROOT_INO), ["e", "keep"]);
    assert_eq!(names(d), ["link", "moved", "new", "sub"]);
    assert!(matches!(
        r.fs.lookup(ROOT_INO, b"f"),
        Err(FsError::Origin(hoardfs_origin::WireError::NotFound))
    ));
    assert_eq!(r.fs.lookup(d, b"moved").unwrap().ino, f);
    let o = r.fs.open(f, READ, &|f| reg.register(f)).unwrap();
    assert_eq!(read_all(&r, o.fh), b"the original f", "cached bytes");
    r.fs.release(o.fh);
    assert_eq!(r.fs.reintegrate().left, r.fs.pending_changes());

    offline(&r, false);
    let done = r.fs.reintegrate();
    assert_eq!((done.conflicts, done.left), (0, 0), "{done:?}");
    assert_eq!(dir_of(&r, ""), ["e", "keep"]);
    assert_eq!(dir_of(&r, "e"), ["link", "moved", "new", "sub"]);
    assert_eq!(
        std::fs::read(r.export.join("e/new")).unwrap(),
        b"made offline"
    );
    assert_eq!(
        std::fs::read(r.export.join("e/sub/deep")).unwrap(),
        b"deeper"
    );
    assert_eq!(
        std::fs::read_link(r.export.join("e/link")).unwrap(),
        Path::new("new")
    );
    let moved = std::fs::metadata(r.export.join("e/moved")).unwrap();
    assert_eq!(
        std::fs::read(r.export.join("e/moved")).unwrap(),
        b"the original f"
    );
    assert_eq!(moved.permissions().mode() & 0o7777, 0o600);
    assert_eq!((moved.mtime(), moved.mtime_nsec()), (1_000_000_000, 5));
    let mode = |p: &str| {
        std::fs::metadata(r.export.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("keep"), 0o604);
    assert_eq!(mode("e"), 0o750);
    assert_eq!(mode("e/sub"), 0o700);
    assert_eq!(r.fs.pending_changes(), 0);
    // The names are the origin's again, and the nodes answer for the origin's objects.
    assert_eq!(names(ROOT_INO), ["e", "keep"]);
    let e = r.fs.lookup(ROOT_INO, b"e").unwrap();
    assert_eq!(e.ino, d);
    assert_eq!(
        e.attr.file_id,
        std::fs::metadata(r.export.join("e")).unwrap().ino()
    );
}

#[test]
fn an_origin_directory_renamed_offline_takes_its_changes_along() {
    let (r, reg, _) = offline_rig(b"f");
    std::fs::create_dir(r.export.join("a")).unwrap();
    std::fs::write(r.export.join("a/x"), b"x before").unwrap();
    std::fs::write(r.export.join("a/w"), b"w stays").unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    let (a, _) = r.lookup("a");
    r.fs.listing(a).unwrap();
    let x = r.fs.lookup(a, b"x").unwrap().ino;
    let (o, _) = open_read(&r, x, READ, &reg);
    r.fs.release(o.fh);

    offline(&r, true);
    let o = r.fs.open(x, WRITE, &|f| reg.register(f)).unwrap();
    r.fs.write(o.fh, 0, b"X", 1).unwrap();
    r.fs.release(o.fh);
    r.fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", 0).unwrap();
    create(&r, &reg, a, "y", b"new in b");
    // Moved out of the renamed directory, then its old name reused.
    r.fs.rename(a, b"x", ROOT_INO, b"z", 0).unwrap();
    create(&r, &reg, a, "x", b"another x");

    offline(&r, false);
    let done = r.fs.reintegrate();
    assert_eq!((done.conflicts, done.left), (0, 0), "{done:?}");
    assert_eq!(dir_of(&r, ""), ["b", "f", "z"]);
    assert_eq!(dir_of(&r, "b"), ["w", "x", "y"]);
    assert_eq!(std::fs::read(r.export.join("z")).unwrap(), b"X before");
    assert_eq!(std::fs::read(r.export.join("b/x")).unwrap(), b"another x");
    assert_eq!(std::fs::read(r.export.join("b/y")).unwrap(), b"new in b");
    assert_eq!(std::fs::read(r.export.join("b/w")).unwrap(), b"w stays");
}

#[test]
fn a_swap_of_two_names_offline_is_sent_back() {
    let (r, _reg, _) = offline_rig(b"f");
    std::fs::write(r.export.join("p"), b"was p").unwrap();
    std::fs::write(r.export.join("q"), b"was q").unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    // (The kernel looks a name up before it renames it.)
    r.lookup("p");
    r.lookup("q");
    offline(&r, true);
    r.fs.rename(ROOT_INO, b"p", ROOT_INO, b"t", 0).unwrap();
    r.fs.rename(ROOT_INO, b"q", ROOT_INO, b"p", 0).unwrap();
    r.fs.rename(ROOT_INO, b"t", ROOT_INO, b"q", 0).unwrap();
    // Renamed away and back: nothing to send for it.
    r.fs.rename(ROOT_INO, b"f", ROOT_INO, b"f2", 0).unwrap();
    r.fs.rename(ROOT_INO, b"f2", ROOT_INO, b"f", 0).unwrap();
    assert_eq!(r.fs.pending_changes(), 2);
    offline(&r, false);
    let done = r.fs.reintegrate();
    assert_eq!((done.conflicts, done.left), (0, 0), "{done:?}");
    assert_eq!(dir_of(&r, ""), ["f", "p", "q"]);
    assert_eq!(std::fs::read(r.export.join("p")).unwrap(), b"was q");
    assert_eq!(std::fs::read(r.export.join("q")).unwrap(), b"was p");
}

#[test]
fn names_taken_or_changed_on_the_origin_meanwhile_keep_both_sides() {
    let (r, reg, _) = offline_rig(b"f");
    std::fs::create_dir(r.export.join("full")).unwrap();
    std::fs::create_dir(r.export.join("d")).unwrap();
    std::fs::write(r.export.join("d/x"), b"x").unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    let (full, _) = r.lookup("full");
    r.fs.listing(full).unwrap();
    let (d, _) = r.lookup("d");
    r.fs.listing(d).unwrap();

    offline(&r, true);
    let n = r.fs.mkdir(ROOT_INO, b"n", 0o755, ME).unwrap().ino;
    create(&r, &reg, n, "inside", b"in n");
    r.fs.symlink(ROOT_INO, b"s", b"target", ME).unwrap();
    r.fs.rename(ROOT_INO, b"f", ROOT_INO, b"taken", 0).unwrap();
    r.fs.rmdir(ROOT_INO, b"full").unwrap();
    create(&r, &reg, d, "new", b"in d");
    // Meanwhile on the server.
    std::fs::write(r.export.join("n"), b"their n").unwrap();
    std::fs::write(r.export.join("s"), b"their s").unwrap();
    std::fs::write(r.export.join("taken"), b"their taken").unwrap();
    std::fs::write(r.export.join("full/theirs"), b"new there").unwrap();
    std::fs::remove_dir_all(r.export.join("d")).unwrap();

    offline(&r, false);
    let done = r.fs.reintegrate();
    assert_eq!(done.left, 0, "{done:?}");
    let all = dir_of(&r, "");
    let copy = |prefix: &str| {
        all.iter()
            .find(|n| n.starts_with(&format!("{prefix}.conflict-testhost-")))
            .unwrap_or_else(|| panic!("no conflict name for {prefix} in {all:?}"))
            .clone()
    };
    // The server's versions stay at the names; this client's are next to them.
    assert_eq!(std::fs::read(r.export.join("n")).unwrap(), b"their n");
    assert_eq!(
        std::fs::read(r.export.join(copy("n")).join("inside")).unwrap(),
        b"in n"
    );
    assert_eq!(std::fs::read(r.export.join("s")).unwrap(), b"their s");
    assert_eq!(
        std::fs::read_link(r.export.join(copy("s"))).unwrap(),
        Path::new("target")
    );
    assert_eq!(
        std::fs::read(r.export.join("taken")).unwrap(),
        b"their taken"
    );
    assert_eq!(std::fs::read(r.export.join(copy("taken"))).unwrap(), b"f");
    assert_eq!(
        dir_of(&r, "full"),
        ["theirs"],
        "a directory with new entries stays"
    );
    // Its directory gone: not in the export root, but in its maker's private directory.
    assert!(!all.iter().any(|n| n.starts_with("d_new")), "{all:?}");
    let orphans = format!(
        ".hoardfs-conflicts-{}",
        hoardfs_origin::caller::process().uid
    );
    let md = std::fs::metadata(r.export.join(&orphans)).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777,
        0o700
    );
    let in_orphans = dir_of(&r, &orphans);
    let copy_of_new = in_orphans
        .iter()
        .find(|n| n.starts_with("d_new.conflict-testhost-"))
        .unwrap_or_else(|| panic!("no conflict copy of d/new in {in_orphans:?}"));
    assert_eq!(
        std::fs::read(r.export.join(&orphans).join(copy_of_new)).unwrap(),
        b"in d"
    );
    let conflicts = r.fs.conflicts();
    assert_eq!(conflicts.len(), 5, "{conflicts:?}");
    assert_eq!(done.conflicts, 5);
}

#[test]
fn symlink_targets_read_while_connected_are_served_offline() {
    let (r, _reg, _) = offline_rig(b"f");
    std::os::unix::fs::symlink("f", r.export.join("l")).unwrap();
    let (l, _) = r.lookup("l");
    assert_eq!(r.fs.readlink(l).unwrap(), b"f");
    offline(&r, true);
    assert_eq!(r.fs.readlink(l).unwrap(), b"f");
}

#[test]
fn offline_names_need_a_listed_directory_and_an_empty_one_to_remove() {
    let (r, _reg, _) = offline_rig(b"f");
    std::fs::create_dir(r.export.join("unlisted")).unwrap();
    std::fs::create_dir(r.export.join("nonempty")).unwrap();
    std::fs::write(r.export.join("nonempty/x"), b"x").unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    let (unlisted, _) = r.lookup("unlisted");
    let (nonempty, _) = r.lookup("nonempty");
    r.fs.listing(nonempty).unwrap();
    offline(&r, true);
    assert!(matches!(
        r.fs.mkdir(unlisted, b"x", 0o755, ME),
        Err(FsError::Offline(_))
    ));
    assert!(matches!(
        r.fs.rmdir(ROOT_INO, b"nonempty"),
        Err(FsError::Origin(hoardfs_origin::WireError::NotEmpty))
    ));
    assert!(matches!(
        r.fs.mkdir(ROOT_INO, b"f", 0o755, ME),
        Err(FsError::Origin(hoardfs_origin::WireError::Exists))
    ));
    assert!(matches!(
        r.fs.rename(ROOT_INO, b"nonempty", nonempty, b"inside", 0),
        Err(FsError::Origin(hoardfs_origin::WireError::Invalid))
    ));
    assert_eq!(r.fs.pending_changes(), 0);
}

#[test]
fn names_reused_after_removals_and_moves_are_sent_back_in_an_order_that_works() {
    let (r, reg, _) = offline_rig(b"f");
    for d in ["d", "m", "x"] {
        std::fs::create_dir(r.export.join(d)).unwrap();
    }
    std::fs::write(r.export.join("d/old"), b"old").unwrap();
    std::fs::write(r.export.join("m/in"), b"in m").unwrap();
    std::fs::write(r.export.join("x/y"), b"y").unwrap();
    std::fs::write(r.export.join("a"), b"a").unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    let mut dirs = std::collections::HashMap::new();
    for d in ["d", "m", "x"] {
        let (ino, _) = r.lookup(d);
        for e in r.fs.listing(ino).unwrap().entries.iter() {
            r.fs.lookup(ino, &e.name).unwrap();
        }
        dirs.insert(d, ino);
    }
    r.lookup("a");

    offline(&r, true);
    // rm -rf d; mkdir d; touch d/f
    r.fs.unlink(dirs["d"], b"old").unwrap();
    r.fs.rmdir(ROOT_INO, b"d").unwrap();
    let d2 = r.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    create(&r, &reg, d2, "f", b"new f");
    // mv m e; mkdir m; mkdir m/sub; ln -s t m/l
    r.fs.rename(ROOT_INO, b"m", ROOT_INO, b"e", 0).unwrap();
    let m2 = r.fs.mkdir(ROOT_INO, b"m", 0o755, ME).unwrap().ino;
    let sub = r.fs.mkdir(m2, b"sub", 0o755, ME).unwrap().ino;
    create(&r, &reg, sub, "s", b"in m/sub");
    r.fs.symlink(m2, b"l", b"t", ME).unwrap();
    // mv x/y z; mv x z/w (each waits for the other)
    let z = r.fs.mkdir(ROOT_INO, b"zz", 0o755, ME).unwrap().ino;
    r.fs.rename(dirs["x"], b"y", z, b"y", 0).unwrap();
    r.fs.rename(ROOT_INO, b"zz", ROOT_INO, b"z", 0).unwrap();
    r.fs.rename(ROOT_INO, b"x", z, b"w", 0).unwrap();
    // A file removed and its name taken by a moved one.
    r.fs.unlink(ROOT_INO, b"a").unwrap();
    r.fs.rename(ROOT_INO, b"f", ROOT_INO, b"a", 0).unwrap();

    offline(&r, false);
    let done = r.fs.reintegrate();
    assert_eq!((done.conflicts, done.left), (0, 0), "{done:?}");
    assert_eq!(dir_of(&r, ""), ["a", "d", "e", "m", "z"]);
    assert_eq!(dir_of(&r, "d"), ["f"]);
    assert_eq!(std::fs::read(r.export.join("d/f")).unwrap(), b"new f");
    assert_eq!(dir_of(&r, "e"), ["in"]);
    assert_eq!(dir_of(&r, "m"), ["l", "sub"]);
    assert_eq!(
        std::fs::read(r.export.join("m/sub/s")).unwrap(),
        b"in m/sub"
    );
    assert_eq!(dir_of(&r, "z"), ["w", "y"]);
    assert!(dir_of(&r, "z/w").is_empty());
    assert_eq!(std::fs::read(r.export.join("z/y")).unwrap(), b"y");
    assert_eq!(std::fs::read(r.export.join("a")).unwrap(), b"f");
    assert!(!r.fs.sb.names_pending());
}

#[test]
fn a_directory_moved_into_one_moved_out_of_it_is_sent_back() {
    let (r, _reg, _) = offline_rig(b"f");
    std::fs::create_dir_all(r.export.join("x/y")).unwrap();
    std::fs::write(r.export.join("x/y/in"), b"in y").unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    let (x, _) = r.lookup("x");
    r.fs.listing(x).unwrap();
    let y = r.fs.lookup(x, b"y").unwrap().ino;
    r.fs.listing(y).unwrap();
    offline(&r, true);
    // mv x/y z; mv x z/w: each waits for the other on the server.
    r.fs.rename(x, b"y", ROOT_INO, b"z", 0).unwrap();
    r.fs.rename(ROOT_INO, b"x", y, b"w", 0).unwrap();
    offline(&r, false);
    let done = r.fs.reintegrate();
    assert_eq!((done.conflicts, done.left), (0, 0), "{done:?}");
    assert_eq!(dir_of(&r, ""), ["f", "z"]);
    assert_eq!(dir_of(&r, "z"), ["in", "w"]);
    assert!(dir_of(&r, "z/w").is_empty());
}

#[test]
fn a_path_reused_by_a_new_directory_is_not_taken_for_the_old_one() {
    let (r, reg, _) = offline_rig(b"f");
    std::fs::create_dir_all(r.export.join("d")).unwrap();
    std::fs::write(r.export.join("d/f"), b"f in d").unwrap();
    std::fs::create_dir_all(r.export.join("a")).unwrap();
    std::fs::write(r.export.join("a/g"), b"g in a").unwrap();
    std::fs::create_dir_all(r.export.join("b")).unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    let mut ino = std::collections::HashMap::new();
    for d in ["d", "a", "b"] {
        let (i, _) = r.lookup(d);
        for e in r.fs.listing(i).unwrap().entries.iter() {
            r.fs.lookup(i, &e.name).unwrap();
        }
        ino.insert(d, i);
    }
    offline(&r, true);
    // mv d e; mkdir d; mv e/f d/f: f goes to the new d, the old d (now e) is left empty.
    r.fs.rename(ROOT_INO, b"d", ROOT_INO, b"e", 0).unwrap();
    let d2 = r.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    r.fs.rename(ino["d"], b"f", d2, b"f", 0).unwrap();
    // mv a/g b/; rmdir a; mv b a: the new a (the old b) holds g.
    r.fs.rename(ino["a"], b"g", ino["b"], b"g", 0).unwrap();
    r.fs.rmdir(ROOT_INO, b"a").unwrap();
    r.fs.rename(ROOT_INO, b"b", ROOT_INO, b"a", 0).unwrap();
    // A directory's times and mode are set after what goes inside it.
    let t = Timestamp {
        secs: 1_200_000_000,
        nanos: 0,
    };
    let m = r.fs.mkdir(ROOT_INO, b"m", 0o755, ME).unwrap().ino;
    let set = SetAttrs {
        mode: Some(0o555),
        mtime: Some(TimeSet::At(t)),
        ..Default::default()
    };
    r.fs.setattr(m, &set).unwrap();
    create(&r, &reg, m, "inside", b"made after the chmod");
    offline(&r, false);
    let mut done = r.fs.reintegrate();
    for _ in 0..5 {
        if done.left == 0 {
            break;
        }
        // (A directory's attributes wait for a later pass.)
        done = r.fs.reintegrate();
    }
    assert_eq!((done.conflicts, done.left), (0, 0), "{done:?}");
    assert_eq!(dir_of(&r, ""), ["a", "d", "e", "f", "m"]);
    assert!(dir_of(&r, "e").is_empty());
    assert_eq!(std::fs::read(r.export.join("d/f")).unwrap(), b"f in d");
    assert_eq!(dir_of(&r, "a"), ["g"]);
    assert_eq!(std::fs::read(r.export.join("a/g")).unwrap(), b"g in a");
    let md = std::fs::metadata(r.export.join("m")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o555);
    assert_eq!(md.mtime(), 1_200_000_000, "set after the file made inside");
    assert_eq!(
        std::fs::read(r.export.join("m/inside")).unwrap(),
        b"made after the chmod"
    );
}

#[test]
fn while_names_wait_an_object_moved_here_is_not_found_under_its_old_name_on_the_origin() {
    let (r, _reg, _) = offline_rig(b"f");
    std::fs::create_dir(r.export.join("u")).unwrap();
    std::fs::write(r.export.join("u/x"), b"x").unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    let (u, _) = r.lookup("u");
    let x = r.fs.lookup(u, b"x").unwrap().ino;
    offline(&r, true);
    r.fs.rename(u, b"x", ROOT_INO, b"y", 0).unwrap();
    // Back, the move not sent yet: u was never listed, so its names come from the origin,
    // which still has x there.
    offline(&r, false);
    assert!(matches!(
        r.fs.lookup(u, b"x"),
        Err(FsError::Origin(hoardfs_origin::WireError::NotFound))
    ));
    assert_eq!(r.fs.lookup(ROOT_INO, b"y").unwrap().ino, x);
    assert_eq!(r.fs.reintegrate().left, 0);
    assert_eq!(std::fs::read(r.export.join("y")).unwrap(), b"x");
}

/// The server reports a name this client is sending back (its create) before the reply
/// is in, when the node still has this client's own id: while names wait, the client's
/// view of names is its own, and the break must not take the name from it.
#[test]
fn while_names_wait_a_break_of_a_name_made_here_does_not_remove_it() {
    let (r, reg, _) = offline_rig(b"f");
    r.fs.listing(ROOT_INO).unwrap();
    let root_id = r.fs.getattr(ROOT_INO).unwrap().attr.file_id;
    offline(&r, true);
    let made = create(&r, &reg, ROOT_INO, "new", b"made offline");
    offline(&r, false);
    r.fs.sb.apply_breaks(vec![hoardfs_origin::Break::Entry {
        dir_id: root_id,
        name: b"new".to_vec(),
        file_id: Some(0x1234),
    }]);
    assert_eq!(r.fs.lookup(ROOT_INO, b"new").unwrap().ino, made);
    // Another client's change meanwhile (here: `f` gone) is put off too...
    r.fs.sb.apply_breaks(vec![hoardfs_origin::Break::Entry {
        dir_id: root_id,
        name: b"f".to_vec(),
        file_id: None,
    }]);
    let told_f = || r.notes.entries.lock().contains(&(ROOT_INO, b"f".to_vec()));
    assert!(!told_f());
    let names = root_names(&r);
    assert!(names.contains(&b"new".to_vec()), "{names:?}");
    assert_eq!(r.fs.reintegrate().left, 0);
    assert_eq!(
        std::fs::read(r.export.join("new")).unwrap(),
        b"made offline"
    );
    // ... and applied once the names are sent back: the kernel drops the name.
    assert!(told_f());
}

/// An offline rig whose root was listed, then broken by another client's change of
/// `name` (the listing is fetched again at its next use); and the root's file id.
fn listed_then_changed_elsewhere(name: &[u8]) -> (Rig, u64) {
    let (r, _reg, _) = offline_rig(b"f");
    r.fs.listing(ROOT_INO).unwrap();
    let root_id = r.fs.getattr(ROOT_INO).unwrap().attr.file_id;
    r.fs.sb.apply_breaks(vec![hoardfs_origin::Break::Entry {
        dir_id: root_id,
        name: name.to_vec(),
        file_id: Some(0x999),
    }]);
    (r, root_id)
}

#[test]
fn a_listing_fetched_while_a_name_is_made_here_does_not_drop_it() {
    // Another client's change: the listing is fetched again at its next use.
    let (r, _) = listed_then_changed_elsewhere(b"theirs");
    // A name made while the listing is on its way (the background lister's, say): the
    // listing, read before it, does not hold it.
    let fs = r.fs.clone();
    let made = Arc::new(Mutex::new(None));
    let got = made.clone();
    *r.origin.after_readdir.lock() = Some(Box::new(move || {
        let reg = Registrar(AtomicUsize::new(0));
        let (e, o) = fs
            .create(ROOT_INO, b"new", 0o640, true, false, WRITE, ME, &|f| {
                reg.register(f)
            })
            .unwrap();
        fs.release(o.fh);
        *got.lock() = Some(e.ino);
    }));
    r.fs.listing(ROOT_INO).unwrap();
    let made = made.lock().expect("made during the listing");
    // The name stays known (here: to take offline names beside it, and to look it up).
    offline(&r, true);
    assert_eq!(r.fs.lookup(ROOT_INO, b"new").unwrap().ino, made);
    let names = root_names(&r);
    assert!(names.contains(&b"new".to_vec()), "{names:?}");
}

#[test]
fn a_removal_of_a_logged_file_waits_briefly_for_a_release_on_its_way() {
    let (r, reg, _) = offline_rig(b"f");
    r.fs.listing(ROOT_INO).unwrap();
    offline(&r, true);
    // Made offline: its removal is the log's, which needs it closed.
    let g = create(&r, &reg, ROOT_INO, "g", b"made here");
    assert_eq!(r.fs.pending_changes(), 1);
    // Open, its close not reported: not removable.
    let fh = r.fs.open(g, READ, &|file| reg.register(file)).unwrap().fh;
    let refused = r.fs.unlink(ROOT_INO, b"g");
    assert!(matches!(refused, Err(FsError::Offline(_))), "{refused:?}");
    assert_eq!(r.fs.pending_changes(), 1);
    // Its RELEASE arrives while the removal waits: the removal goes ahead (the file made
    // offline just goes, with its change).
    let fs = r.fs.clone();
    let late = std::thread::spawn(move || {
        // Released once the removal waits for it (other tests' removals may wait too).
        let waits = || crate::offline::state::removals_waiting() > 0;
        assert!(hoardfs_testutil::wait_until(
            std::time::Duration::from_secs(10),
            waits
        ));
        fs.release(fh);
    });
    r.fs.unlink(ROOT_INO, b"g").unwrap();
    late.join().unwrap();
    assert_eq!(r.fs.pending_changes(), 0);
    assert!(matches!(
        r.fs.lookup(ROOT_INO, b"g"),
        Err(FsError::Origin(hoardfs_origin::WireError::NotFound))
    ));
}

#[test]
fn the_roots_attributes_are_not_changed_offline() {
    let (r, _reg, _) = offline_rig(b"f");
    r.fs.listing(ROOT_INO).unwrap();
    offline(&r, true);
    // (A change is sent back to its path; the root has none.)
    let chmod = SetAttrs {
        mode: Some(0o700),
        ..Default::default()
    };
    let refused = r.fs.setattr(ROOT_INO, &chmod);
    assert!(matches!(refused, Err(FsError::Offline(_))), "{refused:?}");
    assert_eq!(r.fs.pending_changes(), 0);
}

#[test]
fn a_directory_made_offline_with_its_mode_set_lists_its_conflict_name() {
    let (r, _reg, _) = offline_rig(b"f");
    r.fs.listing(ROOT_INO).unwrap();
    offline(&r, true);
    let d = r.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    let chmod = SetAttrs {
        mode: Some(0o700),
        ..Default::default()
    };
    r.fs.setattr(d, &chmod).unwrap();
    // Meanwhile on the server: the name is taken.
    std::fs::write(r.export.join("d"), b"their d").unwrap();
    offline(&r, false);
    // (Its mode waits a pass for what goes inside it.)
    let mut left = r.fs.reintegrate().left;
    for _ in 0..3 {
        if left == 0 {
            break;
        }
        left = r.fs.reintegrate().left;
    }
    assert_eq!(left, 0);
    assert_eq!(std::fs::read(r.export.join("d")).unwrap(), b"their d");
    let conflicts = r.fs.conflicts();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(conflicts[0].path, "/d");
    let copy = conflicts[0].copy.trim_start_matches('/');
    let md = std::fs::metadata(r.export.join(copy)).unwrap();
    assert!(md.is_dir());
    assert_eq!(md.permissions().mode() & 0o777, 0o700);
}

#[test]
fn a_file_whose_create_got_no_answer_is_neither_removed_nor_renamed_until_sent() {
    let (r, reg, _) = offline_rig(b"f");
    r.fs.listing(ROOT_INO).unwrap();
    offline(&r, true);
    create(&r, &reg, ROOT_INO, "n", b"made here");
    // Back, but the create's reply is lost (the file is made) and the server goes away.
    offline(&r, false);
    r.origin.lose_create_reply.store(true, Ordering::SeqCst);
    assert_eq!(r.fs.reintegrate().left, 1);
    assert!(r.export.join("n").exists(), "the create was applied");
    // It may be on the server: neither cancelled nor made again elsewhere.
    assert!(matches!(
        r.fs.unlink(ROOT_INO, b"n"),
        Err(FsError::Offline(_))
    ));
    assert!(matches!(
        r.fs.rename(ROOT_INO, b"n", ROOT_INO, b"m", 0),
        Err(FsError::Offline(_))
    ));
    assert_eq!(r.fs.pending_changes(), 1);
    offline(&r, false);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (1, 0, 0));
    assert_eq!(std::fs::read(r.export.join("n")).unwrap(), b"made here");
    assert!(!r.export.join("m").exists());
    assert_eq!(dir_of(&r, ""), ["f", "n"]);
}

#[test]
fn a_directory_whose_mkdir_got_no_answer_leaves_no_orphan_on_the_server() {
    // (The removal and the rename are refused here for other reasons too, such as the
    // directory's listing being unknown after the cut pass: this checks the outcome,
    // not which rule gives it.)
    let (r, _reg, _) = offline_rig(b"f");
    r.fs.listing(ROOT_INO).unwrap();
    offline(&r, true);
    r.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    offline(&r, false);
    r.origin.lose_create_reply.store(true, Ordering::SeqCst);
    assert_eq!(r.fs.reintegrate().left, 1);
    assert!(r.export.join("d").is_dir(), "the mkdir was applied");
    let refused = r.fs.rmdir(ROOT_INO, b"d");
    assert!(matches!(refused, Err(FsError::Offline(_))), "{refused:?}");
    assert!(matches!(
        r.fs.rename(ROOT_INO, b"d", ROOT_INO, b"e", 0),
        Err(FsError::Offline(_))
    ));
    offline(&r, false);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (1, 0, 0));
    assert_eq!(dir_of(&r, ""), ["d", "f"]);
}

#[test]
fn a_logged_change_of_the_roots_attributes_is_dropped_and_listed_not_retried() {
    // (Logged by an earlier build, which took the root's attributes offline.)
    let (r, _reg, _) = offline_rig(b"f");
    let root = r.fs.getattr(ROOT_INO).unwrap().attr;
    let off = r.fs.sb.offline_writes().unwrap();
    off.log.stage_meta(Vec::new(), None, &root).unwrap();
    assert_eq!(r.fs.pending_changes(), 1);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (0, 1, 0));
    assert_eq!(r.fs.conflicts()[0].path, "/");
}

#[test]
fn an_older_listing_finished_late_does_not_replace_a_newer_one() {
    let (r, root_id) = listed_then_changed_elsewhere(b"other");
    // A listing on its way (the background lister's, say) while another client makes a
    // name, and a newer listing fetched and the name looked up here meanwhile: the older
    // one, finished last, must not replace the newer one and drop the name.
    let (fs, export) = (r.fs.clone(), r.export.clone());
    let looked_up = Arc::new(Mutex::new(None));
    let got = looked_up.clone();
    *r.origin.after_readdir.lock() = Some(Box::new(move || {
        std::fs::write(export.join("other"), b"theirs").unwrap();
        fs.sb.apply_breaks(vec![hoardfs_origin::Break::Entry {
            dir_id: root_id,
            name: b"other".to_vec(),
            file_id: None,
        }]);
        fs.listing(ROOT_INO).unwrap();
        *got.lock() = Some(fs.lookup(ROOT_INO, b"other").unwrap().ino);
    }));
    r.fs.listing(ROOT_INO).unwrap();
    let other = looked_up
        .lock()
        .expect("looked up during the older listing");
    offline(&r, true);
    assert_eq!(r.fs.lookup(ROOT_INO, b"other").unwrap().ino, other);
    assert!(root_names(&r).contains(&b"other".to_vec()));
}
