//! The actors that run a job: thin drivers around the [`protocol`](crate::protocol) state
//! machines.
//!
//! - `NodeActor` drives the master's node (`protocol::MasterNode`): every worker message
//!   goes into the node, and the actor carries out what the node asks — sends, broadcasts,
//!   the master's code (`MasterTask`), replacements of this process's workers, events, the
//!   coordinator's hooks.
//! - `WorkerActor` runs one worker's code ([`WorkerState`](crate::protocol::WorkerState)).
//!
//! All actors of a job share one actix arbiter — one thread, one event loop — on a thread
//! of the job's own, so coordination never crosses a thread. User code runs where the
//! `Placer` says: inline on that thread when it is short, or off it — on the compute pool
//! (one thread per core), or in barrier mode on a thread of the worker's own — handing the
//! result back as a message. The thread that called `run` watches inline code (`Watch`),
//! since nothing on the job's thread can while it runs. The job's thread, its actors, its
//! pool and its workers' threads end with the job — except, in a failed job, user code
//! still running after the failure grace, which is left to end on its own thread.

mod arrivals;
mod cancel;
pub(crate) mod coordination;
mod dump;
mod launch;
mod local;
pub(crate) mod master;
mod node;
mod pool;
mod route;
pub(crate) mod signals;
pub(crate) mod sync_calls;
mod watch;
pub(crate) mod worker;
mod worker_actor;
pub(crate) mod worker_task;

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::checkpoint::{Checkpoint, CheckpointStore, JobShape, Writer};
use crate::collective::FoldAmong;
use crate::compute::{JobEnd, MasterComputable, WorkerComputable};
use crate::coordinator::{Coordinator, Input};
use crate::error::{Cause, JobError};
use crate::events::Events;
use crate::ids::{Iteration, Rank};
use crate::interceptor::{MasterInterceptor, WorkerInterceptor};
use crate::params::JobParams;
use crate::payload::Payload;
use crate::protocol::JobConfig;
use crate::protocol::JobOutcome;
pub(crate) use crate::protocol::OwnedEnding;
use crate::protocol::{Combining, Deployment, NodeConfig, Workers};
use crate::transport::{Fingerprint, Transport};
pub use cancel::{Cancel, Preempt};
pub use dump::{DumpError, FlightRecorder};

use coordination::CoordinatorSlot;
use launch::{launch, Shared};
#[cfg(feature = "sim")]
pub(crate) use launch::{master_process, MasterParts};
use pool::PoolExits;
use watch::Watch;

/// Locks `mutex`, also when a thread panicked holding it: what the runtime's locks guard
/// stays usable (each change under them is whole).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
pub(crate) use worker_task::worker_context;

pub(crate) type DynWorker<M, W> = Box<dyn WorkerComputable<MasterResult = M, WorkerResult = W>>;
pub(crate) type DynMaster<M, W> = Box<dyn MasterComputable<MasterResult = M, WorkerResult = W>>;
pub(crate) type WorkerHooks<M, W> = Vec<Box<dyn WorkerInterceptor<M, W>>>;
pub(crate) type MasterHooks<M, W> = Vec<Box<dyn MasterInterceptor<M, W>>>;
pub(crate) type WorkerFactory<M, W> = Arc<dyn Fn(Rank) -> DynWorker<M, W> + Send + Sync>;
/// `make` as a factory of boxed worker interceptors, one per rank.
pub(crate) fn worker_hook_factory<M: Payload, W: Payload, I: WorkerInterceptor<M, W>>(
    make: impl Fn(Rank) -> I + Send + Sync + 'static,
) -> WorkerHookFactory<M, W> {
    Arc::new(move |rank| Box::new(make(rank)) as Box<dyn WorkerInterceptor<M, W>>)
}

pub(crate) type WorkerHookFactory<M, W> =
    Arc<dyn Fn(Rank) -> Box<dyn WorkerInterceptor<M, W>> + Send + Sync>;

