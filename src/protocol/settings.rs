//! A job's settings: plain data with defaults and a `validate` step, read from code and
//! from a settings document of any serde format (the environment's overrides are read in
//! `config.rs`, above the protocol). Declared once, here: the nodes' settings
//! ([`NodeConfig`](super::NodeConfig)) hold the job's by reference.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::FailurePolicy;
use crate::error::ConfigError;
use crate::ids::{Aggregation, Iteration};

/// Where user compute runs.
///
/// An actix arbiter is one thread and one event loop: the master's node and every
/// in-process worker share one, so coordination never crosses a thread. User code that
/// computes for long on that thread would stall all of them; code that is short is cheaper
/// to run there than to hand to another thread (a wake-up of another thread costs tens of
/// microseconds on small machines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Placement {
    /// Measure each side's iteration (hooks and compute): a worker's start-up and shutdown
    /// and every side's first iteration run on the compute pool; from then on an iteration
    /// whose previous run took less than [`JobConfig::inline_threshold`] runs inline on the
    /// coordination thread, a longer one on the pool. The default.
    ///
    /// A compute that was cheap and turns slow never lines the others up: once it has held
    /// the coordination thread past the threshold, a rescuer thread hands the workers of
    /// its round not reached yet to the pool, so no worker's compute waits for another's,
    /// and a failure among them ends the job while the slow one runs.
    /// (The slow one still holds the coordination thread until it returns; compute whose
    /// cost varies widely is better on `Pool`.)
    ///
    /// In every placement the master's start-up (`pre_application`, its `init`,
    /// restoring a checkpoint) and its `post_application` run inline: at those points the
    /// coordination thread has nothing else to do. A long master `init` holds the node's
    /// timers and cancellation until it returns.
    #[default]
    #[serde(alias = "auto")]
    Auto,
    /// Always run user code inline on the coordination thread: lowest latency for trivial
    /// compute, but a slow compute stalls the whole job, timeouts included, and the
    /// computes after it in its round wait for it.
    #[serde(alias = "inline")]
    Inline,
    /// Always run user code on the compute pool, which has one thread per core.
    #[serde(alias = "pool")]
    Pool,
}

/// The signal that asks a job to stop for a preemption
/// ([`JobConfig::preempt_signal`]): the master checkpoints at the next iteration boundary
/// and every process ends with [`JobError::Preempted`](crate::JobError::Preempted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreemptSignal {
    /// `SIGTERM`: what Kubernetes sends a pod it stops, and Slurm a job it cancels or
    /// preempts. The default.
    #[serde(alias = "sigterm", alias = "SIGTERM")]
    Term,
    /// `SIGINT`.
    #[serde(alias = "sigint", alias = "SIGINT")]
    Int,
    /// `SIGHUP`.
    #[serde(alias = "sighup", alias = "SIGHUP")]
    Hup,
    /// `SIGUSR1`: what Slurm's `--signal=B:USR1@60` sends ahead of a job's end.
    #[serde(alias = "sigusr1", alias = "SIGUSR1")]
    Usr1,
    /// `SIGUSR2`.
    #[serde(alias = "sigusr2", alias = "SIGUSR2")]
    Usr2,
}

impl PreemptSignal {
    /// The signal's number on this system.
    #[cfg(unix)]
    pub fn number(self) -> i32 {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
        match self {
            PreemptSignal::Term => SIGTERM,
            PreemptSignal::Int => SIGINT,
            PreemptSignal::Hup => SIGHUP,
            PreemptSignal::Usr1 => SIGUSR1,
            PreemptSignal::Usr2 => SIGUSR2,
        }
    }
}

impl std::fmt::Display for PreemptSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PreemptSignal::Term => "SIGTERM",
            PreemptSignal::Int => "SIGINT",
            PreemptSignal::Hup => "SIGHUP",
            PreemptSignal::Usr1 => "SIGUSR1",
            PreemptSignal::Usr2 => "SIGUSR2",
        })
    }
}

impl PreemptSignal {
    /// A signal setting as the environment writes it (`SUPERSTEP_PREEMPT_SIGNAL`,
    /// `SUPERSTEP_DUMP_SIGNAL`): `none`, or a signal's name as [`FromStr`](std::str::FromStr)
    /// reads it.
    pub fn from_setting(value: &str) -> Result<Option<Self>, String> {
        match value.trim() {
            none if none.eq_ignore_ascii_case("none") => Ok(None),
            signal => signal.parse().map(Some),
        }
    }
}

