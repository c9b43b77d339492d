//! The workers of this process: started when the job starts, and started again when a
//! failure policy replaces one of them or restarts them all.
//!
//! A worker is reached through the transport, in an actor of its own ([`WorkerActor`]), or
//! — when the transport runs the whole job in this process ([`Transport::in_process`]) —
//! hosted by the master's node actor, which steps its driver directly ([`Hosted`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use actix::{Addr, AsyncContext, Context};

use super::arrivals::Arrivals;
use super::pool::{guarded, ComputePool, Executor, Placer, PoolExits};
use super::route::{OnRestart, Routes};
use super::watch::Watch;
use super::worker::{EndingReport, WorkerDriver};
use super::worker_actor::WorkerActor;
use super::worker_task::WorkerTask;
use super::{WorkerFactory, WorkerHookFactory, WorkerHooks};
use crate::compute::JobEnd;
use crate::coordinator::Shard;
use crate::error::{JobError, Phase};
use crate::ids::{Attempt, Rank};
use crate::payload::Payload;
use crate::protocol::{Envelope, ToMaster, ToWorker, WorkerConfig};
use crate::protocol::{JobConfig, Placement};
use crate::transport::{MemoryMesh, PeerLink, Transport, TransportError, WireCheck, WorkerLink};

/// Everything it takes to start a worker of this process, and the worker of each rank
/// running here.
pub(crate) struct LocalWorkers<M: Payload, W: Payload> {
    parts: LocalParts<M, W>,
    /// By rank.
    slots: Vec<Slot<M, W>>,
    /// Hosted workers replaced while their code was away or their stop under way: they run
    /// to their end, their messages no longer reaching the master's node.
    retired: Vec<Hosted<M, W>>,
    /// Hosted workers made but not started yet: the node actor starts them.
    fresh: Vec<Rank>,
    /// Which connection of each rank is the current one (hosted workers): a link of an
    /// earlier one is closed.
    generations: Arc<[AtomicU64]>,
    /// The hosted worker of each rank, `None` once it stopped (or where the rank is not
    /// hosted): each behind a lock of its own, so that a thread other than the node
    /// actor's can step one (the rescue of a round, `runtime/node/rescue.rs`).
    cells: Arc<[HostedCell<M, W>]>,
    /// The workers of this process as each other's peers, for collectives, when every
    /// worker is here.
    mesh: Option<Arc<MemoryMesh>>,
    /// Where the links of this process's workers reached through the transport deliver
    /// (and the copies of a checkpoint the process keeps for the master's node).
    routes: Arc<Routes<M, W>>,
}

/// Where a hosted worker lives.
pub(crate) type HostedCell<M, W> = Mutex<Option<Box<Hosted<M, W>>>>;

/// The hosted worker in `cell`, locked.
pub(crate) fn lock_cell<M: Payload, W: Payload>(
    cell: &HostedCell<M, W>,
) -> MutexGuard<'_, Option<Box<Hosted<M, W>>>> {
    cell.lock().unwrap_or_else(|e| e.into_inner())
}

/// A worker just made, to be put in its rank's place.
enum Made<M: Payload, W: Payload> {
    Actor(Linked<M, W>),
    Hosted(Box<Hosted<M, W>>),
}

/// The worker of a rank, as this process runs it.
enum Slot<M: Payload, W: Payload> {
    /// The rank runs in another process.
    Elsewhere,
    /// In an actor of its own, reached through the transport.
    Actor(Linked<M, W>),
    /// Stepped by the master's node actor (the worker itself is in its cell).
    Hosted,
}

/// A worker in an actor of its own, reached through the transport: its address, the
/// attempt it was made in, and its link (kept by the worker that replaces it in a gang
/// restart).
struct Linked<M: Payload, W: Payload> {
    addr: Addr<WorkerActor<M, W>>,
    attempt: Attempt,
    link: Arc<dyn WorkerLink<W>>,
}

