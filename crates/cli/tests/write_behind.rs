//! Writes behind the writer (`--write-back close`, the default): many small writes reach
//! the server in few requests, and are all there when `close()` returns (another client
//! opening the file afterwards reads every byte); a `stat` in between shows every byte
//! written so far; a lock release comes after the writes made under it; `--write-back
//! through` still sends one request per write.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;

use common::rig::*;
use common::*;

/// 8 MiB in 4 KiB writes through one client, closed; read by another.
#[test]
fn small_writes_go_in_few_requests_and_another_client_reads_them_all_after_close() {
    let r = rig();
    let b = r.second_client(&[]);
    let data = bytes(1, 8 << 20);
    let before = counter(&r.m, "writes");
    let mut f = File::create(r.m.p("log")).unwrap();
    for piece in data.chunks(4096) {
        f.write_all(piece).unwrap();
    }
    close_checked(f).unwrap();
    // Close-to-open: the other client opens after the close and reads every byte.
    assert_content("the other client", &b.p("log"), &data);
    assert_content("the server", &r.srv("log"), &data);
    // (How many go in one request depends on how fast the writer is against a round
    // trip: one in flight per file, the next batch gathering meanwhile.)
    let sent = counter(&r.m, "writes") - before;
    assert!(
        sent <= 2048 / 4,
        "2,048 writes of 4 KiB took {sent} requests to the server"
    );
    assert_eq!(stats(&r.m)["unsent_write_bytes"].as_u64(), Some(0));
}

/// A `stat` while writes are queued shows the size the writer made (its writes reached
/// the server first), on this client and then on the other.
#[test]
fn a_stat_between_writes_shows_every_byte_written_so_far() {
    let r = rig();
    let b = r.second_client(&[]);
    let mut f = File::create(r.m.p("grows")).unwrap();
    let mut written = 0u64;
    for round in 0..8u64 {
        for piece in bytes(round, 1 << 20).chunks(4096) {
            f.write_all(piece).unwrap();
        }
        written += 1 << 20;
        assert_eq!(std::fs::metadata(r.m.p("grows")).unwrap().len(), written);
        assert_eq!(std::fs::metadata(r.srv("grows")).unwrap().len(), written);
        assert_soon(
            "the other client sees the size",
            || match std::fs::metadata(b.p("grows")).map(|m| m.len()) {
                Ok(n) if n == written => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
    }
    close_checked(f).unwrap();
}

/// Writes made under an exclusive lock are on the server when the lock is released:
/// a process on the other client taking the lock next reads them (as on NFS).
#[test]
fn writes_under_a_lock_reach_the_next_holder_on_another_client() {
    let r = rig_with(
        |exp| std::fs::write(exp.join("counter"), b"0000000000").unwrap(),
        &[],
        &[],
    );
    let b = r.second_client(&[]);
    let (fa, fb) = (
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(r.m.p("counter"))
            .unwrap(),
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(b.p("counter"))
            .unwrap(),
    );
    let bump = |f: &File| {
        flock(f, libc::LOCK_EX);
        let mut buf = [0u8; 10];
        f.read_exact_at(&mut buf, 0).unwrap();
        let n: u64 = std::str::from_utf8(&buf).unwrap().parse().unwrap();
        f.write_all_at(format!("{:010}", n + 1).as_bytes(), 0)
            .unwrap();
        flock(f, libc::LOCK_UN);
    };
    for _ in 0..50 {
        bump(&fa);
        bump(&fb);
    }
    assert_eq!(std::fs::read(r.srv("counter")).unwrap(), b"0000000100");
}

fn flock(f: &File, op: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor we own.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), op) }, 0, "flock");
}

/// `--write-back through`: one request per write, each on the server when it returns.
#[test]
fn write_back_through_sends_every_write_before_it_returns() {
    let r = rig_with(|_| {}, &[], &["--write-back", "through"]);
    let before = counter(&r.m, "writes");
    let mut f = File::create(r.m.p("f")).unwrap();
    for i in 0..20u64 {
        f.write_all(&bytes(i, 4096)).unwrap();
        assert_eq!(std::fs::metadata(r.srv("f")).unwrap().len(), (i + 1) * 4096);
    }
    close_checked(f).unwrap();
    assert_eq!(counter(&r.m, "writes") - before, 20);
}

