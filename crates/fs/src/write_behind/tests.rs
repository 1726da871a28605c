//! The write-behind queues against a recording origin stand-in: order, batching, the
//! barriers, failures reported once, the bound, and the writer's identity.

use std::sync::Arc;
use std::time::Duration;

use hoardfs_origin::Origin;
use hoardfs_origin::caller::{self, Caller};
use hoardfs_origin::local::{LocalOptions, LocalOrigin};
use parking_lot::Mutex;

use super::{Batch, Send, WriteBehind, queue::BATCH};
use crate::FsError;
use crate::nodes::NodeTable;
use crate::open_files::{Access, OpenFile};
use crate::opens::ModeKind;

/// An open for writing of a node numbered `ino` (the root of an empty export, renumbered).
fn open(ino: u64) -> Arc<OpenFile> {
    let dir = tempfile::tempdir().unwrap();
    let origin = LocalOrigin::new(dir.path(), LocalOptions::default()).unwrap();
    let root = origin.info().unwrap().root;
    let node = NodeTable::detached(ino, root.handle, root.attr);
    let access = Access {
        read: false,
        write: true,
        append: false,
        sync: false,
    };
    Arc::new(OpenFile::new(node, ModeKind::Cached, access, None))
}

/// What the stand-in origin received: (inode, offset, bytes, uid), in order.
type Log = Arc<Mutex<Vec<(u64, u64, Vec<u8>, u32)>>>;

/// A sender that records each batch after `delay`, failing those `fail` says.
fn recorder(
    delay: Duration,
    fail: impl Fn(&Batch) -> bool + Sync + 'static + std::marker::Send,
) -> (Send, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let send: Send = Arc::new(move |b: &Batch| {
        std::thread::sleep(delay);
        if fail(b) {
            return Err(FsError::Offline("refused".into()));
        }
        let uid = caller::current().uid;
        l.lock()
            .push((b.of.node.ino, b.offset, b.data.clone(), uid));
        Ok(())
    });
    (send, log)
}

#[test]
fn writes_reach_the_origin_in_order_in_few_batches_and_settle_waits_for_them() {
    let (send, log) = recorder(Duration::from_millis(5), |_| false);
    let wb = WriteBehind::new(send, 64 << 20);
    let of = open(7);
    let mut expected = Vec::new();
    for i in 0..2000u32 {
        let data = [(i % 251) as u8; 4096];
        wb.queue(&of, i as u64 * 4096, &data).unwrap();
        expected.extend_from_slice(&data);
    }
    wb.settle(7);
    assert_eq!(wb.unsent(), 0);
    let log = log.lock();
    let mut got = Vec::new();
    for (ino, offset, data, _) in log.iter() {
        assert_eq!((*ino, *offset), (7, got.len() as u64));
        got.extend_from_slice(data);
    }
    assert!(got == expected, "bytes differ");
    // 8 MB of 4 KiB writes: a handful of round trips, not 2,000.
    assert!(
        log.len() <= 2000 * 4096 / BATCH + 60,
        "{} batches",
        log.len()
    );
    assert!(log.iter().all(|b| b.2.len() <= BATCH));
}

#[test]
fn a_failed_write_is_reported_once_at_the_next_write_or_report() {
    let (send, log) = recorder(Duration::ZERO, |b| b.offset == 100);
    let wb = WriteBehind::new(send, 64 << 20);
    let of = open(3);
    wb.queue(&of, 0, b"fine").unwrap();
    wb.report(3, true).unwrap();
    wb.queue(&of, 100, b"refused").unwrap();
    wb.settle(3);
    // The next write is refused with the failure; the one after it goes.
    assert!(matches!(wb.queue(&of, 200, b"x"), Err(FsError::Offline(_))));
    wb.queue(&of, 300, b"y").unwrap();
    wb.report(3, true).unwrap();
    wb.queue(&of, 100, b"refused").unwrap();
    wb.settle(3);
    // A close of another copy of the descriptor is told, and leaves it for the writer.
    assert!(matches!(wb.report(3, false), Err(FsError::Offline(_))));
    assert!(matches!(wb.report(3, true), Err(FsError::Offline(_))));
    wb.report(3, true).unwrap();
    let offsets: Vec<u64> = log.lock().iter().map(|b| b.1).collect();
    assert_eq!(offsets, [0, 300]);
}

