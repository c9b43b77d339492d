//! What both ends of a TCP connection do alike, on the transport's I/O thread: frames read
//! with a silence timeout, written by a loop with heartbeats, the handshake's proof of the
//! secret, and the read loop that hands each message on until the peer's last.
//! The master's end is `server.rs`, a worker's `client.rs`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use serde::de::IgnoredAny;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;

use super::lane::{Lane, Writing};
use super::wire::{self, FrameCodec, FrameTooLarge, Refusal, Wire, WireError};
use crate::error::Cause;
use crate::ids::Rank;
use crate::payload::Payload;
use crate::transport::Fingerprint;

/// Handshake frames are decoded without the job's types: no user `Deserialize` code runs on
/// bytes from a peer that has not proved the secret.
pub(super) type Handshake = Wire<IgnoredAny, IgnoredAny>;

/// A read half that notes when its last bytes arrived: a peer in the middle of sending a
/// large frame is not silent.
pub(super) struct Watched {
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
pub(super) struct Frames {
    frames: FramedRead<Watched, FrameCodec>,
    origin: Instant,
    last: Arc<AtomicU64>,
}

impl Frames {
    pub(super) fn new(reader: OwnedReadHalf) -> Self {
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

    pub(super) fn allow(&mut self, max_frame: usize) {
        self.frames.decoder_mut().set_max_frame_length(max_frame);
    }

    pub(super) fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }

