//! The transport's I/O thread: one tokio runtime, on a thread of its own, for every
//! connection's tasks; stopped and joined when the transport is dropped.

use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio_util::task::TaskTracker;

use crate::transport::TransportError;

/// The transport's I/O thread: a tokio runtime that runs every connection's tasks.
pub(super) struct IoThread {
    pub(super) handle: tokio::runtime::Handle,
    pub(super) tracker: TaskTracker,
    pub(super) stop: watch::Sender<bool>,
    done: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl IoThread {
    pub(super) fn start(name: String) -> Result<Self, TransportError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                TransportError::io(format!("cannot start the I/O runtime: {e}"), Some(e))
            })?;
        let handle = runtime.handle().clone();
        let tracker = TaskTracker::new();
        let (stop, _) = watch::channel(false);
        let (done, done_rx) = oneshot::channel::<()>();
        let drained = tracker.clone();
        // It logs where the thread that starts it (the job's) does.
        let thread = crate::log::spawn(name, move || {
            runtime.block_on(async move {
                let _ = done_rx.await;
                // Writers flush what is queued once `stop` is set; give them a moment.
                drained.close();
                let _ = tokio::time::timeout(Duration::from_secs(5), drained.wait()).await;
            });
            // Dropping the runtime would wait for blocking work (a name lookup in a
            // connect, say) however long it takes; bound it.
            runtime.shutdown_timeout(Duration::from_secs(1));
        })
        .map_err(|e| TransportError::io(format!("cannot start the I/O thread: {e}"), Some(e)))?;
        Ok(IoThread {
            handle,
            tracker,
            stop,
            done: Some(done),
            thread: Some(thread),
        })
    }

    pub(super) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let _guard = self.handle.enter();
        self.tracker.spawn(task);
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        // Writers send what is queued, then every task ends; the thread is joined, so no
        // thread of the transport outlives it.
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
