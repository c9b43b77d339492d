//! A peer's connection to this worker, read by whichever thread comes to it first: the
//! transport's I/O thread, woken by the socket's readiness, or the worker's compute thread
//! while it waits in a collective ([`Mesh::read_now`](super::Mesh)) — so a piece that came
//! is taken by the thread that waits for it, not handed over by another that had to wake
//! first. Both read under one lock, into one buffer, through one decoder: the frames are
//! taken, and handed to the worker's inbox, in the order they came.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::net::tcp::OwnedReadHalf;
use tokio_util::codec::Decoder;

use super::super::conn::{Handshake, ReadError};
use super::super::wire::{self, FrameCodec, Wire};
use crate::ids::Rank;
use crate::protocol::{PeerBody, PeerMessage};
use crate::transport::PeerEvent;

/// How much the compute thread reads at once.
const CHUNK: usize = 64 * 1024;

/// How a peer's connection to this worker ended, as its reader saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum End {
    /// The peer's goodbye: nothing is lost.
    Bye,
    /// Lost, and how (said of the peer).
    Lost(String),
}

/// A peer's connection to this worker, once admitted: what both threads read it with.
pub(super) struct Incoming {
    /// The peer's rank.
    rank: Rank,
    state: Mutex<State>,
    origin: Instant,
    /// When bytes last came, in milliseconds after `origin`: a peer in the middle of a
    /// large frame is not silent.
    last: AtomicU64,
    /// Whether a reader saw the connection end (`State::end` is set).
    done: AtomicBool,
    /// Woken when a reader other than the I/O thread's saw the connection end.
    ended: tokio::sync::Notify,
    /// Whether the I/O thread found the compute reading, and waits before it looks again.
    backed_off: AtomicBool,
    /// Woken when the compute stops reading and the I/O thread waits.
    resume: tokio::sync::Notify,
}

struct State {
    /// A handle of its own on the connection's socket, read without the I/O driver;
    /// `None` once the connection ended.
    socket: Option<std::net::TcpStream>,
    /// Bytes read past the last frame taken.
    buf: BytesMut,
    codec: FrameCodec,
    /// What the compute thread reads into (allocated at its first read).
    scratch: Vec<u8>,
    end: Option<End>,
}