/// How a new worker reaches the master's node.
enum Linking<W: Payload> {
    /// A link of its own, the rank's first.
    Connect,
    /// A link of its own that closes the old worker's (`Transport::reconnect_worker`).
    Reconnect,
    /// The old worker's link (a gang restart: the link's messages of the old attempt are
    /// stale to the master's node).
    Reuse(Arc<dyn WorkerLink<W>>),
}

/// A hosted worker replaced, and the message that tells it to stop.
pub(crate) type ToRetire<M, W> = (Box<Hosted<M, W>>, ToWorker<M>);

/// A worker stepped by the master's node actor: its driver, and which connection of its
/// rank it is.
pub(crate) struct Hosted<M: Payload, W: Payload> {
    pub(crate) driver: WorkerDriver<M, W>,
    pub(crate) rank: Rank,
    pub(crate) generation: u64,
    pub(crate) attempt: Attempt,
}

/// What it takes to start a worker of this process.
pub(crate) struct LocalParts<M: Payload, W: Payload> {
    pub(crate) config: Arc<JobConfig>,
    /// The settings every worker's node of this process runs by.
    pub(crate) worker_config: Arc<WorkerConfig>,
    pub(crate) job_id: Arc<str>,
    pub(crate) factory: WorkerFactory<M, W>,
    pub(crate) hooks: Vec<WorkerHookFactory<M, W>>,
    pub(crate) transport: Box<dyn Transport<M, W>>,
    pub(crate) pool: Arc<ComputePool>,
    pub(crate) exits: PoolExits,
    pub(crate) watch: Arc<Watch>,
    pub(crate) ended: tokio::sync::mpsc::UnboundedSender<super::worker::Ended<M>>,
    /// Where a worker reached through the transport asks to be replaced in a gang
    /// restart: the master's node actor in its process, the process's own loop in another.
    pub(crate) on_restart: OnRestart,
    /// Each rank's shard of the input, if the job has one.
    pub(crate) shards: Option<Arc<Vec<Shard>>>,
    /// The job's failure as this process hears of it.
    pub(crate) end: JobEnd,
    /// Where the master's node actor takes workers' messages from other threads, when it
    /// hosts this process's workers.
    pub(crate) host: Option<Arc<Arrivals<W>>>,
    /// The workers' part in folding results among themselves, when the job combines them.
    pub(crate) fold_among: Option<crate::collective::FoldAmong<M, W>>,
    /// The flight recorders of this process's ranks.
    pub(crate) recorders: Arc<crate::flight::Recorders>,
}

impl<M: Payload, W: Payload> LocalWorkers<M, W> {
    /// Tells the master's node that this process was asked to stop for a preemption:
    /// returns whether a link of its workers took it.
    pub(crate) fn ask_preempt(&self, by: &str) -> bool {
        self.routes.ask_preempt(by)
    }

    /// Asks the master's process for a dump of every rank's flight recorder (`by`: what
    /// asked here): returns whether a link of its workers took it.
    pub(crate) fn ask_dump(&self, by: &str) -> bool {
        self.routes
            .to_master(|| ToMaster::Dump { by: by.to_owned() })
    }

    pub(crate) fn new(parts: LocalParts<M, W>) -> Self {
        let n = parts.config.workers;
        LocalWorkers {
            slots: (0..n).map(|_| Slot::Elsewhere).collect(),
            retired: Vec::new(),
            cells: (0..n).map(|_| Mutex::new(None)).collect(),
            fresh: Vec::new(),
            generations: (0..n).map(|_| AtomicU64::new(0)).collect(),
            routes: Arc::new(Routes::new(
                n,
                Arc::clone(&parts.worker_config),
                Arc::clone(&parts.on_restart),
                parts.end.clone(),
                Arc::clone(&parts.recorders),
            )),
            mesh: parts
                .transport
                .in_process()
                .map(|p| MemoryMesh::new(n, p.wire_check)),
            parts,
        }
    }

