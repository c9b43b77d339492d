//! A peer's connection to this worker, read by whichever thread comes to it first: the
//! transport's I/O thread, woken by the socket's readiness, or the worker's compute thread
//! while it waits in a collective ([`Mesh::read_now`](super::Mesh)) — so a piece that came
//! is taken by the thread that waits for it, not handed over by another that had to wake
//! first. Both read under one lock, into one buffer, through one decoder: the frames are
//! taken, and handed to the worker's inbox, in the order they came.
//!
//! While the compute polls ([`Window`]), the I/O thread leaves the connections to it: a
//! piece the I/O thread read would be handed over through the compute's channel — a read,
//! a decode and a hand-off on a second thread, on cores the compute and its peers need —
//! for a compute that would have read it itself a moment later.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio_util::codec::Decoder;

use super::super::conn::{Handshake, ReadError};
use super::super::wire::{self, FrameCodec, Wire};
use crate::ids::Rank;
use crate::protocol::{PeerBody, PeerMessage};
use crate::transport::PeerEvent;

/// How much the compute thread reads at once.
const CHUNK: usize = 64 * 1024;

/// Until when the worker's compute reads its peers' connections itself: opened by each of
/// its looks ([`Mesh::read_now`](super::Mesh)) for the time it polls, closed when it stops
/// polling to sleep. Shared by the readers of one worker's connections.
pub(super) struct Window {
    origin: Instant,
    /// The window's end, in microseconds after `origin`; 0: closed.
    until: AtomicU64,
    /// Until when no window opens, in microseconds after `origin`: the compute met a
    /// stream of bytes (a large piece), which the I/O thread reads beside it.
    streaming: AtomicU64,
}

/// How long a compute that met a stream of bytes leaves the reading to the I/O thread.
const STREAMING: Duration = Duration::from_millis(2);

impl Window {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Window {
            origin: Instant::now(),
            until: AtomicU64::new(0),
            streaming: AtomicU64::new(0),
        })
    }

    fn micros(&self) -> u64 {
        // At least 1: 0 is a closed window.
        (self.origin.elapsed().as_micros() as u64).max(1)
    }

    /// The compute looks, and will go on looking for `polls`.
    pub(super) fn open(&self, polls: Duration) {
        let now = self.micros();
        if now < self.streaming.load(Ordering::Relaxed) {
            return;
        }
        let until = now.saturating_add(polls.as_micros() as u64);
        self.until.store(until, Ordering::SeqCst);
    }

    /// The compute met a stream of bytes: while it lasts, the I/O thread reads beside the
    /// compute — a large piece is read on two threads, and the compute reduces what came
    /// while more comes — and for [`STREAMING`] no window opens. Whether the window was
    /// open (see [`close`](Self::close)).
    pub(super) fn streaming(&self) -> bool {
        let until = self.micros().saturating_add(STREAMING.as_micros() as u64);
        self.streaming.store(until, Ordering::Relaxed);
        self.close()
    }

    /// The compute stops looking; whether it had looked since it last stopped.
    pub(super) fn close(&self) -> bool {
        self.until.swap(0, Ordering::SeqCst) != 0
    }

    /// Whether the compute is still looking.
    fn polling(&self) -> bool {
        let until = self.until.load(Ordering::SeqCst);
        until != 0 && self.micros() < until
    }
}

/// The I/O thread's watch on a peer's connection for what comes in: the connection
/// registered with the I/O driver, or — while the compute reads it itself — not
/// ([`unwatch`](Self::unwatch)): a registered socket wakes the I/O thread at every
/// arrival, read by it or not.
pub(super) struct ReadSide {
    watched: Option<tokio::net::TcpStream>,
    idle: Option<std::net::TcpStream>,
}

impl ReadSide {
    /// A watch on `socket` (non-blocking), which starts at the first
    /// [`readable`](Self::readable).
    pub(super) fn new(socket: std::net::TcpStream) -> Self {
        ReadSide {
            watched: None,
            idle: Some(socket),
        }
    }

    /// Until the connection is readable (watched again first, if it was let go of).
    pub(super) async fn readable(&mut self) -> std::io::Result<()> {
        if let Some(socket) = self.idle.take() {
            self.watched = Some(tokio::net::TcpStream::from_std(socket)?);
        }
        match &self.watched {
            Some(watched) => watched.readable().await,
            None => std::future::pending().await,
        }
    }

