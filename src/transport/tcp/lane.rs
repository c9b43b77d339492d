//! A connection's way out: when nothing is queued ahead of a frame, the thread that sends
//! it — the coordination thread, mostly — writes what the socket takes at once, with no
//! hand-off to the transport's I/O thread and no wake-up of it; the rest of the frame (all
//! of it, when something is queued) is queued for the I/O thread's writer, which writes in
//! order. The writer's own heartbeats go the same way, so no two writes ever interleave.
//! A frame may be sent as parts (a piece's head and its body); what is queued is then a
//! part, written in order with the rest. A collective's call no one waits on may be held
//! back ([`Lane::defer`]) until the next frame goes, or for [`HOLD`] at most (the writer
//! then sends it), and goes ahead of the next frame — with it in one write, when that is
//! small; the calls held that follow one another are said in one word ([`CallRun`]).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, Notify};

use super::wire::{self, Wire};
use crate::protocol::CallRun;

/// What a lane writes to: a connection's write half, or (a peer's connection to this
/// worker, which carries only this end's heartbeats and goodbye) a handle of the socket's
/// own that the I/O driver does not watch — so that what comes in on the connection wakes
/// only its reader, and that only while it reads (`ReadSide` in `peer`).
pub(super) enum Socket {
    Half(OwnedWriteHalf),
    Own(OwnWrite),
}

impl From<OwnedWriteHalf> for Socket {
    fn from(half: OwnedWriteHalf) -> Self {
        Socket::Half(half)
    }
}

impl Socket {
    /// Writes what the socket takes of `buf` now, without waiting.
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Socket::Half(half) => half.try_write(buf),
            Socket::Own(own) => std::io::Write::write(&mut &own.0, buf),
        }
    }

    /// Writes some of `buf`, waiting for room as it must.
    async fn write_some(&self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            if let Socket::Half(half) = self {
                half.writable().await?;
            }
            match self.try_write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Socket::Own(_) = self {
                        // Unwatched: looks again in a while. Only heartbeats and a goodbye
                        // go this way, a few bytes each; the socket is full only when its
                        // peer stopped reading, which its silence tells soon.
                        tokio::time::sleep(OWN_RETRY).await;
                    }
                }
                written => return written,
            }
        }
    }
}

/// How long a write to an unwatched socket ([`Socket::Own`]) that would block waits
/// before it tries again.
const OWN_RETRY: Duration = Duration::from_millis(5);

/// A socket's handle for writing only (non-blocking), not watched by the I/O driver (see
/// [`Socket`]); its end of the connection is shut for writing when it goes, as a write
/// half's is.
pub(super) struct OwnWrite(pub(super) std::net::TcpStream);

impl Drop for OwnWrite {
    fn drop(&mut self) {
        let _ = self.0.shutdown(std::net::Shutdown::Write);
    }
}

/// The longest calls are held back ([`Lane::defer`]) with nothing else sent.
pub(super) use crate::protocol::HOLD;

/// The most bytes of the next frame copied into one write with what was held back ahead
/// of it; a larger one goes as a write of its own.
const JOIN: usize = 16 * 1024;

/// The lane's queue is gone: its connection ended.
#[derive(Debug)]
pub(super) struct Closed;

/// One connection's outgoing frames (see the [module docs](self)).
pub(super) struct Lane {
    inner: Mutex<Inner>,
    queue: mpsc::UnboundedSender<Bytes>,
    /// Told when a frame is held back and none was: the writer sends it after [`HOLD`].
    held: Arc<Notify>,
}

struct Inner {
    /// The connection's write half, while its writer runs: frames may be written
    /// directly.
    writer: Option<Arc<Socket>>,
    /// Frames, or parts of one, queued for the writer and not written yet: while there
    /// are any, a new frame queues behind them.
    queued: usize,
    /// Calls held back until the next frame goes ([`Lane::defer`]), each run of them
    /// one word.
    deferred: Vec<CallRun>,
    /// The largest frame the connection carries, as the held calls' sender said.
    max_held: usize,
    /// The writes made from the sending thread.
    #[cfg(test)]
    writes: usize,
}

