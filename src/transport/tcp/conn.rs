//! The connection tasks, run on the transport's I/O thread.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use serde::de::IgnoredAny;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::admission::{log_every, Refusals, Unproven};
use super::lane::{Lane, Writing};
use super::wire::{self, Refusal, Wire, WireError};
use super::{lock, Shared, TcpSettings};
use crate::codec::Undecodable;
use crate::error::{Cause, JobError, Waiting};
use crate::ids::{Attempt, Rank};
use crate::payload::Payload;
use crate::protocol::{Envelope, ToMaster, ToWorker};
use crate::transport::{Fingerprint, Inbox};

/// The attempt a worker starts in, until a master's node tells it another.
pub(super) const FIRST_ATTEMPT: Attempt = 0;

/// Handshake frames are decoded without the job's types: no user `Deserialize` code runs on
/// bytes from a peer that has not proved the secret.
type Handshake = Wire<IgnoredAny, IgnoredAny>;

/// A read half that notes when its last bytes arrived: a peer in the middle of sending a
/// large frame is not silent.
struct Watched {
    inner: OwnedReadHalf,
    origin: Instant,
    last: Arc<AtomicU64>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let now = self.origin.elapsed().as_millis() as u64;
            self.last.store(now, Ordering::Relaxed);
        }
        polled
    }
}

/// A connection's frames, and how long ago its peer last sent any bytes.
struct Frames {
    frames: FramedRead<Watched, LengthDelimitedCodec>,
    origin: Instant,
    last: Arc<AtomicU64>,
}

impl Frames {
    fn new(reader: OwnedReadHalf) -> Self {
        let origin = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let watched = Watched {
            inner: reader,
            origin,
            last: Arc::clone(&last),
        };
        Frames {
            frames: FramedRead::new(watched, wire::codec(wire::HANDSHAKE_MAX_FRAME)),
            origin,
            last,
        }
    }

    fn allow(&mut self, max_frame: usize) {
        self.frames.decoder_mut().set_max_frame_length(max_frame);
    }

    fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }

    /// The next frame; `Err(reason)` when the peer was silent (no bytes at all) for
    /// `timeout`, closed, or sent something unreadable.
    async fn next(&mut self, timeout: Duration) -> Result<Option<bytes::BytesMut>, String> {
        loop {
            let wait = timeout.saturating_sub(self.silent_for());
            match tokio::time::timeout(wait, self.frames.next()).await {
                Ok(Some(Ok(frame))) => {
                    // The frame and its length prefix.
                    #[cfg(feature = "metrics")]
                    crate::metrics::received(frame.len() + 4);
                    return Ok(Some(frame));
                }
                Ok(Some(Err(e))) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Err(format!("unreadable frame: {e}"))
                }
                Ok(Some(Err(e))) => return Err(format!("its connection failed: {e}")),
                Ok(None) => return Ok(None),
                // Bytes of a large frame may have arrived meanwhile: wait on from them.
                Err(_) if self.silent_for() < timeout => continue,
                Err(_) => return Err(format!("silent for {timeout:?} (no message, no heartbeat)")),
            }
        }
    }

    /// The next handshake frame, decoded.
    async fn handshake(&mut self) -> Result<Handshake, Unreadable> {
        let frame = match self.frames.next().await {
            Some(Ok(frame)) => {
                #[cfg(feature = "metrics")]
                crate::metrics::received(frame.len() + 4);
                frame
            }
            Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(Unreadable::Other(format!("unreadable frame: {e}")))
            }
            // What the codec says of a stream that ended inside a frame.
            Some(Err(e)) if e.to_string() == "bytes remaining on stream" => {
                return Err(Unreadable::Closed(
                    "closed the connection in the middle of a frame, before its handshake completed"
                        .into(),
                ))
            }
            Some(Err(e)) => {
                return Err(Unreadable::Closed(format!(
                    "broke the connection before its handshake completed: {e}"
                )))
            }
            None => {
                return Err(Unreadable::Closed(
                    "closed the connection before its handshake completed".into(),
                ))
            }
        };
        wire::decode::<Handshake>(&frame).map_err(|e| match e {
            WireError::Version { ours, theirs } => Unreadable::Version { ours, theirs },
            e => Unreadable::Other(e.to_string()),
        })
    }
}

/// Why a handshake frame could not be read.
enum Unreadable {
    /// The peer speaks another version of the wire protocol.
    Version { ours: u16, theirs: u16 },
    /// The peer closed or broke the connection (what it did, said of the peer).
    Closed(String),
    /// The frame is not a handshake message.
    Other(String),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::Version { ours, theirs } => write!(
                f,
                "the peer speaks protocol version {theirs}, this side version {ours}"
            ),
            Unreadable::Closed(reason) | Unreadable::Other(reason) => f.write_str(reason),
        }
    }
}

/// Decodes a frame of the job's types; a panic in a user `Deserialize` is an error of this
/// connection, not of the I/O thread.
fn decode_guarded<M: Payload, W: Payload>(frame: &[u8]) -> Result<Wire<M, W>, String> {
    match catch_unwind(AssertUnwindSafe(|| wire::decode::<Wire<M, W>>(frame))) {
        Ok(decoded) => decoded.map_err(|e| e.to_string()),
        Err(payload) => Err(format!(
            "decoding its message panicked: {}",
            Cause::from_panic(payload)
        )),
    }
}

