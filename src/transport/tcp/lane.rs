//! A connection's way out: when nothing is queued ahead of a frame, the thread that sends
//! it — the coordination thread, mostly — writes what the socket takes at once, with no
//! hand-off to the transport's I/O thread and no wake-up of it; the rest of the frame (all
//! of it, when something is queued) is queued for the I/O thread's writer, which writes in
//! order. The writer's own heartbeats go the same way, so no two writes ever interleave.
//! A frame may be sent as parts (a piece's head and its body); what is queued is then a
//! part, written in order with the rest.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// The lane's queue is gone: its connection ended.
#[derive(Debug)]
pub(super) struct Closed;

/// One connection's outgoing frames (see the [module docs](self)).
pub(super) struct Lane {
    inner: Mutex<Inner>,
    queue: mpsc::UnboundedSender<Bytes>,
}

struct Inner {
    /// The connection's write half, while its writer runs: frames may be written
    /// directly.
    writer: Option<Arc<OwnedWriteHalf>>,
    /// Frames, or parts of one, queued for the writer and not written yet: while there
    /// are any, a new frame queues behind them.
    queued: usize,
}

impl Lane {
    /// A lane, and the queue its writer takes frames from.
    pub(super) fn new() -> (Arc<Lane>, mpsc::UnboundedReceiver<Bytes>) {
        let (queue, rx) = mpsc::unbounded_channel();
        let lane = Lane {
            inner: Mutex::new(Inner {
                writer: None,
                queued: 0,
            }),
            queue,
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
        for mut rest in parts {
            if inner.queued == 0 {
                if let Some(writer) = &inner.writer {
                    match writer.try_write(&rest) {
                        Ok(n) if n == rest.len() => continue,
                        Ok(n) if n > 0 => rest = rest.slice(n..),
                        // Would block, or failed: the writer waits for the socket, or finds
                        // the failure.
                        _ => {}
                    }
                }
            }
            self.queue.send(rest).map_err(|_| Closed)?;
            inner.queued += 1;
        }
        Ok(())
    }

    /// The writer wrote a queued frame.
    fn written(&self) {
        let mut inner = self.lock();
        inner.queued = inner.queued.saturating_sub(1);
    }

    /// The writer runs with `writer`, or (`None`) no longer does.
    fn open(&self, writer: Option<Arc<OwnedWriteHalf>>) {
        self.lock().writer = writer;
    }

    /// Drops every frame queued (for a master this connection lost: the next one hears
    /// nothing of them); returns how many.
    pub(super) fn clear(&self, queue: &mut mpsc::UnboundedReceiver<Bytes>) -> usize {
        let mut inner = self.lock();
        let mut dropped = 0;
        while queue.try_recv().is_ok() {
            dropped += 1;
        }
        inner.queued = 0;
        dropped
    }
}

/// The writer's handle on its lane: weak, so that the queue closes — and the writer ends —
/// once everyone that sends on the lane let go of it.
pub(super) struct Writing {
    lane: Weak<Lane>,
    writer: Arc<OwnedWriteHalf>,
}

impl Writing {
    /// The writer of `lane` starts with `writer`: from now on frames may be written
    /// directly.
    pub(super) fn start(lane: Weak<Lane>, writer: OwnedWriteHalf) -> Self {
        let writer = Arc::new(writer);
        if let Some(lane) = lane.upgrade() {
            lane.open(Some(Arc::clone(&writer)));
        }
        Writing { lane, writer }
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

/// Writes all of `buf` on a write half shared with the senders' direct writes (which wait
/// for the lane's queue, so they never run meanwhile).
async fn write_all(writer: &OwnedWriteHalf, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        writer.writable().await?;
        match writer.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
