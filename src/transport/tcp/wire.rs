//! The wire format: length-delimited frames, each carrying the protocol version, with
//! MessagePack bodies in the crate's one encoding (named fields, so that serde's attributes
//! survive; see `codec`) — but for a collective's piece, whose head of the crate's own
//! fields is written by position ([`encode_peer`]).
//!
//! ```text
//! +----------------+------------------+---------------------------+
//! | length: u32 BE | version: u16 BE  | body: MessagePack of `Wire` |
//! +----------------+------------------+---------------------------+
//!   length counts version and body
//! ```
//!
//! Decoding never panics on a peer's bytes: a length above the frame limit is refused
//! before anything is allocated for it (`tokio_util`'s `LengthDelimitedCodec` checks the
//! prefix first), a version other than ours is refused naming both, and a body that does
//! not decode is an error (rmp-serde also bounds nesting depth). After the handshake, a
//! message that does not decode as the job's types is a `JobError::Decode` of the job.

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

use crate::protocol::{ToMaster, ToWorker};

use crate::ids::{Attempt, CollectiveCall, Rank};
use crate::transport::Fingerprint;

/// The version of the wire protocol this build speaks. Peers of another version are
/// refused, with both versions named.
pub const PROTOCOL_VERSION: u16 = 25;

const HEADER: usize = 4 + 2;

/// The largest frame accepted before a peer has proved the secret: handshake messages are
/// small, so an unauthenticated peer cannot make the master allocate much.
pub(crate) const HANDSHAKE_MAX_FRAME: usize = 64 << 10;

/// Everything that crosses a connection.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Wire<M, W> {
    /// Worker → master, first: who it is, the job as its process runs it, and where its
    /// peers reach it (when workers reach each other).
    Hello {
        job_id: String,
        rank: Rank,
        fingerprint: Fingerprint,
        peer_addr: Option<String>,
        /// How many more processes its launcher starts, if it said
        /// (`TcpSettings::restarts_left`): a process started again knows a newer count
        /// than the master's process.
        #[serde(default)]
        restarts_left: Option<u32>,
    },
    /// Master → worker: where every rank's peers reach it, as far as the master knows.
    PeerTable { addrs: Vec<Option<String>> },
    /// Worker → worker, first: who it is, whom it means to reach, the job as its process
    /// runs it, and its attempt.
    PeerHello {
        job_id: String,
        rank: Rank,
        to: Rank,
        fingerprint: Fingerprint,
        attempt: Attempt,
    },
    /// Worker → worker: a piece of a collective.
    /// Written by [`encode_peer`], its body not copied into the frame; read with its body
    /// left where it lies in the frame ([`PeerBytes::in_frame`]). The body is the last
    /// field.
    Peer {
        attempt: Attempt,
        call: CollectiveCall,
        step: u32,
        chunk: u32,
        body: PeerBytes,
    },
    /// Worker → worker: this connection closes, as the sender's job ended; no loss.
    PeerBye,
    /// Master → worker: prove you know the secret.
    Challenge { nonce: [u8; 32] },
    /// Worker → master: HMAC-SHA256(secret, nonce ‖ job id ‖ rank ‖ its hello's fingerprint).
    Proof { mac: Vec<u8> },
    /// Master → worker: the connection is accepted; the master's node runs `attempt`, in
    /// which the worker registers.
    Welcome { attempt: Attempt },
    /// Either way: the connection is refused, and why. Then it is closed.
    Refused { refusal: Refusal },
    /// Either way: still here.
    Heartbeat,
    /// A protocol message for the master.
    ToMaster(ToMaster<W>),
    /// A protocol message for a worker.
    ToWorker(ToWorker<M>),
}

/// Why the master's node refused a connection, as the peer is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Refusal {
    /// The worker's process runs the job differently from the master's.
    Mismatch {
        /// The setting or property that differs.
        field: String,
        /// Its value in the master's process.
        master: String,
        /// Its value in the worker's process.
        worker: String,
    },
    /// The peer belongs to another job.
    WrongJob {
        /// The job id it asked for.
        asked: String,
        /// The job id of the side that refused it.
        #[serde(default)]
        ours: String,
    },
    /// The peer's proof of the secret did not verify.
    WrongSecret,
    /// One side has no secret set and the other has one: `worker_has_none` says whether
    /// it is the connecting side (a worker reaching the master, or a peer).
    NoSecret { worker_has_none: bool },
    /// Another connection holds the rank.
    RankTaken { rank: Rank },
    /// The master's node is stopping: its process ends.
    Stopping,
    /// The peer broke the handshake: an unreadable frame, a message out of order.
    Protocol(String),
    /// The peer closed or broke its connection in the handshake (never sent: there is
    /// nobody to tell; noted as it is).
    Closed(String),
    /// A worker's peer runs another attempt of the job.
    OtherAttempt { ours: Attempt, theirs: Attempt },
}

