//! Carries what the links of this process's workers reached through a transport bring, as
//! the process's [`WorkerProcess`] says: to the rank's worker in an actor of its own, a
//! copy of a checkpoint to the master's node, a gang restart to whoever replaces workers
//! here, the job's failure to the process. Every rule — what is held while a worker is
//! replaced, when a connection restarts a gang, which link is the rank's, the copy kept —
//! is the node's.

use std::sync::{Arc, Mutex, Weak};

use actix::Addr;

use super::lock;
use super::worker_actor::WorkerActor;
use crate::compute::JobEnd;
use crate::error::JobError;
use crate::flight::{Recorders, What};
use crate::ids::{Attempt, Rank};
use crate::payload::Payload;
use crate::protocol::{LinkId, ProcessAction, ToMaster, ToWorker, WorkerConfig, WorkerProcess};
use crate::transport::WorkerLink;

/// What to do when a worker reached through the transport must start over in another
/// attempt (its rank, the attempt, the failure the job recovers from): the process that
/// runs it replaces it (`LocalWorkers::restart_linked`).
pub(crate) type OnRestart = Arc<dyn Fn(Rank, Attempt, JobError) + Send + Sync>;

/// The routes of this process's workers reached through a transport: shared by the
/// transport's inboxes (which call [`deliver`](Self::deliver) on the transport's threads)
/// and the process's workers (which make and replace them).
pub(crate) struct Routes<M: Payload, W: Payload> {
    inner: Mutex<Inner<M, W>>,
    on_restart: OnRestart,
    /// The job's failure as this process hears of it.
    end: JobEnd,
    /// The flight recorders of this process's ranks, read for a dump.
    recorders: Arc<Recorders>,
}

struct Inner<M: Payload, W: Payload> {
    process: WorkerProcess<M>,
    /// By rank: the worker the rank's messages are delivered to.
    to: Vec<Option<Addr<WorkerActor<M, W>>>>,
    /// By rank: the rank's link, where a copy kept is offered (once made).
    links: Vec<Option<Weak<dyn WorkerLink<W>>>>,
}

impl<M: Payload, W: Payload> Routes<M, W> {
    pub(crate) fn new(
        workers: usize,
        config: Arc<WorkerConfig>,
        on_restart: OnRestart,
        end: JobEnd,
        recorders: Arc<Recorders>,
    ) -> Self {
        Routes {
            inner: Mutex::new(Inner {
                process: WorkerProcess::new(workers, config),
                to: vec![None; workers],
                links: vec![None; workers],
            }),
            on_restart,
            end,
            recorders,
        }
    }

    /// The worker of `rank` at `addr`, made in `attempt`, gets a link of its own: returns
    /// the number its inbox delivers with.
    pub(crate) fn linked(
        &self,
        rank: Rank,
        attempt: Attempt,
        addr: Addr<WorkerActor<M, W>>,
    ) -> LinkId {
        let mut inner = lock(&self.inner);
        inner.to[rank] = Some(addr);
        inner.links[rank] = None;
        inner.process.linked(rank, attempt)
    }

    /// The link of `rank` was made. (The first `Connected` may come before this, and a
    /// copy kept is then not offered on it: only a master started again needs it, which a
    /// later connection reaches.)
    pub(crate) fn link_made(&self, rank: Rank, link: Weak<dyn WorkerLink<W>>) {
        lock(&self.inner).links[rank] = Some(link);
    }

    /// Tells the master's node that this process was asked to stop for a preemption
    /// (`by`), over the first of its workers' links that is made: returns whether one
    /// took it.
    pub(crate) fn ask_preempt(&self, by: &str) -> bool {
        self.to_master(|| ToMaster::Preempt { by: by.to_string() })
    }

    /// Sends what `make` makes to the master's node over the first of its workers' links
    /// that takes it: returns whether one did.
    pub(crate) fn to_master(&self, make: impl Fn() -> ToMaster<W>) -> bool {
        let inner = lock(&self.inner);
        let links = inner.links.iter().flatten().filter_map(Weak::upgrade);
        for link in links {
            match link.send(make()) {
                Ok(()) => return true,
                Err(error) => {
                    tracing::debug!(%error, "a link could not take a word for the master")
                }
            }
        }
        false
    }

    /// What link `link` of `rank` brought: the transport's inbox.
    pub(crate) fn deliver(&self, rank: Rank, link: LinkId, msg: ToWorker<M>) {
        match &msg {
            ToWorker::Connected { attempt } => {
                let attempt = *attempt;
                self.recorders.of(rank).record(What::Connected { attempt });
            }
            ToWorker::Reconnecting { reason } => {
                let reason = reason.clone();
                self.recorders.of(rank).record(What::MasterLost { reason });
            }
            _ => {}
        }
        let mut inner = lock(&self.inner);
        inner.process.handle_message(rank, link, msg);
        self.carry(&mut inner);
    }

    /// The attempt a gang restart waits for a new worker of `rank` in, if one does.
    pub(crate) fn pending(&self, rank: Rank) -> Option<Attempt> {
        lock(&self.inner).process.pending(rank)
    }

    /// The new worker of `rank` at `addr` in `attempt`, made for a gang restart, takes the
    /// rank's messages — unless a newer restart came while it was made. Returns whether
    /// it took them.
    pub(crate) fn replaced(
        &self,
        rank: Rank,
        attempt: Attempt,
        addr: &Addr<WorkerActor<M, W>>,
    ) -> bool {
        let mut inner = lock(&self.inner);
        let took = inner.process.handle_replaced(rank, attempt);
        if took {
            inner.to[rank] = Some(addr.clone());
        }
        self.carry(&mut inner);
        took
    }

    /// Carries out what the node asks, in order, under the lock: a rank's messages reach
    /// its worker in the order its link brought them.
    fn carry(&self, inner: &mut Inner<M, W>) {
        while let Some(action) = inner.process.poll_action() {
            match action {
                ProcessAction::Deliver { rank, msg } => {
                    if let Some(addr) = &inner.to[rank] {
                        addr.do_send(msg);
                    }
                }
                ProcessAction::Replace {
                    rank,
                    attempt,
                    cause,
                } => {
                    tracing::warn!(rank, attempt, %cause, "every worker starts over; this one is replaced");
                    (self.on_restart)(rank, attempt, cause);
                }
                ProcessAction::Offer { rank, replica } => {
                    let link = inner.links[rank].as_ref().and_then(Weak::upgrade);
                    let iteration = replica.iteration;
                    if let Some(link) = link {
                        if let Err(error) = link.send(ToMaster::Replica(replica)) {
                            tracing::warn!(rank, iteration, %error, "could not offer the master the copy of its checkpoint");
                        }
                    }
                }
                ProcessAction::Record { rank } => {
                    let link = inner.links[rank].as_ref().and_then(Weak::upgrade);
                    let log = self.recorders.log(rank).unwrap_or(crate::flight::RankLog {
                        rank,
                        dropped: 0,
                        events: Vec::new(),
                    });
                    let sent = crate::codec::to_vec(&log)
                        .map_err(|e| e.to_string())
                        .and_then(|log| {
                            let link = link.ok_or("its link is gone")?;
                            link.send(ToMaster::Recorded { log })
                                .map_err(|e| e.to_string())
                        });
                    if let Err(error) = sent {
                        tracing::debug!(rank, %error, "could not send the rank's flight recorder");
                    }
                }
                ProcessAction::EndJob(error) => self.end.end(&error),
            }
        }
    }
}