/// At most `max` characters of a peer's string, for messages and logs.
fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

/// The proof that a peer knows the secret: HMAC-SHA256 over the master's fresh nonce, the
/// job id, the rank and the job's fingerprint as the peer sent it, so a proof cannot be
/// replayed for another connection, job, rank or fingerprint.
fn proof(
    secret: &[u8],
    nonce: &[u8; 32],
    job_id: &str,
    rank: Rank,
    fingerprint: &Fingerprint,
) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(nonce);
    mac.update(job_id.as_bytes());
    mac.update(&(rank as u64).to_le_bytes());
    // A fingerprint is names and values: it always encodes.
    mac.update(&crate::codec::to_vec(fingerprint).unwrap_or_default());
    mac
}

async fn write_frame(writer: &mut OwnedWriteHalf, frame: &[u8]) -> std::io::Result<()> {
    #[cfg(feature = "metrics")]
    crate::metrics::sent(frame.len());
    writer.write_all(frame).await
}

/// The writer of a connection's lane ([`Lane`]): lets senders write directly while it
/// runs, writes the frames they queued, and sends a heartbeat whenever no queued frame
/// went out for a heartbeat interval (frames written directly do not put it off: a
/// heartbeat is a few bytes). When the transport stops, writes what is still queued, then
/// ends; the write half is shut down when the last handle on it goes. Returns why a write
/// failed, if one did.
async fn write_loop(
    lane: Weak<Lane>,
    writer: OwnedWriteHalf,
    queue: &mut mpsc::UnboundedReceiver<Bytes>,
    mut stop: watch::Receiver<bool>,
    heartbeat: Bytes,
    interval: Duration,
) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("could not write to it: {e}");
    let writing = Writing::start(lane, writer);
    loop {
        tokio::select! {
            frame = queue.recv() => match frame {
                Some(frame) => writing.write_queued(&frame).await.map_err(failed)?,
                None => break,
            },
            _ = tokio::time::sleep(interval) => writing.send(heartbeat.clone()),
            _ = stop.changed() => {
                writing.stop();
                while let Ok(frame) = queue.try_recv() {
                    writing.write_queued(&frame).await.map_err(failed)?;
                }
                break;
            }
        }
    }
    Ok(())
}

fn heartbeat_frame(max: usize) -> Bytes {
    wire::encode(&Wire::<(), ()>::Heartbeat, max).expect("a heartbeat always encodes")
}

/// What a delivered message means for its connection.
enum Delivered {
    /// More messages follow.
    More,
    /// The peer's last message: whatever happens on the connection next is no loss.
    Last,
}

/// Reads a connection's frames until its peer's last message or the transport's stop,
/// answering heartbeats by silence and handing every other message — or why a frame did
/// not decode as the job's types — to `deliver`. Returns why the peer was lost (silent,
/// closed, unreadable, or refused by `deliver`), or `None`.
async fn read_until_last<M: Payload, W: Payload>(
    frames: &mut Frames,
    heartbeat_timeout: Duration,
    mut stop: watch::Receiver<bool>,
    mut deliver: impl FnMut(Result<Wire<M, W>, String>) -> Result<Delivered, String>,
) -> Option<String> {
    let mut last = false;
    loop {
        let next = tokio::select! {
            next = frames.next(heartbeat_timeout) => next,
            _ = stop.changed() => return None,
        };
        let frame = match next {
            // After its last message a peer may go as it likes.
            _ if last => return None,
            Ok(Some(frame)) => frame,
            Ok(None) => return Some("its connection closed".into()),
            Err(reason) => return Some(reason),
        };
        match decode_guarded::<M, W>(&frame) {
            Ok(Wire::Heartbeat) => {}
            decoded => match deliver(decoded) {
                Ok(delivered) => last = matches!(delivered, Delivered::Last),
                Err(reason) => return Some(reason),
            },
        }
    }
}

/// Returns once the transport stops (at once if it has).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard it gives back is dropped here: it must not live across an await.
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// A rank claimed by a connection: released however the connection ends.
struct Claim {
    peers: Shared,
    rank: Rank,
}

impl Drop for Claim {
    fn drop(&mut self) {
        lock(&self.peers).conns[self.rank] = None;
    }
}

/// An accepted worker's lane, and the queue its writer takes frames from.
type Accepted = (Weak<Lane>, mpsc::UnboundedReceiver<Bytes>);

/// How a connection's handshake ended, when no worker came of it.
enum Turned {
    /// Refused, and told why; the rank it claimed, if it got that far.
    Refused {
        rank: Option<Rank>,
        refusal: Refusal,
    },
    /// It did not complete its handshake within the handshake timeout.
    TimedOut,
    /// A newer connection took its handshake slot.
    Dropped,
    /// The master's node is stopping.
    Stopping,
}