impl Refusal {
    /// Whether a worker turned away with this at its first connection should stop: every
    /// refusal is final but a taken rank, which a process started again in the place of
    /// one that died waits out (until the old connection is found dead).
    pub(crate) fn is_final_for(&self, restarted: bool) -> bool {
        !(restarted && matches!(self, Refusal::RankTaken { .. }))
    }

    /// Whether a worker reconnecting after losing its master should stop: only a
    /// different job or secret, which no master started again would change.
    pub(crate) fn is_final_on_rejoin(&self) -> bool {
        matches!(
            self,
            Refusal::Mismatch { .. }
                | Refusal::WrongJob { .. }
                | Refusal::WrongSecret
                | Refusal::NoSecret { .. }
        )
    }

    /// A short name of the kind of refusal, for counting them in logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Refusal::Mismatch { .. } => "a different job configuration",
            Refusal::WrongJob { .. } => "another job's id",
            Refusal::WrongSecret => "a wrong secret",
            Refusal::NoSecret { .. } => "a secret missing on one side",
            Refusal::RankTaken { .. } => "a rank already connected",
            Refusal::Stopping => "the node stopping",
            Refusal::Protocol(_) => "a broken handshake",
            Refusal::Closed(_) => "a connection closed in its handshake",
            Refusal::OtherAttempt { .. } => "another attempt of the job",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Mismatch {
                field,
                master,
                worker,
            } => write!(
                f,
                "its job differs from the master's in `{field}`: {worker} in the worker's process, {master} in the master's"
            ),
            Refusal::WrongJob { asked, ours } => write!(
                f,
                "another job: the connecting process runs job {asked:?}, the one it reached job {ours:?}"
            ),
            Refusal::WrongSecret => f.write_str("wrong secret: its proof did not verify"),
            Refusal::NoSecret {
                worker_has_none: true,
            } => f.write_str(
                "the secret is missing: the connecting process has none set (SUPERSTEP_SECRET, TcpSettings::secret) and the one it reached has one; set the same on every process",
            ),
            Refusal::NoSecret {
                worker_has_none: false,
            } => f.write_str(
                "the secret is missing: the process it reached has none set (SUPERSTEP_SECRET, TcpSettings::secret) and the connecting one has one; set the same on every process",
            ),
            Refusal::RankTaken { rank } => write!(f, "rank {rank} is already connected"),
            Refusal::Stopping => f.write_str("the master's node is stopping"),
            Refusal::Protocol(reason) | Refusal::Closed(reason) => f.write_str(reason),
            Refusal::OtherAttempt { ours, theirs } => write!(
                f,
                "it runs attempt {theirs} of the job, this worker attempt {ours}"
            ),
        }
    }
}

/// Why a frame could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    #[error("frame of {len} bytes is over the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("the peer speaks protocol version {theirs}, this side version {ours}")]
    Version { ours: u16, theirs: u16 },
    #[error("frame too short to hold a protocol version ({len} bytes)")]
    Short { len: usize },
    #[error("could not decode a frame: {0}")]
    Decode(String),
    #[error("could not encode a message: {0}")]
    Encode(String),
}

/// Encodes `msg` as one whole frame (header and body) in one buffer: the serialization
/// is the only copy of the message; the bytes are then written as they are, and shared
/// when the same frame goes to many peers.
pub(crate) fn encode<T: Serialize>(msg: &T, max: usize) -> Result<Bytes, WireError> {
    let mut buf = BytesMut::with_capacity(256).writer();
    buf.get_mut().put_slice(&[0; HEADER]);
    crate::codec::write(&mut buf, msg).map_err(|e| WireError::Encode(e.to_string()))?;
    let mut buf = buf.into_inner();
    let len = buf.len() - 4;
    seal(&mut buf, len, max)?;
    Ok(buf.freeze())
}

