//! Starting a job, in named steps: the transport prepared (`launch`); in the master's
//! process, its side opened — the checkpoint read, the attempt chosen, the master's link
//! bound, the coordinator started (`open_master`); this process's workers started; then
//! the master's node built and driven (`master_process`, `NodeActor`) or, in a process
//! without the master, its workers' endings made its outcome (`workers_outcome`).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use actix::{AsyncContext, Context};
use tokio::sync::oneshot;

use super::arrivals::Arrivals;
use super::coordination::{self, Coordination, CoordinatorSlot};
use super::dump::{DumpWatch, Dumps};
use super::local::{HostedMasterLink, LocalParts, LocalWorkers};
use super::master::MasterTask;
use super::node::{NodeActor, NodeParts, RestartLinked};
use super::pool::{guarded, ComputePool, PoolExits};
use super::route::OnRestart;
use super::signals::PreemptWatch;
use super::watch::Watch;
use super::{
    fingerprint, Checkpointing, CombineFn, DynMaster, MasterHooks, OwnedEnding, Plan, SharedStore,
};
use crate::checkpoint::{resume, JobShape, Resume, Resuming};
use crate::compute::{JobEnd, MasterContext};
use crate::coordinator::{Coordinator, JobInfo};
use crate::error::JobError;
use crate::flight::Recorders;
use crate::ids::{Attempt, Rank};
use crate::payload::Payload;
use crate::protocol::JobConfig;
use crate::protocol::{
    attempts_per_process, start_attempt, Combiner, ForWorkers, MasterNode, NodeConfig,
    NodeSettings, ToWorker,
};
use crate::protocol::{JobOutcome, JobReport};
use crate::transport::{LinkSpec, Transport, WireCheck};

/// What the job's thread shares with the thread that called `run` (its watchdog).
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) watch: Arc<Watch>,
    /// The job's failure as this process hears of it.
    pub(super) end: JobEnd,
    /// The job's coordinator, whose `on_error` the watchdog runs when it gives up on a
    /// failed job held up by user code.
    pub(super) coordination: CoordinatorSlot,
    /// Tells every worker the job failed (the master's process only): what the watchdog
    /// does when it gives up on a failed job held up by user code.
    pub(super) abort: Arc<OnceLock<AbortAll>>,
}

pub(super) type AbortAll = Box<dyn Fn(&JobError) + Send + Sync>;

/// How often a process without the master looks for a preemption asked of it.
const PREEMPT_LOOK: std::time::Duration = std::time::Duration::from_millis(50);