/// The master's node: accepts workers, checks their handshake, and carries their frames.
pub(super) struct Server<M, W> {
    pub(super) settings: Arc<TcpSettings>,
    pub(super) inbox: Arc<Inbox<Envelope<ToMaster<W>>>>,
    pub(super) peers: Shared,
    /// The job as this process runs it: every worker's must be the same.
    pub(super) fingerprint: Arc<Fingerprint>,
    /// The attempt this master's node runs: every worker that connects is told it.
    pub(super) attempt: Attempt,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) tracker: TaskTracker,
    pub(super) unproven: Arc<Mutex<Unproven>>,
    pub(super) refusals: Arc<Mutex<Refusals>>,
    pub(super) _types: PhantomData<fn() -> M>,
}

impl<M, W> Clone for Server<M, W> {
    fn clone(&self) -> Self {
        Server {
            settings: Arc::clone(&self.settings),
            inbox: Arc::clone(&self.inbox),
            peers: Arc::clone(&self.peers),
            fingerprint: Arc::clone(&self.fingerprint),
            attempt: self.attempt,
            stop: self.stop.clone(),
            tracker: self.tracker.clone(),
            unproven: Arc::clone(&self.unproven),
            refusals: Arc::clone(&self.refusals),
            _types: PhantomData,
        }
    }
}