/// Writes a frame's length prefix (`len`: what follows it) and version into the first
/// bytes of `buf`, refusing a frame over `max`.
fn seal(buf: &mut BytesMut, len: usize, max: usize) -> Result<(), WireError> {
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    buf[0..4].copy_from_slice(&(len as u32).to_be_bytes());
    buf[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    Ok(())
}

/// A piece's bytes in a [`Wire::Peer`] frame: held (as written, or as a decoder that
/// could not lend them handed them over), or — as read from a frame — where they lie in
/// it, so that they are taken from the frame without a copy.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum PeerBytes {
    Held(Bytes),
    At { addr: usize, len: usize },
}

impl PeerBytes {
    /// The bytes, out of the `frame` they were decoded from (a slice of it, not a copy);
    /// `None` if they do not lie in it.
    pub(crate) fn in_frame(self, frame: &Bytes) -> Option<Bytes> {
        match self {
            PeerBytes::Held(bytes) => Some(bytes),
            PeerBytes::At { addr, len } => {
                let start = addr.checked_sub(frame.as_ptr() as usize)?;
                let end = start.checked_add(len)?;
                (end <= frame.len()).then(|| frame.slice(start..end))
            }
        }
    }
}

impl std::fmt::Debug for PeerBytes {
    /// The length only: where the bytes lie in memory says nothing of the message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = match self {
            PeerBytes::Held(bytes) => bytes.len(),
            PeerBytes::At { len, .. } => *len,
        };
        write!(f, "{len} byte(s)")
    }
}

impl Serialize for PeerBytes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            PeerBytes::Held(bytes) => serializer.serialize_bytes(bytes),
            PeerBytes::At { .. } => Err(serde::ser::Error::custom(
                "a piece's bytes read from a frame are not written again",
            )),
        }
    }
}

impl<'de> Deserialize<'de> for PeerBytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = PeerBytes;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a piece's bytes")
            }

            fn visit_borrowed_bytes<E>(self, bytes: &'de [u8]) -> Result<PeerBytes, E> {
                Ok(PeerBytes::At {
                    addr: bytes.as_ptr() as usize,
                    len: bytes.len(),
                })
            }

            fn visit_bytes<E>(self, bytes: &[u8]) -> Result<PeerBytes, E> {
                Ok(PeerBytes::Held(Bytes::copy_from_slice(bytes)))
            }

            fn visit_byte_buf<E>(self, bytes: Vec<u8>) -> Result<PeerBytes, E> {
                Ok(PeerBytes::Held(Bytes::from(bytes)))
            }
        }
        deserializer.deserialize_bytes(Visit)
    }
}

/// A [`Wire::Peer`] frame for `body`, as two parts written one after the other: the frame
/// up to the body, and the body itself — which is not copied. Its head (the version, the
/// call and its numbers) is in the positional form, which [`decode`] reads as it reads
/// [`encode`]'s.
pub(crate) fn encode_peer(
    (attempt, call, step, chunk): (Attempt, CollectiveCall, u32, u32),
    body: Bytes,
    max: usize,
) -> Result<[Bytes; 2], WireError> {
    let head = Wire::<(), ()>::Peer {
        attempt,
        call,
        step,
        chunk,
        body: PeerBytes::Held(Bytes::new()),
    };
    // Positional: the field names would be most of a small piece's frame (134 bytes of
    // head before an 8-byte value, against 52); the decoder reads either form.
    let mut out = BytesMut::with_capacity(64).writer();
    out.get_mut().put_slice(&[0; HEADER]);
    crate::codec::write_positional(&mut out, &head)
        .map_err(|e| WireError::Encode(e.to_string()))?;
    let mut out = out.into_inner();
    // The empty body, last: a `bin 8` of length 0. It becomes the body's own marker.
    if !out.ends_with(&[0xc4, 0x00]) {
        return Err(WireError::Encode(
            "a piece's frame does not end with its body".into(),
        ));
    }
    out.truncate(out.len() - 2);
    let (marker, used) = crate::codec::bin_header(body.len()).ok_or(WireError::TooLarge {
        len: body.len(),
        max,
    })?;
    out.put_slice(&marker[..used]);
    let len = out.len() - 4 + body.len();
    seal(&mut out, len, max)?;
    Ok([out.freeze(), body])
}

/// The most a piece's frame holds before its body (the version, the call and its
/// numbers), with room to spare: a frame's head is about 40 bytes, at most about 100.
const PIECE_HEAD: usize = 1024;