/// Everything a job is made of, ready to run.
pub(crate) struct Plan<M, W> {
    pub(crate) config: JobConfig,
    pub(crate) master: DynMaster<M, W>,
    pub(crate) master_hooks: MasterHooks<M, W>,
    pub(crate) workers: WorkerFactory<M, W>,
    pub(crate) worker_hooks: Vec<WorkerHookFactory<M, W>>,
    pub(crate) events: Events,
    pub(crate) transport: Box<dyn Transport<M, W>>,
    pub(crate) combine: Option<Combine<M, W>>,
    pub(crate) for_workers: Option<ForWorkersFn<M>>,
    pub(crate) checkpoint: Option<Checkpointing>,
    pub(crate) coordinator: Option<Box<dyn Coordinator>>,
    pub(crate) input: Option<Input>,
    pub(crate) cancel: Option<Cancel>,
    pub(crate) preempt: Option<Preempt>,
    pub(crate) flight: Option<FlightRecorder>,
    /// The job's message type, when it has messages (`JobBuilder::messages`).
    pub(crate) messages: Option<&'static str>,
    /// The program's own parameters (`JobBuilder::params`).
    pub(crate) params: JobParams,
}

impl<M: Payload, W: Payload> Plan<M, W> {
    /// What the job is as its checkpoints record it: its world size, input and
    /// parameters (a file input's description reads each file's size).
    pub(crate) fn shape(&self) -> JobShape {
        JobShape::new(self.config.workers, self.input.as_ref()).with_params(self.params.clone())
    }

    /// The settings the job's master's node runs by, its aggregation settled for its
    /// transport and its way of combining.
    pub(crate) fn node_config(&self) -> Result<NodeConfig, crate::error::ConfigError> {
        let workers = if self.transport.in_process().is_some() {
            Workers::Together
        } else if self.transport.connects_peers() {
            Workers::Connected
        } else {
            Workers::Apart
        };
        NodeConfig::new(
            Arc::new(self.config.clone()),
            &Deployment {
                checkpoint_every: self.checkpoint.as_ref().map(|c| c.every),
                store_outlives_host: self
                    .checkpoint
                    .as_ref()
                    .is_some_and(|c| c.store.outlives_host()),
                combining: combining(self.combine.as_ref()),
                workers,
            },
        )
    }
}

/// Where the master saves its checkpoints, and every how many iterations.
pub(crate) struct Checkpointing {
    pub(crate) store: Box<dyn CheckpointStore>,
    pub(crate) every: Iteration,
}

/// The job's checkpoint store, shared by the master's code, which saves its checkpoints
/// and reads them on a restart, and its coordinator, which records the job's commit in it.
#[derive(Clone)]
pub(crate) struct SharedStore {
    store: Arc<Mutex<Box<dyn CheckpointStore>>>,
    /// What writes the master's checkpoints off its path (waited for at most the job's
    /// shutdown timeout); none in the simulator, where one thread decides every order and
    /// a checkpoint is written where it is made.
    writer: Option<Arc<Writer>>,
}

impl SharedStore {
    /// A store written to in place, by whoever saves a checkpoint (the simulator's).
    #[cfg(any(feature = "sim", test))]
    pub(crate) fn new(store: Box<dyn CheckpointStore>) -> Self {
        SharedStore {
            store: Arc::new(Mutex::new(store)),
            writer: None,
        }
    }