impl Incoming {
    /// The reader of `rank`'s connection, going on from what its handshake's reader left
    /// (`buf`, `codec`); `socket` is a second handle on the same socket as the I/O
    /// thread's read half.
    pub(super) fn new(
        rank: Rank,
        socket: std::net::TcpStream,
        buf: BytesMut,
        codec: FrameCodec,
    ) -> Self {
        Incoming {
            rank,
            state: Mutex::new(State {
                socket: Some(socket),
                buf,
                codec,
                scratch: Vec::new(),
                end: None,
            }),
            origin: Instant::now(),
            last: AtomicU64::new(0),
            done: AtomicBool::new(false),
            ended: tokio::sync::Notify::new(),
            backed_off: AtomicBool::new(false),
            resume: tokio::sync::Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How the connection ended, if it did (looked up without waiting for a reader).
    pub(super) fn end(&self) -> Option<End> {
        if !self.done.load(Ordering::Acquire) {
            return None;
        }
        self.state().end.clone()
    }

    /// How long since the peer last sent any bytes.
    pub(super) fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }

    /// Until the compute thread saw the connection end.
    pub(super) async fn ended(&self) {
        self.ended.notified().await
    }

    /// The connection is done with: its second handle is closed.
    pub(super) fn close(&self) {
        self.state().socket = None;
    }

    fn heard(&self) {
        let now = self.origin.elapsed().as_millis() as u64;
        self.last.store(now, Ordering::Relaxed);
    }

    /// The state, unless another thread is reading the connection.
    fn try_state(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(state) => Some(state),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// On the I/O thread, once the read half said it is readable: reads what came
    /// through `half` (so that its readiness is cleared when nothing is left) and hands
    /// its frames to `deliver` — unless the compute is reading it (`false`): then the
    /// I/O thread waits for [`resumed`](Self::resumed) before it looks again, so that a
    /// compute taking a piece neither waits for the I/O thread nor has to wake it.
    pub(super) fn read_ready(&self, half: &OwnedReadHalf, deliver: &dyn Fn(PeerEvent)) -> bool {
        // Said before the look, so that a compute that stops reading after it sees it.
        self.backed_off.store(true, Ordering::Release);
        let Some(mut state) = self.try_state() else {
            return false;
        };
        self.backed_off.store(false, Ordering::Release);
        while state.end.is_none() {
            state.buf.reserve(CHUNK);
            let read = half.try_read_buf(&mut state.buf);
            if !self.took(&mut state, read, deliver) {
                break;
            }
        }
        if state.end.is_some() {
            state.socket = None;
            self.done.store(true, Ordering::Release);
        }
        true
    }

    /// Until the compute stopped reading (it is about to sleep, [`resume`](Self::resume)),
    /// or a millisecond passed: the I/O thread then reads what came meanwhile.
    pub(super) async fn resumed(&self) {
        let _ = tokio::time::timeout(Duration::from_millis(1), self.resume.notified()).await;
    }

    /// The compute stops reading for now: an I/O thread that backed off for it reads
    /// again at once.
    pub(super) fn resume(&self) {
        if self.backed_off.swap(false, Ordering::AcqRel) {
            self.resume.notify_one();
        }
    }

    /// On the calling thread (a compute waiting for pieces): reads what came, if no other
    /// thread is reading it (the I/O thread hands over what it reads), and hands its
    /// frames to `deliver`. An end it sees wakes the I/O thread's task
    /// ([`ended`](Self::ended)), which says how the connection ended.
    pub(super) fn read_now(&self, deliver: &dyn Fn(PeerEvent)) {
        let Some(mut state) = self.try_state() else {
            return;
        };
        while state.end.is_none() {
            let State {
                socket,
                scratch,
                buf,
                ..
            } = &mut *state;
            let Some(socket) = socket.as_mut() else {
                break;
            };
            if scratch.is_empty() {
                scratch.resize(CHUNK, 0);
            }
            let read = socket.read(scratch);
            if let Ok(n) = read {
                buf.extend_from_slice(&scratch[..n]);
            }
            // A short read: the socket held no more — spare the read that would say so.
            let drained = read.as_ref().is_ok_and(|&n| n < CHUNK);
            if !self.took(&mut state, read, deliver) || drained {
                break;
            }
        }
        if state.end.is_some() && state.socket.take().is_some() {
            self.done.store(true, Ordering::Release);
            drop(state);
            self.ended.notify_one();
        }
    }

    /// What a read of the socket gave (its bytes already in `buf`): frames handed on,
    /// the connection's end, or nothing more for now. Whether to read again.
    fn took(
        &self,
        state: &mut State,
        read: std::io::Result<usize>,
        deliver: &dyn Fn(PeerEvent),
    ) -> bool {
        match read {
            Ok(0) => state.end = Some(End::Lost("closed before its goodbye".into())),
            Ok(_) => {
                self.heard();
                self.take(state, deliver);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => state.end = Some(End::Lost(ReadError::of(e).to_string())),
        }
        state.end.is_none()
    }

    /// Hands every whole frame read to `deliver`, until the connection's end.
    fn take(&self, state: &mut State, deliver: &dyn Fn(PeerEvent)) {
        while state.end.is_none() {
            match state.codec.decode(&mut state.buf) {
                Ok(Some(frame)) => {
                    // The frame and its length prefix.
                    #[cfg(feature = "metrics")]
                    crate::metrics::received(frame.len() + 4);
                    state.end = self.frame(frame, deliver);
                }
                Ok(None) => break,
                Err(e) => state.end = Some(End::Lost(ReadError::of(e).to_string())),
            }
        }
    }

    /// One frame of the peer's: a piece handed to `deliver`, a heartbeat, or the end.
    fn frame(&self, frame: BytesMut, deliver: &dyn Fn(PeerEvent)) -> Option<End> {
        let frame = frame.freeze();
        match wire::decode::<Handshake>(&frame) {
            Ok(Wire::Heartbeat) => None,
            Ok(Wire::PeerBye) => Some(End::Bye),
            Ok(Wire::Peer {
                attempt,
                call,
                step,
                chunk,
                body,
            }) => {
                // The piece's bytes stay in the frame they came in.
                let Some(body) = body.in_frame(&frame) else {
                    return Some(End::Lost(
                        "sent a piece whose bytes are not in its frame".into(),
                    ));
                };
                deliver(PeerEvent::Message(PeerMessage {
                    attempt,
                    from: self.rank,
                    call,
                    step,
                    chunk,
                    body: PeerBody::Encoded(body),
                }));
                None
            }
            Ok(_) => Some(End::Lost("sent a message that is no peer's".into())),
            Err(e) => Some(End::Lost(format!("sent an unreadable frame: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::ids::{Algorithm, CollectiveCall, CollectiveKind, ReduceOp};

    /// The frames of `n` pieces, numbered by their step, one after the other.
    fn pieces(n: u32) -> Vec<u8> {
        let call = CollectiveCall {
            seq: 1,
            at: Default::default(),
            kind: CollectiveKind::AllReduce(Some(ReduceOp::Sum)),
            len: 1,
            algorithm: Algorithm::Ring,
            chunk: 8,
        };
        let mut out = Vec::new();
        for step in 0..n {
            let body = bytes::Bytes::copy_from_slice(&step.to_le_bytes());
            for part in wire::encode_peer((0, call, step, 0), body, 1 << 20).unwrap() {
                out.extend_from_slice(&part);
            }
        }
        out
    }

    /// A peer's end of a connection, and this worker's reader of the other end with its
    /// I/O thread's read half — registered with a runtime nobody drives unless a test does.
    fn connection(rt: &tokio::runtime::Runtime) -> (std::net::TcpStream, Incoming, OwnedReadHalf) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        let _entered = rt.enter();
        let ours = tokio::net::TcpStream::from_std(ours).unwrap();
        let socket = super::super::second_handle(&ours).unwrap();
        let (half, _write) = ours.into_split();
        let reader = Incoming::new(0, socket, BytesMut::new(), wire::codec(1 << 20));
        (peer, reader, half)
    }

    /// A runtime for the I/O thread's side, driven only where a test drives it.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn steps_of(got: &Mutex<Vec<u32>>) -> impl Fn(PeerEvent) + '_ {
        move |event| match event {
            PeerEvent::Message(m) => got.lock().unwrap().push(m.step),
            other => panic!("{other:?}"),
        }
    }

    /// Reads on this thread until `done`, for 10 s at most.
    fn read_until(reader: &Incoming, deliver: &dyn Fn(PeerEvent), done: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < until, "not read in 10 s");
            reader.read_now(deliver);
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_waiting_compute_reads_its_peers_pieces_itself_in_order_through_split_frames() {
        // The runtime is never driven: only this thread reads.
        let rt = runtime();
        let (mut peer, reader, _half) = connection(&rt);
        let got = Mutex::new(Vec::new());
        let deliver = steps_of(&got);
        let bytes = pieces(3);
        // The first frame and part of the second: the part waits for the rest.
        let cut = bytes.len() / 2;
        peer.write_all(&bytes[..cut]).unwrap();
        read_until(&reader, &deliver, || !got.lock().unwrap().is_empty());
        assert_eq!(*got.lock().unwrap(), [0]);
        peer.write_all(&bytes[cut..]).unwrap();
        read_until(&reader, &deliver, || got.lock().unwrap().len() == 3);
        assert_eq!(*got.lock().unwrap(), [0, 1, 2]);
        assert_eq!(reader.end(), None);
        peer.write_all(&wire::encode(&Wire::<(), ()>::PeerBye, 1 << 20).unwrap())
            .unwrap();
        read_until(&reader, &deliver, || reader.end().is_some());
        assert_eq!(reader.end(), Some(End::Bye));
        // The I/O thread's task hears of the end it did not read.
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), reader.ended())
                .await
                .expect("the end was told")
        });
    }

    #[test]
    fn a_connection_closed_before_its_goodbye_is_lost_to_a_compute_reading_it() {
        let rt = runtime();
        let (mut peer, reader, _half) = connection(&rt);
        let got = Mutex::new(Vec::new());
        let deliver = steps_of(&got);
        let bytes = pieces(2);
        // A frame and a half, then the peer is gone.
        peer.write_all(&bytes[..bytes.len() * 3 / 4]).unwrap();
        drop(peer);
        read_until(&reader, &deliver, || reader.end().is_some());
        assert_eq!(*got.lock().unwrap(), [0]);
        assert_eq!(
            reader.end(),
            Some(End::Lost("closed before its goodbye".into()))
        );
    }

    #[test]
    fn the_io_thread_and_a_compute_reading_at_once_hand_over_each_piece_once_in_order() {
        let rt = Arc::new(runtime());
        let (mut peer, reader, half) = connection(&rt);
        let reader = Arc::new(reader);
        let got = Arc::new(Mutex::new(Vec::new()));
        const N: u32 = 2_000;
        // The I/O thread, as `Mesh::carry_in` reads.
        let io = {
            let (reader, got, rt) = (Arc::clone(&reader), Arc::clone(&got), Arc::clone(&rt));
            std::thread::spawn(move || {
                rt.block_on(async {
                    let deliver = steps_of(&got);
                    while got.lock().unwrap().len() < N as usize && reader.end().is_none() {
                        let _ =
                            tokio::time::timeout(Duration::from_millis(10), half.readable()).await;
                        reader.read_ready(&half, &deliver);
                    }
                })
            })
        };
        let bytes = pieces(N);
        let writer = std::thread::spawn(move || {
            // Cuts that fall inside frames.
            for part in bytes.chunks(997) {
                peer.write_all(part).unwrap();
            }
            peer
        });
        let deliver = steps_of(&got);
        read_until(&reader, &deliver, || {
            got.lock().unwrap().len() >= N as usize
        });
        let _peer = writer.join().unwrap();
        io.join().unwrap();
        assert_eq!(*got.lock().unwrap(), (0..N).collect::<Vec<_>>());
    }
}