impl<M: Payload, W: Payload> Server<M, W> {
    pub(super) async fn serve(self, listener: std::net::TcpListener) {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for workers");
                return;
            }
        };
        self.tracker
            .spawn(self.clone().watch(Instant::now()).in_current_span());
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        // A full table makes room by dropping its oldest unproven
                        // connection: idle and trickling peers grow old, workers do not.
                        let (id, token) = lock(&self.unproven).admit(peer.ip());
                        let server = self.clone();
                        self.tracker
                            .spawn(server.connection(stream, peer, id, token).in_current_span());
                    }
                    Err(e) => {
                        // Out of file handles, say: do not spin.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = stopped(&mut stop) => return,
            }
        }
    }

    /// While ranks have never connected: says so at a steady interval, naming them and
    /// the peers refused that claimed them; once `connect_timeout` passed since the node
    /// was bound, fails the job naming them. Also sums up refused connections once per
    /// interval.
    async fn watch(self, bound: Instant) {
        let s = Arc::clone(&self.settings);
        let deadline = bound.checked_add(s.connect_timeout);
        let every = log_every(s.connect_timeout);
        let mut ticks = tokio::time::interval(every.min(Duration::from_secs(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut stop = self.stop.clone();
        let mut next_log = bound + every;
        let mut failed = false;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stopped(&mut stop) => return,
            }
            let now = Instant::now();
            lock(&self.refusals).flush(now);
            let missing = {
                let peers = lock(&self.peers);
                if peers.ending.is_some() {
                    Vec::new()
                } else {
                    peers.never_connected()
                }
            };
            if missing.is_empty() || failed {
                continue;
            }
            let refused = lock(&self.refusals).of(&missing);
            let waited = now.saturating_duration_since(bound);
            if deadline.is_some_and(|d| now >= d) {
                failed = true;
                tracing::error!(
                    ?missing,
                    ?refused,
                    "worker(s) {missing:?} did not connect within {:?}",
                    s.connect_timeout
                );
                let error = JobError::WorkersTimedOut {
                    during: Waiting::Connection,
                    missing: missing.clone(),
                    waited,
                    refused,
                };
                (self.inbox)(Envelope {
                    from: missing[0],
                    msg: ToMaster::Failed {
                        attempt: self.attempt,
                        error,
                    },
                });
            } else if now >= next_log {
                next_log = now + every;
                tracing::warn!(
                    ?missing,
                    ?refused,
                    "waiting for worker(s) {missing:?} to connect ({waited:.0?} of {:?})",
                    s.connect_timeout
                );
            }
        }
    }

    async fn connection(
        self,
        stream: TcpStream,
        peer: SocketAddr,
        id: u64,
        dropped: CancellationToken,
    ) {
        let s = Arc::clone(&self.settings);
        let _ = stream.set_nodelay(true);
        let (reader, mut writer) = stream.into_split();
        let mut frames = Frames::new(reader);
        let mut stop = self.stop.clone();
        let shaken = tokio::select! {
            shaken = tokio::time::timeout(
                s.handshake_timeout,
                self.handshake(&mut frames, &mut writer),
            ) => match shaken {
                Ok(Ok(accepted)) => Ok(accepted),
                Ok(Err((rank, refusal))) => Err(Turned::Refused { rank, refusal }),
                Err(_) => Err(Turned::TimedOut),
            },
            _ = dropped.cancelled() => Err(Turned::Dropped),
            _ = stopped(&mut stop) => Err(Turned::Stopping),
        };
        lock(&self.unproven).leave(id);
        let (claim, (lane, queue)) = match shaken {
            Ok(accepted) => accepted,
            Err(turned) => return self.turn_away(turned, peer, writer).await,
        };
        let rank = claim.rank;
        tracing::debug!(%peer, rank, "worker connected");
        // Proven: from now on frames up to the full limit.
        frames.allow(s.max_frame);
        let (stop, heartbeat) = (self.stop.clone(), heartbeat_frame(s.max_frame));
        let interval = s.heartbeat_interval;
        self.tracker.spawn(
            async move {
                let mut queue = queue;
                // A failed write shows as a closed connection to the reader.
                let _ = write_loop(lane, writer, &mut queue, stop, heartbeat, interval).await;
            }
            .in_current_span(),
        );
        let lost = self.read_loop(rank, peer, &mut frames).await;
        if let Some(reason) = lost {
            tracing::warn!(rank, %peer, %reason, "worker lost");
            (self.inbox)(Envelope {
                from: rank,
                msg: ToMaster::Failed {
                    attempt: self.attempt,
                    error: JobError::WorkerLost { rank, reason },
                },
            });
        }
        // Released only now: a new process of the rank (one started again in its place)
        // can connect, and what it says reaches the master after everything of this one.
        drop(claim);
    }

    /// Notes why a connection was turned away (rate-limited), tells a refused peer why,
    /// and — for a proven process of this job that runs it differently — fails the job
    /// (or, under a policy that replaces workers, that rank's process only).
    async fn turn_away(&self, turned: Turned, peer: SocketAddr, mut writer: OwnedWriteHalf) {
        let s = &self.settings;
        let peer_name = peer.to_string();
        let (rank, refusal) = match turned {
            Turned::Refused { rank, refusal } => (rank, refusal),
            Turned::TimedOut => {
                let reason = format!(
                    "did not complete its handshake within {:?}",
                    s.handshake_timeout
                );
                lock(&self.refusals).note(&peer_name, None, "an unfinished handshake", &reason);
                return;
            }
            Turned::Dropped => {
                let reason = "dropped in its handshake to make room for a newer connection (the handshake slots were full)";
                lock(&self.refusals).note(&peer_name, None, "full handshake slots", reason);
                return;
            }
            Turned::Stopping => return,
        };
        lock(&self.refusals).note(&peer_name, rank, refusal.kind(), &refusal.to_string());
        if let Refusal::Closed(_) = refusal {
            // Nobody is there to tell.
            return;
        }
        if let (Some(rank), Refusal::Mismatch { .. }) = (rank, &refusal) {
            self.mismatched(rank, &refusal);
        }
        if let Ok(frame) = wire::encode(
            &Wire::<(), ()>::Refused { refusal },
            wire::HANDSHAKE_MAX_FRAME,
        ) {
            let _ =
                tokio::time::timeout(s.handshake_timeout, write_frame(&mut writer, &frame)).await;
        }
    }

    /// A proven process of this job, of `rank`, runs it differently: the job's failure
    /// policy decides (it fails the job, or waits for another process of the rank) —
    /// unless the job is over already.
    fn mismatched(&self, rank: Rank, refusal: &Refusal) {
        let Refusal::Mismatch {
            field,
            master,
            worker,
        } = refusal
        else {
            return;
        };
        if lock(&self.peers).ending.is_some() {
            return;
        }
        let error = JobError::Mismatch {
            rank,
            field: field.clone(),
            master: master.clone(),
            worker: worker.clone(),
        };
        // A rank outside the world (another world size) still reaches the master: as
        // the last rank's message, carrying its own rank, which no policy recovers.
        let from = rank.min(self.settings.world_size - 1);
        (self.inbox)(Envelope {
            from,
            msg: ToMaster::Failed {
                attempt: self.attempt,
                error,
            },
        });
    }

    /// Checks a new connection: hello (version, job id, rank, fingerprint), then the
    /// secret's proof, then — proven — the fingerprint, then claims the rank. Returns the
    /// claim and the rank's queue, or why it is refused (with the rank it claimed).
    async fn handshake(
        &self,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
    ) -> Result<(Claim, Accepted), (Option<Rank>, Refusal)> {
        let s = &self.settings;
        let broken = |rank: Option<Rank>| move |reason: String| (rank, Refusal::Protocol(reason));
        // A peer that closed its connection is only noted; one that sent what is not a
        // handshake broke it.
        let refused = |rank: Option<Rank>, e: Unreadable| match e {
            Unreadable::Closed(how) => (rank, Refusal::Closed(how)),
            other => (rank, Refusal::Protocol(other.to_string())),
        };
        let Wire::Hello {
            job_id,
            rank,
            fingerprint,
        } = frames.handshake().await.map_err(|e| refused(None, e))?
        else {
            return Err(broken(None)("expected a hello first".into()));
        };
        // The rank it claims, for what is said of it: not proven, but all there is to name
        // a misconfigured process by.
        let claimed = Some(rank);
        if job_id != s.job_id {
            let asked = clip(&job_id, 64);
            return Err((claimed, Refusal::WrongJob { asked }));
        }
        let mut nonce = [0u8; 32];
        getrandom::fill(&mut nonce)
            .map_err(|e| broken(claimed)(format!("no randomness for a challenge: {e}")))?;
        let challenge = wire::encode(&Wire::<(), ()>::Challenge { nonce }, s.max_frame)
            .map_err(|e| broken(claimed)(e.to_string()))?;
        write_frame(writer, &challenge)
            .await
            .map_err(|e| broken(claimed)(e.to_string()))?;
        let proof_frame = frames.handshake().await;
        let Wire::Proof { mac } = proof_frame.map_err(|e| refused(claimed, e))? else {
            return Err(broken(claimed)("expected a proof of the secret".into()));
        };
        let secret = s.secret.as_deref().unwrap_or_default();
        proof(secret, &nonce, &job_id, rank, &fingerprint)
            .verify_slice(&mac)
            .map_err(|_| (claimed, Refusal::WrongSecret))?;
        if *self.stop.borrow() {
            return Err((claimed, Refusal::Stopping));
        }
        // Proven: a process of this job. Does it run the job as this one does? A rank
        // outside the world is another world size; a rank held by a live connection is
        // turned away before its job is compared, so that a stray process never fails the
        // rank's working one.
        let differs = self.fingerprint.first_difference(&fingerprint);
        let differs = match differs {
            None if rank >= s.world_size => Some((
                "workers".to_string(),
                s.world_size.to_string(),
                format!("more than {rank}"),
            )),
            None => None,
            Some(_) if lock(&self.peers).holds(rank) => {
                return Err((claimed, Refusal::RankTaken { rank }));
            }
            some => some,
        };
        if let Some((field, master, worker)) = differs {
            let (master, worker) = (clip(&master, 200), clip(&worker, 200));
            return Err((
                claimed,
                Refusal::Mismatch {
                    field: clip(&field, 64),
                    master,
                    worker,
                },
            ));
        }
        let (lane, rx) = Lane::new();
        let claim = {
            let mut peers = lock(&self.peers);
            if peers.holds(rank) {
                return Err((claimed, Refusal::RankTaken { rank }));
            }
            peers.conns[rank] = Some(Arc::clone(&lane));
            // The job ended already: the worker hears how, right after its welcome (queued:
            // nothing is written directly before the writer runs).
            if let Some(ending) = &peers.ending {
                let _ = lane.send(ending.clone());
            }
            Claim {
                peers: Arc::clone(&self.peers),
                rank,
            }
        };
        let welcome = Wire::<(), ()>::Welcome {
            attempt: self.attempt,
        };
        let welcome =
            wire::encode(&welcome, s.max_frame).map_err(|e| broken(claimed)(e.to_string()))?;
        write_frame(writer, &welcome)
            .await
            .map_err(|e| broken(claimed)(e.to_string()))?;
        // Welcomed: the rank has connected (what the master's node waits for at start).
        lock(&self.peers).ever[rank] = true;
        Ok((claim, (Arc::downgrade(&lane), rx)))
    }

    /// Delivers a connected worker's messages. A message that does not decode as the job's
    /// types fails the job with [`JobError::Decode`], naming the rank, the type and the
    /// peer (the first such message of the connection; later ones are dropped); the
    /// connection goes on (its `Done` still ends it). A failure only the master's node can
    /// report, sent by a worker, loses the worker. Returns why the worker was lost, or
    /// `None` when it ended as it should (after its `Done`) or the transport stopped.
    async fn read_loop(&self, rank: Rank, peer: SocketAddr, frames: &mut Frames) -> Option<String> {
        let timeout = self.settings.heartbeat_timeout;
        let mut undecodable = false;
        read_until_last::<M, W>(frames, timeout, self.stop.clone(), |wire| match wire {
            Err(message) => {
                if std::mem::replace(&mut undecodable, true) {
                    tracing::debug!(rank, %peer, %message, "another message could not be decoded");
                    return Ok(Delivered::More);
                }
                tracing::error!(rank, %peer, %message, "a worker's message could not be decoded");
                let direction = format!("worker {rank} → master");
                let error =
                    Undecodable::of::<ToMaster<W>>(direction, message).sent_by(peer.to_string());
                (self.inbox)(Envelope {
                    from: rank,
                    msg: ToMaster::Failed {
                        attempt: self.attempt,
                        error,
                    },
                });
                Ok(Delivered::More)
            }
            Ok(Wire::ToMaster(ToMaster::Failed {
                error: JobError::Mismatch { .. } | JobError::WorkersTimedOut { .. },
                ..
            })) => Err("it sent a failure only the master's node reports".into()),
            Ok(Wire::ToMaster(msg)) => {
                // Only a `Done` of this node's attempt ends the connection: one the worker
                // queued for a master before this one is dropped by the gate as stale.
                let last = matches!(msg, ToMaster::Done { attempt, .. } if attempt == self.attempt);
                (self.inbox)(Envelope { from: rank, msg });
                Ok(if last {
                    Delivered::Last
                } else {
                    Delivered::More
                })
            }
            Ok(_) => Err("it sent a handshake message after its handshake".into()),
        })
        .await
    }
}