    /// Whether the worker of `rank` runs in this process.
    pub(crate) fn is_local(&self, rank: Rank) -> bool {
        !matches!(self.slots.get(rank), None | Some(Slot::Elsewhere))
    }

    /// The job's worker count.
    pub(crate) fn ranks(&self) -> usize {
        self.slots.len()
    }

    /// Whether the master's node actor steps the worker of `rank` directly.
    pub(crate) fn is_hosted(&self, rank: Rank) -> bool {
        matches!(self.slots.get(rank), Some(Slot::Hosted))
    }

    /// Every rank's hosted worker, each in its cell.
    pub(crate) fn cells(&self) -> &Arc<[HostedCell<M, W>]> {
        &self.cells
    }

    /// Which connection of each rank is the current one.
    pub(crate) fn generations(&self) -> &Arc<[AtomicU64]> {
        &self.generations
    }

    /// Whether the master's node actor steps every worker of the job directly.
    pub(crate) fn hosts_all(&self) -> bool {
        self.parts.host.is_some()
    }

    /// The connection of the rank's current hosted worker, if it runs (it has not
    /// stopped).
    pub(crate) fn running(&self, rank: Rank) -> Option<u64> {
        match self.slots.get(rank) {
            Some(Slot::Hosted) => lock_cell(&self.cells[rank]).as_ref().map(|h| h.generation),
            _ => None,
        }
    }

    /// Whether the rank's current hosted worker runs (it has not stopped).
    pub(crate) fn is_running(&self, rank: Rank) -> bool {
        self.running(rank).is_some()
    }

    /// The cell of the rank's current hosted worker, if the rank is hosted.
    pub(crate) fn current_cell(&self, rank: Rank) -> Option<&HostedCell<M, W>> {
        match self.slots.get(rank) {
            Some(Slot::Hosted) => Some(&self.cells[rank]),
            _ => None,
        }
    }

    /// The retired hosted worker of `rank` of connection `generation`, if it still runs.
    pub(crate) fn retired_of(&mut self, rank: Rank, generation: u64) -> Option<&mut Hosted<M, W>> {
        self.retired
            .iter_mut()
            .find(|h| h.rank == rank && h.generation == generation)
    }

    /// The hosted worker of `rank` of connection `generation` stopped: it is let go.
    pub(crate) fn hosted_stopped(&mut self, rank: Rank, generation: u64) {
        if let Some(Slot::Hosted) = self.slots.get(rank) {
            let mut cell = lock_cell(&self.cells[rank]);
            if cell.as_ref().is_some_and(|h| h.generation == generation) {
                *cell = None;
                return;
            }
        }
        self.retired
            .retain(|h| !(h.rank == rank && h.generation == generation));
    }

    /// Whether the worker of `rank` of connection `generation` is the rank's current one:
    /// a hosted worker's message may still reach the master's node, and a worker's ending
    /// is its process's to count (a replaced one's is not).
    pub(crate) fn is_current(&self, rank: Rank, generation: u64) -> bool {
        self.generations[rank].load(Ordering::Acquire) == generation
    }

    /// The hosted workers made and not started yet, by rank (taken: the caller starts
    /// them).
    pub(crate) fn take_fresh(&mut self) -> Vec<Rank> {
        std::mem::take(&mut self.fresh)
    }

    /// Keeps a hosted worker that was replaced and has not stopped yet: it runs to its
    /// end.
    pub(crate) fn retire_hosted(&mut self, hosted: Box<Hosted<M, W>>) {
        self.retired.push(*hosted);
    }

    /// Starts the worker of `rank` in `attempt`, for the first time.
    pub(crate) fn start(&mut self, rank: Rank, attempt: Attempt) -> Result<(), JobError> {
        let started = self.spawn(rank, attempt, Linking::Connect)?;
        self.install(rank, started);
        Ok(())
    }