impl Lane {
    /// A lane, and the queue its writer takes frames from.
    pub(super) fn new() -> (Arc<Lane>, mpsc::UnboundedReceiver<Bytes>) {
        let (queue, rx) = mpsc::unbounded_channel();
        let lane = Lane {
            inner: Mutex::new(Inner {
                writer: None,
                queued: 0,
                deferred: Vec::new(),
                max_held: usize::MAX,
                #[cfg(test)]
                writes: 0,
            }),
            queue,
            held: Arc::new(Notify::new()),
        };
        (Arc::new(lane), rx)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `frame`: written at once if nothing is queued and the socket takes it, else
    /// (what is left of it) queued for the writer.
    pub(super) fn send(&self, frame: Bytes) -> Result<(), Closed> {
        self.send_parts([frame])
    }

    /// Sends one frame made of `parts`, in order and with nothing between them: a piece's
    /// head and its body, which is not copied into one buffer with it.
    pub(super) fn send_parts<const N: usize>(&self, parts: [Bytes; N]) -> Result<(), Closed> {
        #[cfg(feature = "metrics")]
        crate::metrics::sent(parts.iter().map(Bytes::len).sum());
        let mut inner = self.lock();
        let small = parts.iter().map(Bytes::len).sum::<usize>() <= JOIN;
        if inner.deferred.is_empty() {
            if N > 1 && small {
                // One write, so one segment: a peer woken by the head would find no body.
                let mut joined = bytes::BytesMut::new();
                parts.iter().for_each(|part| joined.extend_from_slice(part));
                return self.put(&mut inner, joined.freeze());
            }
            for rest in parts {
                self.put(&mut inner, rest)?;
            }
            return Ok(());
        }
        // What was held back goes first, in one write with the frame when that is small:
        // one by one they would cost the writes that holding them back saves.
        let held = std::mem::take(&mut inner.deferred);
        let mut joined = bytes::BytesMut::new();
        for run in held {
            let calls = run.calls();
            match wire::encode(&Wire::<(), ()>::ToMaster(run.word()), inner.max_held) {
                Ok(frame) => {
                    #[cfg(feature = "metrics")]
                    crate::metrics::sent(frame.len());
                    joined.extend_from_slice(&frame);
                }
                // Not met by a call's word, a few dozen bytes; if it were, the master's
                // node, not hearing of the calls, fails the job naming the rank.
                Err(error) => {
                    tracing::error!(calls, %error, "the word of a run of calls was not sent")
                }
            }
        }
        if small {
            parts.iter().for_each(|part| joined.extend_from_slice(part));
            return self.put(&mut inner, joined.freeze());
        }
        self.put(&mut inner, joined.freeze())?;
        for rest in parts {
            self.put(&mut inner, rest)?;
        }
        Ok(())
    }

    /// Holds `calls` back until the next frame is sent, or [`HOLD`] passed (the writer
    /// then sends it), and sends their word ahead of that — in frames of at most `max`
    /// bytes: for calls no one waits on the word of, which so cost no write of their own;
    /// and the calls that follow the last held join it, one word for them all.
    pub(super) fn defer(&self, calls: CallRun, max: usize) -> Result<(), Closed> {
        if self.queue.is_closed() {
            return Err(Closed);
        }
        let first = {
            let mut inner = self.lock();
            inner.max_held = max;
            let unjoined = match inner.deferred.last_mut() {
                Some(last) => last.join(calls).err(),
                None => Some(calls),
            };
            match unjoined {
                Some(calls) => {
                    inner.deferred.push(calls);
                    inner.deferred.len() == 1
                }
                None => false,
            }
        };
        if first {
            self.held.notify_one();
        }
        Ok(())
    }

    /// Sends what is held back, if anything is.
    pub(super) fn flush_held(&self) -> Result<(), Closed> {
        self.send_parts::<0>([])
    }

    /// Writes `rest` at once if nothing is queued and the socket takes it, else (what is
    /// left of it) queues it for the writer.
    fn put(&self, inner: &mut Inner, mut rest: Bytes) -> Result<(), Closed> {
        if inner.queued == 0 {
            if let Some(writer) = &inner.writer {
                #[cfg(test)]
                {
                    inner.writes += 1;
                }
                match writer.try_write(&rest) {
                    Ok(n) if n == rest.len() => return Ok(()),
                    Ok(n) if n > 0 => rest = rest.slice(n..),
                    // Would block, or failed: the writer waits for the socket, or finds
                    // the failure.
                    _ => {}
                }
            }
        }
        self.queue.send(rest).map_err(|_| Closed)?;
        inner.queued += 1;
        Ok(())
    }

    /// The writer wrote a queued frame.
    fn written(&self) {
        let mut inner = self.lock();
        inner.queued = inner.queued.saturating_sub(1);
    }

    /// The writer runs with `writer`, or (`None`) no longer does.
    fn open(&self, writer: Option<Arc<Socket>>) {
        self.lock().writer = writer;
    }

    /// Drops every frame queued and every word of calls held back (for a master this
    /// connection lost: the next one hears nothing of them); returns how many.
    pub(super) fn clear(&self, queue: &mut mpsc::UnboundedReceiver<Bytes>) -> usize {
        let mut inner = self.lock();
        let mut dropped = 0;
        while queue.try_recv().is_ok() {
            dropped += 1;
        }
        inner.queued = 0;
        dropped += inner.deferred.len();
        inner.deferred.clear();
        dropped
    }
}

/// The writer's handle on its lane: weak, so that the queue closes — and the writer ends —
/// once everyone that sends on the lane let go of it.
pub(super) struct Writing {
    lane: Weak<Lane>,
    writer: Arc<Socket>,
    /// Told when the lane holds a frame back ([`Lane::defer`]).
    pub(super) held: Arc<Notify>,
}

impl Writing {
    /// The writer of `lane` starts with `writer`: from now on frames may be written
    /// directly.
    pub(super) fn start(lane: Weak<Lane>, writer: Socket) -> Self {
        let writer = Arc::new(writer);
        let held = match lane.upgrade() {
            Some(lane) => {
                lane.open(Some(Arc::clone(&writer)));
                Arc::clone(&lane.held)
            }
            None => Arc::new(Notify::new()),
        };
        Writing { lane, writer, held }
    }

