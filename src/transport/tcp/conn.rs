//! The connection tasks, run on the transport's I/O thread.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::task::TaskTracker;

use super::wire::{self, Wire};
use super::{Conns, TcpSettings};
use crate::compute::Payload;
use crate::error::JobError;
use crate::protocol::{Envelope, Rank, ToMaster, ToWorker};
use crate::transport::Inbox;

type Frames = FramedRead<OwnedReadHalf, LengthDelimitedCodec>;

/// The first attempt: the only one until attempts are restarted.
const ATTEMPT: u32 = 0;

/// The proof that a peer knows the secret: HMAC-SHA256 over the master's fresh nonce, the
/// job id and the rank, so a proof cannot be replayed for another connection, job or rank.
fn proof(secret: &[u8], nonce: &[u8; 32], job_id: &str, rank: Rank) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(nonce);
    mac.update(job_id.as_bytes());
    mac.update(&(rank as u64).to_le_bytes());
    mac
}

/// Reads one frame, or says why there is none.
async fn next_frame(frames: &mut Frames) -> Result<bytes::BytesMut, String> {
    match frames.next().await {
        Some(Ok(frame)) => Ok(frame),
        Some(Err(e)) => Err(format!("unreadable frame: {e}")),
        None => Err("the connection closed".into()),
    }
}

async fn write_frame(writer: &mut OwnedWriteHalf, frame: &[u8]) -> std::io::Result<()> {
    writer.write_all(frame).await
}

/// Writes queued frames, and a heartbeat whenever nothing else went out for a heartbeat
/// interval. When the transport stops, writes what is still queued, then ends.
async fn write_loop(
    mut writer: OwnedWriteHalf,
    mut queue: mpsc::UnboundedReceiver<Bytes>,
    mut stop: watch::Receiver<bool>,
    heartbeat: Bytes,
    interval: Duration,
) {
    loop {
        tokio::select! {
            frame = queue.recv() => match frame {
                Some(frame) => {
                    if write_frame(&mut writer, &frame).await.is_err() {
                        return;
                    }
                }
                None => break,
            },
            _ = tokio::time::sleep(interval) => {
                if write_frame(&mut writer, &heartbeat).await.is_err() {
                    return;
                }
            }
            _ = stop.changed() => {
                while let Ok(frame) = queue.try_recv() {
                    if write_frame(&mut writer, &frame).await.is_err() {
                        return;
                    }
                }
                break;
            }
        }
    }
    let _ = writer.shutdown().await;
}

fn heartbeat_frame(max: usize) -> Bytes {
    wire::encode(&Wire::<(), ()>::Heartbeat, max).expect("a heartbeat always encodes")
}

