//! The workers' mesh over TCP: each worker listens for its peers, and opens a connection
//! to a peer the first time it sends it something (one connection a direction: what a
//! worker sends a peer goes on its own connection, in order).
//!
//! A worker tells the master's node where its peers reach it in its hello; the master's
//! node tells every worker every rank's address (`Wire::PeerTable`) as ranks connect. A
//! peer connection is admitted as a master connection is: at most the handshake slots
//! unproven at once, a hello naming the job, the rank, the job's fingerprint and the
//! attempt; the secret's proof over a fresh challenge; the same fingerprint and attempt
//! as the acceptor's (refused otherwise, and logged once per kind in an interval). Both
//! ends send heartbeats; a connection that breaks, closes or goes silent for the
//! heartbeat timeout before the peer's goodbye is a lost peer, named with its address
//! and what the connection was doing, and handed to the worker (`PeerEvent::Lost`),
//! whose collective then fails with it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::admission::{Refusals, Unproven};
use super::conn::*;
use super::lane::{Lane, OwnWrite, Socket};
use super::wire::{self, Refusal, Wire};
use super::{lock, TcpSettings};
use crate::ids::{Attempt, Rank};
use crate::protocol::{PeerBody, PeerMessage};
use crate::transport::{Fingerprint, PeerEvent, PeerInbox, PeerLink, TransportError};
use reader::{End, Incoming, ReadSide, Window};

/// How the transport's I/O thread is reached from other threads.
#[derive(Clone)]
pub(super) struct Io {
    pub(super) handle: tokio::runtime::Handle,
    pub(super) tracker: TaskTracker,
    pub(super) stop: watch::Receiver<bool>,
}

/// This process's worker's connection to a peer, by the peer's rank.
enum Out {
    /// None yet.
    Idle,
    /// Open, or opening (in the attempt the mesh ran then): frames queue until it is.
    Open(Arc<Lane>),
    /// Lost, and why; or closed at the end of the peer's job.
    Gone(String),
}

/// A worker process's part of the mesh.
pub(super) struct Mesh {
    settings: Arc<TcpSettings>,
    fingerprint: Arc<Fingerprint>,
    /// The attempt this worker runs, as the master's node last welcomed it: a peer of
    /// another is refused.
    attempt: AtomicU32,
    /// Whether the master's node welcomed this worker yet.
    welcomed: AtomicBool,
    /// How many times the master's node welcomed this worker again (after the first): a
    /// connection to this worker that stood before the last is of no concern once lost.
    rejoins: AtomicU64,
    /// The mesh itself, for the tasks it starts.
    me: Weak<Mesh>,
    /// Where this worker listens for its peers.
    local: SocketAddr,
    listener: Mutex<Option<std::net::TcpListener>>,
    /// Every rank's peer address, as the master's node told it.
    table: watch::Sender<Vec<Option<String>>>,
    out: Mutex<Vec<Out>>,
    /// The connections to this worker that stand, by the peer's rank: this end's lane,
    /// which carries heartbeats and the goodbye.
    incoming: Mutex<Vec<Option<Weak<Lane>>>>,
    /// The readers of the connections to this worker that stand, by the peer's rank:
    /// what a compute waiting for pieces reads itself (`read_now`).
    readers: Mutex<Vec<Option<Arc<Incoming>>>>,
    /// When the worker's compute reads those connections itself: the I/O thread leaves
    /// them to it meanwhile.
    window: Arc<Window>,
    inbox: RwLock<Option<Arc<PeerInbox>>>,
    unproven: Arc<Mutex<Unproven>>,
    refusals: Mutex<Refusals>,
    io: Io,
}

