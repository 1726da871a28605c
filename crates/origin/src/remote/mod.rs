//! [`RemoteOrigin`]: a `hoardfs serve` process reached over TCP.
//!
//! All callers share one multiplexed connection (module `conn`): each request carries an id,
//! replies may come back in any order, and many requests can be in flight at once. A caller
//! waits at most [`RemoteOptions::request_timeout`]. When the connection breaks, waiting
//! callers fail with [`OriginError::Unreachable`] immediately, and the next call reconnects
//! (and repeats the `Hello` handshake) by itself; while a reconnect failed less than
//! [`RemoteOptions::reconnect_backoff`] ago, calls fail fast instead of hammering the server.
//!
//! A restarted server hands out handles with a new epoch; requests naming old handles are
//! answered with [`WireError::Stale`] and the file-system layer re-resolves them by name.
//! [`Origin::info`] always returns what the most recent handshake said.

mod conn;
mod hello;
mod locks;
mod tls;
pub mod validate;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hoardfs_proto::{
    Handle, MAX_WRITE_LEN, Op, Owner, Reply, ServerCounters, SetAttrs, TreeDir, WireError,
};
use parking_lot::Mutex;

use crate::{
    Attr, BreakSink, DirPage, DirectReads, Entry, Origin, OriginError, OriginInfo, ReadReply,
    ReadSlot, Result, StatFs, WriteReply,
};
use conn::{Answer, Conn, SinkSlot};
use hello::{Greeting, handshake};
pub use hoardfs_tls::{ClientTls, Fingerprint, Trust};

/// How a client proves who it is (a token, sent only after the server proved who it is)
/// and how it checks the server (TLS, or none with `--insecure-plaintext`).
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// Credential from `--token-file` (empty: none).
    pub token: Vec<u8>,
    /// TLS settings; `None` is plaintext.
    pub tls: Option<ClientTls>,
}

impl Security {
    /// Plaintext with `token`: for benchmarks and tests only.
    pub fn plaintext(token: Vec<u8>) -> Security {
        Security { token, tls: None }
    }

    /// TLS, checking the server with `tls`, then presenting `token`.
    pub fn tls(token: Vec<u8>, tls: ClientTls) -> Security {
        Security {
            token,
            tls: Some(tls),
        }
    }
}

/// Timeouts and pacing of a [`RemoteOrigin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteOptions {
    /// Bound on establishing the TCP connection, and separately on the `Hello` reply.
    pub connect_timeout: Duration,
    /// Bound on waiting for the reply to one request.
    pub request_timeout: Duration,
    /// After a failed (re)connect, calls fail fast for this long before trying again.
    pub reconnect_backoff: Duration,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(15),
            reconnect_backoff: Duration::from_millis(500),
        }
    }
}

/// Connection state, guarded by one mutex held only briefly.
struct State {
    /// The current connection, if one was established and not replaced.
    conn: Option<Arc<Conn>>,
    /// What the latest successful handshake said.
    info: OriginInfo,
    /// Its `identities`, shared (asked for at every request the file system answers).
    identities: Arc<hoardfs_proto::Identities>,
    /// Number of successful handshakes so far.
    handshakes: u64,
    /// Connection attempts finished so far, successful or not.
    attempts: u64,
    /// Whether the server publishes written files only at `Flush` (its `Hello` says).
    publishes_on_close: bool,
    /// The protocol version the connection speaks (0 before the first handshake).
    version: u32,
    /// When and why the latest (re)connect attempt failed, if it did.
    last_failure: Option<(Instant, OriginError)>,
}