    /// Lets go of the watch until the next [`readable`](Self::readable).
    pub(super) fn unwatch(&mut self) {
        if let Some(watched) = self.watched.take() {
            // (A socket the driver cannot let go of is closed: its reader sees the end.)
            self.idle = watched.into_std().ok();
        }
    }

    /// Reads what came into `buf`, clearing the readiness the watch saw when nothing is
    /// left.
    fn try_read_buf(&self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match &self.watched {
            Some(watched) => watched.try_read_buf(buf),
            None => Err(std::io::ErrorKind::WouldBlock.into()),
        }
    }
}

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
    /// When the worker's compute reads the connection itself.
    window: Arc<Window>,
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
    /// thread's read half; `window` says when the worker's compute reads it.
    pub(super) fn new(
        rank: Rank,
        socket: std::net::TcpStream,
        buf: BytesMut,
        codec: FrameCodec,
        window: Arc<Window>,
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
            window,
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

    /// On the I/O thread, once `side` said the connection is readable: reads what came
    /// (so that its readiness is cleared when nothing is left) and hands its frames to
    /// `deliver` — unless the compute reads it (`false`: it is polling, or reading now):
    /// then the I/O thread lets go of its watch on the connection
    /// ([`ReadSide::unwatch`]) and waits for [`resumed`](Self::resumed) before it looks
    /// again, so that a compute taking a piece neither waits for the I/O thread nor has
    /// to wake it, nor gets it second-hand, and what comes meanwhile wakes no one else.
    pub(super) fn read_ready(&self, side: &ReadSide, deliver: &dyn Fn(PeerEvent)) -> bool {
        // Said before the looks, so that a compute that stops reading after them sees it
        // (and one that stopped before them is seen: both sides' order is sequential).
        self.backed_off.store(true, Ordering::SeqCst);
        if self.window.polling() {
            return false;
        }
        let Some(mut state) = self.try_state() else {
            return false;
        };
        self.backed_off.store(false, Ordering::SeqCst);
        while state.end.is_none() {
            state.buf.reserve(CHUNK);
            let read = side.try_read_buf(&mut state.buf);
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
    /// or it has not looked for its window (a millisecond is checked at a time): the I/O
    /// thread then reads what came meanwhile. A compute making one call after another
    /// looks again within its window, and the I/O thread stays off its connections —
    /// taking its watch again only to let go of it at the next arrival would cost two
    /// changes of the driver's registration and a wake-up on every one of them.
    pub(super) async fn resumed(&self) {
        loop {
            let told = tokio::time::timeout(Duration::from_millis(1), self.resume.notified());
            if told.await.is_ok() {
                return;
            }
            if !self.window.polling() {
                // Not told: no wake-up is left behind for the next back-off (the next
                // `read_ready` says again that the I/O thread waits).
                self.backed_off.store(false, Ordering::SeqCst);
                return;
            }
        }
    }

    /// The compute stops reading for now: an I/O thread that backed off for it reads
    /// again at once.
    pub(super) fn resume(&self) {
        if self.backed_off.swap(false, Ordering::SeqCst) {
            self.resume.notify_one();
        }
    }

    /// On the calling thread (a compute waiting for pieces): reads what came, if no other
    /// thread is reading it (the I/O thread hands over what it reads), and hands its
    /// frames to `deliver`. An end it sees wakes the I/O thread's task
    /// ([`ended`](Self::ended)), which says how the connection ended. Returns whether it
    /// met a stream of bytes, not a few pieces: a read filled all it read into, or a
    /// frame larger than that is on its way.
    pub(super) fn read_now(&self, deliver: &dyn Fn(PeerEvent)) -> bool {
        let Some(mut state) = self.try_state() else {
            return false;
        };
        let mut streamed = false;
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
            streamed |= !drained && read.is_ok();
            if !self.took(&mut state, read, deliver) || drained {
                break;
            }
        }
        // A large piece on its way is a stream too, however fast its bytes come.
        streamed |= state.codec.waiting_for().is_some_and(|len| len > CHUNK);
        if state.end.is_some() && state.socket.take().is_some() {
            self.done.store(true, Ordering::Release);
            drop(state);
            self.ended.notify_one();
        }
        streamed
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
    use std::sync::Mutex;

    use super::*;
    use crate::ids::{Algorithm, CollectiveCall, CollectiveKind, ReduceOp};

    /// A ring's call of `kind` on one value, `seq` in the attempt, in pieces of `chunk`.
    fn call(seq: u64, kind: CollectiveKind, chunk: u32) -> CollectiveCall {
        CollectiveCall {
            seq,
            at: Default::default(),
            kind,
            len: 1,
            algorithm: Algorithm::Ring,
            chunk,
        }
    }

    /// The frames of `n` pieces, numbered by their step, one after the other.
    fn pieces(n: u32) -> Vec<u8> {
        let call = call(1, CollectiveKind::AllReduce(Some(ReduceOp::Sum)), 8);
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
    /// I/O thread's watch on it — registered with `rt` (driven only where a test drives
    /// it) at its first look.
    fn connection(rt: &tokio::runtime::Runtime) -> (std::net::TcpStream, Incoming, ReadSide) {
        connection_in(rt, Window::new())
    }

    /// The same, the compute's window given.
    fn connection_in(
        rt: &tokio::runtime::Runtime,
        window: Arc<Window>,
    ) -> (std::net::TcpStream, Incoming, ReadSide) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        let _entered = rt.enter();
        let socket = ours.try_clone().unwrap();
        let reader = Incoming::new(0, socket, BytesMut::new(), wire::codec(1 << 20), window);
        (peer, reader, ReadSide::new(ours))
    }

    /// Until `side` says its connection is readable, for 10 s at most.
    fn readable(rt: &tokio::runtime::Runtime, side: &mut ReadSide) {
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), side.readable())
                .await
                .expect("readable in 10 s")
                .unwrap()
        })
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
        let (mut peer, reader, _side) = connection(&rt);
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
        let (mut peer, reader, _side) = connection(&rt);
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
    fn the_io_thread_stays_off_while_the_compute_goes_on_looking_and_comes_back_when_it_stops() {
        let rt = runtime();
        let window = Window::new();
        let (mut peer, reader, mut side) = connection_in(&rt, Arc::clone(&window));
        let got = Mutex::new(Vec::new());
        let deliver = steps_of(&got);
        window.open(Duration::from_secs(60));
        peer.write_all(&pieces(1)).unwrap();
        readable(&rt, &mut side);
        assert!(!reader.read_ready(&side, &deliver));
        side.unwatch();
        // The compute is still looking many milliseconds on (a call after another): the
        // I/O thread does not take its watch back.
        let early = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(20), reader.resumed()).await
        });
        assert!(
            early.is_err(),
            "the I/O thread came back while the compute looked"
        );
        read_until(&reader, &deliver, || !got.lock().unwrap().is_empty());
        // Its window passes with no look, and nobody says so: the I/O thread comes back
        // by itself.
        window.open(Duration::ZERO);
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), reader.resumed())
                .await
                .expect("the I/O thread came back once the window passed")
        });
        assert_eq!(*got.lock().unwrap(), [0]);
    }

    #[test]
    fn while_the_compute_polls_the_io_thread_leaves_the_connection_to_it() {
        let rt = runtime();
        let window = Window::new();
        let (mut peer, reader, mut side) = connection_in(&rt, Arc::clone(&window));
        let got = Mutex::new(Vec::new());
        let deliver = steps_of(&got);
        let bytes = pieces(3);
        let (first, second) = (bytes.len() / 3, bytes.len() * 2 / 3);
        // The compute looks, and goes on looking: the I/O thread, woken by the piece,
        // leaves it in the socket, and lets go of its watch.
        window.open(Duration::from_secs(60));
        peer.write_all(&bytes[..first]).unwrap();
        readable(&rt, &mut side);
        assert!(!reader.read_ready(&side, &deliver));
        side.unwatch();
        assert!(got.lock().unwrap().is_empty());
        // The compute takes it itself.
        read_until(&reader, &deliver, || !got.lock().unwrap().is_empty());
        assert_eq!(*got.lock().unwrap(), [0]);
        // What comes while the watch is let go of is there when the watch is back.
        peer.write_all(&bytes[first..second]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // It stops looking: the I/O thread is told at once, and reads.
        assert!(window.close());
        reader.resume();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), reader.resumed())
                .await
                .expect("the I/O thread is told at once")
        });
        readable(&rt, &mut side);
        assert!(reader.read_ready(&side, &deliver));
        assert_eq!(*got.lock().unwrap(), [0, 1]);
        // And what comes next.
        peer.write_all(&bytes[second..]).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while got.lock().unwrap().len() < 3 {
            assert!(Instant::now() < until, "not read by the I/O thread in 10 s");
            readable(&rt, &mut side);
            assert!(reader.read_ready(&side, &deliver));
        }
        assert_eq!(*got.lock().unwrap(), [0, 1, 2]);
        // A window that ran out is no window.
        window.open(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert!(!window.polling());
        assert!(window.close());
        assert!(!window.close());
    }

    #[test]
    fn a_compute_that_meets_a_stream_of_bytes_leaves_the_io_thread_reading_beside_it() {
        let rt = runtime();
        let window = Window::new();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        let peek = ours.try_clone().unwrap();
        let reader = Incoming::new(
            0,
            ours.try_clone().unwrap(),
            BytesMut::new(),
            wire::codec(1 << 20),
            Arc::clone(&window),
        );
        let mut side = ReadSide::new(ours);
        let got = Mutex::new(Vec::new());
        let deliver = steps_of(&got);
        // One piece of 256 KiB: more than a read takes at once.
        let call = call(1, CollectiveKind::AllGather, 1 << 18);
        let body = bytes::Bytes::from(vec![7u8; 1 << 18]);
        let writer = std::thread::spawn(move || {
            for part in wire::encode_peer((0, call, 0, 0), body, 1 << 20).unwrap() {
                peer.write_all(&part).unwrap();
            }
            peer
        });
        window.open(Duration::from_secs(60));
        assert!(window.polling());
        // More than a read takes has come, for certain, before the compute reads.
        let until = Instant::now() + Duration::from_secs(10);
        let mut look = vec![0u8; CHUNK + 1];
        while peek.peek(&mut look).unwrap_or(0) <= CHUNK {
            assert!(Instant::now() < until, "not sent in 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(reader.read_now(&deliver));
        assert!(got.lock().unwrap().is_empty());
        // The window closes, and opens again only once the stream is past.
        assert!(window.streaming());
        window.open(Duration::from_secs(60));
        assert!(!window.polling());
        // The I/O thread reads the rest.
        let _peer = writer.join().unwrap();
        while got.lock().unwrap().is_empty() {
            assert!(Instant::now() < until, "not read by the I/O thread in 10 s");
            readable(&rt, &mut side);
            assert!(reader.read_ready(&side, &deliver));
        }
        std::thread::sleep(STREAMING + Duration::from_millis(1));
        window.open(Duration::from_secs(60));
        assert!(window.polling());
    }

    #[test]
    fn the_first_bytes_of_a_large_piece_are_a_stream_however_slowly_they_come() {
        let rt = runtime();
        let (mut peer, reader, _side) = connection(&rt);
        let got = Mutex::new(Vec::new());
        let deliver = steps_of(&got);
        // A small piece whole, then the first bytes of a large one.
        let small = pieces(1);
        peer.write_all(&small).unwrap();
        read_until(&reader, &deliver, || !got.lock().unwrap().is_empty());
        let body = bytes::Bytes::from(vec![7u8; 4 * CHUNK]);
        let call = call(2, CollectiveKind::AllGather, (4 * CHUNK) as _);
        let mut large = Vec::new();
        for part in wire::encode_peer((0, call, 1, 0), body, 1 << 20).unwrap() {
            large.extend_from_slice(&part);
        }
        assert!(
            !reader.read_now(&deliver),
            "a few small pieces are no stream"
        );
        peer.write_all(&large[..1000]).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while !reader.read_now(&deliver) {
            assert!(Instant::now() < until, "not told in 10 s");
            std::thread::yield_now();
        }
        assert_eq!(*got.lock().unwrap(), [0]);
    }

    #[test]
    fn the_io_thread_and_a_compute_reading_at_once_hand_over_each_piece_once_in_order() {
        let rt = Arc::new(runtime());
        let (mut peer, reader, mut side) = connection(&rt);
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
                            tokio::time::timeout(Duration::from_millis(10), side.readable()).await;
                        if !reader.read_ready(&side, &deliver) {
                            side.unwatch();
                            reader.resumed().await;
                        }
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
