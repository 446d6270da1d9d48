//! The rendezvous store (PyTorch's `TCPStore`): a key-value server on rank 0 that
//! every rank reaches over TCP, to find each other before any tensor moves.
//!
//! A request is one byte of command, then length-prefixed key and value; the
//! answer is a length-prefixed value. `get` blocks until the key is set, up to the
//! store's timeout.
//!
//! The rendezvous ([`join`]): each rank claims its rank and checks its world size
//! against rank 0's, under keys of the group's generation, so that a group left
//! and joined again in the same process does not meet the keys of the one before.

use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const SET: u8 = 1;
const GET: u8 = 2;
const ADD: u8 = 3;
/// Registers the connection as rank `value`'s watch: when it closes without
/// [`BYE`], the rank is gone, and the server records the loss as the group's abort.
const WATCH: u8 = 4;
const BYE: u8 = 5;
/// The key of the first abort's reason, and the counter of aborts reported.
const ABORT: &str = "abort";
const ABORT_GEN: &str = "abort_gen";
/// The answer to a `get` that waited past the server's patience.
const MISSING: u32 = u32::MAX;

/// The server's keys, and a condition that wakes the `get`s waiting for one.
#[derive(Default)]
struct Keys {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
}

/// The server side: accepts clients on a thread of its own until dropped.
pub(crate) struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    keys: Arc<Keys>,
    /// The accepting thread, which owns the listener.
    accept: Option<std::thread::JoinHandle<()>>,
}

impl StoreServer {
    /// Listens on `host:port`. A port already in use is an error that says so.
    pub(crate) fn start(host: &str, port: u16, timeout: Duration) -> Result<StoreServer> {
        // every interface, as PyTorch's store listens: MASTER_ADDR may name this
        // host by an address of loopback (/etc/hosts maps the host name to
        // 127.0.1.1 on some systems) that the other machines reach another way
        let any: std::net::IpAddr = match resolve(host, port)? {
            SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
        };
        let listener = TcpListener::bind(SocketAddr::new(any, port)).map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::AddrInUse {
                format!("port {port} on {host} is in use (another job, or one that has not exited yet?): choose another MASTER_PORT")
            } else {
                format!("cannot listen on {host}:{port}: {e}")
            };
            Error::distributed("init_process_group", why)
        })?;
        let addr = SocketAddr::new(
            resolve(host, port)?.ip(),
            listener
                .local_addr()
                .map_err(|e| io_err("init_process_group", e))?
                .port(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let keys = Arc::new(Keys::default());
        let (flag, shared) = (stop.clone(), keys.clone());
        let accept = std::thread::Builder::new()
            .name("ember-store".into())
            .spawn(move || {
                let keys = shared;
                for conn in listener.incoming() {
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (keys, flag) = (keys.clone(), flag.clone());
                    let _ = std::thread::Builder::new()
                        .name("ember-store-client".into())
                        .spawn(move || serve(conn, &keys, &flag, timeout));
                }
            })
            .map_err(|e| io_err("init_process_group", e))?;
        Ok(StoreServer {
            addr,
            stop,
            keys,
            accept: Some(accept),
        })
    }

    /// The port it listens on (the one asked for, or the one chosen for port 0).
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// Stops the server: the `get`s waiting are woken, and every client's next request
/// finds its connection closed. When this returns, the port is free again (a
/// group joined right after, on the same port, can listen on it).
impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        {
            // under the lock, so that no `get` between its check of the flag and
            // its wait misses the wake-up
            let _map = self.keys.map.lock().unwrap_or_else(|p| p.into_inner());
            self.keys.changed.notify_all();
        }
        // wakes the accepting thread so that it sees the flag (on loopback, which
        // the listener, on every interface, also serves), and waits for it to
        // close the listener
        let ip: std::net::IpAddr = match self.addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        let woken = TcpStream::connect_timeout(
            &SocketAddr::new(ip, self.addr.port()),
            Duration::from_secs(2),
        );
        if let (Ok(_), Some(accept)) = (woken, self.accept.take()) {
            let _ = accept.join();
        }
    }
}

