// Over 800 lines: the ring's wire format, its collectives and its failure diagnosis, which all read the same frames.
//! The CPU backend (the role of PyTorch's gloo): the ranks form a ring of TCP
//! connections, each sending to the next and receiving from the previous, and
//! every collective is a ring algorithm over host buffers.
//!
//! - all-reduce: reduce-scatter then all-gather, each `world - 1` steps of one
//!   chunk, so each rank sends and receives `2 (world - 1) / world` of the tensor
//!   whatever the world size;
//! - broadcast: the root's values travel around the ring in pieces, each rank
//!   forwarding a piece while the next arrives;
//! - all-gather and reduce-scatter: the two halves of the all-reduce.
//!
//! Every collective starts with a header (its sequence number, kind, dtype,
//! device and shape) sent to the next rank and compared with the previous rank's:
//! ranks that disagree fail with both calls named, instead of exchanging bytes that
//! do not match. A rank that exits closes its sockets, so its neighbours fail at
//! once, naming it, and close theirs: the failure travels around the ring, and
//! every rank returns an error instead of waiting.

use super::store::{io_err, Store};
use super::ReduceOp;
use crate::dtype::CpuData;
use crate::error::{Error, Result};
use half::{bf16, f16};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bytes a broadcast forwards at a time.
const PIECE: usize = 1 << 20;
const HELLO: u32 = 0x656d_6272; // "embr"
/// The length word of a frame that carries, instead of data, why the sender
/// stopped: the failure travels around the ring with its first cause.
const POISON: u64 = u64::MAX;

/// What a collective is called with, as the ranks compare it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Call {
    pub(crate) seq: u64,
    pub(crate) op: &'static str,
    pub(crate) reduce: Option<ReduceOp>,
    pub(crate) root: Option<usize>,
    pub(crate) dtype: crate::dtype::DType,
    pub(crate) device: &'static str,
    pub(crate) shape: Vec<usize>,
    /// The NCCL communicator the call goes through (its index among this rank's,
    /// one past them for a new one).
    pub(crate) comm: Option<usize>,
}

const OPS: [&str; 5] = [
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "barrier",
];
const DEVICES: [&str; 2] = ["cpu", "cuda"];
const DTYPES: [crate::dtype::DType; 7] = [
    crate::dtype::DType::Bool,
    crate::dtype::DType::U8,
    crate::dtype::DType::I64,
    crate::dtype::DType::F16,
    crate::dtype::DType::BF16,
    crate::dtype::DType::F32,
    crate::dtype::DType::F64,
];

impl Call {
    fn encode(&self) -> Vec<u8> {
        let code = |list: &[&str], x: &str| list.iter().position(|o| *o == x).unwrap_or(255) as u8;
        let mut v = Vec::with_capacity(32 + 8 * self.shape.len());
        v.extend(self.seq.to_le_bytes());
        v.push(code(&OPS, self.op));
        v.push(self.reduce.map_or(255, |r| r as u8));
        v.extend(self.root.map_or(u64::MAX, |r| r as u64).to_le_bytes());
        v.push(DTYPES.iter().position(|d| *d == self.dtype).unwrap_or(255) as u8);
        v.push(code(&DEVICES, self.device));
        v.extend((self.shape.len() as u32).to_le_bytes());
        for d in &self.shape {
            v.extend((*d as u64).to_le_bytes());
        }
        v.extend(self.comm.map_or(u64::MAX, |c| c as u64).to_le_bytes());
        v
    }