impl Mesh {
    /// Binds this worker's listener for its peers: on the host the settings bind (loopback
    /// by default; any other needs a secret), on `peer_port` or a port of the system's.
    pub(super) fn bind(
        settings: &Arc<TcpSettings>,
        fingerprint: Arc<Fingerprint>,
        io: Io,
    ) -> Result<Arc<Mesh>, TransportError> {
        let ip = settings
            .bind
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |b| b.ip());
        let addr = SocketAddr::new(ip, settings.peer_port.unwrap_or(0));
        if !ip.is_loopback() && settings.secret.is_none() {
            return Err(TransportError::Insecure {
                addr: addr.to_string(),
            });
        }
        let failed = |e: std::io::Error| {
            TransportError::io(format!("cannot listen for peers on {addr}: {e}"), Some(e))
        };
        // (A master address that does not parse fails the transport elsewhere.)
        let master_port = settings.master_port().ok();
        let listener =
            listen_avoiding(addr, master_port, std::net::TcpListener::bind).map_err(failed)?;
        listener.set_nonblocking(true).map_err(failed)?;
        let local = listener.local_addr().map_err(failed)?;
        let world = settings.world_size;
        let (table, _) = watch::channel(vec![None; world]);
        Ok(Arc::new_cyclic(|me| Mesh {
            settings: Arc::clone(settings),
            fingerprint,
            attempt: AtomicU32::new(super::FIRST_ATTEMPT),
            welcomed: AtomicBool::new(false),
            rejoins: AtomicU64::new(0),
            me: Weak::clone(me),
            local,
            listener: Mutex::new(Some(listener)),
            table,
            out: Mutex::new((0..world).map(|_| Out::Idle).collect()),
            incoming: Mutex::new(vec![None; world]),
            readers: Mutex::new(vec![None; world]),
            window: Window::new(),
            inbox: RwLock::new(None),
            unproven: Arc::default(),
            refusals: Mutex::new(Refusals::new(world, Instant::now())),
            io,
        }))
    }

    /// Where peers reach this worker, said in its hello to the master: the listener's
    /// address, or — listening on every interface — the address this process reaches the
    /// master from (`local`, its connection's end), or the master's host for rank 0's own
    /// worker, which reaches its master over loopback.
    pub(super) fn advertised(&self, local: SocketAddr) -> String {
        let port = self.local.port();
        if !self.local.ip().is_unspecified() {
            return self.local.to_string();
        }
        if local.ip().is_loopback() {
            if let Some((host, _)) = self.settings.master_addr.rsplit_once(':') {
                return format!("{host}:{port}");
            }
        }
        SocketAddr::new(local.ip(), port).to_string()
    }

    /// The master's node welcomed this worker in `attempt` — at its start, again after the
    /// master was lost, or in a gang restart. Every connection this worker opened before is
    /// left, with a goodbye, even in the same attempt (a master started again without a
    /// newer checkpoint runs the attempt its workers ran, and starts them over): the next
    /// piece for its peer opens a connection of the new attempt (to the address the
    /// master's node says last, a process of the peer started again listening elsewhere),
    /// and what the old connection still meets — the loss of a peer that died with the
    /// old attempt, found a moment later — is no concern of the new attempt's worker.
    /// So are the connections peers made to this worker before (each peer leaves its own
    /// when welcomed again, and one that does not died): their losses are not said.
    /// Peers lost in an earlier attempt are tried again.
    pub(super) fn joined(&self, attempt: Attempt) {
        self.attempt.store(attempt, Ordering::Release);
        if self.welcomed.swap(true, Ordering::AcqRel) {
            self.rejoins.fetch_add(1, Ordering::AcqRel);
        }
        let bye = wire::encode(&Wire::<(), ()>::PeerBye, self.settings.max_frame).ok();
        for out in lock(&self.out).iter_mut() {
            if let (Out::Open(lane), Some(bye)) = (&*out, &bye) {
                let _ = lane.send(bye.clone());
            }
            *out = Out::Idle;
        }
    }

    fn attempt(&self) -> Attempt {
        self.attempt.load(Ordering::Acquire)
    }

    fn me(&self) -> Arc<Mesh> {
        self.me.upgrade().expect("a mesh in use is alive")
    }

    /// The master's node told where every rank's peers reach it.
    pub(super) fn learn(&self, addrs: Vec<Option<String>>) {
        let world = self.settings.world_size;
        self.table.send_modify(|table| {
            for (rank, addr) in addrs.into_iter().enumerate().take(world) {
                if addr.is_some() {
                    table[rank] = addr;
                }
            }
        });
    }

    /// Starts accepting peers' connections (once).
    pub(super) fn start(self: &Arc<Self>) {
        let Some(listener) = lock(&self.listener).take() else {
            return;
        };
        let span =
            tracing::warn_span!("peers", job = %self.settings.job_id, rank = self.settings.rank);
        let mesh = Arc::clone(self);
        let _guard = self.io.handle.enter();
        self.io.tracker.spawn(mesh.serve(listener).instrument(span));
    }

    /// Says goodbye on every connection this worker opened: its job ended, so a peer that
    /// sees it close loses nothing.
    pub(super) fn close(&self) {
        let Ok(bye) = wire::encode(&Wire::<(), ()>::PeerBye, self.settings.max_frame) else {
            return;
        };
        for out in lock(&self.out).iter() {
            if let Out::Open(lane) = out {
                let _ = lane.send(bye.clone());
            }
        }
        for lane in lock(&self.incoming).iter().flatten() {
            if let Some(lane) = lane.upgrade() {
                let _ = lane.send(bye.clone());
            }
        }
    }

    fn deliver(&self, event: PeerEvent) {
        let inbox = self.inbox.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(inbox) = inbox {
            inbox(event);
        }
    }

    /// The connection `lane` to `to`, opened in `attempt`, is lost (or, with `quietly`,
    /// closed at the end of its job). One left for a newer attempt's (`joined`) is
    /// nobody's concern any more.
    fn lose(&self, to: Rank, lane: &Weak<Lane>, attempt: Attempt, reason: String, quietly: bool) {
        {
            let mut out = lock(&self.out);
            let current =
                matches!(&out[to], Out::Open(open) if Weak::ptr_eq(lane, &Arc::downgrade(open)));
            if !current {
                return;
            }
            out[to] = Out::Gone(reason.clone());
        }
        if !quietly {
            say_lost(to, &reason);
            self.deliver(PeerEvent::Lost {
                rank: to,
                attempt,
                reason,
            });
        }
    }

    async fn serve(self: Arc<Self>, listener: std::net::TcpListener) {
        let stop = self.io.stop.clone();
        accept_each(
            listener,
            &self.unproven,
            &self.io.tracker,
            stop,
            "peers",
            |stream, from, id, token| Arc::clone(&self).accepted(stream, from, id, token),
        )
        .await;
    }

    /// A peer's connection: its handshake, then its pieces to this worker's inbox until
    /// its goodbye, a loss, or the transport's stop.
    async fn accepted(
        self: Arc<Self>,
        stream: TcpStream,
        from: SocketAddr,
        id: u64,
        dropped: CancellationToken,
    ) {
        let s = Arc::clone(&self.settings);
        let _ = stream.set_nodelay(true);
        let (reader, mut writer) = stream.into_split();
        let mut frames = Frames::new(reader);
        let mut stop = self.io.stop.clone();
        let shaken = tokio::select! {
            shaken = tokio::time::timeout(s.handshake_timeout, self.admit(&mut frames, &mut writer)) => match shaken {
                Ok(shaken) => shaken,
                Err(_) => Err((None, Refusal::Closed(format!("did not complete its handshake within {:?}", s.handshake_timeout)))),
            },
            _ = dropped.cancelled() => Err((None, Refusal::Closed("dropped in its handshake to make room for a newer connection".into()))),
            _ = stopped(&mut stop) => return,
        };
        lock(&self.unproven).leave(id);
        let claim = match shaken {
            Ok(claim) => claim,
            Err((rank, refusal)) => {
                {
                    let mut refusals = lock(&self.refusals);
                    refusals.note(
                        &from.to_string(),
                        rank,
                        refusal.kind(),
                        &refusal.to_string(),
                    );
                    refusals.flush(Instant::now());
                }
                if !matches!(refusal, Refusal::Closed(_)) {
                    if let Ok(frame) = wire::encode(
                        &Wire::<(), ()>::Refused { refusal },
                        wire::HANDSHAKE_MAX_FRAME,
                    ) {
                        let _ = tokio::time::timeout(
                            s.handshake_timeout,
                            write_frame(&mut writer, &frame),
                        )
                        .await;
                    }
                }
                return;
            }
        };
        let (rank, attempt, rejoins) = (claim.rank, claim.attempt, claim.rejoins);
        frames.allow(s.max_frame);
        let (half, buf, codec) = frames.into_parts();
        // The socket leaves the I/O driver: its reader watches it for what comes only
        // while the compute does not read it itself (`ReadSide`), and this end's lane
        // writes through a handle of its own, which the driver does not watch.
        let handles = half
            .reunite(writer)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|stream| stream.into_std())
            .and_then(|socket| Ok((socket.try_clone()?, socket.try_clone()?, socket)));
        let (socket, writer, watched) = match handles {
            Ok(handles) => handles,
            Err(e) => {
                tracing::warn!(peer = rank, error = %e, "cannot take a peer's connection off the I/O driver");
                return;
            }
        };
        let writer = Socket::Own(OwnWrite(writer));
        let mut side = ReadSide::new(watched);
        let reader = Arc::new(Incoming::new(
            rank,
            socket,
            buf,
            codec,
            Arc::clone(&self.window),
        ));
        lock(&self.readers)[rank] = Some(Arc::clone(&reader));
        // This end sends only heartbeats, and its goodbye.
        let (lane, mut queue) = Lane::new();
        lock(&self.incoming)[rank] = Some(Arc::downgrade(&lane));
        let (stop, heartbeat) = (self.io.stop.clone(), heartbeat_frame(s.max_frame));
        let interval = s.heartbeat_interval;
        let weak = Arc::downgrade(&lane);
        self.io.tracker.spawn(
            async move {
                let _ = write_loop(weak, writer, &mut queue, stop, heartbeat, interval).await;
            }
            .in_current_span(),
        );
        let lost = self.carry_in(&reader, &mut side).await;
        reader.close();
        {
            let mut readers = lock(&self.readers);
            if readers[rank]
                .as_ref()
                .is_some_and(|r| Arc::ptr_eq(r, &reader))
            {
                readers[rank] = None;
            }
        }
        drop(lane);
        drop(claim);
        let current = self.rejoins.load(Ordering::Acquire) == rejoins;
        if let Some(reason) = lost.filter(|_| current) {
            let reason = format!("its connection to this worker from {from} {reason}");
            // Said where it matters (see `say_lost`).
            say_lost(rank, &reason);
            self.deliver(PeerEvent::Lost {
                rank,
                attempt,
                reason,
            });
        }
    }

    /// Checks a peer's hello, its proof of the secret, its job and attempt, and claims
    /// its rank's incoming connection. Returns the rank, or why it is refused (with the
    /// rank it claimed).
    async fn admit(
        &self,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
    ) -> Result<Claim, (Option<Rank>, Refusal)> {
        let s = &self.settings;
        let refused = |rank: Option<Rank>, e: Unreadable| match e {
            Unreadable::Closed(how) => (rank, Refusal::Closed(how)),
            other => (rank, Refusal::Protocol(other.to_string())),
        };
        let broken = |rank: Option<Rank>, reason: String| (rank, Refusal::Protocol(reason));
        let Wire::PeerHello {
            job_id,
            rank,
            to,
            fingerprint,
            attempt,
        } = frames.handshake().await.map_err(|e| refused(None, e))?
        else {
            return Err(broken(None, "expected a peer's hello first".into()));
        };
        let claimed = Some(rank);
        if job_id != s.job_id {
            let asked = clip(&job_id, 64);
            let ours = s.job_id.clone();
            return Err((claimed, Refusal::WrongJob { asked, ours }));
        }
        let mut nonce = [0u8; 32];
        getrandom::fill(&mut nonce)
            .map_err(|e| broken(claimed, format!("no randomness for a challenge: {e}")))?;
        let challenge = wire::encode(&Wire::<(), ()>::Challenge { nonce }, s.max_frame)
            .map_err(|e| broken(claimed, e.to_string()))?;
        write_frame(writer, &challenge)
            .await
            .map_err(|e| broken(claimed, e.to_string()))?;
        let Wire::Proof { mac } = frames.handshake().await.map_err(|e| refused(claimed, e))? else {
            return Err(broken(claimed, "expected a proof of the secret".into()));
        };
        // The master's port's rule and words: a secret missing on one side is said so.
        check_proof(s.secret.as_deref(), &mac, || {
            let secret = s.secret.as_deref().unwrap_or_default();
            proof(secret, &nonce, &job_id, rank, &fingerprint)
        })
        .map_err(|refusal| (claimed, refusal))?;
        if let Some((field, ours, theirs)) = self.fingerprint.first_difference(&fingerprint) {
            let (master, worker) = (clip(&ours, 200), clip(&theirs, 200));
            let field = clip(&field, 64);
            return Err((
                claimed,
                Refusal::Mismatch {
                    field,
                    master,
                    worker,
                },
            ));
        }
        if rank >= s.world_size || rank == s.rank {
            return Err(broken(
                claimed,
                format!("rank {rank} is no peer of rank {}", s.rank),
            ));
        }
        if to != s.rank {
            // An address that reached another worker than the one meant (a stale table,
            // or a loopback address given to a peer on another host).
            let reached = format!("it meant to reach rank {to}, and reached rank {}", s.rank);
            return Err(broken(claimed, reached));
        }
        if attempt != self.attempt() {
            let ours = self.attempt();
            return Err((
                claimed,
                Refusal::OtherAttempt {
                    ours,
                    theirs: attempt,
                },
            ));
        }
        // Claimed until the connection ends, however it ends (a handshake cancelled while
        // its welcome is written included).
        let claim = {
            let mut incoming = lock(&self.incoming);
            if incoming[rank].is_some() {
                return Err((claimed, Refusal::RankTaken { rank }));
            }
            incoming[rank] = Some(Weak::new());
            Claim {
                mesh: self.me(),
                rank,
                attempt,
                rejoins: self.rejoins.load(Ordering::Acquire),
            }
        };
        let welcome = Wire::<(), ()>::Welcome {
            attempt: self.attempt(),
        };
        let welcome =
            wire::encode(&welcome, s.max_frame).map_err(|e| broken(claimed, e.to_string()))?;
        write_frame(writer, &welcome)
            .await
            .map_err(|e| broken(claimed, e.to_string()))?;
        Ok(claim)
    }

    /// Hands a peer's pieces to this worker's inbox until its goodbye (`None`), or says
    /// how the connection was lost: what came is read here when the socket says it is
    /// readable, unless the worker's compute, waiting for it, read it first.
    async fn carry_in(&self, reader: &Incoming, side: &mut ReadSide) -> Option<String> {
        let mut stop = self.io.stop.clone();
        let timeout = self.settings.heartbeat_timeout;
        // Whether this thread let go of its watch for the compute, which reads the
        // connection: it waits for the compute to stop, not for the socket. An end the
        // compute read, the transport's stop and a silent peer are heard either way.
        let mut off = false;
        loop {
            match reader.end() {
                Some(End::Bye) => return None,
                Some(End::Lost(reason)) => return Some(reason),
                None => {}
            }
            let wait = timeout.saturating_sub(reader.silent_for());
            tokio::select! {
                ready = side.readable(), if !off => {
                    if let Err(e) = ready {
                        return Some(ReadError::of(e).to_string());
                    }
                }
                _ = reader.resumed(), if off => {
                    off = false;
                    continue;
                }
                _ = tokio::time::sleep(wait) => {
                    // Bytes of a large frame may have come meanwhile: wait on from them.
                    if reader.silent_for() >= timeout {
                        return Some(ReadError::silent(timeout).to_string());
                    }
                    continue;
                }
                _ = reader.ended() => continue,
                _ = stopped(&mut stop) => return None,
            }
            if !reader.read_ready(side, &|event| self.deliver(event)) {
                side.unwatch();
                off = true;
            }
        }
    }

    /// The connection to `to`: reached at its address (waited for from the master's node,
    /// and tried again until the connect timeout), its handshake, then this worker's
    /// frames for it until the transport stops.
    async fn open(
        self: Arc<Self>,
        to: Rank,
        attempt: Attempt,
        mut queue: mpsc::UnboundedReceiver<Bytes>,
        lane: Weak<Lane>,
    ) {
        let mut at = None;
        let carried = self
            .reach_and_carry(to, attempt, &mut queue, Weak::clone(&lane), &mut at)
            .await;
        let at = at.map_or_else(String::new, |addr| format!(" at {addr}"));
        let (reason, quietly) = match carried {
            Ok(()) => return,
            Err(Ended::Bye) => (format!("rank {to}{at} ended its job"), true),
            Err(Ended::Lost(reason)) => (format!("rank {to}{at}: {reason}"), false),
        };
        self.lose(to, &lane, attempt, reason, quietly);
    }

    async fn reach_and_carry(
        &self,
        to: Rank,
        attempt: Attempt,
        queue: &mut mpsc::UnboundedReceiver<Bytes>,
        lane: Weak<Lane>,
        at: &mut Option<String>,
    ) -> Result<(), Ended> {
        let s = &self.settings;
        let deadline = Instant::now() + s.connect_timeout;
        // Reaching a peer ends with the transport: nothing is lost then.
        let mut stop = self.io.stop.clone();
        let reached = tokio::select! {
            reached = async {
                self.wait_for_address(to, deadline).await?;
                self.reach(to, attempt, at, deadline).await
            } => reached?,
            _ = stopped(&mut stop) => return Ok(()),
        };
        let (mut frames, writer) = reached;
        frames.allow(s.max_frame);
        let write = write_loop(
            lane,
            writer,
            queue,
            self.io.stop.clone(),
            heartbeat_frame(s.max_frame),
            s.heartbeat_interval,
        );
        tokio::pin!(write);
        let mut stop = self.io.stop.clone();
        loop {
            tokio::select! {
                written = &mut write => {
                    return written.map_err(|e| Ended::Lost(format!("sending to it: {e}")));
                }
                next = frames.next(s.heartbeat_timeout) => match next {
                    Ok(Some(frame)) => match wire::decode::<Handshake>(&frame) {
                        Ok(Wire::Heartbeat) => {}
                        Ok(Wire::PeerBye) => return Err(Ended::Bye),
                        _ => return Err(Ended::Lost("it sent what a peer's end does not".into())),
                    },
                    Ok(None) if *stop.borrow() => return Ok(()),
                    Ok(None) => return Err(Ended::Lost("its connection closed while this worker sent to it".into())),
                    Err(reason) => return Err(Ended::Lost(format!("{reason}, while this worker sent to it"))),
                },
                _ = stopped(&mut stop) => {
                    // Queued frames (the goodbye last) are written by the write loop.
                    return write.await.map_err(|e| Ended::Lost(format!("sending to it: {e}")));
                }
            }
        }
    }

    /// Waits until the master's node told `to`'s address, at most until `deadline`.
    async fn wait_for_address(&self, to: Rank, deadline: Instant) -> Result<(), Ended> {
        let mut table = self.table.subscribe();
        let waited = tokio::time::timeout_at(
            deadline.into(),
            table.wait_for(|t| t.get(to).is_some_and(Option::is_some)),
        )
        .await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Ended::Lost(format!(
                "the master's node did not say where it listens within {:?}",
                self.settings.connect_timeout
            ))),
        }
    }

    /// Connects to `to` and completes the handshake, trying again until `deadline` — each
    /// time at the address the master's node told last (a process of the rank started
    /// again listens elsewhere); the one tried last goes in `at`.
    async fn reach(
        &self,
        to: Rank,
        attempt: Attempt,
        at: &mut Option<String>,
        deadline: Instant,
    ) -> Result<(Frames, OwnedWriteHalf), Ended> {
        let s = &self.settings;
        let mut backoff = Duration::from_millis(20);
        loop {
            let addr = self
                .table
                .borrow()
                .get(to)
                .cloned()
                .flatten()
                .unwrap_or_default();
            *at = Some(addr.clone());
            let addr = addr.as_str();
            let left = deadline.saturating_duration_since(Instant::now());
            let tried = tokio::time::timeout(left.max(Duration::from_millis(1)), async {
                let stream = TcpStream::connect(addr)
                    .await
                    .map_err(|e| Unmet::Failed(format!("could not connect: {e}")))?;
                let _ = stream.set_nodelay(true);
                let (reader, mut writer) = stream.into_split();
                let mut frames = Frames::new(reader);
                match tokio::time::timeout(
                    s.handshake_timeout,
                    self.greet(to, attempt, &mut frames, &mut writer),
                )
                .await
                {
                    Ok(Ok(())) => Ok((frames, writer)),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(Unmet::Failed(format!(
                        "no answer to the handshake within {:?}",
                        s.handshake_timeout
                    ))),
                }
            })
            .await;
            let last = match tried {
                Ok(Ok(reached)) => return Ok(reached),
                // A peer not welcomed in this attempt yet, or whose connection from this
                // worker's process before is not found dead yet, may take it later.
                Ok(Err(Unmet::Refused(refusal))) if !passing(&refusal) => {
                    return Err(Ended::Lost(format!("refused: {refusal}")))
                }
                Ok(Err(Unmet::Refused(refusal))) => format!("refused: {refusal}"),
                Ok(Err(Unmet::Failed(e))) => e,
                Err(_) => "connecting timed out".to_string(),
            };
            if Instant::now() + backoff >= deadline {
                return Err(Ended::Lost(format!(
                    "not reached within {:?}: {last}",
                    s.connect_timeout
                )));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Hello in `attempt`, proof of the secret, welcome.
    async fn greet(
        &self,
        to: Rank,
        attempt: Attempt,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
    ) -> Result<(), Unmet> {
        let s = &self.settings;
        let hello = Wire::<(), ()>::PeerHello {
            job_id: s.job_id.clone(),
            rank: s.rank,
            to,
            fingerprint: (*self.fingerprint).clone(),
            attempt,
        };
        let failed = |e: String| Unmet::Failed(e);
        let send = |msg: &Wire<(), ()>| {
            wire::encode(msg, wire::HANDSHAKE_MAX_FRAME).map_err(|e| failed(e.to_string()))
        };
        write_frame(writer, &send(&hello)?)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let answer = |read: Result<Handshake, Unreadable>| match read {
            Ok(Wire::Refused { refusal }) => Err(Unmet::Refused(refusal)),
            Ok(answer) => Ok(answer),
            Err(e) => Err(failed(format!("rank {to} {e}"))),
        };
        let Wire::Challenge { nonce } = answer(frames.handshake().await)? else {
            return Err(failed("it sent no challenge".into()));
        };
        let mac = proof_to_send(
            s.secret.as_deref(),
            &nonce,
            &s.job_id,
            s.rank,
            &self.fingerprint,
        );
        write_frame(writer, &send(&Wire::Proof { mac })?)
            .await
            .map_err(|e| failed(e.to_string()))?;
        match answer(frames.handshake().await)? {
            Wire::Welcome { .. } => Ok(()),
            _ => Err(failed("it did not answer the proof".into())),
        }
    }
}

/// Whether a refusal may pass: the peer runs another attempt (it may not have heard of
/// the new one yet), or holds a connection of this rank (an earlier one, not found dead
/// yet).
fn passing(refusal: &Refusal) -> bool {
    matches!(
        refusal,
        Refusal::RankTaken { .. } | Refusal::OtherAttempt { .. }
    )
}

/// Why a try to reach a peer did not: refused by it (some refusals may pass), or failed.
enum Unmet {
    Refused(Refusal),
    Failed(String),
}

/// A peer rank's connection to this worker, claimed: released when dropped.
struct Claim {
    mesh: Arc<Mesh>,
    rank: Rank,
    /// The attempt it was admitted in (both ends' then).
    attempt: Attempt,
    /// How many times this worker had been welcomed again then.
    rejoins: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        lock(&self.mesh.incoming)[self.rank] = None;
    }
}

/// How a connection to a peer ended, short of the transport's stop.
enum Ended {
    /// The peer said goodbye: its job ended.
    Bye,
    /// Lost, and how.
    Lost(String),
}

impl From<String> for Ended {
    fn from(reason: String) -> Self {
        Ended::Lost(reason)
    }
}

impl PeerLink for Mesh {
    fn send(&self, to: Rank, msg: PeerMessage) -> Result<(), TransportError> {
        let s = &self.settings;
        if to >= s.world_size || to == s.rank {
            return Err(TransportError::UnknownRank {
                rank: to,
                workers: s.world_size,
            });
        }
        let PeerBody::Encoded(body) = msg.body else {
            return Err(TransportError::Unsupported(
                "a piece for a peer over TCP must be encoded".into(),
            ));
        };
        // The body is written as it is, after the frame's head: not copied into a frame.
        let frame = wire::encode_peer(
            (msg.attempt, msg.call, msg.step, msg.chunk),
            body,
            s.max_frame,
        )
        .map_err(|e| match e {
            wire::WireError::TooLarge { len, max } => TransportError::TooLarge {
                bytes: len,
                limit: max,
            },
            e => TransportError::io(format!("a piece for rank {to}: {e}"), None),
        })?;
        let lane = {
            let mut out = lock(&self.out);
            match &out[to] {
                Out::Open(lane) => Arc::clone(lane),
                Out::Gone(reason) => {
                    return Err(TransportError::io(
                        format!("the connection to {reason}"),
                        None,
                    ))
                }
                Out::Idle => {
                    let (lane, queue) = Lane::new();
                    let attempt = self.attempt();
                    out[to] = Out::Open(Arc::clone(&lane));
                    let mesh = self.me();
                    let weak = Arc::downgrade(&lane);
                    let span = tracing::warn_span!("peer", job = %s.job_id, rank = s.rank, to);
                    let _guard = self.io.handle.enter();
                    self.io
                        .tracker
                        .spawn(mesh.open(to, attempt, queue, weak).instrument(span));
                    lane
                }
            }
        };
        lane.send_parts(frame)
            .map_err(|_| TransportError::io(format!("the connection to rank {to} is closed"), None))
    }

    fn join(&self, rank: Rank, inbox: PeerInbox) {
        if rank == self.settings.rank {
            *self.inbox.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(inbox));
        }
    }

    fn max_piece(&self) -> Option<usize> {
        Some(wire::max_piece(self.settings.max_frame))
    }

    fn poll_for(&self) -> Duration {
        self.settings.peer_poll
    }

    fn read_now(&self) {
        let Some(inbox) = self.inbox.read().unwrap_or_else(|e| e.into_inner()).clone() else {
            return;
        };
        self.window.open(self.settings.peer_poll);
        let deliver = |event| inbox(event);
        let mut streamed = false;
        for reader in lock(&self.readers).iter().flatten() {
            streamed |= reader.read_now(&deliver);
        }
        if streamed && self.window.streaming() {
            self.resume_readers();
        }
    }

    fn stop_reading(&self) {
        // (A window never opened since the last close: no reader backed off for it.)
        if self.window.close() {
            self.resume_readers();
        }
    }
}