    /// Writes a queued frame (or part of one) whole, waiting for the socket as it must.
    pub(super) async fn write_queued(&self, frame: &[u8]) -> std::io::Result<()> {
        write_all(&self.writer, frame).await?;
        if let Some(lane) = self.lane.upgrade() {
            lane.written();
        }
        Ok(())
    }

    /// Sends the writer's own frame (a heartbeat) on the lane, so that it never cuts into
    /// a frame written directly.
    pub(super) fn send(&self, frame: Bytes) {
        if let Some(lane) = self.lane.upgrade() {
            let _ = lane.send(frame);
        }
    }

    /// Sends what the lane holds back ([`Lane::defer`]).
    pub(super) fn flush_held(&self) {
        if let Some(lane) = self.lane.upgrade() {
            let _ = lane.flush_held();
        }
    }

    /// The writer stops: frames queue from now on (and are written by nobody).
    pub(super) fn stop(&self) {
        if let Some(lane) = self.lane.upgrade() {
            lane.open(None);
        }
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes all of `buf` on a socket shared with the senders' direct writes (which wait
/// for the lane's queue, so they never run meanwhile).
async fn write_all(writer: &Socket, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match writer.write_some(buf).await? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => buf = &buf[n..],
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A lane whose writer runs on a connection to a listener on loopback, with the
    /// heartbeat `beat` every `interval`; and the listener's end, to read what came.
    async fn connected(
        beat: &'static [u8],
        interval: Duration,
    ) -> (Arc<Lane>, TcpStream, tokio::sync::watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_read, write) = client.into_split();
        let (lane, mut queue) = Lane::new();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let weak = Arc::downgrade(&lane);
        tokio::spawn(async move {
            let beat = Bytes::from_static(beat);
            let _ =
                super::super::conn::write_loop(weak, write, &mut queue, stopped, beat, interval)
                    .await;
        });
        // The writer is running once a frame sent goes out.
        (lane, server, stop)
    }

    async fn read(server: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut got = vec![0; n];
        tokio::time::timeout(Duration::from_secs(10), server.read_exact(&mut got))
            .await
            .expect("the bytes came in time")
            .unwrap();
        got
    }

    #[tokio::test]
    async fn a_lane_on_an_unwatched_socket_writes_every_frame_in_order_once_its_peer_reads() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.set_nonblocking(true).unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let (lane, mut queue) = Lane::new();
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let weak = Arc::downgrade(&lane);
        let socket = Socket::Own(OwnWrite(client));
        tokio::spawn(async move {
            let beat = Bytes::new();
            let interval = Duration::from_secs(3600);
            let _ =
                super::super::conn::write_loop(weak, socket, &mut queue, stopped, beat, interval)
                    .await;
        });
        // The writer runs once a first frame goes out.
        lane.send(Bytes::from_static(b"first;")).unwrap();
        assert_eq!(read(&mut server, 6).await, b"first;");
        // More than the socket's buffers hold while its peer does not read: what does not
        // go at once is queued, and written by the writer as room comes.
        let frames: Vec<Bytes> = (0..64u8)
            .map(|i| Bytes::from(vec![i; 256 * 1024]))
            .collect();
        for frame in &frames {
            lane.send(frame.clone()).unwrap();
        }
        assert!(
            lane.lock().queued > 0,
            "the socket took everything: no test"
        );
        let got = read(&mut server, frames.len() * 256 * 1024).await;
        assert!(got
            .chunks(256 * 1024)
            .zip(&frames)
            .all(|(got, sent)| got == &sent[..]));
        // Its end shuts for writing when the writer goes.
        drop(lane);
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), server.read_to_end(&mut rest))
            .await
            .expect("shut within 10 s")
            .unwrap();
        assert!(rest.is_empty());
    }

    /// Call `epoch` of rank 0's, an 8-byte `all_reduce` no rank awaits the word on.
    fn call(epoch: crate::ids::Epoch) -> CallRun {
        use crate::ids::{CollectiveKind, GroupId, ReduceOp, SyncKind};
        CallRun::of(crate::protocol::ToMaster::<()>::Sync {
            attempt: 0,
            epoch,
            calls: 1,
            kind: SyncKind::Collective(CollectiveKind::AllReduce(Some(ReduceOp::Sum))),
            message: b"shape".to_vec(),
            awaits: false,
            group: GroupId::ALL,
            ranks: Vec::new(),
        })
        .expect("no rank awaits it")
    }

    /// The frame of the word that says `calls` calls from `epoch`.
    fn word(epoch: crate::ids::Epoch, calls: u32) -> Bytes {
        let mut run = call(epoch);
        for e in epoch + 1..epoch + u64::from(calls) {
            run.join(call(e)).expect("the run's next");
        }
        wire::encode(&Wire::<(), ()>::ToMaster(run.word()), usize::MAX).unwrap()
    }

    #[tokio::test]
    async fn calls_held_back_go_ahead_of_the_next_frame_one_word_for_those_that_follow_one_another()
    {
        let (lane, mut server, _stop) = connected(b"", Duration::from_secs(3600)).await;
        lane.send(Bytes::from_static(b"first;")).unwrap();
        assert_eq!(read(&mut server, 6).await, b"first;");
        for epoch in 0..50 {
            lane.defer(call(epoch), usize::MAX).unwrap();
        }
        // One that skips an epoch is another run, another word.
        lane.defer(call(60), usize::MAX).unwrap();
        lane.send(Bytes::from_static(b"next;")).unwrap();
        let (fifty, one) = (word(0, 50), word(60, 1));
        let got = read(&mut server, fifty.len() + one.len() + 5).await;
        assert_eq!(got, [&fifty[..], &one[..], b"next;"].concat());
        // The master's node reads the word as fifty calls, whatever its payload type.
        let decoded: Wire<(), u64> = wire::decode(&fifty[4..]).unwrap();
        let Wire::ToMaster(crate::protocol::ToMaster::Sync { epoch, calls, .. }) = decoded else {
            panic!("a call's word: {decoded:?}");
        };
        assert_eq!((epoch, calls), (0, 50));
    }

    #[test]
    fn a_held_words_frame_is_never_larger_than_its_bound() {
        use crate::ids::{CollectiveKind, GroupId, ReduceOp, SyncKind};
        let ranks: Vec<crate::ids::Rank> = (0..1_000).map(|r| r * 1_000_003).collect();
        let word = crate::protocol::ToMaster::<()>::Sync {
            attempt: u32::MAX,
            epoch: u64::MAX - u64::from(crate::protocol::MAX_CALLS),
            calls: crate::protocol::MAX_CALLS,
            kind: SyncKind::Collective(CollectiveKind::AllReduce(Some(ReduceOp::Max))),
            message: vec![7; 300],
            awaits: false,
            group: GroupId::of(&ranks),
            ranks,
        };
        let run = CallRun::of(word).unwrap();
        let frame = wire::encode(&Wire::<(), ()>::ToMaster(run.clone().word()), usize::MAX);
        assert!(frame.unwrap().len() <= run.most_bytes());
        for kind in [SyncKind::Barrier, SyncKind::AllGather] {
            let word = crate::protocol::ToMaster::<()>::Sync {
                attempt: u32::MAX,
                epoch: u64::MAX,
                calls: 1,
                kind,
                message: Vec::new(),
                awaits: false,
                group: GroupId::ALL,
                ranks: Vec::new(),
            };
            let run = CallRun::of(word).unwrap();
            let frame = wire::encode(&Wire::<(), ()>::ToMaster(run.clone().word()), usize::MAX);
            assert!(frame.unwrap().len() <= run.most_bytes());
        }
    }

    #[tokio::test]
    async fn calls_held_back_go_on_their_own_once_held_long_enough() {
        // No heartbeat for an hour: what sends them is the writer, after `HOLD`.
        let (lane, mut server, _stop) = connected(b"<beat>", Duration::from_secs(3600)).await;
        let held = tokio::time::Instant::now();
        lane.defer(call(0), usize::MAX).unwrap();
        lane.defer(call(1), usize::MAX).unwrap();
        let two = word(0, 2);
        assert_eq!(read(&mut server, two.len()).await, two);
        assert!(
            held.elapsed() >= HOLD,
            "they went before they were held {HOLD:?}"
        );
    }

    #[tokio::test]
    async fn a_stopping_writer_sends_what_is_held_back_and_a_closed_lane_holds_nothing() {
        let (lane, mut server, stop) = connected(b"", Duration::from_secs(3600)).await;
        lane.defer(call(0), usize::MAX).unwrap();
        stop.send(true).unwrap();
        let one = word(0, 1);
        assert_eq!(read(&mut server, one.len()).await, one);
        let (closed, queue) = Lane::new();
        drop(queue);
        assert!(closed.defer(call(0), usize::MAX).is_err());
    }

    #[tokio::test]
    async fn a_small_frame_in_parts_goes_in_one_write_and_a_large_one_in_a_write_a_part() {
        let (lane, mut server, _stop) = connected(b"", Duration::from_secs(3600)).await;
        lane.send(Bytes::from_static(b"first;")).unwrap();
        assert_eq!(read(&mut server, 6).await, b"first;");
        let writes = || lane.lock().writes;
        let before = writes();
        // A piece's head and its body: one write, so the peer never wakes to half of it.
        lane.send_parts([Bytes::from_static(b"head;"), Bytes::from_static(b"body;")])
            .unwrap();
        assert_eq!(read(&mut server, 10).await, b"head;body;");
        assert_eq!(writes() - before, 1);
        // A large body is not copied: it goes as it is, after its head.
        let body = Bytes::from(vec![7u8; JOIN + 1]);
        lane.send_parts([Bytes::from_static(b"head;"), body.clone()])
            .unwrap();
        let got = read(&mut server, 5 + body.len()).await;
        assert_eq!((&got[..5], &got[5..]), (&b"head;"[..], &body[..]));
        assert_eq!(writes() - before, 3);
    }

    #[tokio::test]
    async fn clearing_a_lane_drops_what_it_held_back() {
        let (lane, mut server, _stop) = connected(b"", Duration::from_secs(3600)).await;
        lane.defer(call(0), usize::MAX).unwrap();
        lane.defer(call(1), usize::MAX).unwrap();
        let (_tx, mut rx) = mpsc::unbounded_channel();
        assert_eq!(lane.clear(&mut rx), 1);
        lane.send(Bytes::from_static(b"after;")).unwrap();
        assert_eq!(read(&mut server, 6).await, b"after;");
    }
}