impl std::str::FromStr for PreemptSignal {
    type Err = String;

    /// `term`, `SIGTERM`, `TERM` (any case), and the same of `int`, `hup`, `usr1`, `usr2`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim().to_ascii_lowercase();
        Ok(match name.strip_prefix("sig").unwrap_or(&name) {
            "term" => PreemptSignal::Term,
            "int" => PreemptSignal::Int,
            "hup" => PreemptSignal::Hup,
            "usr1" => PreemptSignal::Usr1,
            "usr2" => PreemptSignal::Usr2,
            _ => return Err("must be term, int, hup, usr1 or usr2 (or none)".into()),
        })
    }
}

/// What a malformed row does ([`JobBuilder::malformed_rows`](crate::JobBuilder::malformed_rows)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum MalformedRows {
    /// The row fails the worker (and the job), naming its file and line. The default.
    #[default]
    Fail,
    /// The row is skipped, counted as rejected, and recorded with its file, line and why.
    Skip,
}

/// The settings of a job. Every setting has a default; [`JobConfig::validate`] checks
/// them all and names the first invalid one.
///
/// # From a file
///
/// A settings document in any serde format names only the settings it changes; the rest
/// keep their defaults. Durations are written as people write them (`"30s"`, `"1h 30m"`,
/// `"250ms"`; a number is seconds), and a setting the job does not have is an error
/// naming it:
///
/// ```
/// # use superstep::JobConfig;
/// let config: JobConfig = serde_json::from_str(
///     r#"{"workers": 4, "iterations": 10, "iteration_timeout": "90s"}"#,
/// )?;
/// assert_eq!((config.workers, config.iterations), (4, 10));
/// assert_eq!(config.iteration_timeout, std::time::Duration::from_secs(90));
/// assert_eq!(config.job_id, "superstep");
/// # Ok::<(), serde_json::Error>(())
/// ```
///
/// # From the environment
///
/// [`with_env`](JobConfig::with_env) (or
/// [`JobBuilder::settings_from_env`](crate::JobBuilder::settings_from_env)) lets the
/// environment override the common settings, for a run that differs from the code's or
/// the file's without a rebuild:
///
/// | variable | setting |
/// |---|---|
/// | `SUPERSTEP_WORKERS` | [`workers`](JobConfig::workers) |
/// | `SUPERSTEP_ITERATIONS` | [`iterations`](JobConfig::iterations) |
/// | `SUPERSTEP_PLACEMENT` | [`placement`](JobConfig::placement): `auto`, `inline` or `pool` |
/// | `SUPERSTEP_COMPUTE_THREADS` | [`compute_threads`](JobConfig::compute_threads) |
/// | `SUPERSTEP_STARTUP_TIMEOUT` | [`startup_timeout`](JobConfig::startup_timeout) |
/// | `SUPERSTEP_ITERATION_TIMEOUT` | [`iteration_timeout`](JobConfig::iteration_timeout) |
/// | `SUPERSTEP_SHUTDOWN_TIMEOUT` | [`shutdown_timeout`](JobConfig::shutdown_timeout) |
/// | `SUPERSTEP_SYNC_TIMEOUT` | [`sync_timeout`](JobConfig::sync_timeout) |
/// | `SUPERSTEP_FAILURE_GRACE` | [`failure_grace`](JobConfig::failure_grace) |
/// | `SUPERSTEP_AGGREGATION` | [`aggregation`](JobConfig::aggregation): `auto`, `star`, `tree` or `ring` |
/// | `SUPERSTEP_FAILURE_POLICY` | [`failure_policy`](JobConfig::failure_policy): `fail`, `continue_without`, `restart_worker:N`, `restart_all:N` |
/// | `SUPERSTEP_PROGRESS_INTERVAL` | [`progress_interval`](JobConfig::progress_interval) |
/// | `SUPERSTEP_CHECKPOINT_SLOW` | [`checkpoint_slow`](JobConfig::checkpoint_slow) |
/// | `SUPERSTEP_RESHARD_ON_RESUME` | [`reshard_on_resume`](JobConfig::reshard_on_resume): `true` or `false` |
/// | `SUPERSTEP_CHECKPOINT_REPLICAS` | [`checkpoint_replicas`](JobConfig::checkpoint_replicas): `auto` or a number |
/// | `SUPERSTEP_PREEMPT_SIGNAL` | [`preempt_signal`](JobConfig::preempt_signal): `term`, `int`, `hup`, `usr1`, `usr2` or `none` |
/// | `SUPERSTEP_PREEMPT_GRACE` | [`preempt_grace`](JobConfig::preempt_grace) |
/// | `SUPERSTEP_FLIGHT_EVENTS` | [`flight_events`](JobConfig::flight_events) |
/// | `SUPERSTEP_FLIGHT_DIR` | [`flight_dir`](JobConfig::flight_dir) |
/// | `SUPERSTEP_DUMP_SIGNAL` | [`dump_signal`](JobConfig::dump_signal): `term`, `int`, `hup`, `usr1`, `usr2` or `none` |
///
/// Durations as in a file (`30s`, or a number of seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "Document")]
#[non_exhaustive]
pub struct JobConfig {
    /// A name for the job, used in logs, spans and (over a network) to keep jobs apart.
    /// Default `"superstep"`.
    pub job_id: String,
    /// The number of workers. Default 1.
    pub workers: usize,
    /// The most iterations to run; the master may halt earlier. Default 50 (Guagua's
    /// `guagua.iteration.count` as its client sets it).
    pub iterations: Iteration,
    /// Halt the job when every worker votes to halt in an iteration (after the master has
    /// computed that iteration) and, in a job with messages, no message is on its way, as
    /// Guagua's `guagua.worker.halt.enable`. Default off: only the master halts.
    pub worker_halt: bool,
    /// How long start-up may take (`Duration::MAX` means no limit): every worker's `pre_application` and `init` (which loads
    /// its shard) until it registers — over a network, also until its process started and
    /// connected — and the master's `pre_application`. Longer than an iteration's by
    /// default: 30 min.
    #[serde(with = "duration")]
    pub startup_timeout: Duration,
    /// How long one iteration may wait (`Duration::MAX` means no limit): for every worker's result from the moment the
    /// iteration is broadcast, and for the master's compute. Default 10 min.
    #[serde(with = "duration")]
    pub iteration_timeout: Duration,
    /// How long the end of the job may take (`Duration::MAX` means no limit): every worker's `post_application`. Default 1 min.
    #[serde(with = "duration")]
    pub shutdown_timeout: Duration,
    /// Once the job failed, how long its end waits for workers still running user code
    /// (their compute, their `post_application`) before the job returns its first failure
    /// and leaves that code to end on its own thread, naming the ranks. Default 250 ms.
    /// A compute can stop earlier: see
    /// [`WorkerContext::check_cancelled`](crate::WorkerContext::check_cancelled).
    #[serde(with = "duration")]
    pub failure_grace: Duration,
    /// Where user compute runs. Default [`Placement::Auto`].
    pub placement: Placement,
    /// With [`Placement::Auto`], an iteration that took less than this runs inline the next
    /// time. Default 50 µs.
    #[serde(with = "duration")]
    pub inline_threshold: Duration,
    /// Threads of the compute pool; `None` (the default) means one per available core.
    /// (In barrier mode workers compute on threads of their own, and the pool serves the
    /// master.)
    pub compute_threads: Option<usize>,
    /// Barrier mode (Spark's barrier execution mode): workers may call `barrier()` and
    /// `all_gather()` in their compute and wait for each other there. Every worker then
    /// computes on a dedicated thread of its own (the gang: one thread per worker, on which
    /// nothing else ever runs), never inline. Default off.
    pub barrier_mode: bool,
    /// How the workers' results of a job that combines them reach the master: each on its
    /// own (a star), or folded among the workers over the peer mesh first. Default
    /// [`Aggregation::Auto`]; `Tree` and `Ring` need barrier mode and a combining job.
    pub aggregation: Aggregation,
    /// How long one `barrier()` / `all_gather()` epoch may wait, from its first arrival
    /// (Spark's `spark.barrier.sync.timeout`, whose 365-day default is not copied). Default
    /// 10 min; `Duration::MAX` means no limit. The iteration timeout still bounds the whole
    /// iteration; if it passes while an epoch gathers, the error is the epoch's timeout.
    #[serde(with = "duration")]
    pub sync_timeout: Duration,
    /// The fraction of workers an iteration may go on with once
    /// [`min_workers_timeout`](JobConfig::min_workers_timeout) has passed (Guagua's
    /// `guagua.min.workers.ratio`): after it, the iteration completes as soon as
    /// `ceil(ratio × workers)` results are in, and the ranks still missing are left out of
    /// it — their late results are dropped as stale. In `(0, 1]`; default 1.0, which waits
    /// for every worker (until the iteration timeout). Not with barrier mode, whose ranks
    /// wait for each other. Below 1.0, workers never compute inline (see [`Placement`]):
    /// a straggler must not hold the thread that is to go on without it.
    pub min_workers_ratio: f64,
    /// How long an iteration waits for every worker before it may go on with
    /// `ceil(min_workers_ratio × workers)` (Guagua's `guagua.min.workers.timeout`). Measured
    /// from the broadcast that starts the iteration. Default 5 s; unused while the ratio
    /// is 1.0.
    #[serde(with = "duration")]
    pub min_workers_timeout: Duration,
    /// What the job does when a worker fails — its code errs or panics in start-up or an
    /// iteration, or it is lost (its process killed, its heartbeats gone). Default
    /// [`FailurePolicy::Fail`]. [`FailurePolicy::ContinueWithout`] needs a
    /// [`min_workers_ratio`](JobConfig::min_workers_ratio) below 1.0 (the quorum it may go
    /// down to); in barrier mode `ContinueWithout` is refused, since ranks wait for each
    /// other inside an iteration, and a replacement under
    /// [`FailurePolicy::RestartWorker`] takes every rank back to the last checkpoint.
    pub failure_policy: FailurePolicy,
    /// What a malformed CSV or JSONL row does to a worker that reads it with
    /// `coordinator::RowSource` (the `pipeline` feature; through
    /// [`WorkerContext::malformed_rows`](crate::WorkerContext::malformed_rows)): fail it,
    /// naming the file and line (the default), or skip and record it.
    pub malformed_rows: MalformedRows,
    /// How many of the last iterations the job report keeps in detail
    /// ([`JobReport::iterations`](crate::JobReport::iterations)); running totals count
    /// every iteration ([`JobReport::totals`](crate::JobReport::totals)). Default 1,000
    /// (about 100 KB); 0 keeps none.
    pub report_iterations: usize,
    /// Whether a job may resume from a checkpoint of another shape — another world size
    /// ([`workers`](JobConfig::workers)) or another input — re-sharding its input over the
    /// workers it has now. Default `false`: such a checkpoint is refused, naming both
    /// shapes (a job that meant to resume would otherwise go on with shards the checkpoint
    /// never saw). When `true`, the master's state and last result carry over and each
    /// worker starts from its `init` on its new shard; a checkpoint that holds the
    /// workers' own states (`WorkerComputable::save_state`, or messages on their way) is
    /// still refused, since those states belong to the old shards.
    pub reshard_on_resume: bool,
    /// How many workers of other processes keep a copy of each checkpoint, in memory, so
    /// that it outlives the master's host: a master started again with an empty (or
    /// older) checkpoint store — on a fresh host, say — takes the newest copy the workers
    /// that connect hold, checks its checksum, job id and shape, saves it into its store
    /// and resumes from it. Each copy is sent to its worker once per checkpoint, after the
    /// next iteration's broadcast; one larger than the transport's frame limit
    /// (`SUPERSTEP_MAX_FRAME`) cannot be sent, and is skipped with a warning. The copies go
    /// to workers of other processes, those on other hosts than the master's first (as the
    /// transport tells from each connection's addresses). `None` (the default) is 1 when
    /// the job spans two hosts or more (or the transport cannot tell) and 0 when every
    /// process is on the master's host, whose loss would take the copies too, or when the
    /// store outlives the host (`CheckpointStore::outlives_host`: an object store);
    /// `Some(0)` keeps none. Only a job with a checkpoint store makes copies. A copy holds
    /// the whole checkpoint: the master's state and result, and every worker's saved
    /// state.
    /// A copy lives as long as its worker's process: a job whose every process is started
    /// again (a requeue) needs a store that outlives the host (`ObjectCheckpointStore`).
    pub checkpoint_replicas: Option<usize>,
    /// How often the master logs a completed iteration at INFO (its number, its time and
    /// its slowest worker): the first iteration, then one at most this often, saying how
    /// many went by since the last line. Default 1 s; zero logs every iteration. (Quiet it
    /// with a filter: `RUST_LOG=superstep=warn`.)
    #[serde(with = "duration")]
    pub progress_interval: Duration,
    /// How long a checkpoint's write may take before it is said at WARN, naming the store
    /// — and again each time as long while it lasts. The master hands each checkpoint to a
    /// writer of its own and goes on: a slow or paused store slows no iteration, but a
    /// write that lasts this long means the newest checkpoint lags. Default 10 s.
    #[serde(with = "duration")]
    pub checkpoint_slow: Duration,
    /// The signal that asks the job to stop for a preemption, in any of its processes
    /// (`None`: none does). The master then checkpoints at the next iteration boundary —
    /// or at the end of the one under way, when it is one the job checkpoints —, and every
    /// process of the job ends with [`JobError::Preempted`](crate::JobError::Preempted),
    /// whose [`exit_code`](crate::JobError::exit_code) says "requeue me"; run again, the
    /// job resumes from that checkpoint. Copies of the signal within a second are the same
    /// notice; a later one ends the process as the signal does by default. The signal's
    /// handler is installed when the first such job starts and kept: outside a job the
    /// signal does its default (a program that ignores or handles the signal itself sets
    /// this to `None`, and may call [`Preempt::request`](crate::Preempt::request) from its
    /// handler). Default `SIGTERM` (what Kubernetes and Slurm send); `SIGUSR1` for Slurm's
    /// `--signal=USR1@120`. Unix only.
    pub preempt_signal: Option<PreemptSignal>,
    /// How long a preempted job may take to stop — to finish the iteration under way, the
    /// next one if the checkpoint needs it, and the checkpoint's write — before it gives up
    /// the checkpoint and ends at once, still with
    /// [`JobError::Preempted`](crate::JobError::Preempted) (naming the checkpoint before).
    /// Keep it below the scheduler's own grace (Kubernetes' `terminationGracePeriodSeconds`,
    /// 30 s by default; the lead time of Slurm's `--signal`). Default 20 s.
    #[serde(with = "duration")]
    pub preempt_grace: Duration,
    /// How many of its last events each rank's flight recorder keeps (its calls, their
    /// ends, its messages, its saves, its peers lost: see [`superstep::flight`](crate::flight));
    /// 0 keeps none. Default 256.
    pub flight_events: usize,
    /// Where a dump of the flight recorders is written (`None`: the system's temporary
    /// directory, `std::env::temp_dir()`), on the master's host.
    pub flight_dir: Option<std::path::PathBuf>,
    /// The signal that asks for a dump of every rank's flight recorder, to any process of
    /// the job (`None`: none does; [`FlightRecorder::dump`](crate::FlightRecorder::dump)
    /// still does). The master's process writes the dump and logs where at WARN; the job
    /// goes on; every signal is a request (copies within a second, such as a launcher's
    /// to every process, are one). The same signal as the
    /// [`preempt_signal`](Self::preempt_signal) is the preemption's alone (said at WARN).
    /// Before the job starts the signal does its default (`SIGUSR2` ends the process);
    /// once a job took it, it no longer does, in or after the job. Default `SIGUSR2`. Unix
    /// only.
    pub dump_signal: Option<PreemptSignal>,
    /// The settings a document named, when this was read from one.
    #[serde(skip)]
    pub(crate) named: Named,
}