    /// A store the job's checkpoints are written to by a thread of their own (named
    /// `name`): the master hands each over and goes on. A write that lasts longer than
    /// `slow` is said while it lasts; [`flush`](Self::flush) waits at most `bound`.
    pub(crate) fn writing(
        store: Box<dyn CheckpointStore>,
        name: String,
        slow: std::time::Duration,
        bound: std::time::Duration,
    ) -> Result<Self, JobError> {
        let location = store.location();
        let store = Arc::new(Mutex::new(store));
        let writer =
            Writer::start(name, Arc::clone(&store), location, slow, bound).map_err(|e| {
                JobError::Runtime {
                    message: format!("could not start the thread that writes checkpoints: {e}"),
                }
            })?;
        Ok(SharedStore {
            store,
            writer: Some(Arc::new(writer)),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Box<dyn CheckpointStore>> {
        lock(&self.store)
    }

    /// Saves `checkpoint`: hands it to the writer (which says how the write went), or
    /// writes it now (an error says why it was not).
    pub(crate) fn save(&self, checkpoint: Checkpoint) -> Result<(), String> {
        match &self.writer {
            Some(writer) => {
                writer.write(checkpoint);
                Ok(())
            }
            None => self.lock().save(&checkpoint).map_err(|e| e.to_string()),
        }
    }

    /// Waits until every checkpoint handed over is written: before the store is read or
    /// written in place again, and as the job ends. Bounded by the job's shutdown
    /// timeout; a store that did not finish by then is said at WARN.
    pub(crate) fn flush(&self) {
        if let Some(writer) = &self.writer {
            writer.flush();
        }
    }

    /// [`flush`](Self::flush), waiting at most `bound` (and never past the shutdown
    /// timeout).
    /// Waits at most `bound` for the checkpoints handed over to be written: whether they
    /// were (or there is no writer: each is written where it is saved).
    pub(crate) fn flush_within(&self, bound: std::time::Duration) -> bool {
        self.writer
            .as_ref()
            .is_none_or(|writer| writer.flush_within(bound))
    }

    /// Records that job `job_id` committed its output after `iteration`, its last: its
    /// checkpoint of that iteration is saved again, marked committed. Without one (its
    /// write failed, or a later one is newer) nothing is marked, and a master started
    /// again would wait for its workers; that is logged. So is a failed write: the job
    /// committed all the same.
    pub(crate) fn record_commit(&self, job_id: &str, iteration: Iteration) {
        self.flush();
        let mut store = self.lock();
        let newest = store.latest().map(|l| l.map(|l| l.checkpoint));
        let recorded = match newest {
            Ok(Some(mut c)) if c.job_id == job_id && c.iteration == iteration => {
                c.committed = true;
                store.save(&c).map_err(|e| e.to_string())
            }
            Ok(other) => Err(format!(
                "the newest checkpoint is {}, not the job's last",
                other.map_or("none".to_string(), |c| format!(
                    "of iteration {}",
                    c.iteration
                ))
            )),
            Err(e) => Err(e.to_string()),
        };
        match recorded {
            Ok(()) => tracing::debug!(iteration, "the job's commit is recorded"),
            Err(error) => tracing::warn!(
                iteration,
                %error,
                "the job committed, but the commit could not be recorded with its checkpoint: a master started again would run the job's end again"
            ),
        }
    }
}

/// What every process of this job must agree on: the crate's version (another wire
/// protocol version is refused before the fingerprint is read), the settings that change
/// what a worker computes or how the protocol runs, the input, the result types. Not the
/// checkpoints, which only the master's process keeps (the others need no store).
/// `shape` is the job's world size and input, as its checkpoints record them.
pub(crate) fn fingerprint<M, W>(
    config: &JobConfig,
    shape: &JobShape,
    combining: Combining,
    messages: Option<&str>,
) -> Fingerprint {
    let on = |b: bool| if b { "on" } else { "off" };
    Fingerprint::new()
        .with("crate version", env!("CARGO_PKG_VERSION"))
        .with("workers", shape.workers)
        .with("iterations", config.iterations)
        .with("barrier_mode", on(config.barrier_mode))
        .with("worker_halt", on(config.worker_halt))
        .with(
            "combine",
            match combining {
                Combining::No => "off".to_string(),
                Combining::Whole => "on".to_string(),
                Combining::Elementwise(op) => format!("element by element: {op}"),
            },
        )
        .with("failure_policy", format!("{:?}", config.failure_policy))
        .with("malformed_rows", format!("{:?}", config.malformed_rows))
        .with("input", &shape.input)
        .with("master result type", std::any::type_name::<M>())
        .with("worker result type", std::any::type_name::<W>())
        .with("message type", messages.unwrap_or("none"))
        .with_params(shape.params.as_ref())
}

/// The user's combiner of worker results (see `JobBuilder::combine`).
pub(crate) type CombineFn<W> = Arc<dyn Fn(&mut W, W) + Send + Sync>;

/// The final result as the job's worker processes get it, made from the master's (see
/// `JobBuilder::result_for_worker_processes`).
pub(crate) type ForWorkersFn<M> = Arc<dyn Fn(&M) -> M + Send + Sync>;

/// How a job combines its workers' results: the fold, the workers' part when they fold
/// among themselves, and what kind of fold it is.
pub(crate) struct Combine<M, W> {
    pub(crate) fold: CombineFn<W>,
    pub(crate) among: FoldAmong<M, W>,
    pub(crate) combining: Combining,
}

/// What kind of fold a job's `combine` is.
pub(crate) fn combining<M, W>(combine: Option<&Combine<M, W>>) -> Combining {
    combine.map_or(Combining::No, |c| c.combining)
}

impl<M, W> Clone for Combine<M, W> {
    fn clone(&self) -> Self {
        Combine {
            fold: Arc::clone(&self.fold),
            among: Arc::clone(&self.among),
            combining: self.combining,
        }
    }
}

/// Runs a job to its end on a thread of its own, and returns its outcome. Blocks the
/// calling thread (which may be inside an async runtime: the job has its own).
///
/// While it waits, the calling thread is the job's watchdog: user code that runs inline
/// holds the job's thread, so no timer there can fire until it returns. If such code
/// outlives its deadline, this returns the timeout error naming it, and leaves the job's
/// thread to end whenever that code returns.
pub(crate) fn execute<M: Payload, W: Payload>(plan: Plan<M, W>) -> Result<JobOutcome<M>, JobError> {
    plan.config.validate()?;
    let config = Arc::new(plan.node_config()?);
    let job_config = Arc::clone(&config);
    let shared = Shared {
        watch: Arc::new(Watch::new()),
        end: JobEnd::default(),
        coordination: CoordinatorSlot::default(),
        abort: Arc::default(),
    };
    let job = shared.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // The job's span, a child of the caller's: every span of the job's work is under it.
    let span = tracing::info_span!("job", job = %config.job.job_id, workers = config.job.workers);
    // The job's threads log where the caller does, or to standard error if nothing would
    // hear them (`crate::log`); each thread it starts takes this one's.
    let dispatch = crate::log::for_job();
    tracing::dispatcher::with_default(&dispatch, || {
        warn_of_unread_variables(|var| std::env::var_os(var).is_some())
    });
    let thread = std::thread::Builder::new()
        .name(crate::config::thread_prefix(&config.job.job_id))
        .spawn(move || {
            crate::log::adopt(&dispatch);
            let _job = span.entered();
            let exits = PoolExits::default();
            let (shutdown, grace) = (job_config.job.shutdown_timeout, job_config.failure_grace());
            // The coordinator's thread ends with the job's, even if this one panics.
            let coordinator = Closing(job.coordination.clone());
            let outcome =
                actix::System::new().block_on(launch(plan, job_config, job, exits.clone()));
            if let Err(error) = &outcome {
                // A job that failed before its node could clean up still does (once: the
                // coordinator's actor runs nothing after its end ran), within the limit.
                coordinator.0.fail_from_outside(error, shutdown);
            }
            // The system, its actors and the pool's last handle are dropped by now; the
            // pool's threads end once their current work returns. A failed job waits only
            // its grace for them.
            let bound = if outcome.is_err() { grace } else { shutdown };
            let running = exits.wait(bound);
            if running > 0 {
                tracing::warn!(
                    running,
                    "compute threads still run user code after the job ended; they are left to end on their own"
                );
            }
            // The receiver is gone only if the watchdog already gave up on the job.
            let _ = tx.send(outcome);
            // The coordinator's thread is joined only now: a hook that never returns holds
            // up this thread, not `run`.
            drop(coordinator);
        })
        .map_err(|e| JobError::Runtime {
            message: format!("could not start the job's thread: {e}"),
        })?;
    let tick = config.check_interval();
    loop {
        match rx.recv_timeout(tick) {
            Ok(outcome) => {
                // The thread only has to return now; a panic in it was a bug in the runtime.
                let _ = thread.join();
                return outcome;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Some(error) = shared.watch.overdue(&config) {
                    tracing::error!(%error, "inline user code outlived its deadline; the job's thread is left to it");
                    shared
                        .coordination
                        .fail_from_outside(&error, config.job.shutdown_timeout);
                    return Err(error);
                }
                if let Some(error) = held_up(&shared, &config) {
                    shared
                        .coordination
                        .fail_from_outside(&error, config.job.shutdown_timeout);
                    return Err(error);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let message = match thread.join() {
                    Err(panic) => {
                        format!("the job's thread panicked: {}", Cause::from_panic(panic))
                    }
                    Ok(()) => "the job's thread ended without an outcome".to_string(),
                };
                return Err(JobError::Runtime { message });
            }
        }
    }
}

/// Warns, once in a process, of each of superstep's variables that is set (`is_set`) but
/// that nothing in this process read: the program never made the call that reads it,
/// so it has no effect. Says which call would.
fn warn_of_unread_variables(is_set: impl Fn(&str) -> bool) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        for (var, call) in unread_variables(is_set) {
            tracing::warn!(
                variable = var,
                "{var} is set, but this program never called {call}, which reads it: it has no effect"
            );
        }
    });
}

/// Each of superstep's variables set (`is_set`) that nothing read, with the call that reads
/// it.
fn unread_variables(is_set: impl Fn(&str) -> bool) -> Vec<(&'static str, &'static str)> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut unread = Vec::new();
    if !crate::config::JOB_VARS_READ.load(Relaxed) {
        let call = "JobBuilder::settings_from_env (or JobConfig::with_env)";
        unread.extend(
            crate::config::job_vars()
                .filter(|v| is_set(v))
                .map(|v| (v, call)),
        );
    }
    #[cfg(feature = "tcp")]
    if !crate::transport::tcp::env::CLUSTER_VARS_READ.load(Relaxed) {
        let call = "JobBuilder::cluster_from_env (or ClusterEnv::from_env)";
        unread.extend(
            crate::transport::tcp::env::CLUSTER_VARS
                .into_iter()
                .filter(|v| is_set(v))
                .map(|v| (v, call)),
        );
    }
    unread
}

