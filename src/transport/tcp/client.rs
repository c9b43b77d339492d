//! A worker's end of the TCP transport: it reaches the master's node (again, after a loss,
//! within the reconnect timeout), proves the secret in its handshake, and carries the
//! master's messages to the worker and the worker's to the master.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use super::admission::log_every;
use super::conn::*;
use super::lane::Lane;
use super::wire::{self, Refusal, Wire};
use super::TcpSettings;
use crate::codec::Undecodable;
use crate::error::JobError;
use crate::ids::Attempt;
use crate::payload::Payload;
use crate::protocol::{ToMaster, ToWorker};
use crate::transport::{Fingerprint, Inbox};

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
    /// The attempt the worker runs in: the one it starts in, until a welcome or a gang
    /// restart says another. What an abort this connection makes is for; shared with the
    /// worker's link, whose `Done` of this attempt is its last word.
    pub(super) attempt: Arc<AtomicU32>,
    /// The worker's queue of frames for the master, for a failure the connection itself
    /// finds (a message that does not decode). Weak: the queue ends when the worker's
    /// link is dropped, as it must for the writer to end.
    pub(super) to_master: Weak<Lane>,
    /// This worker's way to its peers, when the job asked for one: where they reach it
    /// goes in the hello, and where they listen comes from the master.
    pub(super) mesh: Option<Arc<super::peer::Mesh>>,
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
        let mut lost: Option<String> = None;
        loop {
            let (mut frames, writer, joined_attempt) = match self.reach(lost.as_deref()).await {
                Ok(joined) => joined,
                Err(Unreached::Lost(reason)) => {
                    tracing::error!(rank = s.rank, %reason, "cannot reach the master");
                    return self.abort(JobError::MasterLost { reason });
                }
                Err(Unreached::Refused(refusal)) => {
                    tracing::error!(rank = s.rank, %refusal, "the master refused this worker");
                    let error = self.refused(refusal);
                    return self.abort(error);
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
            let attempt = joined_attempt;
            self.attempt.store(attempt, Ordering::Release);
            if let Some(mesh) = &self.mesh {
                mesh.joined(attempt);
            }
            (self.inbox)(ToWorker::Connected { attempt });
            match self.session(&mut frames, writer, &mut queue).await {
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
                    (self.inbox)(ToWorker::Reconnecting {
                        reason: reason.clone(),
                    });
                    lost = Some(reason);
                }
                SessionEnd::Lost(reason) => {
                    tracing::error!(rank = s.rank, %reason, "master lost");
                    return self.abort(JobError::MasterLost { reason });
                }
            }
        }
    }

    /// Ends the job for this worker, in the attempt it runs.
    fn abort(&self, error: JobError) {
        let attempt = self.attempt.load(Ordering::Acquire);
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
                        "could not reach the master at {}{} within {timeout:?}: {last}",
                        self.target,
                        from_note(s)
                    ),
                }));
            }
            if now >= next_log {
                next_log = now + every;
                tracing::warn!(
                    rank = s.rank,
                    master = %self.target,
                    error = %last,
                    "still trying to reach the master{} ({:.0?} of {timeout:?})",
                    from_note(s),
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
        let read = self.read_loop(frames);
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
            Err(Unreadable::Stranger(text)) => Err(Unreached::Lost(format!(
                "{} is not a superstep master: it answered {text:?}",
                s.master_addr
            ))),
            Err(other) => Err(lost("the master's answer could not be read")(
                other.to_string(),
            )),
        };
        let peer_addr = match (&self.mesh, writer.local_addr()) {
            (Some(mesh), Ok(local)) => Some(mesh.advertised(local)),
            _ => None,
        };
        let hello = Wire::<(), ()>::Hello {
            job_id: s.job_id.clone(),
            rank: s.rank,
            fingerprint: (*self.fingerprint).clone(),
            peer_addr,
            restarts_left: s.restarts_left,
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
        let mac = proof_to_send(
            s.secret.as_deref(),
            &nonce,
            &s.job_id,
            s.rank,
            &self.fingerprint,
        );
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
    async fn read_loop(&self, frames: &mut Frames) -> Option<String> {
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
                    attempt: self.attempt.load(Ordering::Acquire),
                    error: error.clone(),
                });
                if let (Some(to_master), Ok(frame)) = (
                    self.to_master.upgrade(),
                    wire::encode(&failed, self.settings.max_frame),
                ) {
                    let _ = to_master.send(frame);
                }
                self.abort(error);
                Ok(Delivered::More)
            }
            Ok(Wire::ToWorker(msg)) => {
                // A gang restart: the worker's process replaces its worker, which runs in
                // the new attempt; peers lost in the old one are tried again. (A worker
                // that failed may have said its `Done` before: the master's node reads on.)
                if let ToWorker::Restart { attempt, .. } = &msg {
                    self.attempt.store(*attempt, Ordering::Release);
                    // The old worker's `Done` was not the rank's last word.
                    self.said_done.store(false, Ordering::SeqCst);
                    if let Some(mesh) = &self.mesh {
                        mesh.joined(*attempt);
                    }
                }
                let last = matches!(msg, ToWorker::Finish { .. } | ToWorker::Abort { .. });
                (self.inbox)(msg);
                Ok(if last {
                    Delivered::Last
                } else {
                    Delivered::More
                })
            }
            Ok(Wire::PeerTable { addrs }) => {
                if let Some(mesh) = &self.mesh {
                    mesh.learn(addrs);
                }
                Ok(Delivered::More)
            }
            Ok(Wire::Refused { refusal }) => Err(format!("it closed this connection: {refusal}")),
            Ok(_) => Err("it sent a handshake message after the handshake".into()),
        })
        .await
        .map(|error| error.to_string())
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

/// ` (check MASTER_ADDR and MASTER_PORT)` when the environment gave the master's address:
/// the variables a wrong address came from.
fn from_note(s: &super::TcpSettings) -> String {
    s.master_addr_from
        .map(|from| format!(" (check {from})"))
        .unwrap_or_default()
}