/// The names of the settings a document named: what
/// [`JobBuilder::config`](crate::JobBuilder::config) overlays. Never compared: two
/// configurations with the same settings are equal however they were made.
#[derive(Debug, Clone, Default)]
pub(crate) struct Named(Vec<&'static str>);

impl PartialEq for Named {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Every setting of [`JobConfig`], once: the document form that reads only what it names
/// (and remembers which), and the overlay of one configuration on another.
macro_rules! settings {
    ($($field:ident: $ty:ty $(=> $with:tt)?),+ $(,)?) => {
        /// A settings document as read: each setting it names.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Document {
            $(
                #[serde(default $(, deserialize_with = $with)?)]
                $field: Option<$ty>,
            )+
        }

        impl From<Document> for JobConfig {
            fn from(document: Document) -> Self {
                let mut config = JobConfig::default();
                let mut named = Vec::new();
                $(
                    if let Some(value) = document.$field {
                        config.$field = value;
                        named.push(stringify!($field));
                    }
                )+
                config.named = Named(named);
                config
            }
        }

        impl JobConfig {
            /// Sets from `other` the settings it names — those its document named, when it
            /// was read from one, and those it changed from their defaults — and returns
            /// their names; the rest stay as they are.
            pub(crate) fn overlay(&mut self, other: JobConfig) -> Vec<&'static str> {
                let defaults = JobConfig::default();
                // Every setting is listed: a new one that is not fails to compile here.
                let JobConfig { $($field,)+ named } = other;
                let mut set = Vec::new();
                $(
                    let name = stringify!($field);
                    if named.0.contains(&name) || $field != defaults.$field {
                        self.$field = $field;
                        set.push(name);
                    }
                )+
                set
            }
        }
    };
}

