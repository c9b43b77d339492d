//! The master's end of the TCP transport: it accepts workers' connections, admits their
//! handshakes (the secret's proof, the job's fingerprint, the rank's claim), carries their
//! frames to the master's node, and tells the node when one is lost.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::admission::{log_every, Refusals, Unproven};
use super::conn::*;
use super::lane::Lane;
use super::wire::{self, Refusal, Wire};
use super::{lock, Shared, TcpSettings};
use crate::codec::Undecodable;
use crate::error::{JobError, Waiting};
use crate::ids::{Attempt, Rank};
use crate::payload::Payload;
use crate::protocol::{Envelope, ToMaster};
use crate::transport::{Fingerprint, Inbox};

/// A rank claimed by a connection: released however the connection ends.
struct Claim {
    peers: Shared,
    rank: Rank,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut peers = lock(&self.peers);
        peers.conns[self.rank] = None;
        peers.remote[self.rank] = None;
        peers.closing[self.rank] = false;
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
            stop: self.stop.clone(),
            tracker: self.tracker.clone(),
            unproven: Arc::clone(&self.unproven),
            refusals: Arc::clone(&self.refusals),
            _types: PhantomData,
        }
    }
}

impl<M: Payload, W: Payload> Server<M, W> {
    /// The attempt the master's node runs: every worker that connects is told it; a gang
    /// restart moves it on ([`Peers::attempt`](super::Peers)).
    fn attempt(&self) -> Attempt {
        lock(&self.peers).attempt
    }

    pub(super) async fn serve(self, listener: std::net::TcpListener) {
        self.tracker
            .spawn(self.clone().watch(Instant::now()).in_current_span());
        let (unproven, tracker) = (Arc::clone(&self.unproven), self.tracker.clone());
        let stop = self.stop.clone();
        accept_each(
            listener,
            &unproven,
            &tracker,
            stop,
            "workers",
            |stream, peer, id, token| self.clone().connection(stream, peer, id, token),
        )
        .await;
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
                    heard: Vec::new(),
                };
                (self.inbox)(Envelope {
                    from: missing[0],
                    msg: ToMaster::Failed {
                        attempt: self.attempt(),
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
        // Whether it comes from another host, as its two ends' addresses tell.
        let remote = stream
            .local_addr()
            .ok()
            .map(|local| super::another_host(local.ip(), peer.ip()));
        let (reader, mut writer) = stream.into_split();
        let mut frames = Frames::new(reader);
        let mut stop = self.stop.clone();
        let shaken = tokio::select! {
            shaken = tokio::time::timeout(
                s.handshake_timeout,
                self.handshake(&mut frames, &mut writer, remote),
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
        tracing::debug!(%peer, rank, ?remote, "worker connected");
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
        if let Some(lost) = lost {
            let error = match lost {
                ReadError::TooLarge(big) => JobError::FrameTooLarge {
                    rank,
                    peer: peer.to_string(),
                    bytes: big.bytes,
                    limit: big.limit,
                },
                ReadError::Lost(reason) => JobError::WorkerLost { rank, reason },
            };
            tracing::warn!(rank, %peer, %error, "worker lost");
            // Not a connection of the rank any more, for whoever hears of the loss.
            lock(&self.peers).closing[rank] = true;
            (self.inbox)(Envelope {
                from: rank,
                msg: ToMaster::Failed {
                    attempt: self.attempt(),
                    error,
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
                attempt: self.attempt(),
                error,
            },
        });
    }

    /// Checks a new connection: hello (version, job id, rank, fingerprint), then the
    /// secret's proof, then — proven — the fingerprint, then claims the rank (with
    /// whether the connection comes from another host, `remote`). Returns the
    /// claim and the rank's queue, or why it is refused (with the rank it claimed).
    async fn handshake(
        &self,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
        remote: Option<bool>,
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
            peer_addr,
            restarts_left,
        } = frames.handshake().await.map_err(|e| refused(None, e))?
        else {
            return Err(broken(None)("expected a hello first".into()));
        };
        // The rank it claims, for what is said of it: not proven, but all there is to name
        // a misconfigured process by.
        let claimed = Some(rank);
        if job_id != s.job_id {
            let asked = clip(&job_id, 64);
            let ours = s.job_id.clone();
            return Err((claimed, Refusal::WrongJob { asked, ours }));
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
        check_proof(s.secret.as_deref(), &mac, || {
            proof(
                s.secret.as_deref().unwrap_or_default(),
                &nonce,
                &job_id,
                rank,
                &fingerprint,
            )
        })
        .map_err(|refusal| (claimed, refusal))?;
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
        let attempt;
        let claim = {
            let mut peers = lock(&self.peers);
            if peers.holds(rank) {
                return Err((claimed, Refusal::RankTaken { rank }));
            }
            peers.conns[rank] = Some(Arc::clone(&lane));
            peers.remote[rank] = remote;
            // Under the lock a gang restart's broadcast takes: a connection is welcomed in
            // the new attempt, or hears the restart after its welcome.
            attempt = peers.attempt;
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
        let welcome = Wire::<(), ()>::Welcome { attempt };
        let welcome =
            wire::encode(&welcome, s.max_frame).map_err(|e| broken(claimed)(e.to_string()))?;
        write_frame(writer, &welcome)
            .await
            .map_err(|e| broken(claimed)(e.to_string()))?;
        // Welcomed: the rank has connected (what the master's node waits for at start).
        let mut peers = lock(&self.peers);
        peers.ever[rank] = true;
        // A process started again knows how many restarts its launcher has left now.
        if let Some(left) = restarts_left {
            peers.restarts_left = Some(peers.restarts_left.map_or(left, |l| l.min(left)));
        }
        // Where its peers reach it: every worker is told every rank's address.
        if let Some(addr) = peer_addr {
            peers.addrs[rank] = Some(clip(&addr, 300));
            let table = Wire::<(), ()>::PeerTable {
                addrs: peers.addrs.clone(),
            };
            if let Ok(frame) = wire::encode(&table, s.max_frame) {
                for lane in peers.conns.iter().flatten() {
                    let _ = lane.send(frame.clone());
                }
            }
        }
        drop(peers);
        Ok((claim, (Arc::downgrade(&lane), rx)))
    }

    /// Delivers a connected worker's messages. A message that does not decode as the job's
    /// types fails the job with [`JobError::Decode`], naming the rank, the type and the
    /// peer (the first such message of the connection; later ones are dropped); the
    /// connection goes on (its `Done` still ends it). A failure only the master's node can
    /// report, sent by a worker, loses the worker. Returns why the worker was lost, or
    /// `None` when it ended as it should (after its `Done`) or the transport stopped.
    async fn read_loop(
        &self,
        rank: Rank,
        peer: SocketAddr,
        frames: &mut Frames,
    ) -> Option<ReadError> {
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
                        attempt: self.attempt(),
                        error,
                    },
                });
                Ok(Delivered::More)
            }
            // The master's side says these: a worker that says it was lost, say, would
            // make its connection's end a second failure of the rank.
            Ok(Wire::ToMaster(ToMaster::Failed {
                error:
                    JobError::WorkerLost { .. }
                    | JobError::Mismatch { .. }
                    | JobError::WorkersTimedOut { .. },
                ..
            })) => Err("it sent a failure only the master's side reports (a worker lost, a process of another job, workers timed out)".into()),
            Ok(Wire::ToMaster(msg)) => {
                // Only a `Done` of this node's attempt ends the connection: one the worker
                // queued for a master before this one is dropped by the gate as stale.
                let last = matches!(msg, ToMaster::Done { attempt, .. } if attempt == self.attempt());
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
