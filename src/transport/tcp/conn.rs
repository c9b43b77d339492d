//! The connection tasks, run on the transport's I/O thread.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
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
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::task::TaskTracker;

use super::wire::{self, Wire};
use super::{Conns, TcpSettings};
use crate::compute::Payload;
use crate::error::{Cause, JobError};
use crate::protocol::{Attempt, Envelope, Rank, ToMaster, ToWorker};
use crate::transport::Inbox;

/// The attempt a worker starts in, until a master's node tells it another.
pub(super) const FIRST_ATTEMPT: Attempt = 0;

/// How many connections may be in their handshake at once; more are closed at once, so
/// that unauthenticated peers cannot hold much of the master's memory or time.
const HANDSHAKES_IN_FLIGHT: usize = 64;

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
                Ok(Some(Ok(frame))) => return Ok(Some(frame)),
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
    async fn handshake(&mut self) -> Result<Handshake, String> {
        let frame = match self.frames.next().await {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Err(format!("unreadable frame: {e}")),
            None => return Err("the connection closed".into()),
        };
        wire::decode::<Handshake>(&frame).map_err(|e| e.to_string())
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
/// job id and the rank, so a proof cannot be replayed for another connection, job or rank.
fn proof(secret: &[u8], nonce: &[u8; 32], job_id: &str, rank: Rank) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(nonce);
    mac.update(job_id.as_bytes());
    mac.update(&(rank as u64).to_le_bytes());
    mac
}

async fn write_frame(writer: &mut OwnedWriteHalf, frame: &[u8]) -> std::io::Result<()> {
    writer.write_all(frame).await
}

/// Writes queued frames, and a heartbeat whenever nothing else went out for a heartbeat
/// interval. When the transport stops, writes what is still queued, then ends. Returns
/// why a write failed, if one did.
async fn write_loop(
    mut writer: OwnedWriteHalf,
    queue: &mut mpsc::UnboundedReceiver<Bytes>,
    mut stop: watch::Receiver<bool>,
    heartbeat: Bytes,
    interval: Duration,
) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("could not write to it: {e}");
    loop {
        tokio::select! {
            frame = queue.recv() => match frame {
                Some(frame) => write_frame(&mut writer, &frame).await.map_err(failed)?,
                None => break,
            },
            _ = tokio::time::sleep(interval) => {
                write_frame(&mut writer, &heartbeat).await.map_err(failed)?;
            }
            _ = stop.changed() => {
                while let Ok(frame) = queue.try_recv() {
                    write_frame(&mut writer, &frame).await.map_err(failed)?;
                }
                break;
            }
        }
    }
    let _ = writer.shutdown().await;
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

/// A rank claimed by a connection: released however the connection ends.
struct Claim {
    conns: Conns,
    rank: Rank,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())[self.rank] = None;
    }
}

/// The master's node: accepts workers, checks their handshake, and carries their frames.
pub(super) struct Server<M, W> {
    pub(super) settings: Arc<TcpSettings>,
    pub(super) inbox: Arc<Inbox<Envelope<ToMaster<W>>>>,
    pub(super) conns: Conns,
    /// The attempt this master's node runs: every worker that connects is told it.
    pub(super) attempt: Attempt,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) tracker: TaskTracker,
    pub(super) _types: PhantomData<fn() -> M>,
}