settings! {
    job_id: String,
    workers: usize,
    iterations: Iteration,
    worker_halt: bool,
    startup_timeout: Duration => "duration::some",
    iteration_timeout: Duration => "duration::some",
    shutdown_timeout: Duration => "duration::some",
    failure_grace: Duration => "duration::some",
    placement: Placement,
    inline_threshold: Duration => "duration::some",
    compute_threads: Option<usize>,
    barrier_mode: bool,
    aggregation: Aggregation,
    sync_timeout: Duration => "duration::some",
    min_workers_ratio: f64,
    min_workers_timeout: Duration => "duration::some",
    failure_policy: FailurePolicy,
    malformed_rows: MalformedRows,
    report_iterations: usize,
    reshard_on_resume: bool,
    checkpoint_replicas: Option<usize>,
    progress_interval: Duration => "duration::some",
    checkpoint_slow: Duration => "duration::some",
    preempt_signal: Option<PreemptSignal> => "named_or_null",
    preempt_grace: Duration => "duration::some",
    flight_events: usize,
    flight_dir: Option<std::path::PathBuf>,
    dump_signal: Option<PreemptSignal> => "named_or_null",
}

fn default_failure_grace() -> Duration {
    Duration::from_millis(250)
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            job_id: "superstep".to_string(),
            workers: 1,
            iterations: 50,
            worker_halt: false,
            startup_timeout: Duration::from_secs(1800),
            iteration_timeout: Duration::from_secs(600),
            shutdown_timeout: Duration::from_secs(60),
            failure_grace: default_failure_grace(),
            placement: Placement::Auto,
            inline_threshold: Duration::from_micros(50),
            compute_threads: None,
            barrier_mode: false,
            aggregation: Aggregation::Auto,
            sync_timeout: Duration::from_secs(600),
            min_workers_ratio: 1.0,
            min_workers_timeout: Duration::from_secs(5),
            failure_policy: FailurePolicy::Fail,
            malformed_rows: MalformedRows::Fail,
            report_iterations: 1_000,
            reshard_on_resume: false,
            checkpoint_replicas: None,
            progress_interval: Duration::from_secs(1),
            checkpoint_slow: Duration::from_secs(10),
            preempt_signal: Some(PreemptSignal::Term),
            preempt_grace: Duration::from_secs(20),
            flight_events: 256,
            flight_dir: None,
            dump_signal: Some(PreemptSignal::Usr2),
            named: Named::default(),
        }
    }
}

