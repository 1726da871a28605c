//! Files fetched ahead of a reader walking a directory in listing order (`fetch::siblings`).

use super::*;

/// A mount with a disk cache of an export of `n` files of 10 KiB, listed as READDIRPLUS
/// lists them (every entry remembered); their inodes and numbers (file `fNN` holds
/// `content(NN, 10 KiB)`) in listing order.
fn listed_files(n: usize) -> (Rig, Vec<Ino>, Vec<u8>) {
    let data: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| (format!("f{i:02}"), content(i as u8, 10 << 10)))
        .collect();
    let files: Vec<(&str, &[u8])> = data
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    let r = Rig::new(&files, false, true, config(Duration::from_secs(600)));
    let listing = r.fs.listing(ROOT_INO).unwrap();
    let inos = listing
        .entries
        .iter()
        .map(|e| r.fs.remember_entry(ROOT_INO, &listing, e).ino)
        .collect();
    let numbers = listing
        .entries
        .iter()
        .map(|e| std::str::from_utf8(&e.name[1..]).unwrap().parse().unwrap())
        .collect();
    (r, inos, numbers)
}

/// Paths of the files fully in the disk cache.
fn cached(r: &Rig) -> usize {
    r.fs.cache_entries()
        .unwrap()
        .iter()
        .filter(|e| e.bytes >= 10 << 10)
        .count()
}

#[test]
fn a_reader_walking_a_directory_in_order_finds_the_next_files_fetched() {
    let (r, inos, numbers) = listed_files(24);
    let reg = Registrar(AtomicUsize::new(0));
    // The first entry misses: the next four are fetched whole meanwhile.
    let (o, _) = open_read(&r, inos[0], READ, &reg);
    r.fs.release(o.fh);
    wait_until("four files fetched ahead", || {
        r.fs.stats().files_fetched_ahead == 4 && cached(&r) == 5
    });
    // In order: the window doubles (8 past the second entry, 16 past the third), and
    // the files fetched ahead open complete (passthrough: the kernel reads the cache).
    for &ino in &inos[1..3] {
        let (o, _) = open_read(&r, ino, READ, &reg);
        assert_eq!(kind(&o), "passthrough");
        r.fs.release(o.fh);
    }
    wait_until("entries up to 18 fetched ahead", || cached(&r) == 19);
    let fetched = r.fs.stats().chunk_fetches;
    for (i, &ino) in inos.iter().enumerate().take(19).skip(3) {
        let (o, _) = open_read(&r, ino, READ, &reg);
        assert_eq!(kind(&o), "passthrough", "entry {i}");
        r.fs.release(o.fh);
    }
    wait_until("the window reached the end", || cached(&r) == 24);
    assert_eq!(
        r.fs.stats().chunk_fetches,
        fetched + 5,
        "the reader fetched nothing itself; only the last five were fetched ahead since"
    );
    // What was fetched ahead is the files' bytes.
    for (i, &ino) in inos.iter().enumerate() {
        let got = r.fs.read_unopened(ino, 0, 20 << 10).unwrap();
        assert!(got[..] == content(numbers[i], 10 << 10)[..], "entry {i}");
    }
}

#[test]
fn a_reader_out_of_order_gets_nothing_fetched_for_it() {
    let (r, inos, _) = listed_files(12);
    let reg = Registrar(AtomicUsize::new(0));
    for i in [7, 2, 9, 4] {
        let (o, _) = open_read(&r, inos[i], READ, &reg);
        r.fs.release(o.fh);
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(r.fs.stats().files_fetched_ahead, 0);
    assert_eq!(cached(&r), 4);
}