/// A worker's connection to the master's node.
pub(super) struct Client<M, W> {
    pub(super) settings: Arc<TcpSettings>,
    pub(super) target: String,
    pub(super) inbox: Inbox<ToWorker<M>>,
    /// The job as this process runs it, which the master checks.
    pub(super) fingerprint: Arc<Fingerprint>,
    /// Whether the worker queued its last message: after it, a lost master is no loss.
    pub(super) said_done: Arc<AtomicBool>,
    pub(super) stop: watch::Receiver<bool>,
    /// The attempt the worker starts in, until a welcome says another: what an abort
    /// before the first welcome is for.
    pub(super) first_attempt: Attempt,
    /// The worker's queue of frames for the master, for a failure the connection itself
    /// finds (a message that does not decode). Weak: the queue ends when the worker's
    /// link is dropped, as it must for the writer to end.
    pub(super) to_master: Weak<Lane>,
    pub(super) _types: PhantomData<fn() -> W>,
}

/// How a worker's attempt to reach the master failed.
enum Unreached {
    /// Not reached — no connection, or it closed or went silent during the handshake —
    /// and why: tried again until the timeout.
    Lost(String),
    /// The master refused this worker, and told it why.
    Refused(Refusal),
}

/// How a connection to the master ended.
enum SessionEnd {
    /// The job ended for this worker (its finish or abort arrived), or the transport
    /// stopped.
    Over,
    /// The master was lost, and why.
    Lost(String),
}