impl Mesh {
    /// Every reader's I/O thread that backed off for the compute reads again at once.
    fn resume_readers(&self) {
        for reader in lock(&self.readers).iter().flatten() {
            reader.resume();
        }
    }
}

/// Binds `addr`; on a port of the system's (port 0), never on the master's port
/// (`avoid`): a launcher that found the master a free port let go of it for rank 0 to
/// take, and the system may hand it to a worker's listener first — whose own connection
/// to "the master" would then reach its own listener, or rank 0 find its port taken. A
/// port handed out that way is held until another is bound, so it is not handed out again.
fn listen_avoiding(
    addr: SocketAddr,
    avoid: Option<u16>,
    mut bind: impl FnMut(SocketAddr) -> std::io::Result<std::net::TcpListener>,
) -> std::io::Result<std::net::TcpListener> {
    let mut held = Vec::new();
    loop {
        let listener = bind(addr)?;
        let port = listener.local_addr()?.port();
        if addr.port() != 0 || Some(port) != avoid {
            return Ok(listener);
        }
        if held.len() >= 3 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("the system gave the master's port ({port}) again and again"),
            ));
        }
        held.push(listener);
    }
}

/// Says a peer's connection was lost, at DEBUG: a loss that matters is said where it does —
/// the collective or message exchange that waited on the peer fails naming it, and the
/// master's node loses the peer's worker (its own link) — while one that does not (a peer
/// whose process ended with the job, before its goodbye was read) is no warning in a job
/// that went well.
fn say_lost(peer: Rank, reason: &str) {
    tracing::debug!(peer, %reason, "peer lost");
}

mod reader;
#[cfg(test)]
mod tests;
