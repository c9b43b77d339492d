//! The route a transport's inbox delivers a worker's messages by: to the rank's current
//! worker in an actor of its own, or — while its process replaces it in a gang restart
//! (`ToWorker::Restart`, or a master's node reached again under a policy that restarts
//! every worker) — held for the new one. It also keeps the copy of a checkpoint the
//! master's node sends the rank, and offers it to each master's node its link reaches.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use actix::Addr;

use super::lock;
use super::worker_actor::WorkerActor;
use crate::error::JobError;
use crate::ids::{Attempt, Rank};
use crate::payload::Payload;
use crate::protocol::{ToMaster, ToWorker};
use crate::transport::WorkerLink;

/// Where a process keeps the newest copy of a checkpoint the master's node sent a rank:
/// shared by the rank's routes, one after another.
pub(crate) type ReplicaSlot = Mutex<Option<crate::protocol::Replica>>;

/// What to do when a worker reached through the transport must start over in another
/// attempt (its rank, the attempt, the failure the job recovers from): the process that
/// runs it replaces it (`LocalWorkers::restart_linked`).
pub(crate) type OnRestart = Arc<dyn Fn(Rank, Attempt, JobError) + Send + Sync>;

/// Where the transport's inbox of a worker reached through it delivers the master's
/// messages: to the rank's current worker, or — while this process replaces it in a gang
/// restart — held for the new one, in their order.
pub(crate) struct Route<M: Payload, W: Payload> {
    pub(super) rank: Rank,
    /// Whether a master's node of another attempt (one started again) restarts every
    /// worker too: the job's failures restart every worker.
    pub(super) gang: bool,
    pub(super) state: Mutex<RouteState<M, W>>,
    pub(super) on_restart: OnRestart,
    /// The copy of a checkpoint this process keeps for the rank (it outlives the rank's
    /// workers and routes).
    pub(super) replica: Arc<ReplicaSlot>,
    /// The link whose inbox this route is, once made: where the copy is offered.
    pub(super) link: OnceLock<Weak<dyn WorkerLink<W>>>,
    /// How many times the link reached a master's node (`Connected`).
    pub(super) connections: AtomicU32,
}

pub(super) enum RouteState<M: Payload, W: Payload> {
    /// To the worker made in `attempt`.
    To {
        addr: Addr<WorkerActor<M, W>>,
        attempt: Attempt,
    },
    /// A new worker of `attempt` is being made: what arrives meanwhile waits for it.
    Restarting {
        attempt: Attempt,
        held: Vec<ToWorker<M>>,
    },
}

impl<M: Payload, W: Payload> Route<M, W> {
    /// Delivers `msg` from the master. A gang restart — the master's `Restart` into
    /// another attempt, or in a job whose failures restart every worker, a link that
    /// reached a master's node of another attempt or again (one started again) — holds
    /// what follows and asks this process to replace the worker.
    pub(super) fn deliver(&self, msg: ToWorker<M>) {
        // A link reaches a master's node again after losing one (its first connection is
        // the worker's start).
        let mut again = false;
        match &msg {
            ToWorker::Replica(replica) => return self.keep(replica),
            ToWorker::Connected { .. } => {
                again = self.connections.fetch_add(1, Ordering::AcqRel) > 0;
                self.offer();
            }
            _ => {}
        }
        let restart = match &msg {
            ToWorker::Restart { attempt, cause } => Some((*attempt, cause.clone())),
            ToWorker::Connected { attempt } if self.gang => Some((
                *attempt,
                JobError::MasterLost {
                    reason: format!(
                        "worker {} reached the master's node in attempt {attempt} (a master started again, or a gang restart it joins late): every worker starts over from the newest checkpoint",
                        self.rank
                    ),
                },
            )),
            _ => None,
        };
        let mut state = lock(&self.state);
        let asked = match (&mut *state, restart) {
            // A master's node reached again starts every worker over even in the worker's
            // own attempt: one started on an empty store may run the attempt the master it
            // replaces ran (`protocol::start_attempt` without a checkpoint).
            (RouteState::To { attempt: now, .. }, Some((attempt, cause)))
                if attempt != *now || again =>
            {
                *state = RouteState::Restarting {
                    attempt,
                    held: vec![msg],
                };
                Some((attempt, cause))
            }
            (
                RouteState::Restarting {
                    attempt: pending,
                    held,
                },
                Some((attempt, cause)),
            ) if attempt != *pending => {
                // A newer restart before the last one was carried out: what was held is
                // the older attempt's.
                *pending = attempt;
                *held = vec![msg];
                Some((attempt, cause))
            }
            (RouteState::To { addr, .. }, _) => {
                addr.do_send(msg);
                None
            }
            (RouteState::Restarting { held, .. }, _) => {
                held.push(msg);
                None
            }
        };
        drop(state);
        if let Some((attempt, cause)) = asked {
            tracing::warn!(rank = self.rank, attempt, %cause, "every worker starts over; this one is replaced");
            (self.on_restart)(self.rank, attempt, cause);
        }
    }

    /// Keeps the copy of a checkpoint the master's node sent, in place of the one kept:
    /// the process's, not the worker's.
    fn keep(&self, replica: &crate::protocol::Replica) {
        tracing::debug!(
            rank = self.rank,
            iteration = replica.iteration,
            bytes = replica.bytes.len(),
            "keeping a copy of the master's checkpoint"
        );
        *lock(&self.replica) = Some(replica.clone());
    }

    /// The link reached a master's node: the copy kept goes to it first — here, on the
    /// transport's thread, before the worker hears of the connection and registers (or is
    /// replaced, and its new one registers), so that the node has every copy once every
    /// worker registered.
    fn offer(&self) {
        let kept = lock(&self.replica).clone();
        let link = self.link.get().and_then(Weak::upgrade);
        if let (Some(replica), Some(link)) = (kept, link) {
            let iteration = replica.iteration;
            if let Err(error) = link.send(ToMaster::Replica(replica)) {
                tracing::warn!(rank = self.rank, iteration, %error, "could not offer the master the copy of its checkpoint");
            }
        }
    }

    /// The attempt a restart waits for a new worker of, if one does.
    pub(super) fn pending(&self) -> Option<Attempt> {
        match &*lock(&self.state) {
            RouteState::Restarting { attempt, .. } => Some(*attempt),
            RouteState::To { .. } => None,
        }
    }

    /// The new worker of `attempt` takes the rank's messages: first those held for it —
    /// unless a newer restart came while it was made, whose worker takes them instead.
    /// Returns whether it took them.
    pub(super) fn install(&self, addr: &Addr<WorkerActor<M, W>>, attempt: Attempt) -> bool {
        let mut state = lock(&self.state);
        match &mut *state {
            RouteState::Restarting {
                attempt: pending, ..
            } if *pending != attempt => return false,
            RouteState::Restarting { held, .. } => {
                for msg in held.drain(..) {
                    addr.do_send(msg);
                }
            }
            RouteState::To { .. } => {}
        }
        *state = RouteState::To {
            addr: addr.clone(),
            attempt,
        };
        true
    }
}