/// The master's node: accepts workers, checks their handshake, and carries their frames.
pub(super) struct Server<M, W> {
    pub(super) settings: Arc<TcpSettings>,
    pub(super) inbox: Arc<Inbox<Envelope<ToMaster<W>>>>,
    pub(super) conns: Conns,
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
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let server = self.clone();
                        self.tracker.spawn(server.connection(stream, peer));
                    }
                    Err(e) => tracing::warn!(error = %e, "accepting a connection failed"),
                },
                _ = stop.changed() => return,
            }
        }
    }

    async fn connection(self, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let (reader, mut writer) = stream.into_split();
        let mut frames = FramedRead::new(reader, wire::codec(wire::HANDSHAKE_MAX_FRAME));
        let handshake = self.handshake(&mut frames, &mut writer);
        let (rank, queue) = match tokio::time::timeout(self.settings.handshake_timeout, handshake)
            .await
        {
            Ok(Ok(accepted)) => accepted,
            Ok(Err(reason)) => {
                tracing::warn!(%peer, %reason, "refused a connection");
                if let Ok(frame) =
                    wire::encode(&Wire::<(), ()>::Refused { reason }, self.settings.max_frame)
                {
                    let _ = write_frame(&mut writer, &frame).await;
                }
                return;
            }
            Err(_) => {
                tracing::warn!(%peer, timeout = ?self.settings.handshake_timeout, "dropped a connection that did not complete its handshake in time");
                return;
            }
        };
        tracing::debug!(%peer, rank, "worker connected");
        // Proven: from now on frames up to the full limit.
        frames
            .decoder_mut()
            .set_max_frame_length(self.settings.max_frame);
        self.tracker.spawn(write_loop(
            writer,
            queue,
            self.stop.clone(),
            heartbeat_frame(self.settings.max_frame),
            self.settings.heartbeat_interval,
        ));
        let lost = self.read_loop(rank, &mut frames).await;
        self.conns.lock().unwrap_or_else(|e| e.into_inner())[rank] = None;
        if let Some(reason) = lost {
            tracing::warn!(rank, %peer, %reason, "worker lost");
            (self.inbox)(Envelope {
                from: rank,
                msg: ToMaster::Failed {
                    attempt: ATTEMPT,
                    error: JobError::WorkerLost { rank, reason },
                },
            });
        }
    }

    /// Checks a new connection: hello (version, job id, rank), then the secret's proof,
    /// then claims the rank. Returns the rank and its queue, or why it is refused.
    async fn handshake(
        &self,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
    ) -> Result<(Rank, mpsc::UnboundedReceiver<Bytes>), String> {
        let s = &self.settings;
        let hello =
            wire::decode::<Wire<M, W>>(&next_frame(frames).await?).map_err(|e| e.to_string())?;
        let Wire::Hello { job_id, rank } = hello else {
            return Err("expected a hello first".into());
        };
        if job_id != s.job_id {
            return Err(format!(
                "wrong job id: this master runs job {:?}, the peer asked for {job_id:?}",
                s.job_id
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
        let Wire::Proof { mac } =
            wire::decode::<Wire<M, W>>(&next_frame(frames).await?).map_err(|e| e.to_string())?
        else {
            return Err("expected a proof of the secret".into());
        };
        let secret = s.secret.as_deref().unwrap_or_default();
        proof(secret, &nonce, &job_id, rank)
            .verify_slice(&mac)
            .map_err(|_| format!("wrong secret: rank {rank}'s proof did not verify"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            if conns[rank].is_some() {
                return Err(format!("rank {rank} is already connected"));
            }
            conns[rank] = Some(tx);
        }
        let welcome =
            wire::encode(&Wire::<(), ()>::Welcome, s.max_frame).map_err(|e| e.to_string())?;
        if let Err(e) = write_frame(writer, &welcome).await {
            self.conns.lock().unwrap_or_else(|e| e.into_inner())[rank] = None;
            return Err(e.to_string());
        }
        Ok((rank, rx))
    }

    /// Delivers a connected worker's messages. Returns why it was lost, or `None` when it
    /// ended as it should (after its `Done`) or the transport stopped.
    async fn read_loop(&self, rank: Rank, frames: &mut Frames) -> Option<String> {
        let mut done = false;
        let mut stop = self.stop.clone();
        loop {
            let frame = tokio::select! {
                frame = tokio::time::timeout(self.settings.heartbeat_timeout, frames.next()) => frame,
                _ = stop.changed() => return None,
            };
            let frame = match frame {
                Err(_) => {
                    return Some(format!(
                        "silent for {:?} (no message, no heartbeat)",
                        self.settings.heartbeat_timeout
                    ))
                }
                Ok(None) if done => return None,
                Ok(None) => return Some("its connection closed".into()),
                Ok(Some(Err(e))) => return Some(format!("unreadable frame: {e}")),
                Ok(Some(Ok(frame))) => frame,
            };
            match wire::decode::<Wire<M, W>>(&frame) {
                Ok(Wire::Heartbeat) => {}
                Ok(Wire::ToMaster(msg)) => {
                    done |= matches!(msg, ToMaster::Done { .. });
                    (self.inbox)(Envelope { from: rank, msg });
                }
                Ok(_) => return Some("it sent a handshake message after its handshake".into()),
                Err(e) => return Some(e.to_string()),
            }
        }
    }
}

/// A worker's connection to the master's node.
pub(super) struct Client<M, W> {
    pub(super) settings: Arc<TcpSettings>,
    pub(super) target: String,
    pub(super) inbox: Inbox<ToWorker<M>>,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) tracker: TaskTracker,
    pub(super) _types: PhantomData<fn() -> W>,
}

impl<M: Payload, W: Payload> Client<M, W> {
    fn abort(&self, error: JobError) {
        (self.inbox)(ToWorker::Abort {
            attempt: ATTEMPT,
            error,
        });
    }

    pub(super) async fn run(self, queue: mpsc::UnboundedReceiver<Bytes>) {
        let s = Arc::clone(&self.settings);
        let stream = match self.connect().await {
            Ok(stream) => stream,
            Err(reason) => {
                tracing::error!(rank = s.rank, %reason, "cannot reach the master");
                return self.abort(JobError::MasterLost { reason });
            }
        };
        let (reader, mut writer) = stream.into_split();
        let mut frames = FramedRead::new(reader, wire::codec(wire::HANDSHAKE_MAX_FRAME));
        let handshake = self.handshake(&mut frames, &mut writer);
        match tokio::time::timeout(s.handshake_timeout, handshake).await {
            Ok(Ok(())) => frames.decoder_mut().set_max_frame_length(s.max_frame),
            Ok(Err(reason)) => {
                tracing::error!(rank = s.rank, %reason, "the master refused this worker");
                return self.abort(JobError::Transport {
                    message: format!(
                        "the master at {} refused worker {}: {reason}",
                        self.target, s.rank
                    ),
                });
            }
            Err(_) => {
                return self.abort(JobError::MasterLost {
                    reason: format!(
                        "no answer to the handshake within {:?}",
                        s.handshake_timeout
                    ),
                })
            }
        }
        self.tracker.spawn(write_loop(
            writer,
            queue,
            self.stop.clone(),
            heartbeat_frame(s.max_frame),
            s.heartbeat_interval,
        ));
        if let Some(reason) = self.read_loop(&mut frames).await {
            tracing::error!(rank = s.rank, %reason, "master lost");
            self.abort(JobError::MasterLost { reason });
        }
    }

    /// Connects to the master, retrying with backoff until the connect timeout: the master
    /// may start after its workers.
    async fn connect(&self) -> Result<TcpStream, String> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            match TcpStream::connect(&self.target).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(e) if started.elapsed() >= self.settings.connect_timeout => {
                    return Err(format!(
                        "could not connect to {} within {:?}: {e}",
                        self.target, self.settings.connect_timeout
                    ))
                }
                Err(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    async fn handshake(
        &self,
        frames: &mut Frames,
        writer: &mut OwnedWriteHalf,
    ) -> Result<(), String> {
        let s = &self.settings;
        let hello = Wire::<(), ()>::Hello {
            job_id: s.job_id.clone(),
            rank: s.rank,
        };
        let frame = wire::encode(&hello, s.max_frame).map_err(|e| e.to_string())?;
        write_frame(writer, &frame)
            .await
            .map_err(|e| e.to_string())?;
        let nonce = match wire::decode::<Wire<M, W>>(&next_frame(frames).await?)
            .map_err(|e| e.to_string())?
        {
            Wire::Challenge { nonce } => nonce,
            Wire::Refused { reason } => return Err(reason),
            _ => return Err("the master did not send a challenge".into()),
        };
        let secret = s.secret.as_deref().unwrap_or_default();
        let mac = proof(secret, &nonce, &s.job_id, s.rank)
            .finalize()
            .into_bytes()
            .to_vec();
        let frame =
            wire::encode(&Wire::<(), ()>::Proof { mac }, s.max_frame).map_err(|e| e.to_string())?;
        write_frame(writer, &frame)
            .await
            .map_err(|e| e.to_string())?;
        match wire::decode::<Wire<M, W>>(&next_frame(frames).await?).map_err(|e| e.to_string())? {
            Wire::Welcome => Ok(()),
            Wire::Refused { reason } => Err(reason),
            _ => Err("the master did not answer the proof".into()),
        }
    }

    /// Delivers the master's messages. Returns why the master was lost, or `None` when
    /// the job ended (finish or abort received) or the transport stopped.
    async fn read_loop(&self, frames: &mut Frames) -> Option<String> {
        let mut ended = false;
        let mut stop = self.stop.clone();
        loop {
            let frame = tokio::select! {
                frame = tokio::time::timeout(self.settings.heartbeat_timeout, frames.next()) => frame,
                _ = stop.changed() => return None,
            };
            let frame = match frame {
                Err(_) if ended => return None,
                Err(_) => {
                    return Some(format!(
                        "silent for {:?} (no message, no heartbeat)",
                        self.settings.heartbeat_timeout
                    ))
                }
                Ok(None) if ended => return None,
                Ok(None) => return Some("its connection closed".into()),
                Ok(Some(Err(e))) => return Some(format!("unreadable frame: {e}")),
                Ok(Some(Ok(frame))) => frame,
            };
            match wire::decode::<Wire<M, W>>(&frame) {
                Ok(Wire::Heartbeat) => {}
                Ok(Wire::ToWorker(msg)) => {
                    ended |= matches!(msg, ToWorker::Finish { .. } | ToWorker::Abort { .. });
                    (self.inbox)(msg);
                }
                Ok(Wire::Refused { reason }) => {
                    return Some(format!("it closed this connection: {reason}"))
                }
                Ok(_) => return Some("it sent a handshake message after the handshake".into()),
                Err(e) => return Some(e.to_string()),
            }
        }
    }
}