impl JobConfig {
    /// Checks every setting; the error names the first invalid one, its value and what it
    /// must be.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.job_id.is_empty() || self.job_id.contains('\0') {
            return Err(ConfigError::new(
                "job_id",
                &self.job_id,
                "must not be empty nor contain a NUL character",
            ));
        }
        if self.workers == 0 {
            return Err(ConfigError::new(
                "workers",
                self.workers,
                "must be at least 1",
            ));
        }
        if self.iterations == 0 {
            return Err(ConfigError::new(
                "iterations",
                self.iterations,
                "must be at least 1",
            ));
        }
        for (name, value) in [
            ("startup_timeout", self.startup_timeout),
            ("iteration_timeout", self.iteration_timeout),
            ("shutdown_timeout", self.shutdown_timeout),
            ("sync_timeout", self.sync_timeout),
            ("min_workers_timeout", self.min_workers_timeout),
            ("preempt_grace", self.preempt_grace),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(name, value, "must be longer than zero"));
            }
        }
        if self.barrier_mode && self.placement == Placement::Inline {
            return Err(ConfigError::new(
                "placement",
                self.placement,
                "cannot be Inline in barrier mode: ranks waiting for each other need threads of their own",
            ));
        }
        if matches!(self.aggregation, Aggregation::Tree | Aggregation::Ring) && !self.barrier_mode {
            return Err(ConfigError::new(
                "aggregation",
                self.aggregation,
                "needs barrier mode: folding among the workers makes every rank wait for the others at the end of its compute; set barrier_mode, or Auto or Star",
            ));
        }
        let ratio = self.min_workers_ratio;
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(ConfigError::new(
                "min_workers_ratio",
                ratio,
                "must be more than 0 and at most 1",
            ));
        }
        if self.barrier_mode && ratio < 1.0 {
            return Err(ConfigError::new(
                "min_workers_ratio",
                ratio,
                "must be 1.0 in barrier mode: every rank takes part in every barrier",
            ));
        }
        if ratio < 1.0 && self.placement == Placement::Inline {
            return Err(ConfigError::new(
                "placement",
                self.placement,
                "cannot be Inline with a min-workers ratio below 1: a straggler computing inline would hold the thread that is to go on without it",
            ));
        }
        match self.failure_policy {
            FailurePolicy::ContinueWithout if self.quorum() >= self.workers => {
                return Err(ConfigError::new(
                    "failure_policy",
                    self.failure_policy,
                    &format!(
                        "needs a min_workers_ratio whose quorum ceil(ratio × workers) is below the job's {} (it is {}): it goes on without a failed worker only while the quorum remains",
                        crate::error::counted(self.workers, "worker"),
                        self.quorum()
                    ),
                ));
            }
            FailurePolicy::ContinueWithout if self.barrier_mode => {
                return Err(ConfigError::new(
                    "failure_policy",
                    self.failure_policy,
                    "must be Fail, RestartWorker or RestartAll in barrier mode: ranks wait for each other inside an iteration, so one rank cannot be left out alone",
                ));
            }
            FailurePolicy::RestartAll { max_attempts: 0 } => {
                return Err(ConfigError::new(
                    "failure_policy",
                    self.failure_policy,
                    "max_attempts must be at least 1 (the first attempt counts)",
                ));
            }
            _ => {}
        }
        if self.compute_threads == Some(0) {
            return Err(ConfigError::new(
                "compute_threads",
                self.compute_threads,
                "must be at least 1 when set",
            ));
        }
        Ok(())
    }

    /// How many results an iteration needs once the min-workers timeout has passed:
    /// `ceil(min_workers_ratio × workers)`, at least 1.
    pub fn quorum(&self) -> usize {
        quorum(self.min_workers_ratio, self.workers)
    }
}