/// Client side of the hoardfs protocol; see the module docs.
pub struct RemoteOrigin {
    addr: String,
    security: Security,
    opts: RemoteOptions,
    state: Mutex<State>,
    /// Serialises reconnect attempts, so a burst of callers makes one attempt, not many.
    connecting: Mutex<()>,
    next_id: AtomicU64,
    sink: SinkSlot,
    /// Whether a background thread reconnects (see `reconnect_in_background`).
    background: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for RemoteOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteOrigin")
            .field("addr", &self.addr)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl RemoteOrigin {
    /// Connects to `addr` (`HOST:PORT`), checks the server's identity and presents the
    /// token as `security` says. A refused token yields
    /// `OriginError::Fs(WireError::AuthFailed)`; a server that is not who it should be,
    /// `OriginError::Security`.
    pub fn connect(addr: &str, security: Security, opts: RemoteOptions) -> Result<RemoteOrigin> {
        let sink = SinkSlot::default();
        let Greeting {
            conn,
            info,
            publishes_on_close,
            version,
        } = handshake(addr, &security, &opts, &sink)?;
        Ok(RemoteOrigin {
            sink,
            addr: addr.to_owned(),
            security,
            opts,
            state: Mutex::new(State {
                conn: Some(Arc::new(conn)),
                identities: Arc::new(info.identities.clone()),
                info,
                handshakes: 1,
                attempts: 1,
                publishes_on_close,
                version,
                last_failure: None,
            }),
            connecting: Mutex::new(()),
            next_id: AtomicU64::new(1),
            background: Default::default(),
        })
    }

    /// An origin for `addr` that starts disconnected, answering [`Origin::info`] with
    /// `info` (what an earlier session of this client saw) until a connection succeeds;
    /// the first request, or [`RemoteOrigin::reconnect`], tries to connect. For a mount
    /// that starts while the server is unreachable.
    pub fn disconnected(
        addr: &str,
        security: Security,
        opts: RemoteOptions,
        info: OriginInfo,
        publishes_on_close: bool,
        why: OriginError,
    ) -> RemoteOrigin {
        RemoteOrigin {
            sink: SinkSlot::default(),
            addr: addr.to_owned(),
            security,
            opts,
            state: Mutex::new(State {
                conn: None,
                identities: Arc::new(info.identities.clone()),
                info,
                handshakes: 0,
                attempts: 0,
                publishes_on_close,
                version: 0,
                last_failure: Some((Instant::now(), why)),
            }),
            connecting: Mutex::new(()),
            next_id: AtomicU64::new(1),
            background: Default::default(),
        }
    }

    /// Whether the latest attempt to reach the server failed and no connection was made
    /// since: the state a background [`RemoteOrigin::reconnect`] is for. (A connection the
    /// server closed while idle is not this: the next request reconnects.)
    pub fn is_offline(&self) -> bool {
        let st = self.state.lock();
        st.last_failure.is_some() && !st.conn.as_ref().is_some_and(|c| c.is_alive())
    }

    /// Connects now if there is no live connection, whatever the backoff. Callers that
    /// arrive while an attempt is under way share its outcome rather than each making
    /// one after it (an unreachable server would make them wait a connect timeout each).
    pub fn reconnect(&self) -> Result<()> {
        self.conn_or_attempt(true).map(|_| ())
    }

    /// From now on a background thread calls [`RemoteOrigin::reconnect`] while the
    /// server is unreachable: requests fail at once instead of trying themselves (and
    /// waiting up to the connect timeout each time).
    pub fn reconnect_in_background(&self) {
        self.background.store(true, Ordering::Relaxed);
    }

    /// The address this origin was given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Number of successful handshakes (1 after [`RemoteOrigin::connect`], +1 per
    /// reconnect). A change means the server may have restarted: compare
    /// `info().root.handle.epoch` to see whether old handles went stale.
    pub fn handshakes(&self) -> u64 {
        self.state.lock().handshakes
    }

    /// The server's counters (its own plus its origin's).
    pub fn counters(&self) -> Result<ServerCounters> {
        match self.request(Op::Counters)? {
            (Reply::Counters(c), d) if d.is_empty() => Ok(c),
            other => Err(unexpected(&other)),
        }
    }

    /// The current connection, reconnecting if there is none (subject to the backoff).
    fn conn(&self) -> Result<Arc<Conn>> {
        self.conn_or_attempt(false)
    }

    /// Fails at once if the last attempt failed within the backoff, or at all when a
    /// background thread does the reconnecting (`forced` is that thread).
    fn fail_fast(&self, forced: bool) -> Result<()> {
        if forced {
            return Ok(());
        }
        if let Some((at, err)) = &self.state.lock().last_failure {
            let ago = at.elapsed();
            if ago < self.opts.reconnect_backoff || self.background.load(Ordering::Relaxed) {
                return Err(OriginError::Unreachable(format!(
                    "{}: last connection attempt {} ms ago failed: {err}",
                    self.addr,
                    ago.as_millis()
                )));
            }
        }
        Ok(())
    }

    fn conn_or_attempt(&self, forced: bool) -> Result<Arc<Conn>> {
        if let Some(c) = self.live_conn() {
            return Ok(c);
        }
        // Before waiting for an attempt in progress: an unreachable server must not make
        // every caller wait for the next attempt's timeout.
        self.fail_fast(forced)?;
        let attempts = self.state.lock().attempts;
        let _one_at_a_time = self.connecting.lock();
        // Someone else may have reconnected (or failed) while we waited.
        if let Some(c) = self.live_conn() {
            return Ok(c);
        }
        self.fail_fast(forced)?;
        if forced {
            let st = self.state.lock();
            if st.attempts != attempts
                && let Some((_, e)) = &st.last_failure
            {
                return Err(e.clone());
            }
        }
        match handshake(&self.addr, &self.security, &self.opts, &self.sink) {
            Ok(Greeting {
                conn,
                info,
                publishes_on_close,
                version,
            }) => {
                let conn = Arc::new(conn);
                let mut st = self.state.lock();
                st.publishes_on_close = publishes_on_close;
                st.version = version;
                if st.info.root.handle.epoch != info.root.handle.epoch {
                    tracing::info!(addr = %self.addr, "server restarted; old handles are stale");
                }
                if st.info.export_id != info.export_id {
                    tracing::warn!(addr = %self.addr, "server now exports a different tree");
                }
                st.conn = Some(Arc::clone(&conn));
                if *st.identities != info.identities {
                    st.identities = Arc::new(info.identities.clone());
                }
                st.info = info;
                st.handshakes += 1;
                st.attempts += 1;
                st.last_failure = None;
                tracing::debug!(addr = %self.addr, handshakes = st.handshakes, "reconnected");
                Ok(conn)
            }
            Err(e) => {
                if let OriginError::Security(msg) = &e {
                    tracing::error!(addr = %self.addr, "refusing the server: {msg}");
                }
                let mut st = self.state.lock();
                st.conn = None;
                st.attempts += 1;
                st.last_failure = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    fn live_conn(&self) -> Option<Arc<Conn>> {
        self.state
            .lock()
            .conn
            .as_ref()
            .filter(|c| c.is_alive())
            .cloned()
    }

    /// A new request id.
    fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends one request on the current connection and waits for its reply.
    fn request(&self, op: Op) -> Result<Answer> {
        self.request_with_data(op, &[])
    }

    /// Sends one request with a data section.
    fn request_with_data(&self, op: Op, data: &[u8]) -> Result<Answer> {
        let conn = self.conn()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let expect = validate::Expect::of(&op, data.len());
        let answer = conn.call_with_data(id, op, data, self.opts.request_timeout)?;
        validate::answer(&expect, answer)
    }

    /// A request whose reply is an `Entry`.
    fn entry(&self, op: Op) -> Result<Entry> {
        match self.request(op)? {
            (Reply::Entry(e), d) if d.is_empty() => Ok(e),
            other => Err(unexpected(&other)),
        }
    }

    /// A request whose reply is `Done`.
    fn done(&self, op: Op, data: &[u8]) -> Result<()> {
        match self.request_with_data(op, data)? {
            (Reply::Done, d) if d.is_empty() => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// A request whose reply is `Xattr` bytes.
    fn xattr(&self, op: Op) -> Result<Vec<u8>> {
        match self.request(op)? {
            (Reply::Xattr { len }, d) if d.len() == len as usize => Ok(d),
            other => Err(unexpected(&other)),
        }
    }
}

impl Origin for RemoteOrigin {
    fn info(&self) -> Result<OriginInfo> {
        Ok(self.state.lock().info.clone())
    }

    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        match self.request(Op::Lookup {
            parent,
            name: name.to_vec(),
        })? {
            (Reply::Entry(e), d) if d.is_empty() => Ok(e),
            other => Err(unexpected(&other)),
        }
    }

    fn getattr(&self, handle: Handle) -> Result<Attr> {
        match self.request(Op::GetAttr { handle })? {
            (Reply::Attr(a), d) if d.is_empty() => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage> {
        match self.request(Op::ReadDir {
            dir,
            cookie,
            max_entries,
        })? {
            (Reply::DirPage { entries, next }, d) if d.is_empty() => Ok(DirPage { entries, next }),
            other => Err(unexpected(&other)),
        }
    }

    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply> {
        match self.request(Op::Read {
            handle,
            offset,
            len,
        })? {
            (Reply::Data { len: got, version }, data) => {
                if data.len() != got as usize || got > len {
                    return Err(OriginError::Protocol(format!(
                        "read reply announces {got} bytes (asked {len}) but carries {}",
                        data.len()
                    )));
                }
                Ok(ReadReply { data, version })
            }
            other => Err(unexpected(&other)),
        }
    }

    fn direct_reads(&self) -> Option<&dyn DirectReads> {
        Some(self)
    }

    fn locks(&self) -> Option<&dyn crate::Locks> {
        Some(self)
    }

    fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        match self.request(Op::ReadLink { handle })? {
            (Reply::Link(target), d) if d.is_empty() => Ok(target),
            other => Err(unexpected(&other)),
        }
    }

    fn identities(&self) -> Arc<hoardfs_proto::Identities> {
        Arc::clone(&self.state.lock().identities)
    }

    fn access(&self, handle: Handle, mask: u32) -> Result<()> {
        self.done(Op::Access { handle, mask }, &[])
    }

    fn statfs(&self) -> Result<StatFs> {
        match self.request(Op::StatFs)? {
            (Reply::StatFs(s), d) if d.is_empty() => Ok(s),
            other => Err(unexpected(&other)),
        }
    }

    fn reconnect_now(&self) {
        if !self.is_connected() {
            let _ = self.reconnect();
        }
    }

    fn is_connected(&self) -> bool {
        self.state
            .lock()
            .conn
            .as_ref()
            .is_some_and(|c| c.is_alive())
    }

    fn subscribe(&self, sink: BreakSink) -> bool {
        *self.sink.lock() = Some(validate::break_sink(sink));
        true
    }

    fn create(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: Owner,
    ) -> Result<Entry> {
        self.entry(Op::Create {
            parent,
            name: name.to_vec(),
            mode,
            exclusive,
            owner,
        })
    }

    fn mknod(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<Entry> {
        self.entry(Op::MkNod {
            parent,
            name: name.to_vec(),
            mode,
            rdev,
            owner,
        })
    }

    fn mkdir(&self, parent: Handle, name: &[u8], mode: u32, owner: Owner) -> Result<Entry> {
        self.entry(Op::MkDir {
            parent,
            name: name.to_vec(),
            mode,
            owner,
        })
    }

    fn symlink(&self, parent: Handle, name: &[u8], target: &[u8], owner: Owner) -> Result<Entry> {
        self.entry(Op::Symlink {
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
            owner,
        })
    }

    fn link(&self, handle: Handle, parent: Handle, name: &[u8]) -> Result<Entry> {
        self.entry(Op::Link {
            handle,
            parent,
            name: name.to_vec(),
        })
    }

    fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        let name = name.to_vec();
        self.done(Op::Unlink { parent, name }, &[])
    }

    fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        let name = name.to_vec();
        self.done(Op::RmDir { parent, name }, &[])
    }

    fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        let op = Op::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
        };
        self.done(op, &[])
    }

    fn setattr(&self, handle: Handle, set: &SetAttrs) -> Result<Attr> {
        match self.request(Op::SetAttr { handle, set: *set })? {
            (Reply::Attr(a), d) if d.is_empty() => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    fn write(&self, handle: Handle, offset: u64, data: &[u8], append: bool) -> Result<WriteReply> {
        if data.len() > MAX_WRITE_LEN as usize {
            return Err(OriginError::Fs(WireError::Invalid));
        }
        let op = Op::Write {
            handle,
            offset,
            append,
        };
        match self.request_with_data(op, data)? {
            (
                Reply::Written {
                    len,
                    offset,
                    pre_version,
                    attr,
                },
                d,
            ) if d.is_empty() && len as usize <= data.len() => Ok(WriteReply {
                written: len,
                offset,
                pre_version,
                attr,
            }),
            other => Err(unexpected(&other)),
        }
    }

    fn fallocate(&self, handle: Handle, offset: u64, length: u64, mode: u32) -> Result<Attr> {
        let op = Op::Fallocate {
            handle,
            offset,
            length,
            mode,
        };
        match self.request(op)? {
            (Reply::Attr(a), d) if d.is_empty() => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    fn fsync(&self, handle: Handle, datasync: bool) -> Result<()> {
        self.done(Op::Fsync { handle, datasync }, &[])
    }

    fn publishes_on_close(&self) -> bool {
        self.state.lock().publishes_on_close
    }

    fn lists_trees(&self) -> bool {
        self.state.lock().version >= 5
    }

    fn read_tree(&self, dir: Handle, dir_id: u64, max_entries: u32) -> Result<Vec<TreeDir>> {
        if !self.lists_trees() {
            return crate::tree::walk(self, dir, dir_id, max_entries);
        }
        match self.request(Op::ReadTree { dir, max_entries })? {
            (Reply::Tree { dirs }, d) if d.is_empty() => {
                validate::tree_shape(&dirs, dir_id)?;
                Ok(dirs)
            }
            other => Err(unexpected(&other)),
        }
    }

    fn flush(&self, handle: Handle) -> Result<Option<(u64, Attr)>> {
        if !self.publishes_on_close() {
            return Ok(None);
        }
        match self.request(Op::Flush { handle })? {
            (Reply::Done, _) => Ok(None),
            (
                Reply::Written {
                    pre_version, attr, ..
                },
                _,
            ) => Ok(Some((pre_version, attr))),
            other => Err(unexpected(&other)),
        }
    }

    fn getxattr(&self, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        self.xattr(Op::GetXattr {
            handle,
            name: name.to_vec(),
        })
    }

    fn listxattr(&self, handle: Handle) -> Result<Vec<u8>> {
        self.xattr(Op::ListXattr { handle })
    }

    fn setxattr(&self, handle: Handle, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        if value.len() > MAX_WRITE_LEN as usize {
            return Err(OriginError::Fs(WireError::TooBig));
        }
        let op = Op::SetXattr {
            handle,
            name: name.to_vec(),
            flags,
        };
        self.done(op, value)
    }

    fn removexattr(&self, handle: Handle, name: &[u8]) -> Result<()> {
        let name = name.to_vec();
        self.done(Op::RemoveXattr { handle, name }, &[])
    }
}

impl DirectReads for RemoteOrigin {
    fn read_direct(
        &self,
        handle: Handle,
        offset: u64,
        len: u32,
        dst: &mut ReadSlot,
    ) -> Result<u32> {
        let conn = self.conn()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let op = Op::Read {
            handle,
            offset,
            len,
        };
        let expect = validate::Expect::of(&op, 0);
        let asked = len.min(dst.capacity() as u32);
        let answer = conn.call_direct(id, op, asked, dst, self.opts.request_timeout)?;
        if dst.answered() {
            // Filled and answered by the reader thread, which took it only for a `Data`
            // reply whose data section matched its length, within what was asked.
            return match answer {
                (Reply::Data { len, .. }, _) => Ok(len),
                (other, _) => Err(unexpected(&(other, Vec::new()))),
            };
        }
        match validate::answer(&expect, answer)? {
            // The data came the ordinary way (a destination smaller than the reply, for
            // one): copied here.
            (Reply::Data { len, .. }, data) => dst.answer_with(&data).map(|()| len),
            other => Err(unexpected(&other)),
        }
    }
}

/// The error for a reply of the wrong kind (or with a stray data section).
fn unexpected((reply, data): &Answer) -> OriginError {
    OriginError::Protocol(format!(
        "unexpected {} reply with {} data bytes",
        validate::kind_name(reply),
        data.len()
    ))
}

#[cfg(test)]
mod tests;