/// The largest body [`encode_peer`] frames within `max_frame`.
pub(crate) fn max_piece(max_frame: usize) -> usize {
    max_frame.saturating_sub(PIECE_HEAD)
}

/// Decodes one frame's content (what follows the length prefix).
pub(crate) fn decode<T: DeserializeOwned>(frame: &[u8]) -> Result<T, WireError> {
    if frame.len() < 2 {
        return Err(WireError::Short { len: frame.len() });
    }
    let theirs = u16::from_be_bytes([frame[0], frame[1]]);
    if theirs != PROTOCOL_VERSION {
        return Err(WireError::Version {
            ours: PROTOCOL_VERSION,
            theirs,
        });
    }
    crate::codec::from_slice(&frame[2..]).map_err(|e| WireError::Decode(e.to_string()))
}

/// The codec that splits a byte stream into frames (tokio-util's length-delimited one),
/// refusing a length prefix over `max` before allocating for it — with a
/// [`FrameTooLarge`] that says how large the frame claimed to be, the limit, and the
/// bytes that came with the prefix (what a peer that is no superstep process sent).
pub(crate) fn codec(max: usize) -> FrameCodec {
    FrameCodec {
        inner: LengthDelimitedCodec::builder()
            .length_field_length(4)
            .big_endian()
            .max_frame_length(max)
            .new_codec(),
        max,
        in_frame: false,
        length: 0,
    }
}

/// See [`codec`].
#[derive(Debug)]
pub(crate) struct FrameCodec {
    inner: LengthDelimitedCodec,
    max: usize,
    /// The inner codec read a frame's length prefix and waits for its body.
    in_frame: bool,
    /// The length of the last prefix read.
    length: usize,
}

impl FrameCodec {
    /// The largest frame taken from now on.
    pub(crate) fn set_max_frame_length(&mut self, max: usize) {
        self.max = max;
        self.inner.set_max_frame_length(max);
    }

    /// How long the frame whose body it waits for is, if it waits for one.
    pub(crate) fn waiting_for(&self) -> Option<usize> {
        self.in_frame.then_some(self.length)
    }
}

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, std::io::Error> {
        if !self.in_frame && src.len() >= 4 {
            let bytes = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
            if bytes > self.max {
                let head = src[..src.len().min(FrameTooLarge::HEAD)].to_vec();
                let error = FrameTooLarge {
                    bytes,
                    limit: self.max,
                    head,
                };
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, error));
            }
            self.length = bytes;
        }
        let before = src.len();
        let frame = self.inner.decode(src)?;
        // The inner codec takes the prefix off once it read it, then waits for the body
        // (over as many calls as it takes to arrive), and gives the frame.
        if frame.is_some() {
            self.in_frame = false;
        } else if src.len() < before {
            self.in_frame = true;
        }
        Ok(frame)
    }
}

/// A length prefix over the frame limit: the connection cannot go on (what follows is
/// the frame's body, which is not read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrameTooLarge {
    /// The length the prefix claims.
    pub(crate) bytes: usize,
    /// The limit.
    pub(crate) limit: usize,
    /// The first bytes that came, the prefix included (at most [`Self::HEAD`]).
    pub(crate) head: Vec<u8>,
}

impl FrameTooLarge {
    const HEAD: usize = 64;

    /// The error of `error`, if it is one.
    pub(crate) fn of(error: &std::io::Error) -> Option<&FrameTooLarge> {
        error.get_ref()?.downcast_ref::<FrameTooLarge>()
    }

    /// What the peer sent, if it reads as text: a peer that is no superstep process (an
    /// HTTP server, say) answers in words, whose first four bytes make no sane length.
    pub(crate) fn text(&self) -> Option<String> {
        let text = std::str::from_utf8(&self.head).ok()?;
        let line = text.lines().next()?.trim();
        let printable = |c: char| c.is_ascii_graphic() || c == ' ';
        (line.len() >= 4 && line.chars().all(printable)).then(|| line.to_owned())
    }
}

impl std::fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a frame of {} bytes, over the limit of {} bytes (max_frame)",
            self.bytes, self.limit
        )
    }
}

impl std::error::Error for FrameTooLarge {}