pub(super) async fn launch<M: Payload, W: Payload>(
    plan: Plan<M, W>,
    node_config: Arc<NodeConfig>,
    job: Shared,
    exits: PoolExits,
) -> Result<JobOutcome<M>, JobError> {
    let watch = Arc::clone(&job.watch);
    let Plan {
        config,
        master,
        master_hooks,
        workers,
        worker_hooks,
        events,
        mut transport,
        combine,
        for_workers,
        checkpoint,
        mut coordinator,
        input,
        cancel,
        preempt,
        flight,
        messages,
        params,
    } = plan;
    // The settings every worker's node of this process runs by: the master's node's, as a
    // worker needs them.
    let worker_config = Arc::new(node_config.worker());
    let config = Arc::new(config);
    let job_id: Arc<str> = Arc::from(config.job_id.as_str());
    // The input described once (a file input's description reads each file's size).
    let shape = JobShape::new(config.workers, input.as_ref()).with_params(params);
    let topology = transport.prepare(&LinkSpec {
        job_id: config.job_id.clone(),
        workers: config.workers,
        fingerprint: fingerprint::<M, W>(
            &config,
            &shape,
            super::combining(combine.as_ref()),
            messages,
        ),
        peers: config.barrier_mode,
    })?;
    // A transport that runs the whole job here leaves the connecting to the runtime: the
    // node actor hosts every worker and steps it directly.
    let in_process = transport.in_process();
    if in_process.is_some() && !(topology.master && topology.workers.len() == config.workers) {
        return Err(JobError::transport(
            format!(
                "a transport that runs the job in one process must run the master and every worker ({}) here, not {topology:?}",
                crate::error::counted(config.workers, "worker")
            ),
            None,
        ));
    }
    let started = Instant::now();
    let pool = Arc::new(ComputePool::new(
        config.compute_threads(),
        &config.job_id,
        &exits,
    )?);
    let (outcome_tx, outcome_rx) = oneshot::channel();

    let (ended_tx, ended_rx) = tokio::sync::mpsc::unbounded_channel();
    let local_ranks = topology.workers.clone();
    // Every process shards alike: each of its workers takes its own.
    let shards =
        coordination::shards(coordinator.as_mut(), input.as_ref(), config.workers)?.map(Arc::new);
    // The context first: the transport's inbox needs the node's address before it runs.
    let node_ctx = Context::<NodeActor<M, W>>::new();
    // A gang restart replaces a worker reached through the transport in its own process:
    // the master's node actor does it in the master's, the loop below in another.
    let (restarts_tx, restarts_rx) = tokio::sync::mpsc::unbounded_channel();
    let on_restart: OnRestart = if topology.master {
        let node = node_ctx.address();
        Arc::new(move |rank, attempt, cause| {
            node.do_send(RestartLinked {
                rank,
                attempt,
                cause,
            })
        })
    } else {
        Arc::new(move |rank, attempt, cause| {
            let _ = restarts_tx.send((rank, attempt, cause));
        })
    };
    let arrivals = Arrivals::new(node_ctx.address().recipient());
    // What asks this process's job to stop for a preemption, watched from here on.
    let process = if in_process.is_some() {
        "this process".to_string()
    } else {
        process_name(&local_ranks)
    };
    let preempt = PreemptWatch::start(preempt, config.preempt_signal, process.clone());
    // What asks for a dump of the flight recorders here, and this process's ranks' ones.
    let signals = (config.dump_signal, config.preempt_signal);
    let dump_watch = DumpWatch::start(flight, signals, process);
    let recorders = Arc::new(Recorders::new(config.flight_events));
    // A process without the master learns the attempt from the master's node when its
    // workers connect (`ToWorker::Connected`).
    let (bound, attempt) = if topology.master {
        let side = open_master(
            MasterOpening {
                config: &config,
                node_config: &node_config,
                job: &job,
                transport: transport.as_mut(),
                hosted: in_process.is_some(),
                restarted: topology.restarted,
                arrivals: &arrivals,
            },
            checkpoint,
            shape,
            &mut coordinator,
        )
        .await?;
        let attempt = side.attempt;
        (Some(side), attempt)
    } else {
        (None, 0)
    };
    let mut local = LocalWorkers::new(LocalParts {
        config: Arc::clone(&config),
        worker_config,
        job_id: Arc::clone(&job_id),
        factory: workers,
        hooks: worker_hooks,
        transport,
        pool: Arc::clone(&pool),
        exits,
        watch: Arc::clone(&watch),
        ended: ended_tx,
        on_restart,
        shards,
        end: job.end.clone(),
        host: in_process.map(|_| Arc::clone(&arrivals)),
        fold_among: combine.as_ref().map(|c| Arc::clone(&c.among)),
        recorders: Arc::clone(&recorders),
    });
    for &rank in &local_ranks {
        if let Err(error) = local.start(rank, attempt) {
            job.coordination.fail(Some(attempt), error.clone()).await;
            return Err(error);
        }
    }
    if let Some(MasterSide {
        link,
        store,
        resuming,
        resumed,
        ..
    }) = bound
    {
        let link = Arc::new(std::sync::Mutex::new(link));
        // (Hosted workers share the job's thread, held by the code the watchdog gives up
        // on: what reaches them is the process's `JobEnd`, set already.)
        if in_process.is_none() {
            let _ = job.abort.set(abort_all(Arc::clone(&link), attempt));
        }
        let (task, node) = master_process(
            MasterParts {
                master,
                hooks: master_hooks,
                combine: combine.as_ref().map(|c| Arc::clone(&c.fold)),
                for_workers,
                store,
                resuming,
                resumed,
                attempt,
                end: job.end.clone(),
            },
            Arc::clone(&node_config),
            NodeSettings {
                local: (0..config.workers).map(|r| local.is_local(r)).collect(),
                coordinated: job.coordination.is_set(),
                listening: events.is_listened_to(),
                // (The metrics are recorded from the node's events.)
                metrics: cfg!(feature = "metrics"),
            },
            &job_id,
            Instant::now(),
        );
        node_ctx.run(NodeActor::new(NodeParts {
            config: Arc::clone(&config),
            node,
            link,
            local,
            task,
            pool: Arc::clone(&pool),
            watch: Arc::clone(&watch),
            events,
            coordination: job.coordination.clone(),
            cancel,
            preempt,
            dumps: (
                dump_watch,
                Dumps::new(recorders, &config.job_id, config.flight_dir.clone()),
            ),
            outcome: outcome_tx,
            tick: node_config.check_interval(),
            end: job.end.clone(),
            wire_check: in_process.map_or(WireCheck::Off, |p| p.wire_check),
            arrivals,
        }));
        drop(pool);
        return outcome_rx.await.unwrap_or_else(|_| {
            Err(JobError::Runtime {
                message: "the master stopped without an outcome".into(),
            })
        });
    };
    drop(pool);
    let watches = (preempt, dump_watch);
    workers_outcome(local, local_ranks, restarts_rx, ended_rx, started, watches).await
}