/// Stops the coordinator's actor, and waits for its thread, when dropped.
struct Closing(CoordinatorSlot);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The job's first failure, once user code on the job's thread has held up its end for
/// longer than the failure grace (that code never heard of the failure: it started first).
fn held_up(shared: &Shared, config: &NodeConfig) -> Option<JobError> {
    let (error, at) = shared.end.first()?;
    if at.elapsed() <= config.failure_grace() + config.check_interval() {
        return None;
    }
    let (running, since, stopping) = shared.watch.running()?;
    // Only code that started before the failure holds the end up: what runs after it (a
    // `post_application`, say) is the end itself.
    if stopping || since >= *at {
        return None;
    }
    tracing::error!(%error, "the job failed, and {running} still runs inline past the failure grace: the job's thread is left to it");
    if let Some(abort) = shared.abort.get() {
        abort(error);
    }
    Some(error.clone())
}

/// Like [`execute`], but waits without blocking an async caller.
pub(crate) async fn execute_async<M: Payload, W: Payload>(
    plan: Plan<M, W>,
) -> Result<JobOutcome<M>, JobError> {
    let (tx, rx) = oneshot::channel();
    // The job's span is a child of the caller's, here as with `run`.
    let caller = tracing::Span::current();
    // Logs where the caller does (`crate::log::spawn`).
    crate::log::spawn(
        format!("{}-run", crate::config::thread_prefix(&plan.config.job_id)),
        move || {
            let _caller = caller.entered();
            let _ = tx.send(execute(plan));
        },
    )
    .map_err(|e| JobError::Runtime {
        message: format!("could not start the job's thread: {e}"),
    })?;
    rx.await.unwrap_or_else(|_| {
        Err(JobError::Runtime {
            message: "the job's thread ended without an outcome".into(),
        })
    })
}
