//! Job events, to drive progress bars, metrics and logs.
//!
//! Subscribe with [`JobBuilder::on_event`](crate::JobBuilder::on_event). The callback runs
//! on the job's coordination thread, in order: keep it cheap (update a progress bar, bump a
//! counter), or hand events to another thread with [`channel`]. A subscriber that panics
//! is logged and skipped for that event; the job goes on.

use std::sync::mpsc;
use std::sync::Arc;

pub use crate::protocol::JobEvent;

pub(crate) type Callback = Arc<dyn Fn(&JobEvent) + Send + Sync + 'static>;

/// The subscribers of one job.
#[derive(Clone, Default)]
pub(crate) struct Events {
    subscribers: Vec<Callback>,
}

impl Events {
    pub(crate) fn subscribe(&mut self, callback: Callback) {
        self.subscribers.push(callback);
    }

    /// Whether anyone listens.
    pub(crate) fn is_listened_to(&self) -> bool {
        !self.subscribers.is_empty()
    }

    /// Emits the event made by `make`, which is not called when nobody listens.
    pub(crate) fn emit(&self, make: impl FnOnce() -> JobEvent) {
        if self.subscribers.is_empty() {
            return;
        }
        let event = make();
        for s in &self.subscribers {
            // A subscriber's panic is logged and the job goes on: watching a job must not
            // be able to break it.
            if let Err(payload) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s(&event)))
            {
                tracing::error!(
                    cause = %crate::error::Cause::from_panic(payload),
                    ?event,
                    "an event subscriber panicked"
                );
            }
        }
    }
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Events({} subscribers)", self.subscribers.len())
    }
}

/// A subscriber that sends every event into a channel, and the channel's receiving end.
///
/// ```
/// let (subscriber, events) = superstep::events::channel();
/// subscriber(&superstep::JobEvent::WorkerDone { rank: 3 });
/// assert!(matches!(events.try_recv(), Ok(superstep::JobEvent::WorkerDone { rank: 3 })));
/// ```
pub fn channel() -> (
    impl Fn(&JobEvent) + Send + Sync + 'static,
    mpsc::Receiver<JobEvent>,
) {
    let (tx, rx) = mpsc::channel();
    let subscriber = move |event: &JobEvent| {
        // The receiver may be gone; events are then not wanted.
        let _ = tx.send(event.clone());
    };
    (subscriber, rx)
}