/// A duration as people write it: `30s`, `1h 30m`, `250ms` (humantime's forms), or a
/// number of seconds (`30`, `2.5`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| "must be a number of seconds, 0 or more".to_string());
    }
    humantime::parse_duration(text).map_err(|e| {
        format!("must be a duration such as \"30s\", \"1h 30m\" or \"250ms\", or a number of seconds ({e})")
    })
}

/// A setting that may be `null` in a document, naming it: `null` is `None`, not "not named"
/// (the signal's default is one).
fn named_or_null<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Durations in settings documents: written as `"30s"`, read from such a string, a number
/// of seconds, or the `{"secs": …, "nanos": …}` of serde's own form.
pub(crate) mod duration {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{self, MapAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(DurationVisitor)
    }

    /// A duration a document names.
    pub(crate) fn some<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        deserialize(d).map(Some)
    }

    struct DurationVisitor;

    impl<'de> Visitor<'de> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as \"30s\", or a number of seconds")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            super::parse_duration(v).map_err(|why| E::custom(format!("{v:?} {why}")))
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(v))
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            u64::try_from(v)
                .map(Duration::from_secs)
                .map_err(|_| E::custom(format!("{v} seconds is below 0")))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
            Duration::try_from_secs_f64(v)
                .map_err(|_| E::custom(format!("{v} is not a number of seconds, 0 or more")))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Duration, A::Error> {
            let (mut secs, mut nanos) = (None::<u64>, None::<u32>);
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "secs" => secs = Some(map.next_value()?),
                    "nanos" => nanos = Some(map.next_value()?),
                    other => return Err(de::Error::unknown_field(other, &["secs", "nanos"])),
                }
            }
            let secs = secs.ok_or_else(|| de::Error::missing_field("secs"))?;
            let nanos = nanos.unwrap_or(0);
            if nanos >= 1_000_000_000 {
                return Err(de::Error::custom(format!(
                    "{nanos} nanos is a second or more"
                )));
            }
            Ok(Duration::new(secs, nanos))
        }
    }
}