    /// The next frame; `Err` when the peer was silent (no bytes at all) for `timeout`,
    /// closed, or sent something unreadable — a frame over the limit among them.
    pub(super) async fn next(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<bytes::BytesMut>, ReadError> {
        loop {
            let wait = timeout.saturating_sub(self.silent_for());
            match tokio::time::timeout(wait, self.frames.next()).await {
                Ok(Some(Ok(frame))) => {
                    // The frame and its length prefix.
                    #[cfg(feature = "metrics")]
                    crate::metrics::received(frame.len() + 4);
                    return Ok(Some(frame));
                }
                Ok(Some(Err(e))) => return Err(ReadError::of(e)),
                Ok(None) => return Ok(None),
                // Bytes of a large frame may have arrived meanwhile: wait on from them.
                Err(_) if self.silent_for() < timeout => continue,
                Err(_) => return Err(ReadError::silent(timeout)),
            }
        }
    }

    /// The read half, the bytes read past the last frame taken, and the decoder (with
    /// its limit): for a reader that goes on from where this one stopped.
    pub(super) fn into_parts(self) -> (OwnedReadHalf, bytes::BytesMut, FrameCodec) {
        let parts = self.frames.into_parts();
        (parts.io.inner, parts.read_buf, parts.codec)
    }

    /// The next handshake frame, decoded.
    pub(super) async fn handshake(&mut self) -> Result<Handshake, Unreadable> {
        let frame = match self.frames.next().await {
            Some(Ok(frame)) => {
                #[cfg(feature = "metrics")]
                crate::metrics::received(frame.len() + 4);
                frame
            }
            Some(Err(e)) => {
                if let Some(text) = FrameTooLarge::of(&e).and_then(FrameTooLarge::text) {
                    return Err(Unreadable::Stranger(text));
                }
                if e.kind() == std::io::ErrorKind::InvalidData {
                    return Err(Unreadable::Other(format!("unreadable frame: {e}")));
                }
                // What the codec says of a stream that ended inside a frame.
                if e.to_string() == "bytes remaining on stream" {
                    return Err(Unreadable::Closed(
                        "closed the connection in the middle of a frame, before its handshake completed"
                            .into(),
                    ));
                }
                return Err(Unreadable::Closed(format!(
                    "broke the connection before its handshake completed: {e}"
                )));
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

/// Why a connection's next frame could not be read: the connection cannot go on.
#[derive(Debug)]
pub(super) enum ReadError {
    /// A frame over the limit.
    TooLarge(FrameTooLarge),
    /// The peer was silent, closed or broke the connection, or sent an unreadable frame
    /// (what it did, said of the peer).
    Lost(String),
}

impl ReadError {
    /// What a failed read or decode says of the connection.
    pub(super) fn of(e: std::io::Error) -> Self {
        if let Some(big) = FrameTooLarge::of(&e) {
            return ReadError::TooLarge(big.clone());
        }
        if e.kind() == std::io::ErrorKind::InvalidData {
            return ReadError::Lost(format!("unreadable frame: {e}"));
        }
        ReadError::Lost(format!("its connection failed: {e}"))
    }

    /// No bytes at all for `timeout`.
    pub(super) fn silent(timeout: Duration) -> Self {
        ReadError::Lost(format!("silent for {timeout:?} (no message, no heartbeat)"))
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::TooLarge(big) => write!(f, "it sent {big}"),
            ReadError::Lost(reason) => f.write_str(reason),
        }
    }
}

/// Why a handshake frame could not be read.
pub(super) enum Unreadable {
    /// The peer speaks another version of the wire protocol.
    Version { ours: u16, theirs: u16 },
    /// The peer closed or broke the connection (what it did, said of the peer).
    Closed(String),
    /// The peer is no superstep process: it sent words (its first line), whose first four
    /// bytes make no sane frame length — an HTTP server, say.
    Stranger(String),
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
            Unreadable::Stranger(text) => {
                write!(f, "it is not a superstep process: it sent {text:?}")
            }
            Unreadable::Closed(reason) | Unreadable::Other(reason) => f.write_str(reason),
        }
    }
}

/// Decodes a frame of the job's types; a panic in a user `Deserialize` is an error of this
/// connection, not of the I/O thread.
pub(super) fn decode_guarded<M: Payload, W: Payload>(frame: &[u8]) -> Result<Wire<M, W>, String> {
    match catch_unwind(AssertUnwindSafe(|| wire::decode::<Wire<M, W>>(frame))) {
        Ok(decoded) => decoded.map_err(|e| e.to_string()),
        Err(payload) => Err(format!(
            "decoding its message panicked: {}",
            Cause::from_panic(payload)
        )),
    }
}

/// At most `max` characters of a peer's string, for messages and logs.
pub(super) fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

/// The proof that a peer knows the secret: HMAC-SHA256 over the master's fresh nonce, the
/// job id, the rank and the job's fingerprint as the peer sent it, so a proof cannot be
/// replayed for another connection, job, rank or fingerprint.
/// Checks a peer's proof of the secret, `mac`, against this side's `secret`: an empty
/// proof is a peer with no secret set — accepted only where this side has none either —
/// and a proof where this side has none is a peer with one; otherwise `expected` must
/// verify it.
pub(super) fn check_proof(
    secret: Option<&[u8]>,
    mac: &[u8],
    expected: impl FnOnce() -> Hmac<Sha256>,
) -> Result<(), Refusal> {
    match (secret, mac.is_empty()) {
        (None, true) => Ok(()),
        (Some(_), true) => Err(Refusal::NoSecret {
            worker_has_none: true,
        }),
        (None, false) => Err(Refusal::NoSecret {
            worker_has_none: false,
        }),
        (Some(_), false) => expected()
            .verify_slice(mac)
            .map_err(|_| Refusal::WrongSecret),
    }
}

/// The proof a connecting side sends in answer to `nonce`: the HMAC of [`proof`] with its
/// secret — or, with none, an empty one, which says so (the side it reached tells a secret
/// missing on one side as missing, [`check_proof`]).
pub(super) fn proof_to_send(
    secret: Option<&[u8]>,
    nonce: &[u8; 32],
    job_id: &str,
    rank: Rank,
    fingerprint: &Fingerprint,
) -> Vec<u8> {
    match secret {
        Some(secret) => proof(secret, nonce, job_id, rank, fingerprint)
            .finalize()
            .into_bytes()
            .to_vec(),
        None => Vec::new(),
    }
}

pub(super) fn proof(
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

pub(super) async fn write_frame(writer: &mut OwnedWriteHalf, frame: &[u8]) -> std::io::Result<()> {
    #[cfg(feature = "metrics")]
    crate::metrics::sent(frame.len());
    writer.write_all(frame).await
}

/// The writer of a connection's lane ([`Lane`]): lets senders write directly while it
/// runs, writes the frames they queued, sends what the lane held back once it was held
/// for [`HOLD`](super::lane::HOLD), and sends a heartbeat whenever no queued frame went
/// out for a heartbeat interval (frames written directly do not put it off: a heartbeat
/// is a few bytes). When the transport stops, writes what is still held and queued, then
/// ends; the write half is shut down when the last handle on it goes. Returns why a write
/// failed, if one did.
pub(super) async fn write_loop(
    lane: Weak<Lane>,
    writer: impl Into<super::lane::Socket>,
    queue: &mut mpsc::UnboundedReceiver<Bytes>,
    mut stop: watch::Receiver<bool>,
    heartbeat: Bytes,
    interval: Duration,
) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("could not write to it: {e}");
    let writing = Writing::start(lane, writer.into());
    let held = Arc::clone(&writing.held);
    // When what the lane holds back is to go, once it holds something.
    let mut flush_at: Option<tokio::time::Instant> = None;
    let far = || tokio::time::Instant::now() + Duration::from_secs(3600);
    loop {
        tokio::select! {
            frame = queue.recv() => match frame {
                Some(frame) => writing.write_queued(&frame).await.map_err(failed)?,
                None => break,
            },
            _ = held.notified(), if flush_at.is_none() => {
                flush_at = Some(tokio::time::Instant::now() + super::lane::HOLD);
            }
            _ = tokio::time::sleep_until(flush_at.unwrap_or_else(far)), if flush_at.is_some() => {
                flush_at = None;
                writing.flush_held();
            }
            _ = tokio::time::sleep(interval) => writing.send(heartbeat.clone()),
            _ = stop.changed() => {
                writing.flush_held();
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

pub(super) fn heartbeat_frame(max: usize) -> Bytes {
    wire::encode(&Wire::<(), ()>::Heartbeat, max).expect("a heartbeat always encodes")
}

/// What a delivered message means for its connection.
pub(super) enum Delivered {
    /// More messages follow.
    More,
    /// The peer's last message: its connection's close or silence next is no loss (a
    /// message after it says anew).
    Last,
}

/// Reads a connection's frames until its peer goes after its last message, or the
/// transport's stop, answering heartbeats by silence and handing every other message — or why a frame did
/// not decode as the job's types — to `deliver`. Returns why the peer was lost (silent,
/// closed, unreadable, or refused by `deliver`), or `None`.
pub(super) async fn read_until_last<M: Payload, W: Payload>(
    frames: &mut Frames,
    heartbeat_timeout: Duration,
    mut stop: watch::Receiver<bool>,
    mut deliver: impl FnMut(Result<Wire<M, W>, String>) -> Result<Delivered, String>,
) -> Option<ReadError> {
    let mut last = false;
    loop {
        let next = tokio::select! {
            next = frames.next(heartbeat_timeout) => next,
            _ = stop.changed() => return None,
        };
        let frame = match next {
            Ok(Some(frame)) => frame,
            // After its last message a peer may go as it likes. (A message after it is
            // delivered, and says anew whether it was the last: a worker that failed says
            // its `Done`, and a gang restart's new worker speaks on after it.)
            _ if last => return None,
            Ok(None) => return Some(ReadError::Lost("its connection closed".into())),
            Err(error) => return Some(error),
        };
        match decode_guarded::<M, W>(&frame) {
            Ok(Wire::Heartbeat) => {}
            decoded => match deliver(decoded) {
                Ok(delivered) => last = matches!(delivered, Delivered::Last),
                Err(reason) => return Some(ReadError::Lost(reason)),
            },
        }
    }
}

/// Returns once the transport stops (at once if it has).
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard it gives back is dropped here: it must not live across an await.
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Accepts connections on `listener` until the transport stops, each admitted to a
/// handshake slot of `unproven` — a full table makes room by dropping its oldest unproven
/// connection: idle and trickling peers grow old, workers do not — and served by a task
/// of `tracker` (`serve(stream, its address, its slot, the token that drops it)`).
pub(super) async fn accept_each<F, Fut>(
    listener: std::net::TcpListener,
    unproven: &std::sync::Mutex<super::admission::Unproven>,
    tracker: &tokio_util::task::TaskTracker,
    mut stop: watch::Receiver<bool>,
    whose: &str,
    mut serve: F,
) where
    F: FnMut(
        tokio::net::TcpStream,
        std::net::SocketAddr,
        u64,
        tokio_util::sync::CancellationToken,
    ) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use tracing::Instrument;
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for {whose}");
            return;
        }
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let (id, token) = super::lock(unproven).admit(peer.ip());
                    tracker.spawn(serve(stream, peer, id, token).in_current_span());
                }
                Err(e) => {
                    // Out of file handles, say: do not spin.
                    tracing::warn!(error = %e, "accepting a connection of {whose} failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = stopped(&mut stop) => return,
        }
    }
}