    fn decode(r: &mut impl Read) -> std::io::Result<Call> {
        let mut fixed = [0u8; 24];
        r.read_exact(&mut fixed)?;
        let u64_at = |i: usize| u64::from_le_bytes(fixed[i..i + 8].try_into().unwrap());
        let ndim = u32::from_le_bytes(fixed[20..24].try_into().unwrap()) as usize;
        if ndim > 64 {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "a corrupt header",
            ));
        }
        let mut dims = vec![0u8; 8 * ndim];
        r.read_exact(&mut dims)?;
        let mut comm = [0u8; 8];
        r.read_exact(&mut comm)?;
        let comm = u64::from_le_bytes(comm);
        let bad = || std::io::Error::new(ErrorKind::InvalidData, "a corrupt header");
        Ok(Call {
            seq: u64_at(0),
            op: OPS.get(fixed[8] as usize).ok_or_else(bad)?,
            reduce: ReduceOp::ALL.get(fixed[9] as usize).copied(),
            root: (u64_at(10) != u64::MAX).then(|| u64_at(10) as usize),
            dtype: *DTYPES.get(fixed[18] as usize).ok_or_else(bad)?,
            device: DEVICES.get(fixed[19] as usize).ok_or_else(bad)?,
            shape: dims
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
                .collect(),
            comm: (comm != u64::MAX).then_some(comm as usize),
        })
    }

    /// The size of the largest data frame the collective sends over `world` ranks.
    fn largest_frame(&self, world: usize) -> usize {
        let bytes = self.shape.iter().product::<usize>() * self.dtype.size_in_bytes();
        match self.op {
            "all_reduce" | "reduce_scatter" | "barrier" => bytes.div_ceil(world) + 8,
            "broadcast" => bytes.min(PIECE),
            _ => bytes,
        }
    }

    /// `all_reduce(sum) of float32 [3, 4] on cpu` (collective #5)
    fn describe(&self) -> String {
        let mut s = self.op.to_string();
        if let Some(r) = self.reduce {
            s += &format!("({})", r.name());
        }
        if let Some(r) = self.root {
            s += &format!("(src={r})");
        }
        let comm = self
            .comm
            .map_or(String::new(), |c| format!(", NCCL communicator #{c}"));
        format!(
            "{s} of {} {:?} on {} (collective #{}{comm})",
            self.dtype, self.shape, self.device, self.seq
        )
    }
}

/// The address the other ranks reach this one at: the one this host reached the
/// store from, unless that is a loopback address and the job spans machines; then
/// the address of the interface of the default route (no packet is sent to find
/// it), if there is one.
fn advertised(ip: std::net::IpAddr, spans_machines: bool) -> std::net::IpAddr {
    if !(spans_machines && ip.is_loopback()) {
        return ip;
    }
    let probe = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
        .and_then(|s| s.local_addr());
    match probe {
        Ok(a) if !a.ip().is_loopback() && !a.ip().is_unspecified() => a.ip(),
        _ => ip,
    }
}

/// What a frame's length word announces.
enum Frame {
    /// That many bytes of data follow.
    Data(u64),
    /// The sender stopped, for this reason (read).
    Poison(String),
}

/// Reads a frame's length word, and a poison frame's message.
fn read_frame_start(mut r: impl Read) -> std::io::Result<Frame> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len != POISON {
        return Ok(Frame::Data(len));
    }
    let mut n = [0u8; 4];
    r.read_exact(&mut n)?;
    let mut why = vec![0u8; (u32::from_le_bytes(n) as usize).min(1 << 16)];
    r.read_exact(&mut why)?;
    Ok(Frame::Poison(String::from_utf8_lossy(&why).into_owned()))
}

/// A poison frame: why this rank stops, for the next one.
pub(crate) fn poison_frame(why: &str) -> Vec<u8> {
    let mut frame = POISON.to_le_bytes().to_vec();
    frame.extend((why.len() as u32).to_le_bytes());
    frame.extend(why.as_bytes());
    frame
}

/// The ring's two connections (none for a world of one), and the failure that
/// broke it, if one did.
pub(crate) struct Ring {
    rank: usize,
    world: usize,
    next: Option<TcpStream>,
    prev: Option<TcpStream>,
    timeout: Duration,
    broken: Option<String>,
}