impl<M: Payload, W: Payload> Client<M, W> {
    /// Connects to the master, and again whenever it is lost while reconnecting is on
    /// (`reconnect_timeout`), until the job ends for this worker. After each handshake the
    /// worker learns the master's attempt (`ToWorker::Connected`); after a reconnect,
    /// what it queued for the master it lost is dropped, so the new one hears nothing of
    /// it.
    pub(super) async fn run(self, mut queue: mpsc::UnboundedReceiver<Bytes>) {
        let s = Arc::clone(&self.settings);
        let mut attempt = self.first_attempt;
        let mut lost: Option<String> = None;
        loop {
            let (mut frames, writer, joined_attempt) = match self.reach(lost.as_deref()).await {
                Ok(joined) => joined,
                Err(Unreached::Lost(reason)) => {
                    tracing::error!(rank = s.rank, %reason, "cannot reach the master");
                    return self.abort(attempt, JobError::MasterLost { reason });
                }
                Err(Unreached::Refused(refusal)) => {
                    tracing::error!(rank = s.rank, %refusal, "the master refused this worker");
                    let error = self.refused(refusal);
                    return self.abort(attempt, error);
                }
            };
            if lost.is_some() {
                let dropped = self
                    .to_master
                    .upgrade()
                    .map_or(0, |lane| lane.clear(&mut queue));
                tracing::info!(
                    rank = s.rank,
                    attempt = joined_attempt,
                    dropped,
                    "reached the master again"
                );
            }
            attempt = joined_attempt;
            (self.inbox)(ToWorker::Connected { attempt });
            match self.session(&mut frames, writer, &mut queue, attempt).await {
                SessionEnd::Over => return,
                // The worker said its last word, or the job is over for this process: a
                // new connection would only look like a worker lost.
                SessionEnd::Lost(_)
                    if self.said_done.load(Ordering::SeqCst) || *self.stop.borrow() =>
                {
                    return
                }
                SessionEnd::Lost(reason) if !s.reconnect_timeout.is_zero() => {
                    tracing::warn!(
                        rank = s.rank,
                        %reason,
                        within = ?s.reconnect_timeout,
                        "master lost; trying to reach it again"
                    );
                    lost = Some(reason);
                }
                SessionEnd::Lost(reason) => {
                    tracing::error!(rank = s.rank, %reason, "master lost");
                    return self.abort(attempt, JobError::MasterLost { reason });
                }
            }
        }
    }

    /// Ends the job for this worker, in the attempt it runs.
    fn abort(&self, attempt: Attempt, error: JobError) {
        (self.inbox)(ToWorker::Abort { attempt, error });
    }

    /// The error this worker ends with when the master refused it for good.
    fn refused(&self, refusal: Refusal) -> JobError {
        let rank = self.settings.rank;
        match refusal {
            Refusal::Mismatch {
                field,
                master,
                worker,
            } => JobError::Mismatch {
                rank,
                field,
                master,
                worker,
            },
            other => JobError::transport(
                format!(
                    "the master at {} refused worker {rank}: {other}",
                    self.target
                ),
                None,
            ),
        }
    }