/// A writer killed (`kill -9`) right after its close returned, and one killed in the
/// middle of its writes: what close acknowledged is on the server, and so is every write
/// the killed writer was told was made (the kernel closes its descriptor; the mount sends
/// what was queued).
#[test]
fn a_killed_writer_loses_nothing_it_was_told_was_written() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let r = rig();
    // Writes 4 KiB blocks of byte i % 251; says "wrote N" after every 256 of them and
    // "closed" after its close returned, then waits to be killed.
    const WRITER: &str = r#"
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(int(sys.argv[2])):
    os.write(fd, bytes([i % 251]) * 4096)
    if i % 256 == 255:
        print("wrote", i + 1, flush=True)
os.close(fd)
print("closed", flush=True)
time.sleep(600)
"#;
    let expected = |blocks: usize| -> Vec<u8> {
        (0..blocks)
            .flat_map(|i| std::iter::repeat_n((i % 251) as u8, 4096))
            .collect()
    };
    let run = |name: &str, blocks: usize, until: &str| -> usize {
        let mut child = Command::new("python3")
            .args([
                "-c",
                WRITER,
                r.m.p(name).to_str().unwrap(),
                &blocks.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut told = 0;
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("wrote ") {
                told = n.parse().unwrap();
            }
            if line.starts_with(until) {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        told
    };
    // Killed after its close returned: every byte is on the server already.
    run("closed", 2048, "closed");
    assert_content("the server after close", &r.srv("closed"), &expected(2048));
    // Killed while writing: the first 1,024 blocks it was told were written get there.
    let told = run("cut", 1 << 20, "wrote 1024");
    assert!(told >= 1024);
    let on_mount = std::fs::metadata(r.m.p("cut")).unwrap().len() as usize;
    assert!(
        on_mount >= told * 4096,
        "{on_mount} bytes after {told} blocks"
    );
    let server = std::fs::read(r.srv("cut")).unwrap();
    assert_eq!(server.len(), on_mount, "a stat waits for the queued writes");
    assert!(
        server[..on_mount] == expected(on_mount / 4096)[..],
        "the server holds other bytes"
    );
}

/// Files with queued writes whose server stopped answering (SIGSTOP: the connection stays
/// up, nothing answers): every file's data is refused at its write or at its close (EIO),
/// after one wait for the server (15 s), not one wait per file (16 files and 4 senders
/// would take a minute).
#[test]
fn files_written_to_a_server_that_stopped_answering_fail_after_one_wait() {
    let r = rig_with(|_| {}, &[], &["--timeout", "2"]);
    let files: Vec<File> = (0..16)
        .map(|i| File::create(r.m.p(&format!("f{i}"))).unwrap())
        .collect();
    // SAFETY: kill(2) on the test's own server process.
    unsafe { libc::kill(r.srv.pid() as libc::pid_t, libc::SIGSTOP) };
    let started = std::time::Instant::now();
    // Queued while the mount believes the server there (the first send has 2 s to fail);
    // refused at once after.
    let wrote: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(i, mut f)| f.write_all(&bytes(i as u64, 64 << 10)))
        .collect();
    let queued = wrote.iter().filter(|w| w.is_ok()).count();
    for (i, (f, wrote)) in files.into_iter().zip(wrote).enumerate() {
        match (wrote, close_checked(f)) {
            (Err(e), _) | (Ok(()), Err(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}")
            }
            (Ok(()), Ok(())) => panic!("file {i}: write and close succeeded"),
        }
    }
    let took = started.elapsed();
    // (Let the server be killed at the end.)
    // SAFETY: as above.
    unsafe { libc::kill(r.srv.pid() as libc::pid_t, libc::SIGCONT) };
    assert!(queued > 8, "only {queued} files had their writes queued");
    assert!(took < std::time::Duration::from_secs(40), "{took:?}");
}