impl Ring {
    /// Joins the ring: listens for the previous rank, publishes the address in the
    /// store, connects to the next rank, and accepts the previous one.
    pub(crate) fn connect(
        store: &Store,
        prefix: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
        spans_machines: bool,
    ) -> Result<Ring> {
        let mut ring = Ring {
            rank,
            world,
            next: None,
            prev: None,
            timeout,
            broken: None,
        };
        if world == 1 {
            return Ok(ring);
        }
        let op = "init_process_group";
        let ip = advertised(store.local_ip()?, spans_machines);
        let any: std::net::IpAddr = match ip {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
        };
        let listener = TcpListener::bind(SocketAddr::new(any, 0)).map_err(|e| io_err(op, e))?;
        let port = listener.local_addr().map_err(|e| io_err(op, e))?.port();
        let me = SocketAddr::new(ip, port);
        store.set(&format!("{prefix}/ring/{rank}"), me.to_string().as_bytes())?;
        let next = (rank + 1) % world;
        let addr = store.get(&format!("{prefix}/ring/{next}"), || {
            format!("rank {next} to join (world size {world}): it has not started, or failed before joining")
        })?;
        let addr: SocketAddr = String::from_utf8_lossy(&addr)
            .parse()
            .map_err(|_| Error::distributed(op, format!("rank {next} published a bad address")))?;
        let until = Instant::now() + timeout;
        let mut out = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(c) => break c,
                Err(e) if Instant::now() >= until => {
                    return Err(Error::distributed(
                        op,
                        format!("could not connect to rank {next} at {addr}: {e}"),
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut hello = HELLO.to_le_bytes().to_vec();
        hello.extend((rank as u32).to_le_bytes());
        hello.extend((world as u32).to_le_bytes());
        out.write_all(&hello).map_err(|e| io_err(op, e))?;
        listener.set_nonblocking(true).map_err(|e| io_err(op, e))?;
        let prev = (rank + world - 1) % world;
        let mut inc = loop {
            match listener.accept() {
                Ok((c, _)) => {
                    c.set_nonblocking(false).map_err(|e| io_err(op, e))?;
                    break c;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= until {
                        return Err(Error::distributed(
                            op,
                            format!(
                                "rank {prev} did not connect within {}s",
                                timeout.as_secs_f64()
                            ),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io_err(op, e)),
            }
        };
        inc.set_read_timeout(Some(timeout))
            .map_err(|e| io_err(op, e))?;
        let mut got = [0u8; 12];
        inc.read_exact(&mut got).map_err(|e| io_err(op, e))?;
        let word = |i: usize| u32::from_le_bytes(got[i..i + 4].try_into().unwrap());
        if word(0) != HELLO || word(4) as usize != prev || word(8) as usize != world {
            return Err(Error::distributed(
                op,
                format!(
                    "expected rank {prev} of {world} to connect, got a peer calling itself rank {} of {}",
                    word(4),
                    word(8)
                ),
            ));
        }
        for s in [&out, &inc] {
            s.set_nodelay(true).map_err(|e| io_err(op, e))?;
            s.set_read_timeout(Some(timeout))
                .map_err(|e| io_err(op, e))?;
            s.set_write_timeout(Some(timeout))
                .map_err(|e| io_err(op, e))?;
        }
        ring.next = Some(out);
        ring.prev = Some(inc);
        Ok(ring)
    }

    /// A ring that is not connected (a world of one, or a placeholder): every
    /// collective over more than one rank fails.
    pub(crate) fn unconnected(rank: usize, world: usize) -> Ring {
        Ring {
            rank,
            world,
            next: None,
            prev: None,
            timeout: Duration::from_secs(1),
            broken: (world > 1).then(|| "the ring is not connected".to_string()),
        }
    }

    /// Compares this rank's call with the others' (the header exchange alone).
    pub(crate) fn agree(&mut self, call: &Call) -> Result<()> {
        self.run_with(call, true, |_| Ok(()))
    }

    fn prev_rank(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    fn next_rank(&self) -> usize {
        (self.rank + 1) % self.world
    }

    /// Runs one collective: the header exchange, then `body` with the link to the
    /// neighbours. A failure breaks the ring (later calls fail at once) and closes
    /// the sockets, so that the neighbours notice.
    fn run(
        &mut self,
        call: &Call,
        body: impl FnOnce(&mut Link) -> std::result::Result<(), Fault>,
    ) -> Result<()> {
        let direct = call.largest_frame(self.world) <= DIRECT;
        self.run_with(call, direct, body)
    }

    fn run_with(
        &mut self,
        call: &Call,
        direct: bool,
        body: impl FnOnce(&mut Link) -> std::result::Result<(), Fault>,
    ) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::distributed(
                call.op,
                format!("the process group is broken since an earlier failure: {why}"),
            ));
        }
        if self.world == 1 {
            return Ok(());
        }
        let (rank, prev, next) = (self.rank, self.prev_rank(), self.next_rank());
        let timeout = self.timeout;
        let (Some(out), Some(inc)) = (&self.next, &self.prev) else {
            unreachable!("a ring of more than one rank has both connections")
        };
        // the header goes out with the first data, and the previous rank's is
        // checked before its first data is read: no round trip of its own
        let run_body = move |out: Out| {
            let mut link = Link {
                out,
                inc,
                expect: Some(call),
            };
            link.send(&call.encode())
                .and_then(|()| body(&mut link))
                .and_then(|()| link.check_header())
        };
        let outcome = if direct {
            // small: each frame fits in the connection's buffers, so writing it
            // from this thread cannot wait on the next rank (no thread, no handoff)
            run_body(Out::Direct(out))
        } else {
            // a thread writes, so that a rank sending a large chunk to the next one
            // is reading the previous one's at the same time
            std::thread::scope(|s| {
                let (tx, rx) = mpsc::channel::<Vec<u8>>();
                let mut w: &TcpStream = out;
                let writer = s.spawn(move || -> std::io::Result<()> {
                    for m in rx {
                        w.write_all(&m)?;
                    }
                    Ok(())
                });
                let res = run_body(Out::Thread(tx));
                if res.is_err() {
                    // the writer may be blocked on a next rank that stopped reading
                    // (it failed too): closing the sending side releases it
                    let _ = out.shutdown(Shutdown::Write);
                }
                let wrote = writer
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the sending thread panicked")));
                match (res, wrote) {
                    (Err(f), _) => Err(f),
                    (Ok(()), Err(e)) => Err(Fault::Write(e)),
                    (Ok(()), Ok(())) => Ok(()),
                }
            })
        };
        let Err(fault) = outcome else { return Ok(()) };
        let t = timeout.as_secs_f64();
        let poisoned = matches!(fault, Fault::Poison(_));
        let mut poisoned_by_prev = false;
        let msg = match fault {
            Fault::Poison(why) => why,
            Fault::Protocol(what) => format!(
                "rank {prev} sent {what} in {}: the ranks are out of step",
                call.describe()
            ),
            Fault::Mismatch(theirs) => format!(
                "the ranks disagree: rank {prev} called {} while rank {rank} called {}",
                theirs.describe(),
                call.describe()
            ),
            Fault::Read(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => format!(
                "rank {prev} sent nothing for {t}s (the timeout) in {}: it is stuck, or waits in another collective",
                call.describe()
            ),
            Fault::Read(e) => format!(
                "lost rank {prev} in {}: its connection closed ({e}); the process exited or failed",
                call.describe()
            ),
            Fault::Write(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => format!(
                "rank {next} took nothing for {t}s (the timeout) in {}: it is stuck, or waits in another collective",
                call.describe()
            ),
            // the next rank's connection closed: it may be the one lost, or it
            // stopped because another was (its news goes forward, to its own next
            // rank); what the previous rank says settles it
            Fault::Write(e) => match self.diagnose(call) {
                Some((why, true)) => {
                    poisoned_by_prev = true;
                    why
                }
                Some((why, false)) => why,
                None => format!(
                    "lost rank {next} in {}: its connection closed ({e}); the process exited or failed",
                    call.describe()
                ),
            },
        };
        let poisoned = poisoned || poisoned_by_prev;
        let msg = if poisoned {
            msg
        } else {
            format!("{msg} (seen by rank {rank})")
        };
        self.abort(&msg);
        Err(Error::distributed(call.op, msg))
    }

    /// Second handles on the two connections, to close them from another thread
    /// while a collective waits on them.
    pub(crate) fn handles(&self) -> Vec<TcpStream> {
        [&self.next, &self.prev]
            .into_iter()
            .flatten()
            .filter_map(|s| s.try_clone().ok())
            .collect()
    }

    /// After a write to the next rank failed: the previous rank's news, read for up
    /// to a second: its poison frame (`true`: the message as it came), or the end
    /// of its connection. `None` when it sends data or nothing.
    fn diagnose(&self, call: &Call) -> Option<(String, bool)> {
        let mut inc = self.prev.as_ref()?;
        let until = Instant::now() + Duration::from_secs(1);
        // frames of data the previous rank sent before it learnt of the failure
        // are skipped
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            inc.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            let got = read_frame_start(&mut inc).and_then(|f| match f {
                Frame::Poison(why) => Ok(Some(why)),
                Frame::Data(len) => {
                    std::io::copy(&mut inc.take(len), &mut std::io::sink())?;
                    Ok(None)
                }
            });
            match got {
                Ok(Some(why)) => return Some((why, true)),
                Ok(None) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset) => {
                    return Some((
                        format!(
                            "lost rank {} in {}: its connection closed ({e}); the process exited or failed",
                            self.prev_rank(),
                            call.describe()
                        ),
                        false,
                    ))
                }
                Err(_) => return None,
            }
        }
    }

    /// Breaks the ring: later calls fail with `why`, and the neighbours see the
    /// connections close.
    pub(crate) fn abort(&mut self, why: &str) {
        if self.broken.is_none() {
            self.broken = Some(why.to_string());
        }
        if let Some(mut out) = self.next.as_ref() {
            // best effort: the next rank learns the first cause, not only that this
            // rank stopped
            let _ = out.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = out.write_all(&poison_frame(why));
        }
        for s in [&self.next, &self.prev].into_iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Combines `buf` over the ranks in place.
    pub(crate) fn all_reduce(
        &mut self,
        call: &Call,
        buf: &mut CpuData,
        op: ReduceOp,
    ) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        on_elems!(buf, op, |v, red| {
            self.run(call, |link| {
                let n = v.len();
                let bounds = |c: usize| (c * n / world, (c + 1) * n / world);
                reduce_scatter_phase(link, v, rank, world, &bounds, red)?;
                all_gather_phase(link, v, rank, world, &bounds)
            })
        })?;
        if op == ReduceOp::Avg {
            divide(buf, world);
        }
        Ok(())
    }

    /// Gives every rank the root's `buf`.
    pub(crate) fn broadcast(&mut self, call: &Call, buf: &mut CpuData, root: usize) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        let last = (root + world - 1) % world;
        on_elems!(buf, ReduceOp::Sum, |v, _op| {
            self.run(call, |link| {
                let elem = v.first().map_or(1, std::mem::size_of_val);
                let piece = (PIECE / elem).max(1);
                for lo in (0..v.len()).step_by(piece) {
                    let hi = (lo + piece).min(v.len());
                    let part = &mut v[lo..hi];
                    if rank != root {
                        link.recv(part)?;
                    }
                    if rank != last {
                        link.send(bytemuck::cast_slice(part))?;
                    }
                }
                Ok(())
            })
        })
    }

    /// `buf` holds `world` equal chunks, this rank's at chunk `rank`: fills the
    /// others with the other ranks' chunks.
    pub(crate) fn all_gather(&mut self, call: &Call, buf: &mut CpuData) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        on_elems!(buf, ReduceOp::Sum, |v, _op| {
            self.run(call, |link| {
                let m = v.len() / world;
                all_gather_phase(link, v, rank, world, &|c| (c * m, (c + 1) * m))
            })
        })
    }

    /// `buf` holds `world` equal chunks: leaves chunk `rank` combined over the
    /// ranks (the other chunks hold partial results).
    pub(crate) fn reduce_scatter(
        &mut self,
        call: &Call,
        buf: &mut CpuData,
        op: ReduceOp,
    ) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        on_elems!(buf, op, |v, red| {
            self.run(call, |link| {
                let m = v.len() / world;
                reduce_scatter_phase(link, v, rank, world, &|c| (c * m, (c + 1) * m), red)
            })
        })?;
        if op == ReduceOp::Avg {
            divide(buf, world);
        }
        Ok(())
    }

    /// Waits until every rank has called it.
    pub(crate) fn barrier(&mut self, call: &Call) -> Result<()> {
        let mut token = CpuData::U8(vec![0]);
        self.all_reduce(call, &mut token, ReduceOp::Max)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        for s in [&self.next, &self.prev].into_iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

enum Fault {
    Read(std::io::Error),
    Write(std::io::Error),
    Mismatch(Call),
    /// The previous rank stopped, for this reason.
    Poison(String),
    /// A frame of the wrong size.
    Protocol(String),
}

/// What a collective's body sees: a queue to the thread that writes to the next
/// rank, and the connection from the previous one.
/// Where a link's frames go: to the thread that writes them, or straight to the
/// socket.
enum Out<'a> {
    Thread(mpsc::Sender<Vec<u8>>),
    Direct(&'a TcpStream),
}

/// Collectives whose frames are at most this many bytes write from the calling
/// thread. A frame then fits in the connection's socket buffers (16 KiB of send
/// buffer and 128 KiB of receive buffer at least, by Linux's defaults), so a write
/// waits for the next rank only when it lags several frames behind, and ranks
/// cannot all wait on each other's writes around the ring.
const DIRECT: usize = 32 << 10;

struct Link<'a> {
    out: Out<'a>,
    inc: &'a TcpStream,
    /// This rank's call, until the previous rank's header has been compared with it.
    expect: Option<&'a Call>,
}

impl Link<'_> {
    /// Queues one frame: the length, then `bytes`.
    fn send(&mut self, bytes: &[u8]) -> std::result::Result<(), Fault> {
        let mut frame = Vec::with_capacity(8 + bytes.len());
        frame.extend((bytes.len() as u64).to_le_bytes());
        frame.extend_from_slice(bytes);
        match &mut self.out {
            Out::Thread(tx) => tx.send(frame).map_err(|_| {
                Fault::Write(std::io::Error::new(
                    ErrorKind::BrokenPipe,
                    "the sending thread stopped",
                ))
            }),
            Out::Direct(w) => w.write_all(&frame).map_err(Fault::Write),
        }
    }

    /// The length word of the next frame; a poison frame is the sender's failure.
    fn frame_len(&mut self) -> std::result::Result<usize, Fault> {
        match read_frame_start(&mut self.inc).map_err(Fault::Read)? {
            Frame::Data(len) => {
                usize::try_from(len).map_err(|_| Fault::Protocol(format!("a frame of {len} bytes")))
            }
            Frame::Poison(why) => Err(Fault::Poison(why)),
        }
    }

    /// Reads the previous rank's header, if not done yet, and compares it with
    /// this rank's call.
    fn check_header(&mut self) -> std::result::Result<(), Fault> {
        let Some(mine) = self.expect.take() else {
            return Ok(());
        };
        let theirs = self.recv_header()?;
        if theirs != *mine {
            return Err(Fault::Mismatch(theirs));
        }
        Ok(())
    }

    fn recv<T: bytemuck::Pod>(&mut self, into: &mut [T]) -> std::result::Result<(), Fault> {
        self.check_header()?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(into);
        let len = self.frame_len()?;
        if len != bytes.len() {
            return Err(Fault::Protocol(format!(
                "{len} bytes where {} were due",
                bytes.len()
            )));
        }
        self.inc.read_exact(bytes).map_err(Fault::Read)
    }

    fn recv_header(&mut self) -> std::result::Result<Call, Fault> {
        let len = self.frame_len()?;
        let mut bytes = vec![0u8; len.min(1 << 16)];
        self.inc.read_exact(&mut bytes).map_err(Fault::Read)?;
        Call::decode(&mut bytes.as_slice())
            .map_err(|_| Fault::Protocol("a header that does not parse".into()))
    }
}

fn reduce_scatter_phase<T: Elem>(
    link: &mut Link,
    v: &mut [T],
    rank: usize,
    world: usize,
    bounds: &dyn Fn(usize) -> (usize, usize),
    op: ReduceOp,
) -> std::result::Result<(), Fault> {
    let mut tmp: Vec<T> = Vec::new();
    for s in 0..world - 1 {
        let (a, b) = bounds((rank + 2 * world - s - 1) % world);
        link.send(bytemuck::cast_slice(&v[a..b]))?;
        let (a, b) = bounds((rank + 2 * world - s - 2) % world);
        tmp.resize(b - a, T::zeroed());
        link.recv(&mut tmp)?;
        for (x, y) in v[a..b].iter_mut().zip(&tmp) {
            *x = T::combine(*x, *y, op);
        }
    }
    Ok(())
}

fn all_gather_phase<T: Elem>(
    link: &mut Link,
    v: &mut [T],
    rank: usize,
    world: usize,
    bounds: &dyn Fn(usize) -> (usize, usize),
) -> std::result::Result<(), Fault> {
    for s in 0..world - 1 {
        let (a, b) = bounds((rank + world - s) % world);
        link.send(bytemuck::cast_slice(&v[a..b]))?;
        let (a, b) = bounds((rank + 2 * world - s - 1) % world);
        link.recv(&mut v[a..b])?;
    }
    Ok(())
}

/// An element the ring combines.
trait Elem: bytemuck::Pod + Send {
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
}

macro_rules! float_elem {
    ($t:ty, $to:expr, $from:expr) => {
        impl Elem for $t {
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                let (x, y) = ($to(a), $to(b));
                $from(match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    ReduceOp::Product => x * y,
                    // NaN wins, as in torch.maximum
                    ReduceOp::Max if x.is_nan() || y.is_nan() => x + y,
                    ReduceOp::Min if x.is_nan() || y.is_nan() => x + y,
                    ReduceOp::Max => x.max(y),
                    ReduceOp::Min => x.min(y),
                })
            }
        }
    };
}
float_elem!(f32, |x| x, |x| x);
float_elem!(f64, |x| x, |x| x);
float_elem!(f16, f16::to_f32, f16::from_f32);
float_elem!(bf16, bf16::to_f32, bf16::from_f32);

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Product => a.wrapping_mul(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                }
            }
        }
    };
}
int_elem!(i64);
int_elem!(u8);

