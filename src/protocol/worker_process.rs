//! A process that hosts workers reached through a transport, as one state machine with no
//! I/O: what each rank's link brings (the master's messages, the transport's word that it
//! reached a master's node) and what that means for the process — deliver to the rank's
//! worker, hold for the worker that replaces it, replace it in a gang restart, keep the
//! copy of a checkpoint the master's node sends and offer it to each master's node the
//! link reaches, end the job for the whole process.
//!
//! It owns, by rank: which link is the rank's (a worker made again on a link of its own
//! starts another; what an older one still brings is not this worker's), how many times
//! that link reached a master's node, the messages held while the rank's worker is
//! replaced, and the copy kept (which outlives the rank's links and workers, not the
//! process).
//!
//! Call order: [`WorkerProcess::linked`] when a rank's worker gets a link of its own (its
//! first, or one that closes the old one's); then, as they happen,
//! [`handle_message`](WorkerProcess::handle_message) (what the rank's link brings, in
//! order) and [`handle_replaced`](WorkerProcess::handle_replaced) (a worker asked for by
//! [`ProcessAction::Replace`] was made); after each, carry out every
//! [`poll_action`](WorkerProcess::poll_action) in order before the next input (a
//! [`ProcessAction::Deliver`] goes to the worker the rank has at that point).

use std::collections::VecDeque;
use std::sync::Arc;

use super::config::{abort_ends_job, WorkerConfig};
use super::{Replica, ToWorker};
use crate::error::JobError;
use crate::ids::{Attempt, Rank};

/// Which of a rank's links a message came on: each link a worker of the rank gets of its
/// own is the next (a gang restart keeps the link, and its number).
pub(crate) type LinkId = u64;

/// What a worker process asks its driver to do, in the order it must be done.
#[derive(Debug)]
pub(crate) enum ProcessAction<M> {
    /// Hand this to the rank's worker (the one it has now).
    Deliver { rank: Rank, msg: ToWorker<M> },
    /// Make a new worker of `rank` in `attempt` on the same link — a gang restart — and
    /// tell the old one to stop with `cause`; once it is made, say so with
    /// [`WorkerProcess::handle_replaced`].
    Replace {
        rank: Rank,
        attempt: Attempt,
        cause: JobError,
    },
    /// Send this copy of a checkpoint to the master's node the rank's link just reached
    /// (before the rank's worker hears of the connection, and registers).
    Offer { rank: Rank, replica: Replica },
    /// Answer the master's node's driver with the rank's flight recorder, over the rank's
    /// link.
    Record { rank: Rank },
    /// The job failed with this, as far as this process is concerned: no compute of it
    /// starts from now on (heard on the transport's thread, even while user code holds the
    /// job's).
    EndJob(JobError),
}

/// Where a rank's messages go.
#[derive(Debug)]
enum Route<M> {
    /// To the worker made in `attempt`.
    To { attempt: Attempt },
    /// A new worker of `attempt` is being made: what arrives meanwhile waits for it.
    Replacing {
        attempt: Attempt,
        held: Vec<ToWorker<M>>,
    },
}

/// A rank of this process, while it has a link.
#[derive(Debug)]
struct Linked<M> {
    link: LinkId,
    route: Route<M>,
    /// How many times the link reached a master's node (`ToWorker::Connected`): its first
    /// is the worker's start; a later one is a master's node reached again.
    connections: u32,
}

/// A process's workers reached through a transport (see the [module docs](self)).
pub(crate) struct WorkerProcess<M> {
    config: Arc<WorkerConfig>,
    /// By rank: `None` where the rank has no link here (it runs elsewhere, or not yet).
    ranks: Vec<Option<Linked<M>>>,
    /// By rank: the copy of a checkpoint kept for a master's node started again without
    /// it. The process's, not a worker's: it outlives the rank's links and workers.
    kept: Vec<Option<Replica>>,
    /// The last link number given out, by rank.
    links: Vec<LinkId>,
    actions: VecDeque<ProcessAction<M>>,
}

impl<M> WorkerProcess<M> {
    /// A process of a job of `workers` ranks, by the job's settings for workers.
    pub(crate) fn new(workers: usize, config: Arc<WorkerConfig>) -> Self {
        WorkerProcess {
            config,
            ranks: (0..workers).map(|_| None).collect(),
            kept: vec![None; workers],
            links: vec![0; workers],
            actions: VecDeque::new(),
        }
    }

    /// The next thing to do.
    pub(crate) fn poll_action(&mut self) -> Option<ProcessAction<M>> {
        self.actions.pop_front()
    }

    /// The worker of `rank`, made in `attempt`, got a link of its own (its first, or one
    /// that closes the old worker's): what the rank's older links still bring is not for
    /// it. Returns the link's number, which its messages come with.
    pub(crate) fn linked(&mut self, rank: Rank, attempt: Attempt) -> LinkId {
        self.links[rank] += 1;
        let link = self.links[rank];
        self.ranks[rank] = Some(Linked {
            link,
            route: Route::To { attempt },
            connections: 0,
        });
        link
    }