/// This process as a preemption's cause names it: by the ranks of its workers.
fn process_name(ranks: &[Rank]) -> String {
    match ranks {
        [rank] => format!("rank {rank}'s process"),
        ranks => format!("the process of ranks {ranks:?}"),
    }
}

/// What the master's process is made of, once its checkpoint is read and its attempt
/// chosen.
pub(crate) struct MasterParts<M, W> {
    pub(crate) master: DynMaster<M, W>,
    pub(crate) hooks: MasterHooks<M, W>,
    pub(crate) combine: Option<CombineFn<W>>,
    /// The final result as worker processes get it, if not the master's.
    pub(crate) for_workers: Option<super::ForWorkersFn<M>>,
    /// Where the master's checkpoints go, if the job keeps them.
    pub(crate) store: Option<SharedStore>,
    /// What a checkpoint must agree with to be resumed from.
    pub(crate) resuming: Resuming,
    pub(crate) resumed: Option<Resume<M>>,
    pub(crate) attempt: Attempt,
    /// The job's failure as the process hears of it.
    pub(crate) end: JobEnd,
}

/// The master's code and the master's node of one master's process: a first start, a
/// start after the process died, and a resume from a checkpoint alike (the runtime's and
/// the simulator's).
pub(crate) fn master_process<M: Payload, W: Payload>(
    parts: MasterParts<M, W>,
    config: Arc<NodeConfig>,
    settings: NodeSettings,
    job_id: &Arc<str>,
    now: Instant,
) -> (MasterTask<M, W>, MasterNode<M, W>) {
    let attempt = parts.attempt;
    // The user's combiner is user code: guarded, a panic in it is the master's failure.
    let combiner = parts.combine.map(|combine| -> Combiner<W> {
        Box::new(move |fold, next| {
            guarded(|| {
                combine(fold, next);
                Ok(())
            })
        })
    });
    let task = MasterTask::new(
        parts.master,
        parts.hooks,
        MasterContext::new(
            config.job.workers,
            Arc::clone(job_id),
            config.job.iterations,
        )
        .ending_with(parts.end),
        parts.store,
        parts.resuming,
        parts.resumed,
        attempt,
    );
    let task = if crate::protocol::restarts_all(config.job.failure_policy, config.job.barrier_mode)
    {
        task.keeping_initial_state()
    } else {
        task
    };
    // User code too: a panic in it is the master's.
    let for_workers = parts
        .for_workers
        .map(|make| -> ForWorkers<M> { Box::new(move |last| guarded(|| Ok(make(last)))) });
    let node = MasterNode::new(config, settings, attempt, combiner, task.resumed(), now)
        .measuring_folds(crate::codec::encoded_len::<W>)
        .sending_workers(for_workers);
    (task, node)
}