#[test]
fn a_writer_past_the_bound_waits_and_nothing_is_lost() {
    let (send, log) = recorder(Duration::from_millis(2), |_| false);
    // The bound is at least one batch.
    let wb = Arc::new(WriteBehind::new(send, 1));
    let of = open(9);
    let chunk = vec![1u8; 256 << 10];
    for i in 0..40u64 {
        wb.queue(&of, i * chunk.len() as u64, &chunk).unwrap();
        assert!(wb.unsent() <= BATCH as u64, "{} bytes queued", wb.unsent());
    }
    wb.settle(9);
    let total: usize = log.lock().iter().map(|b| b.2.len()).sum();
    assert_eq!(total, 40 * chunk.len());
}

#[test]
fn each_batch_is_sent_as_its_writer_and_files_do_not_wait_for_each_other() {
    let (send, log) = recorder(Duration::from_millis(1), |_| false);
    let wb = WriteBehind::new(send, 64 << 20);
    let (a, b) = (open(1), open(2));
    let user = |uid| {
        Arc::new(Caller {
            uid,
            gid: uid,
            groups: vec![],
        })
    };
    caller::with(user(1000), || wb.queue(&a, 0, b"alice").unwrap());
    caller::with(user(1001), || wb.queue(&a, 5, b"bob").unwrap());
    caller::with(user(1002), || wb.queue(&b, 0, b"carol").unwrap());
    wb.settle(1);
    wb.settle(2);
    let mut got: Vec<(u64, u32)> = log.lock().iter().map(|b| (b.1 + b.0 * 100, b.3)).collect();
    got.sort();
    assert_eq!(got, [(100, 1000), (105, 1001), (200, 1002)]);
    // Stopping sends what is left and ends the senders; a later write starts one again.
    wb.queue(&b, 5, b"!").unwrap();
    wb.stop();
    assert_eq!(wb.unsent(), 0);
    wb.queue(&b, 6, b"?").unwrap();
    wb.settle(2);
    assert_eq!(log.lock().len(), 5);
}

#[test]
fn barriers_racing_writes_and_closes_always_return() {
    // A writer closing after every few writes (its queue spent and dropped each time)
    // while another thread settles the same file: a barrier numbered by an old queue must
    // not wait for the new one's writes to count up to it (it did, for good: SQLite on
    // two clients hung in a getattr).
    let (send, log) = recorder(Duration::from_micros(200), |_| false);
    let wb = Arc::new(WriteBehind::new(send, 64 << 20));
    let of = open(4);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (settler_tx, settler_done) = std::sync::mpsc::channel();
    {
        let (wb, stop) = (wb.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                wb.settle(4);
            }
            settler_tx.send(()).unwrap();
        });
    }
    let (writer_tx, writer_done) = std::sync::mpsc::channel();
    {
        let (wb, of) = (wb.clone(), of.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            for round in 0..300u64 {
                // Fewer writes in a round than in the one before, now and then.
                for _ in 0..(8 - round % 8) {
                    wb.queue(&of, n, b"x").unwrap();
                    n += 1;
                }
                wb.report(4, true).unwrap();
            }
            writer_tx.send(n).unwrap();
        });
    }
    let written = writer_done.recv_timeout(Duration::from_secs(20));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let settled = settler_done.recv_timeout(Duration::from_secs(5));
    assert!(written.is_ok(), "the writer's close waited for good");
    assert!(settled.is_ok(), "a barrier waited for good");
    let total: usize = log.lock().iter().map(|b| b.2.len()).sum();
    assert_eq!(total as u64, written.unwrap());
}