/// Adds `by` to the counter `key` (0 when unset) and returns its new value.
fn bump(map: &mut HashMap<Vec<u8>, Vec<u8>>, key: Vec<u8>, by: i64) -> i64 {
    let slot = map
        .entry(key)
        .or_insert_with(|| 0i64.to_le_bytes().to_vec());
    let now = i64::from_le_bytes(slot.as_slice().try_into().unwrap_or([0; 8])) + by;
    *slot = now.to_le_bytes().to_vec();
    now
}

/// Answers one client's requests until it disconnects or the server stops.
fn serve(mut conn: TcpStream, keys: &Keys, stop: &AtomicBool, timeout: Duration) {
    let _ = conn.set_nodelay(true);
    let (mut watched, mut bye): (Option<u64>, bool) = (None, false);
    loop {
        let mut cmd = [0u8; 1];
        if conn.read_exact(&mut cmd).is_err() {
            if let (Some(rank), false, false) = (watched, bye, stop.load(Ordering::SeqCst)) {
                let mut map = keys.map.lock().unwrap_or_else(|p| p.into_inner());
                map.entry(ABORT.as_bytes().to_vec()).or_insert_with(|| {
                    format!("lost rank {rank}: its process exited (its connection to the rendezvous store closed)").into_bytes()
                });
                bump(&mut map, ABORT_GEN.as_bytes().to_vec(), 1);
                drop(map);
                keys.changed.notify_all();
            }
            return;
        }
        let (Ok(key), Ok(value)) = (read_frame(&mut conn), read_frame(&mut conn)) else {
            return;
        };
        // a stopped server answers nothing more: the client sees its connection
        // close, as when rank 0 exits
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let answer = match cmd[0] {
            SET => {
                keys.map
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, value);
                keys.changed.notify_all();
                Some(Vec::new())
            }
            ADD => {
                let by = i64::from_le_bytes(value.try_into().unwrap_or([0; 8]));
                let mut map = keys.map.lock().unwrap_or_else(|p| p.into_inner());
                let now = bump(&mut map, key, by);
                drop(map);
                keys.changed.notify_all();
                Some(now.to_le_bytes().to_vec())
            }
            GET => {
                let until = Instant::now() + timeout;
                let mut map = keys.map.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(v) = map.get(&key) {
                        break Some(v.clone());
                    }
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let now = Instant::now();
                    if now >= until {
                        break None;
                    }
                    let wait = (until - now).min(Duration::from_millis(500));
                    map = keys
                        .changed
                        .wait_timeout(map, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            WATCH => {
                watched = Some(u64::from_le_bytes(value.try_into().unwrap_or([0; 8])));
                Some(Vec::new())
            }
            BYE => {
                bye = true;
                Some(Vec::new())
            }
            _ => return,
        };
        let sent = match answer {
            Some(v) => write_frame(&mut conn, &v),
            None => conn.write_all(&MISSING.to_le_bytes()),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// A client of the store.
pub(crate) struct Store {
    conn: Mutex<TcpStream>,
    addr: String,
    timeout: Duration,
    /// Set when a request found the connection broken (the server stopped, or
    /// its process exited).
    lost: AtomicBool,
}

impl Store {
    /// Connects to the store at `host:port`, retrying until `timeout` while the
    /// server is not up yet.
    pub(crate) fn connect(host: &str, port: u16, timeout: Duration) -> Result<Store> {
        Store::connect_by(host, port, timeout, Instant::now() + timeout)
    }

    /// [`connect`](Self::connect), retrying until `until` (the end of a
    /// rendezvous that began earlier).
    pub(crate) fn connect_by(
        host: &str,
        port: u16,
        timeout: Duration,
        until: Instant,
    ) -> Result<Store> {
        let addr = resolve(host, port)?;
        let conn = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(c) => break c,
                Err(e) => {
                    if Instant::now() >= until {
                        return Err(Error::distributed(
                            "init_process_group",
                            format!(
                                "could not reach the rendezvous store at {host}:{port} within {}s ({e}): is rank 0 running, and are MASTER_ADDR and MASTER_PORT the same for every rank?",
                                timeout.as_secs_f64()
                            ),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        let _ = conn.set_nodelay(true);
        // the server answers a `get` within its timeout; a little more here
        conn.set_read_timeout(Some(timeout + Duration::from_secs(5)))
            .map_err(|e| io_err("init_process_group", e))?;
        Ok(Store {
            conn: Mutex::new(conn),
            addr: format!("{host}:{port}"),
            timeout,
            lost: AtomicBool::new(false),
        })
    }

    /// Whether a request found the connection broken.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The address the store was reached at.
    pub(crate) fn local_ip(&self) -> Result<std::net::IpAddr> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.local_addr()
            .map(|a| a.ip())
            .map_err(|e| io_err("init_process_group", e))
    }

    fn request(&self, cmd: u8, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let lost = |e: std::io::Error| {
            self.lost.store(true, Ordering::SeqCst);
            Error::distributed(
                "store",
                format!(
                    "lost the rendezvous store at {} ({e}): rank 0 has exited",
                    self.addr
                ),
            )
        };
        let mut msg = vec![cmd];
        msg.extend((key.len() as u32).to_le_bytes());
        msg.extend(key.as_bytes());
        msg.extend((value.len() as u32).to_le_bytes());
        msg.extend(value);
        conn.write_all(&msg).map_err(lost)?;
        let mut len = [0u8; 4];
        conn.read_exact(&mut len).map_err(lost)?;
        let len = u32::from_le_bytes(len);
        if len == MISSING {
            return Ok(None);
        }
        let mut v = vec![0u8; len as usize];
        conn.read_exact(&mut v).map_err(lost)?;
        Ok(Some(v))
    }

    /// Sets `key` to `value`.
    pub(crate) fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.request(SET, key, value).map(|_| ())
    }

    /// The value of `key`, waiting for it to be set; after the timeout an error
    /// that `waiting_for` explains.
    pub(crate) fn get(&self, key: &str, waiting_for: impl FnOnce() -> String) -> Result<Vec<u8>> {
        self.request(GET, key, &[])?.ok_or_else(|| {
            Error::distributed(
                "store",
                format!(
                    "timed out after {}s waiting for {}",
                    self.timeout.as_secs_f64(),
                    waiting_for()
                ),
            )
        })
    }

    /// Makes this connection rank `rank`'s watch (see [`WATCH`]).
    pub(crate) fn watch(&self, rank: usize) -> Result<()> {
        self.request(WATCH, "", &(rank as u64).to_le_bytes())
            .map(|_| ())
    }

    /// Ends a watch: the rank leaves normally.
    pub(crate) fn bye(&self) -> Result<()> {
        self.request(BYE, "", &[]).map(|_| ())
    }

    /// Records `why` as the group's abort, unless one was recorded before.
    pub(crate) fn report_abort(&self, why: &str) -> Result<()> {
        self.report_abort_at("", why)
    }

    /// The group's abort, if a rank reported one or the store saw a rank go.
    pub(crate) fn aborted(&self) -> Result<Option<String>> {
        self.aborted_at("")
    }

    /// [`report_abort`](Self::report_abort) under the keys of `prefix` (a
    /// rendezvous's, which a rank of an earlier group must not see).
    pub(crate) fn report_abort_at(&self, prefix: &str, why: &str) -> Result<()> {
        if self.add(&format!("{prefix}{ABORT_GEN}"), 1)? == 1 {
            self.set(&format!("{prefix}{ABORT}"), why.as_bytes())?;
        }
        Ok(())
    }

    /// [`aborted`](Self::aborted) under the keys of `prefix`.
    pub(crate) fn aborted_at(&self, prefix: &str) -> Result<Option<String>> {
        if self.add(&format!("{prefix}{ABORT_GEN}"), 0)? == 0 {
            return Ok(None);
        }
        let why = self.get(&format!("{prefix}{ABORT}"), || {
            "the reason of the abort".into()
        })?;
        Ok(Some(String::from_utf8_lossy(&why).into_owned()))
    }

    /// Adds `by` to the counter `key` (0 when unset) and returns its new value.
    pub(crate) fn add(&self, key: &str, by: i64) -> Result<i64> {
        let v = self
            .request(ADD, key, &by.to_le_bytes())?
            .unwrap_or_default();
        Ok(i64::from_le_bytes(v.try_into().unwrap_or([0; 8])))
    }
}

fn read_frame(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let mut v = vec![0u8; u32::from_le_bytes(len) as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn write_frame(w: &mut impl Write, v: &[u8]) -> std::io::Result<()> {
    let mut msg = (v.len() as u32).to_le_bytes().to_vec();
    msg.extend(v);
    w.write_all(&msg)
}

/// `host:port` as a socket address (the first the name resolves to, IPv4 first).
pub(crate) fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| {
            Error::distributed(
                "init_process_group",
                format!("cannot resolve MASTER_ADDR {host:?}: {e}"),
            )
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| {
            Error::distributed(
                "init_process_group",
                format!("MASTER_ADDR {host:?} resolves to no address"),
            )
        })
}

pub(crate) fn io_err(op: &'static str, e: std::io::Error) -> Error {
    Error::distributed(op, e.to_string())
}

/// Connects to the store at `host:port` and joins the rendezvous of `prefix` as
/// rank `rank` of `world`, within `timeout`; the store, once every rank has
/// joined.
pub(super) fn join(
    host: &str,
    port: u16,
    prefix: &str,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<Store> {
    let until = Instant::now() + timeout;
    loop {
        let st = Store::connect_by(host, port, timeout, until)?;
        let mut reached = false;
        match rendezvous(&st, prefix, rank, world, timeout, until, &mut reached) {
            Ok(()) => return Ok(st),
            // the store of rank 0's previous group, closed as this rank came (a
            // group left and joined again): rank 0's next store comes up on the
            // same port
            Err(_) if st.is_lost() && !reached && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A rendezvous address (`MASTER_ADDR`, `MASTER_PORT`) and a rank.
pub(super) type JoinedAs = (String, u16, usize);

/// Per rendezvous address and rank, the number of groups this process has
/// joined and left there.
static GROUPS_LEFT: Mutex<BTreeMap<JoinedAs, u64>> = Mutex::new(BTreeMap::new());

/// A rendezvous completed at an address as a rank: counted as a group left when
/// dropped, with the group, or without it when a later step of making the group
/// failed (so that every rank of the job counts it, whatever happened next).
pub(super) struct Joined(pub(super) JoinedAs);

impl Drop for Joined {
    fn drop(&mut self) {
        *GROUPS_LEFT
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(self.0.clone())
            .or_default() += 1;
    }
}

/// The generation of the next group joined at `joined_as`: the prefix of its
/// keys in the store (the role of PyTorch's `default_pg/<n>/`). Every rank of a
/// job leaves and joins again as many times, so the ranks agree on it; and a rank
/// that joins again while the store of the group before is still up (rank 0 has
/// not left it yet) finds none of that group's keys.
pub(super) fn generation(joined_as: &JoinedAs) -> u64 {
    GROUPS_LEFT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(joined_as)
        .copied()
        .unwrap_or(0)
}

/// One rank's attempt at the rendezvous of `prefix`: claims the rank, checks
/// the world size against rank 0's, and waits until every rank has joined.
/// `reached` is set once rank 0's world size is read: a store lost before that
/// may be the one of rank 0's previous group, closing, and the caller tries again.
///
/// A failure (a rank claimed twice, a world size that differs from rank 0's, the
/// timeout) is reported through the store, so that the other ranks fail with it
/// at once instead of waiting out the timeout; rank 0, whose store the others
/// read it from, waits (a little) for them to leave before returning.
fn rendezvous(
    st: &Store,
    prefix: &str,
    rank: usize,
    world: usize,
    timeout: Duration,
    until: Instant,
    reached: &mut bool,
) -> Result<()> {
    let key = |k: &str| format!("{prefix}{k}");
    st.add(&key("arrived"), 1)?;
    let out = join_store(st, prefix, rank, world, timeout, until, reached);
    let Err(e) = &out else {
        return out;
    };
    if st.is_lost() {
        return out;
    }
    let why = match e {
        Error::Distributed { msg, .. } => msg.clone(),
        e => e.to_string(),
    };
    // (the first report is kept: a rank failing because another did repeats it)
    let _ = st.report_abort_at(prefix, &why);
    let _ = st.add(&key("left"), 1);
    if rank == 0 {
        let linger = Instant::now() + Duration::from_secs(2).min(timeout);
        while Instant::now() < linger {
            match (st.add(&key("left"), 0), st.add(&key("arrived"), 0)) {
                (Ok(left), Ok(arrived)) if left < arrived => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
    }
    out
}

/// The steps of [`rendezvous`].
fn join_store(
    st: &Store,
    prefix: &str,
    rank: usize,
    world: usize,
    timeout: Duration,
    until: Instant,
    reached: &mut bool,
) -> Result<()> {
    let op = "init_process_group";
    let key = |k: &str| format!("{prefix}{k}");
    if st.add(&key(&format!("claim/{rank}")), 1)? > 1 {
        return Err(Error::distributed(
            op,
            format!("rank {rank} joined twice: two workers were given RANK={rank}"),
        ));
    }
    if rank == 0 {
        st.set(&key("world"), &(world as u64).to_le_bytes())?;
    }
    let theirs = st.get(&key("world"), || "rank 0 to join".into())?;
    *reached = true;
    let theirs = u64::from_le_bytes(theirs.try_into().unwrap_or([0; 8])) as usize;
    if theirs != world {
        return Err(Error::distributed(
            op,
            format!("rank 0 has world size {theirs}, rank {rank} has {world}: every rank must be given the same WORLD_SIZE"),
        ));
    }
    st.add(&key(&format!("joined/{rank}")), 1)?;
    st.add(&key("joined"), 1)?;
    loop {
        let joined = st.add(&key("joined"), 0)? as usize;
        if joined >= world {
            return Ok(());
        }
        if let Some(why) = st.aborted_at(prefix)? {
            return Err(Error::distributed(op, why));
        }
        if Instant::now() >= until {
            let mut missing = Vec::new();
            for r in 0..world {
                if st.add(&key(&format!("joined/{r}")), 0)? == 0 {
                    missing.push(r.to_string());
                }
            }
            return Err(Error::distributed(
                op,
                format!(
                    "the rendezvous timed out after {}s: {joined} of {world} ranks joined (missing: rank {})",
                    timeout.as_secs_f64(),
                    missing.join(", ")
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_rank_that_goes_is_reported_and_one_that_leaves_is_not() {
        let t = Duration::from_secs(10);
        let server = StoreServer::start("127.0.0.1", 0, t).unwrap();
        let port = server.port();
        let other = Store::connect("127.0.0.1", port, t).unwrap();
        // leaves normally
        let a = Store::connect("127.0.0.1", port, t).unwrap();
        a.watch(1).unwrap();
        a.bye().unwrap();
        drop(a);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(other.aborted().unwrap(), None);
        // goes without a word
        let b = Store::connect("127.0.0.1", port, t).unwrap();
        b.watch(3).unwrap();
        drop(b);
        let until = Instant::now() + Duration::from_secs(5);
        let why = loop {
            if let Some(why) = other.aborted().unwrap() {
                break why;
            }
            assert!(Instant::now() < until, "the loss was not recorded");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(why.starts_with("lost rank 3"), "{why}");
        // the first cause stays
        other.report_abort("a later failure").unwrap();
        assert!(other.aborted().unwrap().unwrap().starts_with("lost rank 3"));
    }

    #[test]
    fn a_dropped_server_frees_its_port_and_closes_its_clients() {
        let t = Duration::from_secs(10);
        let server = StoreServer::start("127.0.0.1", 0, t).unwrap();
        let port = server.port();
        let idle = Store::connect("127.0.0.1", port, t).unwrap();
        let waiting = Store::connect("127.0.0.1", port, t).unwrap();
        let t0 = Instant::now();
        std::thread::scope(|s| {
            let w = s.spawn(|| waiting.get("never", || "a key never set".into()));
            std::thread::sleep(Duration::from_millis(100));
            drop(server);
            // the port is free as soon as the server is dropped
            let again = StoreServer::start("127.0.0.1", port, t).unwrap();
            assert_eq!(again.port(), port);
            let e = w.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("lost the rendezvous store"), "{e}");
        });
        assert!(waiting.is_lost());
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // an idle client of the old server finds its connection closed at its
        // next request
        assert!(!idle.is_lost());
        assert!(idle.add("k", 1).is_err());
        assert!(idle.is_lost());
    }
}