    /// Puts a worker just made in its rank's place.
    fn install(&mut self, rank: Rank, made: Made<M, W>) {
        self.slots[rank] = match made {
            Made::Actor(linked) => Slot::Actor(linked),
            Made::Hosted(hosted) => {
                *lock_cell(&self.cells[rank]) = Some(hosted);
                Slot::Hosted
            }
        };
    }

    /// Replaces the worker of `rank` by a new one in `attempt`: the new one's link closes
    /// the old one's, and the old one, if it still runs, is told to stop with `cause` —
    /// an actor at once, a hosted worker by the caller (returned with the message for it).
    pub(crate) fn replace(
        &mut self,
        rank: Rank,
        attempt: Attempt,
        cause: &JobError,
    ) -> (Result<(), JobError>, Option<ToRetire<M, W>>) {
        let spawned = self.spawn(rank, attempt, Linking::Reconnect);
        // Told to stop also when its replacement could not be made: the job fails then.
        let old = self.retire(rank, cause);
        let replaced = match spawned {
            Ok(new) => {
                self.install(rank, new);
                Ok(())
            }
            // The factory's own failure, as at start-up (logged with the one it replaces).
            Err(e) => {
                tracing::error!(%cause, error = %e, "worker {rank} failed and could not be replaced");
                Err(e)
            }
        };
        (replaced, old)
    }

    /// Replaces every hosted worker of this process by a new one in `attempt` (a worker
    /// reached through the transport is replaced when its link delivers the master's
    /// `Restart`: [`restart_linked`](Self::restart_linked)). If one cannot be made, every
    /// worker not yet replaced is still told to stop. Hosted workers to tell are returned,
    /// with the message for each.
    pub(crate) fn replace_all(
        &mut self,
        attempt: Attempt,
        cause: &JobError,
    ) -> (Result<(), JobError>, Vec<ToRetire<M, W>>) {
        let ranks: Vec<Rank> = (0..self.slots.len())
            .filter(|&r| self.is_hosted(r))
            .collect();
        let mut first = Ok(());
        let mut told = Vec::new();
        for rank in ranks {
            let old = if first.is_ok() {
                let (replaced, old) = self.replace(rank, attempt, cause);
                first = replaced;
                old
            } else {
                self.retire(rank, cause)
            };
            told.extend(old);
        }
        (first, told)
    }

    /// Replaces the worker of `rank` reached through the transport by a new one in
    /// `attempt` — a gang restart its route asked for — on the same link: the new one's
    /// `init` runs, and it registers in `attempt`; the old one is told to stop with
    /// `cause` (what it still sends is of its own attempt: stale to the master's node). A
    /// restart overtaken by a newer one, or carried out already, does nothing.
    pub(crate) fn restart_linked(
        &mut self,
        rank: Rank,
        attempt: Attempt,
        cause: &JobError,
    ) -> Result<(), JobError> {
        let Some(Slot::Actor(old)) = self.slots.get(rank) else {
            return Ok(());
        };
        if self.routes.pending(rank) != Some(attempt) {
            return Ok(());
        }
        let link = Arc::clone(&old.link);
        let made = self.spawn(rank, attempt, Linking::Reuse(link));
        // Told to stop also when its replacement could not be made: this process fails
        // then. (An actor is told at once: nothing comes back to step.)
        let _ = self.retire(rank, cause);
        match made {
            Ok(made) => {
                // (Overtaken while it was made by a newer restart, it is made again for
                // that one next, and told to stop then.)
                if let Made::Actor(new) = &made {
                    if self.routes.replaced(rank, attempt, &new.addr) {
                        tracing::debug!(rank, attempt, "worker made again for the new attempt");
                    }
                }
                self.install(rank, made);
                Ok(())
            }
            Err(e) => {
                tracing::error!(%cause, error = %e, "worker {rank} could not be made again for attempt {attempt}");
                Err(e)
            }
        }
    }