/// What a process that runs the master opens before any of its workers starts.
struct MasterOpening<'a, M: Payload, W: Payload> {
    config: &'a Arc<JobConfig>,
    node_config: &'a Arc<NodeConfig>,
    job: &'a Shared,
    transport: &'a mut dyn Transport<M, W>,
    /// Whether the node actor hosts every worker (a transport that runs the job here).
    hosted: bool,
    /// How many times the master's process was started before (`Topology::restarted`).
    restarted: u32,
    arrivals: &'a Arc<Arrivals<W>>,
}

/// The master's side of its process, open: its link to the workers, its store, the rules
/// and the checkpoint it resumes by, the attempt it runs.
struct MasterSide<M> {
    link: Box<dyn crate::transport::MasterLink<M>>,
    store: Option<SharedStore>,
    resuming: Resuming,
    resumed: Option<Resume<M>>,
    attempt: Attempt,
}

/// Opens the master's side: reads the newest usable checkpoint (before anything binds or
/// starts: checkpoints that cannot be used fail the job before a worker is told
/// anything), chooses the attempt, binds the master's link, and starts the coordinator —
/// unless the job committed, which ends with its result and runs no hook again.
async fn open_master<M: Payload, W: Payload>(
    o: MasterOpening<'_, M, W>,
    checkpoint: Option<Checkpointing>,
    shape: JobShape,
    coordinator: &mut Option<Box<dyn Coordinator>>,
) -> Result<MasterSide<M>, JobError> {
    // Read before anything binds or starts: checkpoints that cannot be used fail the
    // job before a worker is told anything.
    // Written off the master's path, by a thread of their own.
    let store = match checkpoint {
        Some(c) => Some(SharedStore::writing(
            c.store,
            format!(
                "{}-checkpoints",
                crate::config::thread_prefix(&o.config.job_id)
            ),
            o.config.checkpoint_slow,
            o.config.shutdown_timeout,
        )?),
        None => None,
    };
    let resuming = Resuming::new(o.config, shape);
    let resumed = match &store {
        Some(store) => resume::<M>(store.lock().as_mut(), &resuming)?,
        None => None,
    };
    let job = &o.node_config.job;
    let per_process = attempts_per_process(job.failure_policy, job.barrier_mode);
    let attempt = start_attempt(
        o.restarted,
        resumed.as_ref().map(|r| r.attempt),
        per_process,
    );
    if o.restarted > 0 {
        tracing::warn!(
            restarted = o.restarted,
            attempt,
            resumed_from = ?resumed.as_ref().map(|r| r.iteration),
            "the master's process was started again; the job goes on as a new attempt"
        );
    }
    let inbox = Arc::clone(o.arrivals);
    let (rules, heard) = (Arc::clone(o.node_config), o.job.end.clone());
    let link: Box<dyn crate::transport::MasterLink<M>> = if o.hosted {
        Box::new(HostedMasterLink)
    } else {
        o.transport.bind_master(
            attempt,
            Box::new(move |env| {
                // A worker's failure that ends the job: this process hears of it here, on
                // the transport's thread, even while user code holds the job's.
                if let Some(error) = rules.ends_job_at_once(attempt, &env) {
                    heard.end(&error);
                }
                inbox.deliver(env)
            }),
        )?
    };
    // Before any worker of this process starts, and before any iteration anywhere.
    // A job that committed ends with its result: its coordinator runs no hook again.
    let committed = resumed
        .as_ref()
        .filter(|r| r.committed_end)
        .map(|r| r.iteration);
    if let (Some(iteration), Some(_)) = (committed, &coordinator) {
        tracing::info!(
            iteration,
            "the job committed after iteration {iteration}: it ends with its result, and its coordinator does not run again"
        );
        *coordinator = None;
    }
    if let Some(coordinator) = coordinator.take() {
        let info = JobInfo::new(o.config.job_id.clone(), o.config.workers, attempt);
        let coordination = Coordination::new(coordinator, info).recording(store.clone());
        o.job.coordination.start(coordination).await?;
    }
    Ok(MasterSide {
        link,
        store,
        resuming,
        resumed,
        attempt,
    })
}

