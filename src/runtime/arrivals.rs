//! Workers' messages from other threads, on their way to the node actor: what the
//! transport's threads and the hosted workers' compute threads hand over, gathered into
//! batches so that a burst wakes the node once.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::{Message, Recipient};

use crate::protocol::{Envelope, ToMaster};

/// A worker's message from another thread (the transport's, or a hosted worker's compute
/// thread), stamped with when it was handed over: its deadline is judged by that instant,
/// not by when the node got to it (inline compute may have held the thread meanwhile).
pub(crate) struct Arrived<W> {
    pub(crate) env: Envelope<ToMaster<W>>,
    pub(crate) at: Instant,
}

/// Workers' messages from other threads (the transport's, a compute thread's sync calls),
/// gathered for the node actor: the first of a batch wakes it with one message
/// ([`Drain`]), the rest join the batch while it has not taken it — no hand-off per
/// message when they come in bursts. Invariant: while the batch is not empty, a `Drain`
/// is queued that has not started.
pub(crate) struct Arrivals<W> {
    batch: Mutex<Vec<Arrived<W>>>,
    /// The node actor, woken by a [`Drain`].
    node: Recipient<Drain>,
}

impl<W> Arrivals<W> {
    /// Arrivals for the node actor that `node` wakes.
    pub(crate) fn new(node: Recipient<Drain>) -> Arc<Self> {
        Arc::new(Arrivals {
            batch: Mutex::new(Vec::new()),
            node,
        })
    }

    /// `env` arrived now.
    pub(crate) fn deliver(&self, env: Envelope<ToMaster<W>>) {
        self.deliver_if(env, || true);
    }

    /// Delivers `env` if `current` still holds, judged under the same lock as
    /// [`hold`](Self::hold): a link closed under it delivers nothing after.
    pub(crate) fn deliver_if(
        &self,
        env: Envelope<ToMaster<W>>,
        current: impl FnOnce() -> bool,
    ) -> bool {
        let mut batch = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if !current() {
            return false;
        }
        batch.push(Arrived {
            env,
            at: Instant::now(),
        });
        if batch.len() == 1 {
            // Under the lock, so that the invariant holds at every moment (an unbounded
            // mailbox's send never blocks).
            self.node.do_send(Drain);
        }
        true
    }

    /// Runs `f` under the batch's lock: no delivery is under way meanwhile.
    pub(crate) fn hold<T>(&self, f: impl FnOnce() -> T) -> T {
        let _batch = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        f()
    }

    /// Takes the batch, leaving `spare` (empty) in its place.
    pub(crate) fn take(&self, spare: Vec<Arrived<W>>) -> Vec<Arrived<W>> {
        let mut batch = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *batch, spare)
    }
}

/// The batch of [`Arrivals`] waits for the node actor.
pub(crate) struct Drain;

impl Message for Drain {
    type Result = ();
}