/// Splits `bytes` into frames and decodes each as a wire message, for tests and fuzzing:
/// what a connection would do with these bytes, minus the socket. Each item is the decoded
/// message's debug form, or the error that ends the connection.
pub fn decode_stream(bytes: &[u8], max: usize) -> Vec<Result<String, String>> {
    let mut codec = codec(max);
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    loop {
        match codec.decode(&mut buf) {
            Ok(Some(frame)) => out.push(
                decode::<Wire<Vec<f64>, Vec<f64>>>(&frame)
                    .map(|w| format!("{w:?}"))
                    .map_err(|e| e.to_string()),
            ),
            Ok(None) => return out,
            Err(e) => {
                out.push(Err(e.to_string()));
                return out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_carries_its_version() {
        let msg: Wire<u8, u8> = Wire::Hello {
            job_id: "j".into(),
            rank: 3,
            fingerprint: Fingerprint::default(),
            peer_addr: Some("10.0.0.3:41000".into()),
            restarts_left: None,
        };
        let bytes = encode(&msg, 1 << 20).unwrap();
        assert_eq!(
            u32::from_be_bytes(bytes[0..4].try_into().unwrap()) as usize,
            bytes.len() - 4
        );
        assert_eq!(u16::from_be_bytes([bytes[4], bytes[5]]), PROTOCOL_VERSION);
        match decode::<Wire<u8, u8>>(&bytes[4..]).unwrap() {
            Wire::Hello { job_id, rank, .. } => assert_eq!((job_id.as_str(), rank), ("j", 3)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_piece_written_in_two_parts_reads_back_as_its_message_without_a_copy() {
        let call = CollectiveCall {
            seq: 3,
            at: Default::default(),
            kind: crate::ids::CollectiveKind::AllGather,
            len: 9,
            algorithm: crate::ids::Algorithm::Ring,
            chunk: 4,
        };
        // Each size of MessagePack's bin header: 8, 16 and 32 bits of length.
        for n in [0usize, 1, 255, 256, 65_535, 65_536, 300_000] {
            let body = Bytes::from((0..n).map(|i| i as u8).collect::<Vec<u8>>());
            let [head, tail] = encode_peer((2, call, 5, 7), body.clone(), 1 << 20).unwrap();
            assert_eq!(tail, body, "the body goes as it is");
            // The fields by position, not by name: a small piece is mostly its value.
            assert!(head.len() <= 48, "{} bytes of head", head.len());
            let written = [&head[..], &tail[..]].concat();
            assert_eq!(
                u32::from_be_bytes(written[0..4].try_into().unwrap()) as usize,
                written.len() - 4
            );
            let frame = Bytes::from(written).slice(4..);
            let Ok(Wire::Peer {
                attempt: 2,
                call: read_call,
                step: 5,
                chunk: 7,
                body: read,
            }) = decode::<Wire<(), ()>>(&frame)
            else {
                panic!("{n} bytes: not read back");
            };
            assert_eq!(read_call, call);
            // Its debug form (as `dev::decode_stream` prints it) says no address.
            assert_eq!(format!("{read:?}"), format!("{n} byte(s)"));
            let read = read.in_frame(&frame).expect("the body lies in the frame");
            assert_eq!(read, body, "{n} bytes");
            if n > 0 {
                assert!(
                    frame.as_ptr_range().contains(&read.as_ptr()),
                    "{n} bytes: the body was copied out of the frame"
                );
            }
        }
        // Over the limit: refused, not sent.
        let body = Bytes::from(vec![0; 2048]);
        assert!(matches!(
            encode_peer((0, call, 0, 0), body, 1024),
            Err(WireError::TooLarge { max: 1024, .. })
        ));
    }

    #[test]
    fn a_piece_of_max_piece_bytes_fits_its_frame_whatever_its_call() {
        // Every number at its largest, every name at its longest.
        let call = CollectiveCall {
            seq: u64::MAX,
            at: crate::ids::CallAt {
                iteration: u64::MAX,
                call: u64::MAX,
                group: crate::ids::GroupId(u64::MAX),
            },
            kind: crate::ids::CollectiveKind::Reduce {
                root: usize::MAX,
                op: Some(crate::ids::ReduceOp::Min),
            },
            len: u64::MAX,
            algorithm: crate::ids::Algorithm::Doubling,
            chunk: u32::MAX,
        };
        let max_frame = HANDSHAKE_MAX_FRAME;
        let many = CollectiveCall {
            kind: crate::ids::CollectiveKind::AllReduceMany {
                op: crate::ids::ReduceOp::Min,
                values: u32::MAX,
                lengths: u64::MAX,
            },
            ..call
        };
        for call in [call, many] {
            let body = Bytes::from(vec![7; max_piece(max_frame)]);
            let numbers = (u32::MAX, call, u32::MAX, u32::MAX);
            let [head, tail] = encode_peer(numbers, body, max_frame).unwrap();
            assert!(head.len() + tail.len() - 4 <= max_frame);
            assert!(head.len() < PIECE_HEAD / 4, "{} bytes of head", head.len());
        }
    }

    #[test]
    fn another_version_is_refused_naming_both() {
        let theirs = PROTOCOL_VERSION + 1;
        let [hi, lo] = theirs.to_be_bytes();
        let err = decode::<Wire<u8, u8>>(&[hi, lo, 0x80]).unwrap_err();
        assert_eq!(
            err,
            WireError::Version {
                ours: PROTOCOL_VERSION,
                theirs
            }
        );
        assert_eq!(
            err.to_string(),
            format!(
                "the peer speaks protocol version {theirs}, this side version {PROTOCOL_VERSION}"
            )
        );
    }

    #[test]
    fn an_oversized_length_prefix_is_refused_before_allocating() {
        let out = decode_stream(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3], 1 << 20);
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0].as_ref().unwrap_err(),
            &format!(
                "a frame of {} bytes, over the limit of {} bytes (max_frame)",
                u32::MAX,
                1 << 20
            )
        );
        // A prefix that fits is read on, across calls: a body that arrives in pieces is
        // never read as a prefix.
        let mut pieces = codec(8);
        let mut buf = BytesMut::from(&[0, 0, 0, 3, 0xff][..]);
        assert_eq!(pieces.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(&[0xff]);
        assert_eq!(pieces.decode(&mut buf).unwrap(), None);
        assert_eq!(pieces.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(&[0xff, 0, 0, 0, 9]);
        assert_eq!(
            pieces.decode(&mut buf).unwrap().as_deref(),
            Some(&[0xff, 0xff, 0xff][..])
        );
        let err = pieces.decode(&mut buf).unwrap_err();
        let big = FrameTooLarge::of(&err).unwrap();
        assert_eq!((big.bytes, big.limit), (9, 8));
        let mut codec = codec(8);
        let mut buf = BytesMut::from(&[0, 0, 0, 3, 1][..]);
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(&[2, 3, 0, 0, 0, 9]);
        assert_eq!(
            codec.decode(&mut buf).unwrap().as_deref(),
            Some(&[1, 2, 3][..])
        );
        let err = codec.decode(&mut buf).unwrap_err();
        let big = FrameTooLarge::of(&err).unwrap();
        assert_eq!((big.bytes, big.limit), (9, 8));
        assert_eq!(big.text(), None);
        // Words are no frame.
        let mut buf = BytesMut::from(&b"HTTP/1.1 400 Bad Request\r\nServer: x\r\n"[..]);
        let err = codec.decode(&mut buf).unwrap_err();
        let text = FrameTooLarge::of(&err).and_then(FrameTooLarge::text);
        assert_eq!(text.as_deref(), Some("HTTP/1.1 400 Bad Request"));
        let err = encode::<Wire<Vec<u8>, u8>>(&Wire::Proof { mac: vec![0; 100] }, 50).unwrap_err();
        assert!(matches!(err, WireError::TooLarge { max: 50, .. }));
    }

    #[test]
    fn garbage_and_truncated_frames_are_errors_not_panics() {
        assert!(decode_stream(&[0, 0, 0, 3, 0, 1, 0xc1], 1 << 20)[0].is_err());
        assert!(
            decode_stream(&[0, 0, 0, 10, 0, 1], 1 << 20).is_empty(),
            "waits for the rest"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// The frame decoder never panics, whatever bytes a peer sends.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = decode_stream(&bytes, 1 << 16);
        }

        #[test]
        fn well_framed_arbitrary_bodies_never_panic(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            frames in 1usize..4,
        ) {
            let mut bytes = Vec::new();
            for _ in 0..frames {
                bytes.extend_from_slice(&((body.len() + 2) as u32).to_be_bytes());
                bytes.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
                bytes.extend_from_slice(&body);
            }
            let decoded = decode_stream(&bytes, 1 << 16);
            proptest::prop_assert_eq!(decoded.len(), frames);
        }
    }
}