    /// Tells the worker of `rank`, if it still runs, to stop with `cause`. A worker that
    /// failed is stopping already and drops this; one of an attempt that ended stops with
    /// the failure that ended it. A hosted one is returned with the message, for the
    /// caller to step.
    fn retire(&mut self, rank: Rank, cause: &JobError) -> Option<ToRetire<M, W>> {
        let slot = self.slots.get_mut(rank)?;
        match std::mem::replace(slot, Slot::Elsewhere) {
            Slot::Actor(old) => {
                old.addr.do_send(ToWorker::Abort {
                    attempt: old.attempt,
                    error: cause.clone(),
                });
                None
            }
            Slot::Hosted => {
                *slot = Slot::Hosted;
                let old = lock_cell(&self.cells[rank]).take();
                old.map(|old| {
                    let msg = ToWorker::Abort {
                        attempt: old.attempt,
                        error: cause.clone(),
                    };
                    (old, msg)
                })
            }
            Slot::Elsewhere => None,
        }
    }

    /// Makes a worker of `rank` in `attempt` (an actor is started at once; a hosted worker
    /// is started by the node actor, from `fresh`): its code first, then its link
    /// (which, when it `replace`s, closes the old worker's), so that a factory that fails
    /// leaves the old link as it was.
    fn spawn(
        &mut self,
        rank: Rank,
        attempt: Attempt,
        linking: Linking<W>,
    ) -> Result<Made<M, W>, JobError> {
        let parts = &mut self.parts;
        let (factory, hooks) = (&parts.factory, &parts.hooks);
        let (computable, hooks) = guarded(|| {
            let hooks: WorkerHooks<M, W> = hooks.iter().map(|make| make(rank)).collect();
            Ok((factory(rank), hooks))
        })
        .map_err(|cause| JobError::Worker {
            rank,
            iteration: 0,
            phase: Phase::Create,
            cause,
        })?;
        let config = Arc::clone(&parts.config);
        let worker_ctx = Context::<WorkerActor<M, W>>::new();
        let reconnect = matches!(linking, Linking::Reconnect);
        let (link, generation): (Arc<dyn WorkerLink<W>>, u64) = match &parts.host {
            Some(node) => {
                // A new connection of the rank: the old one's link is closed from now on —
                // under the arrivals' lock, so that none of its sync calls is being
                // delivered meanwhile.
                let generation =
                    node.hold(|| self.generations[rank].fetch_add(1, Ordering::AcqRel) + 1);
                let link = HostedLink {
                    rank,
                    generation,
                    generations: Arc::clone(&self.generations),
                    node: Arc::clone(node),
                    wire_check: parts
                        .transport
                        .in_process()
                        .map_or(WireCheck::Off, |p| p.wire_check),
                };
                (Arc::new(link), generation)
            }
            None => {
                let generation = self.generations[rank].fetch_add(1, Ordering::AcqRel) + 1;
                let link = match linking {
                    Linking::Reuse(link) => link,
                    Linking::Connect | Linking::Reconnect => {
                        let id = self.routes.linked(rank, attempt, worker_ctx.address());
                        let routes = Arc::clone(&self.routes);
                        let inbox = Box::new(move |msg: ToWorker<M>| routes.deliver(rank, id, msg));
                        let link = if reconnect {
                            parts.transport.reconnect_worker(rank, inbox)?
                        } else {
                            parts.transport.connect_worker(rank, inbox)?
                        };
                        let link: Arc<dyn WorkerLink<W>> = Arc::from(link);
                        self.routes.link_made(rank, Arc::downgrade(&link));
                        link
                    }
                };
                (link, generation)
            }
        };
        let mut ctx = super::worker_context(
            &config,
            &parts.job_id,
            rank,
            parts.shards.as_ref(),
            parts.end.clone(),
        );
        // In barrier mode every worker computes on a thread of its own, so that ranks can
        // wait for each other in sync calls.
        let (placement, sync_answers, executor) = if config.barrier_mode {
            let peers: Option<Arc<dyn PeerLink>> = match &self.mesh {
                Some(mesh) => Some(Arc::clone(mesh) as Arc<dyn PeerLink>),
                None => parts.transport.peers(rank)?,
            };
            let (sync, answers) = super::sync_calls::sync_link(
                Arc::new(super::sync_calls::LinkCalls(Arc::clone(&link))),
                attempt,
                Arc::clone(&parts.worker_config),
                peers
                    .clone()
                    .ok_or("the job's transport does not connect workers to each other"),
                parts.recorders.of(rank),
            );
            if let Some(peers) = peers {
                peers.join(rank, answers.peer_inbox());
            }
            ctx.sync = Some(sync);
            let name = format!(
                "{}-worker-{rank}",
                crate::config::thread_prefix(&config.job_id)
            );
            (
                Placement::Pool,
                Some(answers),
                Executor::own(name, &parts.exits)?,
            )
        } else if config.min_workers_ratio < 1.0 {
            // A straggler computing inline would hold the thread that is to go on
            // without it.
            (
                Placement::Pool,
                None,
                Executor::Pool(Arc::clone(&parts.pool)),
            )
        } else {
            (
                config.placement,
                None,
                Executor::Pool(Arc::clone(&parts.pool)),
            )
        };
        let worker_config = Arc::clone(&parts.worker_config);
        let driver = WorkerDriver::new(
            WorkerTask::new(computable, hooks, ctx, attempt, Arc::clone(&worker_config))
                .folding(parts.fold_among.clone()),
            worker_config,
            sync_answers,
            executor,
            Placer::new(placement, config.inline_threshold),
            Arc::clone(&parts.watch),
            EndingReport {
                to: parts.ended.clone(),
                generation,
                end: parts.end.clone(),
            },
        );
        if parts.host.is_some() {
            self.fresh.push(rank);
            return Ok(Made::Hosted(Box::new(Hosted {
                driver,
                rank,
                generation,
                attempt,
            })));
        }
        let addr = worker_ctx.address();
        worker_ctx.run(WorkerActor::new(driver, Arc::clone(&link)));
        Ok(Made::Actor(Linked {
            addr,
            attempt,
            link,
        }))
    }
}