/// `ceil(ratio × workers)`, at least 1 and at most `workers`.
fn quorum(ratio: f64, workers: usize) -> usize {
    // Less a hair, so that a product a rounding error above a whole number (0.7 × 10 is
    // 7.000000000000001) does not round up past it.
    let q = (ratio * workers as f64 - 1e-9).ceil() as usize;
    q.clamp(1, workers.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_overlays_what_it_names_and_nothing_else() {
        let mut made = JobConfig {
            workers: 3,
            iterations: 7,
            placement: Placement::Pool,
            ..JobConfig::default()
        };
        let document: JobConfig =
            serde_json::from_str(r#"{"iterations": 10, "placement": "auto"}"#).unwrap();
        let set = made.overlay(document);
        assert_eq!(set, ["iterations", "placement"]);
        assert_eq!((made.workers, made.iterations), (3, 10));
        // Named, so set, though it is the default.
        assert_eq!(made.placement, Placement::Auto);

        // A configuration made in code names what it changed from the defaults.
        let code = JobConfig {
            sync_timeout: Duration::from_secs(5),
            ..JobConfig::default()
        };
        let set = made.overlay(code);
        assert_eq!(set, ["sync_timeout"]);
        assert_eq!((made.workers, made.iterations), (3, 10));
        assert_eq!(made.sync_timeout, Duration::from_secs(5));
    }

    #[test]
    fn a_partial_document_keeps_the_defaults_and_reads_durations_as_written() {
        let config: JobConfig = serde_json::from_str(
            r#"{"workers": 4, "iterations": 10, "startup_timeout": "1h 30m",
                "iteration_timeout": 90, "failure_grace": "250ms", "sync_timeout": 2.5,
                "shutdown_timeout": {"secs": 3, "nanos": 5}, "placement": "pool"}"#,
        )
        .unwrap();
        let expected = JobConfig {
            workers: 4,
            iterations: 10,
            startup_timeout: Duration::from_secs(5400),
            iteration_timeout: Duration::from_secs(90),
            failure_grace: Duration::from_millis(250),
            sync_timeout: Duration::from_millis(2500),
            shutdown_timeout: Duration::new(3, 5),
            placement: Placement::Pool,
            ..JobConfig::default()
        };
        assert_eq!(config, expected);
        let empty: JobConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, JobConfig::default());
    }

    #[test]
    fn a_document_round_trips_with_durations_as_text() {
        let config = JobConfig {
            iteration_timeout: Duration::MAX,
            inline_threshold: Duration::from_micros(50),
            ..JobConfig::default()
        };
        let text = serde_json::to_string(&config).unwrap();
        assert!(text.contains(r#""inline_threshold":"50us""#), "{text}");
        assert_eq!(serde_json::from_str::<JobConfig>(&text).unwrap(), config);
    }

    #[test]
    fn a_wrong_setting_in_a_document_is_named() {
        let err = serde_json::from_str::<JobConfig>(r#"{"wokers": 4}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `wokers`"), "{err}");
        let err =
            serde_json::from_str::<JobConfig>(r#"{"iteration_timeout": "soon"}"#).unwrap_err();
        assert!(
            err.to_string().contains(r#""soon" must be a duration"#),
            "{err}"
        );
        let err = serde_json::from_str::<JobConfig>(r#"{"iteration_timeout": -1}"#).unwrap_err();
        assert!(err.to_string().contains("below 0"), "{err}");
    }

    #[test]
    fn the_default_configuration_is_valid() {
        JobConfig::default().validate().unwrap();
    }

    #[test]
    fn an_invalid_setting_is_named_with_its_value() {
        let config = JobConfig {
            workers: 0,
            ..JobConfig::default()
        };
        let err = config.validate().unwrap_err();
        assert_eq!(err.setting, "workers");
        assert_eq!(
            err.to_string(),
            "invalid setting `workers` = 0: must be at least 1"
        );
        let config = JobConfig {
            iteration_timeout: Duration::ZERO,
            ..JobConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().setting, "iteration_timeout");
        let config = JobConfig {
            job_id: "a\0b".into(),
            ..JobConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().setting, "job_id");
    }

    #[test]
    fn the_min_workers_ratio_is_a_fraction_and_its_quorum_rounds_up() {
        for ratio in [0.0, -0.5, 1.5, f64::NAN] {
            let config = JobConfig {
                min_workers_ratio: ratio,
                ..JobConfig::default()
            };
            assert_eq!(config.validate().unwrap_err().setting, "min_workers_ratio");
        }
        let config = JobConfig {
            min_workers_ratio: 0.9,
            barrier_mode: true,
            ..JobConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().setting, "min_workers_ratio");
        let quorum = |workers, ratio| {
            JobConfig {
                workers,
                min_workers_ratio: ratio,
                ..JobConfig::default()
            }
            .quorum()
        };
        assert_eq!(quorum(10, 0.95), 10);
        assert_eq!(quorum(10, 0.9), 9);
        assert_eq!(quorum(4, 0.6), 3);
        assert_eq!(quorum(10, 0.7), 7, "not 8 from a rounding error");
        assert_eq!(quorum(3, 0.01), 1);
        assert_eq!(quorum(3, 1.0), 3);
    }
}