/// Runs `$body` with `$v` bound to the typed elements of `$buf` and `$op` to the
/// reduction for them (bool as bytes, where sum and max are `or`, product and min
/// are `and`).
macro_rules! on_elems {
    ($buf:expr, $op0:expr, |$v:ident, $op:ident| $body:expr) => {{
        let $op = $op0;
        match $buf {
            CpuData::Bool(b) => {
                let mut bytes: Vec<u8> = b.iter().map(|x| *x as u8).collect();
                let $op = match $op {
                    ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Max => ReduceOp::Max,
                    ReduceOp::Product | ReduceOp::Min => ReduceOp::Min,
                };
                let $v: &mut [u8] = &mut bytes;
                let r = $body;
                for (x, y) in b.iter_mut().zip(bytes) {
                    *x = y != 0;
                }
                r
            }
            CpuData::U8(b) => {
                let $v: &mut [u8] = b;
                $body
            }
            CpuData::I64(b) => {
                let $v: &mut [i64] = b;
                $body
            }
            CpuData::F16(b) => {
                let $v: &mut [f16] = b;
                $body
            }
            CpuData::BF16(b) => {
                let $v: &mut [bf16] = b;
                $body
            }
            CpuData::F32(b) => {
                let $v: &mut [f32] = b;
                $body
            }
            CpuData::F64(b) => {
                let $v: &mut [f64] = b;
                $body
            }
        }
    }};
}
use on_elems;

fn divide(buf: &mut CpuData, world: usize) {
    let w = world as f64;
    match buf {
        CpuData::F16(v) => v
            .iter_mut()
            .for_each(|x| *x = f16::from_f32(x.to_f32() / w as f32)),
        CpuData::BF16(v) => v
            .iter_mut()
            .for_each(|x| *x = bf16::from_f32(x.to_f32() / w as f32)),
        CpuData::F32(v) => v.iter_mut().for_each(|x| *x /= w as f32),
        CpuData::F64(v) => v.iter_mut().for_each(|x| *x /= w),
        // refused before the collective: avg needs a floating-point dtype
        CpuData::Bool(_) | CpuData::U8(_) | CpuData::I64(_) => {}
    }
}