    /// Reaches the master — the first time, or again after it was lost (for `lost`) — and
    /// completes the handshake, trying again with backoff until the connect timeout (the
    /// reconnect timeout after a loss). A connection that cannot be made, or that closes or
    /// goes silent in its handshake, is tried again; so is a refusal that may pass (a rank
    /// still held by the connection of the process this one replaces). At a steady
    /// interval (a quarter of the timeout, at most 10 s) it says what it tries to reach
    /// and the last error.
    async fn reach(
        &self,
        lost: Option<&str>,
    ) -> Result<(Frames, OwnedWriteHalf, Attempt), Unreached> {
        let s = &self.settings;
        let timeout = match lost {
            Some(_) => s.reconnect_timeout,
            None => s.connect_timeout,
        };
        let restarted = s.restart_count > 0;
        let started = Instant::now();
        let deadline = deadline_after(timeout);
        let every = log_every(timeout);
        let mut next_log = started + every;
        let mut backoff = Duration::from_millis(20);
        let mut gave_up = false;
        let mut stop = self.stop.clone();
        loop {
            if *stop.borrow() {
                return Err(Unreached::Lost(match lost {
                    Some(reason) => {
                        format!("{reason}; this process ended before the master was reached again")
                    }
                    None => "the job ended before the master could be reached".into(),
                }));
            }
            let last = match self.connect(deadline, every).await {
                Ok(stream) => match self.greet(stream).await {
                    Ok(joined) => return Ok(joined),
                    Err(Unreached::Refused(refusal)) => {
                        // A handshake given up on may have claimed the rank on the master's
                        // node after all: until it lets go, the rank is taken by this very
                        // process.
                        let last = match lost {
                            None => refusal.is_final_for(restarted || gave_up),
                            Some(_) => refusal.is_final_on_rejoin(),
                        };
                        if last {
                            return Err(Unreached::Refused(refusal));
                        }
                        format!("refused: {refusal}")
                    }
                    Err(Unreached::Lost(e)) => {
                        gave_up = true;
                        e
                    }
                },
                Err(e) => e,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(Unreached::Lost(match lost {
                    Some(reason) => {
                        format!("{reason}; not reached again within {timeout:?}: {last}")
                    }
                    None => format!(
                        "could not reach the master at {} within {timeout:?}: {last}",
                        self.target
                    ),
                }));
            }
            if now >= next_log {
                next_log = now + every;
                tracing::warn!(
                    rank = s.rank,
                    master = %self.target,
                    error = %last,
                    "still trying to reach the master ({:.0?} of {timeout:?})",
                    now.saturating_duration_since(started)
                );
            } else {
                tracing::debug!(rank = s.rank, master = %self.target, error = %last, "master not reached yet");
            }
            let pause = jittered(backoff).min(deadline.saturating_duration_since(now));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// The handshake on a new connection, within the handshake timeout.
    async fn greet(
        &self,
        stream: TcpStream,
    ) -> Result<(Frames, OwnedWriteHalf, Attempt), Unreached> {
        let s = &self.settings;
        let (reader, mut writer) = stream.into_split();
        let mut frames = Frames::new(reader);
        let handshake = self.handshake(&mut frames, &mut writer);
        match tokio::time::timeout(s.handshake_timeout, handshake).await {
            Ok(Ok(attempt)) => {
                frames.allow(s.max_frame);
                Ok((frames, writer, attempt))
            }
            Ok(Err(unreached)) => Err(unreached),
            Err(_) => Err(Unreached::Lost(format!(
                "no answer to the handshake within {:?}",
                s.handshake_timeout
            ))),
        }
    }

    /// Carries one connection's messages both ways until the job ends for this worker or
    /// the master is lost.
    async fn session(
        &self,
        frames: &mut Frames,
        writer: OwnedWriteHalf,
        queue: &mut mpsc::UnboundedReceiver<Bytes>,
        attempt: Attempt,
    ) -> SessionEnd {
        let s = &self.settings;
        let write = write_loop(
            Weak::clone(&self.to_master),
            writer,
            queue,
            self.stop.clone(),
            heartbeat_frame(s.max_frame),
            s.heartbeat_interval,
        );
        tokio::pin!(write);
        let read = self.read_loop(frames, attempt);
        tokio::pin!(read);
        tokio::select! {
            lost = &mut read => match lost {
                Some(reason) => SessionEnd::Lost(reason),
                // The job ended for this worker: what it still sends (its done) goes out
                // until the transport stops.
                None => {
                    let _ = write.await;
                    SessionEnd::Over
                }
            },
            written = &mut write => match written {
                Err(reason) => SessionEnd::Lost(reason),
                // The transport stopped, or this worker's link is gone: messages from the
                // master may still be on their way.
                Ok(()) => match read.await {
                    Some(reason) => SessionEnd::Lost(reason),
                    None => SessionEnd::Over,
                },
            },
        }
    }

    /// One try to connect to the master before `deadline`: resolves its name (a name that
    /// does not resolve is said as such), then tries its addresses in turn.
    /// Each step (resolving the name, connecting to an address) may take at most `slice`
    /// (and what is left until `deadline`): a name server or a host that does not answer
    /// is then tried again, and said, at a steady pace.
    async fn connect(&self, deadline: Instant, slice: Duration) -> Result<TcpStream, String> {
        let left = || {
            deadline.saturating_duration_since(Instant::now()).clamp(
                Duration::from_millis(1),
                slice.max(Duration::from_millis(1)),
            )
        };
        let host = self
            .target
            .rsplit_once(':')
            .map_or(self.target.as_str(), |(host, _)| host);
        let addrs: Vec<SocketAddr> =
            match tokio::time::timeout(left(), tokio::net::lookup_host(self.target.as_str())).await
            {
                Ok(Ok(addrs)) => addrs.collect(),
                Ok(Err(e)) => return Err(format!("the name {host} does not resolve: {e}")),
                Err(_) => return Err(format!("resolving the name {host} timed out")),
            };
        if addrs.is_empty() {
            return Err(format!("the name {host} resolves to no address"));
        }
        let mut last = String::new();
        for addr in addrs {
            match tokio::time::timeout(left(), TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(e)) => last = format!("could not connect to {addr}: {e}"),
                Err(_) => last = format!("connecting to {addr} timed out"),
            }
        }
        Err(last)
    }

    /// Hello, proof of the secret, welcome: returns the attempt the master's node runs.
    async fn handshake(
        &self,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
    ) -> Result<Attempt, Unreached> {
        let s = &self.settings;
        let lost = |what: &str| {
            let what = what.to_string();
            move |e: String| Unreached::Lost(format!("{what} during the handshake: {e}"))
        };
        // What the master answers: a master of another protocol version is another build,
        // and no retry changes that.
        let answer = |read: Result<Handshake, Unreadable>| match read {
            Ok(answer) => Ok(answer),
            Err(Unreadable::Version { ours, theirs }) => {
                Err(Unreached::Refused(Refusal::Mismatch {
                    field: "wire version".into(),
                    master: theirs.to_string(),
                    worker: ours.to_string(),
                }))
            }
            Err(Unreadable::Closed(how)) => Err(Unreached::Lost(format!("the master {how}"))),
            Err(other) => Err(lost("the master answered nothing")(other.to_string())),
        };
        let hello = Wire::<(), ()>::Hello {
            job_id: s.job_id.clone(),
            rank: s.rank,
            fingerprint: (*self.fingerprint).clone(),
        };
        let frame = wire::encode(&hello, wire::HANDSHAKE_MAX_FRAME)
            .map_err(|e| lost("could not encode its hello")(e.to_string()))?;
        write_frame(writer, &frame)
            .await
            .map_err(|e| lost("could not write")(e.to_string()))?;
        let nonce = match answer(frames.handshake().await)? {
            Wire::Challenge { nonce } => nonce,
            Wire::Refused { refusal } => return Err(Unreached::Refused(refusal)),
            _ => {
                return Err(Unreached::Lost(
                    "the master did not send a challenge".into(),
                ))
            }
        };
        let secret = s.secret.as_deref().unwrap_or_default();
        let mac = proof(secret, &nonce, &s.job_id, s.rank, &self.fingerprint)
            .finalize()
            .into_bytes()
            .to_vec();
        let frame = wire::encode(&Wire::<(), ()>::Proof { mac }, wire::HANDSHAKE_MAX_FRAME)
            .map_err(|e| lost("could not encode its proof")(e.to_string()))?;
        write_frame(writer, &frame)
            .await
            .map_err(|e| lost("could not write")(e.to_string()))?;
        match answer(frames.handshake().await)? {
            Wire::Welcome { attempt } => Ok(attempt),
            Wire::Refused { refusal } => Err(Unreached::Refused(refusal)),
            _ => Err(Unreached::Lost(
                "the master did not answer the proof".into(),
            )),
        }
    }

    /// Delivers the master's messages. A message that does not decode as the job's types
    /// fails this worker with [`JobError::Decode`] — the master is told at once, and the
    /// worker stops — and the connection goes on until the master's abort. Returns why the
    /// master was lost, or `None` when the job ended (finish or abort received) or the
    /// transport stopped.
    async fn read_loop(&self, frames: &mut Frames, attempt: Attempt) -> Option<String> {
        let timeout = self.settings.heartbeat_timeout;
        let rank = self.settings.rank;
        let mut undecodable = false;
        read_until_last::<M, W>(frames, timeout, self.stop.clone(), |wire| match wire {
            Err(message) => {
                if std::mem::replace(&mut undecodable, true) {
                    tracing::debug!(rank, %message, "another message could not be decoded");
                    return Ok(Delivered::More);
                }
                tracing::error!(rank, %message, "a message from the master could not be decoded");
                let direction = format!("master → worker {rank}");
                let error =
                    Undecodable::of::<ToWorker<M>>(direction, message).sent_by(&self.target);
                let failed = Wire::<(), ()>::ToMaster(ToMaster::Failed {
                    attempt,
                    error: error.clone(),
                });
                if let (Some(to_master), Ok(frame)) = (
                    self.to_master.upgrade(),
                    wire::encode(&failed, self.settings.max_frame),
                ) {
                    let _ = to_master.send(frame);
                }
                self.abort(attempt, error);
                Ok(Delivered::More)
            }
            Ok(Wire::ToWorker(msg)) => {
                let last = matches!(msg, ToWorker::Finish { .. } | ToWorker::Abort { .. });
                (self.inbox)(msg);
                Ok(if last {
                    Delivered::Last
                } else {
                    Delivered::More
                })
            }
            Ok(Wire::Refused { refusal }) => Err(format!("it closed this connection: {refusal}")),
            Ok(_) => Err("it sent a handshake message after the handshake".into()),
        })
        .await
    }
}

/// `backoff`, give or take a quarter, so that workers turned away together do not come
/// back together.
fn jittered(backoff: Duration) -> Duration {
    let mut random = [0u8; 2];
    let _ = getrandom::fill(&mut random);
    let unit = f64::from(u16::from_le_bytes(random)) / f64::from(u16::MAX);
    backoff.mul_f64(0.75 + 0.5 * unit)
}

/// `timeout` from now; a timeout too long to add (`Duration::MAX`) is a deadline that never
/// comes.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
