//! The in-memory transport: every part of the job in this process, stepped directly by the
//! master's node — no message per worker and no serialization — unless its wire check is
//! on (by default in debug builds), which sends every message that carries a user's result
//! through the wire encoding first.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

use super::{InProcess, Inbox, LinkSpec, MasterLink, Topology, Transport, TransportError};
use super::{PeerEvent, PeerInbox, PeerLink, WireCheck, WorkerLink};
use crate::ids::{Attempt, Rank};
use crate::payload::Payload;
use crate::protocol::{Envelope, PeerMessage, ToMaster, ToWorker};

/// Runs the master and every worker in this process. The master's node steps each worker
/// directly ([`Transport::in_process`]): a broadcast is handed to each worker as a typed
/// value — the master result one `Arc` shared by every worker — its code runs inline or on
/// the compute pool as placement says, and the results are taken by the node as one batch.
///
/// This is the default transport of [`Job`](crate::Job).
///
/// # The wire check
///
/// A result type whose serde form does not survive an encoding works in memory and fails
/// over TCP. With the wire check on, every message that carries a master or worker result
/// (`Iterate`, `Finish`, `Result`) is encoded as the TCP transport would encode it and
/// decoded again, and the decoded copy is what the peer gets — so such a type fails the
/// job's own tests in memory, with the same [`JobError::Decode`](crate::JobError::Decode)
/// (or a wrong result) that a cluster run would give. It is on by default in builds with
/// debug assertions (`cargo test`, `cargo run` without `--release`), where a test should
/// find this, and off in release builds, where it would cost an encoding per message;
/// [`wire_check`](Self::wire_check) sets it either way.
pub struct MemoryTransport<M, W> {
    wire_check: WireCheck,
    _types: PhantomData<fn() -> (M, W)>,
}

impl<M, W> MemoryTransport<M, W> {
    /// A transport for one job, with the wire check on in builds with debug assertions.
    pub fn new() -> Self {
        MemoryTransport {
            wire_check: WireCheck::of(cfg!(debug_assertions)),
            _types: PhantomData,
        }
    }

    /// Turns the [wire check](Self#the-wire-check) on or off.
    pub fn wire_check(mut self, on: bool) -> Self {
        self.wire_check = WireCheck::of(on);
        self
    }
}

impl<M, W> Default for MemoryTransport<M, W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M, W> fmt::Debug for MemoryTransport<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTransport")
            .field("wire_check", &self.wire_check)
            .finish()
    }
}

fn connects_nothing() -> TransportError {
    TransportError::Unsupported(
        "the in-memory transport connects nothing: the master's node steps its workers directly"
            .into(),
    )
}

impl<M: Payload, W: Payload> Transport<M, W> for MemoryTransport<M, W> {
    fn in_process(&self) -> Option<InProcess> {
        Some(InProcess::new(self.wire_check))
    }

    fn prepare(&mut self, spec: &LinkSpec) -> Result<Topology, TransportError> {
        Ok(Topology {
            master: true,
            workers: (0..spec.workers).collect(),
            restarted: 0,
        })
    }

    fn bind_master(
        &mut self,
        _attempt: Attempt,
        _inbox: Inbox<Envelope<ToMaster<W>>>,
    ) -> Result<Box<dyn MasterLink<M>>, TransportError> {
        Err(connects_nothing())
    }

    fn connect_worker(
        &mut self,
        _rank: Rank,
        _inbox: Inbox<ToWorker<M>>,
    ) -> Result<Box<dyn WorkerLink<W>>, TransportError> {
        Err(connects_nothing())
    }
}

/// The workers of one process as each other's peers: a piece is handed to the peer's
/// inbox on the sending thread — no copy, no encoding, unless the wire check is on.
pub(crate) struct MemoryMesh {
    /// Each rank's inbox, once its worker started (again, after a restart of every
    /// worker: the newest one).
    inboxes: Vec<RwLock<Option<Arc<PeerInbox>>>>,
    wire_check: WireCheck,
}

impl MemoryMesh {
    /// A mesh of `workers` ranks; with the wire check on, pieces travel encoded, as over
    /// TCP.
    pub(crate) fn new(workers: usize, wire_check: WireCheck) -> Arc<Self> {
        Arc::new(MemoryMesh {
            inboxes: (0..workers).map(|_| RwLock::new(None)).collect(),
            wire_check,
        })
    }
}

impl PeerLink for MemoryMesh {
    fn join(&self, rank: Rank, inbox: PeerInbox) {
        if let Some(slot) = self.inboxes.get(rank) {
            *slot.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(inbox));
        }
    }

    fn send(&self, to: Rank, msg: PeerMessage) -> Result<(), TransportError> {
        let inbox = self
            .inboxes
            .get(to)
            .and_then(|slot| slot.read().unwrap_or_else(|e| e.into_inner()).clone())
            .ok_or_else(|| TransportError::io(format!("worker {to} is not running"), None))?;
        // Called outside the lock: an inbox may take its time.
        inbox(PeerEvent::Message(msg));
        Ok(())
    }

    fn carries_values(&self) -> bool {
        self.wire_check == WireCheck::Off
    }

    fn spans_processes(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_here_and_nothing_is_connected() {
        let mut t = MemoryTransport::<String, u32>::new().wire_check(false);
        assert_eq!(
            Transport::<String, u32>::in_process(&t),
            Some(InProcess::new(WireCheck::Off))
        );
        let topology = t.prepare(&LinkSpec::new("t", 3)).unwrap();
        assert!(topology.master);
        assert_eq!(topology.workers, vec![0, 1, 2]);
        assert!(matches!(
            t.connect_worker(0, Box::new(|_| {})),
            Err(TransportError::Unsupported(_))
        ));
    }
}