/// What the watchdog does when it gives up on a failed job held up by user code: tells
/// every worker on `link` that the job failed, in `attempt`.
fn abort_all<M: Payload>(
    link: Arc<std::sync::Mutex<Box<dyn crate::transport::MasterLink<M>>>>,
    attempt: Attempt,
) -> AbortAll {
    Box::new(move |error: &JobError| {
        let link = link.lock().unwrap_or_else(|e| e.into_inner());
        let msg = ToWorker::Abort {
            attempt,
            error: error.clone(),
        };
        if let Err(e) = link.broadcast(msg) {
            tracing::warn!(error = %e, "could not tell the workers the job failed");
        }
    })
}

/// A process without the master: its outcome is how its workers saw the job end. A
/// failed worker's process ends, and a new one joins in its place — except in a gang
/// restart, where this process replaces each of its workers, as the master's node asks.
async fn workers_outcome<M: Payload, W: Payload>(
    mut local: LocalWorkers<M, W>,
    mut running: Vec<Rank>,
    mut restarts_rx: tokio::sync::mpsc::UnboundedReceiver<(Rank, Attempt, JobError)>,
    mut ended_rx: tokio::sync::mpsc::UnboundedReceiver<super::worker::Ended<M>>,
    started: Instant,
    (mut preempt, mut dump): (PreemptWatch, DumpWatch),
) -> Result<JobOutcome<M>, JobError> {
    let mut outcome = None;
    // A preemption asked here goes to the master's node, over the first link made.
    let mut asked: Option<String> = None;
    // And a dump.
    let mut dump_asked: Option<String> = None;
    let mut look = tokio::time::interval(PREEMPT_LOOK);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !running.is_empty() {
        let (rank, ending) = tokio::select! {
            _ = look.tick() => {
                if let Some(by) = preempt.poll() {
                    tracing::warn!(by, "asked to stop for a preemption: the master's node is told");
                    asked = Some(by);
                }
                if asked.as_deref().is_some_and(|by| local.ask_preempt(by)) {
                    asked = None;
                }
                if let Some((by, replies)) = dump.poll() {
                    tracing::warn!(by, "a dump of the flight recorders asked: the master's process writes it");
                    dump_asked = Some(by);
                    for reply in replies {
                        let _ = reply.send(Err(super::DumpError::Elsewhere));
                    }
                }
                // Until a link to the master's node takes it.
                if dump_asked.as_deref().is_some_and(|by| local.ask_dump(by)) {
                    dump_asked = None;
                }
                continue;
            }
            Some((rank, attempt, cause)) = restarts_rx.recv() => {
                if let Err(error) = local.restart_linked(rank, attempt, &cause) {
                    running.retain(|&r| r != rank);
                    outcome = Some(Err(error));
                }
                continue;
            }
            ended = ended_rx.recv() => match ended {
                Some((rank, generation, ending)) if local.is_current(rank, generation) => (rank, ending),
                Some((rank, _, _)) => {
                    tracing::debug!(rank, "a worker replaced in a gang restart ended");
                    continue;
                }
                None => return Err(JobError::Runtime {
                    message: "a worker stopped without an ending".into(),
                }),
            },
        };
        running.retain(|&r| r != rank);
        tracing::debug!(rank, "local worker ended");
        outcome = Some(match (outcome, ending) {
            (Some(Err(first)), _) => Err(first),
            (_, OwnedEnding::Failed(error)) => Err(error),
            (
                _,
                OwnedEnding::Completed {
                    iterations,
                    halted,
                    last,
                },
            ) => Ok(JobOutcome {
                result: last,
                iterations,
                halted,
                report: JobReport {
                    elapsed: started.elapsed(),
                    ..JobReport::default()
                },
            }),
        });
    }
    outcome.unwrap_or_else(|| {
        Err(JobError::Runtime {
            message: "this process runs neither the master nor any worker".into(),
        })
    })
}