    /// The attempt a gang restart waits for a new worker of `rank` in, if one does.
    pub(crate) fn pending(&self, rank: Rank) -> Option<Attempt> {
        match self.ranks.get(rank)?.as_ref()?.route {
            Route::Replacing { attempt, .. } => Some(attempt),
            Route::To { .. } => None,
        }
    }

    /// The copy of a checkpoint this process keeps for `rank`, if any.
    #[cfg(test)]
    pub(crate) fn kept(&self, rank: Rank) -> Option<&Replica> {
        self.kept.get(rank)?.as_ref()
    }

    /// What link `link` of `rank` brought. A gang restart — the master's `Restart` into
    /// another attempt or, in a job whose failures restart every worker, the link reaching
    /// a master's node of another attempt or again (one started again) — holds what
    /// follows and asks for the worker to be replaced.
    pub(crate) fn handle_message(&mut self, rank: Rank, link: LinkId, msg: ToWorker<M>) {
        // The job's failure: this process hears of it here, whichever link of the rank
        // brought it.
        if let Some(error) = abort_ends_job(rank, &msg) {
            self.actions.push_back(ProcessAction::EndJob(error.clone()));
        }
        let Some(Some(linked)) = self.ranks.get_mut(rank) else {
            return;
        };
        if linked.link != link {
            // An older link's: its worker was told to stop when this one was made.
            return;
        }
        // The link reached a master's node again after it reached one before.
        let mut again = false;
        match &msg {
            ToWorker::Record => {
                self.actions.push_back(ProcessAction::Record { rank });
                return;
            }
            ToWorker::Replica(replica) => {
                tracing::debug!(
                    rank,
                    iteration = replica.iteration,
                    bytes = replica.bytes.len(),
                    "keeping a copy of the master's checkpoint"
                );
                self.kept[rank] = Some(replica.clone());
                return;
            }
            ToWorker::Connected { .. } => {
                again = linked.connections > 0;
                linked.connections += 1;
                // The copy goes first: the node has every copy once every worker
                // registered.
                if let Some(replica) = self.kept[rank].clone() {
                    self.actions
                        .push_back(ProcessAction::Offer { rank, replica });
                }
            }
            _ => {}
        }
        let restart = match &msg {
            ToWorker::Restart { attempt, cause } => Some((*attempt, cause.clone())),
            ToWorker::Connected { attempt } if self.config.gang => Some((
                *attempt,
                JobError::MasterLost {
                    reason: format!(
                        "worker {rank} reached the master's node in attempt {attempt} (a master started again, or a gang restart it joins late): every worker starts over from the newest checkpoint"
                    ),
                },
            )),
            _ => None,
        };
        match (&mut linked.route, restart) {
            // A master's node reached again starts every worker over even in the worker's
            // own attempt: a master's attempt is past every one its process before could
            // run (`protocol::start_attempt`) only if its launcher counted its starts.
            (Route::To { attempt: now }, Some((attempt, cause))) if attempt != *now || again => {
                linked.route = Route::Replacing {
                    attempt,
                    held: vec![msg],
                };
                self.actions.push_back(ProcessAction::Replace {
                    rank,
                    attempt,
                    cause,
                });
            }
            (
                Route::Replacing {
                    attempt: pending,
                    held,
                },
                Some((attempt, cause)),
            ) if attempt != *pending => {
                // A newer restart before the last one was carried out: what was held is
                // the older attempt's.
                *pending = attempt;
                *held = vec![msg];
                self.actions.push_back(ProcessAction::Replace {
                    rank,
                    attempt,
                    cause,
                });
            }
            (Route::To { .. }, _) => self.actions.push_back(ProcessAction::Deliver { rank, msg }),
            (Route::Replacing { held, .. }, _) => held.push(msg),
        }
    }

    /// The new worker of `rank` in `attempt` that a [`ProcessAction::Replace`] asked for
    /// was made. It takes the rank's messages — first those held for it — unless a newer
    /// restart came while it was made, whose worker takes them instead. Returns whether
    /// it took them (the driver delivers to it from now on).
    pub(crate) fn handle_replaced(&mut self, rank: Rank, attempt: Attempt) -> bool {
        let Some(Some(linked)) = self.ranks.get_mut(rank) else {
            return false;
        };
        match &mut linked.route {
            Route::Replacing {
                attempt: pending, ..
            } if *pending != attempt => return false,
            Route::Replacing { held, .. } => {
                for msg in held.drain(..) {
                    self.actions.push_back(ProcessAction::Deliver { rank, msg });
                }
            }
            Route::To { .. } => {}
        }
        linked.route = Route::To { attempt };
        true
    }
}

#[cfg(test)]
mod tests;