impl<M, W> Clone for Server<M, W> {
    fn clone(&self) -> Self {
        Server {
            settings: Arc::clone(&self.settings),
            inbox: Arc::clone(&self.inbox),
            conns: Arc::clone(&self.conns),
            attempt: self.attempt,
            stop: self.stop.clone(),
            tracker: self.tracker.clone(),
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
        let handshakes = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT));
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let Ok(permit) = Arc::clone(&handshakes).try_acquire_owned() else {
                            tracing::warn!(%peer, "too many connections in their handshake; closed this one");
                            continue;
                        };
                        let server = self.clone();
                        self.tracker.spawn(server.connection(stream, peer, permit));
                    }
                    Err(e) => {
                        // Out of file handles, say: do not spin.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = stop.changed() => return,
            }
        }
    }

    async fn connection(
        self,
        stream: TcpStream,
        peer: SocketAddr,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let s = Arc::clone(&self.settings);
        let _ = stream.set_nodelay(true);
        let (reader, mut writer) = stream.into_split();
        let mut frames = Frames::new(reader);
        let handshake = self.handshake(&mut frames, &mut writer);
        let accepted = tokio::time::timeout(s.handshake_timeout, handshake).await;
        drop(permit);
        let (claim, queue) = match accepted {
            Ok(Ok(accepted)) => accepted,
            Ok(Err(reason)) => {
                tracing::warn!(%peer, %reason, "refused a connection");
                if let Ok(frame) = wire::encode(
                    &Wire::<(), ()>::Refused { reason },
                    wire::HANDSHAKE_MAX_FRAME,
                ) {
                    let _ =
                        tokio::time::timeout(s.handshake_timeout, write_frame(&mut writer, &frame))
                            .await;
                }
                return;
            }
            Err(_) => {
                tracing::warn!(%peer, timeout = ?s.handshake_timeout, "dropped a connection that did not complete its handshake in time");
                return;
            }
        };
        let rank = claim.rank;
        tracing::debug!(%peer, rank, "worker connected");
        // Proven: from now on frames up to the full limit.
        frames.allow(s.max_frame);
        let (stop, heartbeat) = (self.stop.clone(), heartbeat_frame(s.max_frame));
        let interval = s.heartbeat_interval;
        self.tracker.spawn(async move {
            let mut queue = queue;
            // A failed write shows as a closed connection to the reader.
            let _ = write_loop(writer, &mut queue, stop, heartbeat, interval).await;
        });
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

    /// Checks a new connection: hello (version, job id, rank), then the secret's proof,
    /// then claims the rank. Returns the claim and the rank's queue, or why it is refused.
    async fn handshake(
        &self,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
    ) -> Result<(Claim, mpsc::UnboundedReceiver<Bytes>), String> {
        let s = &self.settings;
        let Wire::Hello { job_id, rank } = frames.handshake().await? else {
            return Err("expected a hello first".into());
        };
        if job_id != s.job_id {
            return Err(format!(
                "wrong job id: the peer asked for {:?}",
                clip(&job_id, 64)
            ));
        }
        if rank >= s.world_size {
            return Err(format!("rank {rank} is outside 0..{}", s.world_size));
        }
        let mut nonce = [0u8; 32];
        getrandom::fill(&mut nonce).map_err(|e| format!("no randomness for a challenge: {e}"))?;
        let challenge = wire::encode(&Wire::<(), ()>::Challenge { nonce }, s.max_frame)
            .map_err(|e| e.to_string())?;
        write_frame(writer, &challenge)
            .await
            .map_err(|e| e.to_string())?;
        let Wire::Proof { mac } = frames.handshake().await? else {
            return Err("expected a proof of the secret".into());
        };
        let secret = s.secret.as_deref().unwrap_or_default();
        proof(secret, &nonce, &job_id, rank)
            .verify_slice(&mac)
            .map_err(|_| format!("wrong secret: rank {rank}'s proof did not verify"))?;
        if *self.stop.borrow() {
            return Err("the master's node is stopping".into());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let claim = {
            let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            if conns[rank].is_some() {
                return Err(format!("rank {rank} is already connected"));
            }
            conns[rank] = Some(tx);
            Claim {
                conns: Arc::clone(&self.conns),
                rank,
            }
        };
        let welcome = Wire::<(), ()>::Welcome {
            attempt: self.attempt,
        };
        let welcome = wire::encode(&welcome, s.max_frame).map_err(|e| e.to_string())?;
        write_frame(writer, &welcome)
            .await
            .map_err(|e| e.to_string())?;
        Ok((claim, rx))
    }

    /// Delivers a connected worker's messages. A message that does not decode as the job's
    /// types fails the job with [`JobError::Decode`], naming the rank, the type and the
    /// peer; the connection goes on (its `Done` still ends it). Returns why the worker was
    /// lost, or `None` when it ended as it should (after its `Done`) or the transport
    /// stopped.
    async fn read_loop(&self, rank: Rank, peer: SocketAddr, frames: &mut Frames) -> Option<String> {
        let timeout = self.settings.heartbeat_timeout;
        read_until_last::<M, W>(frames, timeout, self.stop.clone(), |wire| match wire {
            Err(message) => {
                tracing::error!(rank, %peer, %message, "a worker's message could not be decoded");
                let error = JobError::Decode {
                    direction: format!("worker {rank} → master"),
                    type_name: std::any::type_name::<ToMaster<W>>().to_string(),
                    peer: peer.to_string(),
                    message,
                };
                (self.inbox)(Envelope {
                    from: rank,
                    msg: ToMaster::Failed {
                        attempt: self.attempt,
                        error,
                    },
                });
                Ok(Delivered::More)
            }
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
    /// Whether the worker queued its last message: after it, a lost master is no loss.
    pub(super) said_done: Arc<AtomicBool>,
    pub(super) stop: watch::Receiver<bool>,
    /// The attempt the worker starts in, until a welcome says another: what an abort
    /// before the first welcome is for.
    pub(super) first_attempt: Attempt,
    /// The worker's queue of frames for the master, for a failure the connection itself
    /// finds (a message that does not decode). Weak: the queue ends when the worker's
    /// link is dropped, as it must for the writer to end.
    pub(super) to_master: mpsc::WeakUnboundedSender<Bytes>,
    pub(super) _types: PhantomData<fn() -> W>,
}

/// How a worker's attempt to reach the master failed.
enum Unreached {
    /// Not reached (no connection, or no answer to the handshake): the master is lost.
    Lost(String),
    /// The master refused this worker.
    Refused(String),
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
            let joined = match &lost {
                None => self.join().await,
                Some(reason) => self.rejoin(reason).await,
            };
            let (mut frames, writer, joined_attempt) = match joined {
                Ok(joined) => joined,
                Err(Unreached::Lost(reason)) => {
                    tracing::error!(rank = s.rank, %reason, "cannot reach the master");
                    return self.abort(attempt, JobError::MasterLost { reason });
                }
                Err(Unreached::Refused(reason)) => {
                    tracing::error!(rank = s.rank, %reason, "the master refused this worker");
                    return self.abort(
                        attempt,
                        JobError::Transport {
                            message: format!(
                                "the master at {} refused worker {}: {reason}",
                                self.target, s.rank
                            ),
                        },
                    );
                }
            };
            if lost.is_some() {
                let mut dropped = 0;
                while queue.try_recv().is_ok() {
                    dropped += 1;
                }
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

    /// The first connection: retried until the connect timeout (the master may start
    /// after its workers); a refusal is final.
    async fn join(&self) -> Result<(Frames, OwnedWriteHalf, Attempt), Unreached> {
        let s = &self.settings;
        let stream = self
            .connect(deadline_after(s.connect_timeout))
            .await
            .map_err(|e| Unreached::Lost(format!("{e} (tried for {:?})", s.connect_timeout)))?;
        self.greet(stream).await
    }

    /// A connection after the master was lost (for `reason`): connection and handshake
    /// retried, refusals included (the master's node may still hold this rank's old
    /// connection), until the reconnect timeout.
    async fn rejoin(&self, reason: &str) -> Result<(Frames, OwnedWriteHalf, Attempt), Unreached> {
        let s = &self.settings;
        let deadline = deadline_after(s.reconnect_timeout);
        let mut backoff = Duration::from_millis(20);
        let mut stop = self.stop.clone();
        loop {
            if *stop.borrow() {
                return Err(Unreached::Lost(format!(
                    "{reason}; this process ended before the master was reached again"
                )));
            }
            let last = match self.connect(deadline).await {
                Ok(stream) => match self.greet(stream).await {
                    Ok(joined) => return Ok(joined),
                    Err(Unreached::Lost(e) | Unreached::Refused(e)) => e,
                },
                Err(e) => e,
            };
            if Instant::now() >= deadline || *stop.borrow() {
                return Err(Unreached::Lost(format!(
                    "{reason}; not reached again within {:?}: {last}",
                    s.reconnect_timeout
                )));
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
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
            Ok(Err(reason)) => Err(Unreached::Refused(reason)),
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

    /// Connects to the master, retrying with backoff until `deadline`.
    async fn connect(&self, deadline: Instant) -> Result<TcpStream, String> {
        let mut backoff = Duration::from_millis(20);
        let mut stop = self.stop.clone();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = tokio::time::timeout(left, TcpStream::connect(&self.target));
            let error = tokio::select! {
                attempt = attempt => match attempt {
                    Ok(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        return Ok(stream);
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "timed out".to_string(),
                },
                _ = stop.changed() => return Err("the job ended before the master could be reached".into()),
            };
            if Instant::now() >= deadline {
                return Err(format!("could not connect to {}: {error}", self.target));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Hello, proof of the secret, welcome: returns the attempt the master's node runs.
    async fn handshake(
        &self,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
    ) -> Result<Attempt, String> {
        let s = &self.settings;
        let hello = Wire::<(), ()>::Hello {
            job_id: s.job_id.clone(),
            rank: s.rank,
        };
        let frame = wire::encode(&hello, wire::HANDSHAKE_MAX_FRAME).map_err(|e| e.to_string())?;
        write_frame(writer, &frame)
            .await
            .map_err(|e| e.to_string())?;
        let nonce = match frames.handshake().await? {
            Wire::Challenge { nonce } => nonce,
            Wire::Refused { reason } => return Err(reason),
            _ => return Err("the master did not send a challenge".into()),
        };
        let secret = s.secret.as_deref().unwrap_or_default();
        let mac = proof(secret, &nonce, &s.job_id, s.rank)
            .finalize()
            .into_bytes()
            .to_vec();
        let frame = wire::encode(&Wire::<(), ()>::Proof { mac }, wire::HANDSHAKE_MAX_FRAME)
            .map_err(|e| e.to_string())?;
        write_frame(writer, &frame)
            .await
            .map_err(|e| e.to_string())?;
        match frames.handshake().await? {
            Wire::Welcome { attempt } => Ok(attempt),
            Wire::Refused { reason } => Err(reason),
            _ => Err("the master did not answer the proof".into()),
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
        read_until_last::<M, W>(frames, timeout, self.stop.clone(), |wire| match wire {
            Err(message) => {
                tracing::error!(rank, %message, "a message from the master could not be decoded");
                let error = JobError::Decode {
                    direction: format!("master → worker {rank}"),
                    type_name: std::any::type_name::<ToWorker<M>>().to_string(),
                    peer: self.target.clone(),
                    message,
                };
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
            Ok(Wire::Refused { reason }) => Err(format!("it closed this connection: {reason}")),
            Ok(_) => Err("it sent a handshake message after the handshake".into()),
        })
        .await
    }
}

/// `timeout` from now; a timeout too long to add (`Duration::MAX`) is a deadline that never
/// comes.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