/// The node's link when it hosts every worker: it reaches each directly, never through a
/// link, so nothing is sent here; every rank is reachable.
pub(crate) struct HostedMasterLink;

impl<M: Payload> crate::transport::MasterLink<M> for HostedMasterLink {
    fn send(&self, to: Rank, _: ToWorker<M>) -> Result<(), TransportError> {
        Err(TransportError::NotConnected { rank: to })
    }

    fn broadcast(&self, _: ToWorker<M>) -> Result<(), TransportError> {
        Err(TransportError::Unsupported(
            "the node hosts every worker: it hands them a broadcast directly".into(),
        ))
    }
}

/// A hosted worker's link to the master's node, for what its compute thread sends itself
/// (sync calls, in barrier mode): an arrival for the node actor. Closed once a replacement
/// took the rank.
struct HostedLink<W: Payload> {
    rank: Rank,
    generation: u64,
    generations: Arc<[AtomicU64]>,
    node: Arc<Arrivals<W>>,
    wire_check: WireCheck,
}

impl<W: Payload> WorkerLink<W> for HostedLink<W> {
    fn send(&self, msg: ToMaster<W>) -> Result<(), TransportError> {
        let rank = self.rank;
        let msg = self
            .wire_check
            .apply(msg, || format!("worker {rank} → master"))?;
        let current = || self.generations[rank].load(Ordering::Acquire) == self.generation;
        if !self.node.deliver_if(Envelope { from: rank, msg }, current) {
            return Err(TransportError::Replaced { rank });
        }
        Ok(())
    }
}
