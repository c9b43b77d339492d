//! # superstep
//!
//! Iterative master/workers jobs as actors. Every worker computes on its own shard, a
//! barrier waits for all of them, the master folds their results — in rank order — into
//! one master result, and that result is broadcast to start the next iteration, until the
//! master halts or the iteration count is reached.
//!
//! ## A whole job
//!
//! Each worker sums its shard plus the last total; the master sums the workers' results.
//!
//! ```
//! use superstep::prelude::*;
//!
//! struct SumWorker {
//!     shard: Vec<u64>,
//! }
//!
//! impl WorkerComputable for SumWorker {
//!     type MasterResult = u64;
//!     type WorkerResult = u64;
//!
//!     fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
//!         Ok(self.shard.iter().sum())
//!     }
//! }
//!
//! struct SumMaster;
//!
//! impl MasterComputable for SumMaster {
//!     type MasterResult = u64;
//!     type WorkerResult = u64;
//!
//!     fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
//!         let total = ctx.last_master_result().copied().unwrap_or(0)
//!             + ctx.worker_results().iter().sum::<u64>();
//!         Ok(Step::Continue(total))
//!     }
//! }
//!
//! # fn main() -> Result<(), superstep::JobError> {
//! let outcome = Job::builder(SumMaster, |rank| SumWorker {
//!     shard: (0..10).map(|i| (rank * 10 + i) as u64).collect(),
//! })
//! .workers(4)
//! .iterations(3)
//! .run()?;
//!
//! assert_eq!(*outcome.result, 3 * (0..40).sum::<u64>());
//! assert_eq!(outcome.iterations, 3);
//! assert_eq!(outcome.report.iterations.len(), 3);
//! # Ok(())
//! # }
//! ```
//!
//! ## Halting, failures and timeouts
//!
//! The master ends the job early by returning [`Step::Halt`]. An `Err` or a panic in any
//! compute or interceptor fails the whole job at once with a [`JobError`] that names the
//! worker rank (or the master), the iteration, the phase and the cause; every other actor
//! is told and stops, and `post_application` still runs everywhere. Every wait has a
//! timeout ([`JobConfig`]) whose error names whom it waited for.
//!
//! ```
//! use superstep::prelude::*;
//!
//! struct Flaky;
//! impl WorkerComputable for Flaky {
//!     type MasterResult = ();
//!     type WorkerResult = ();
//!     fn compute(&mut self, ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
//!         if ctx.rank() == 2 && ctx.iteration() == 3 {
//!             return Err("disk full".into());
//!         }
//!         Ok(())
//!     }
//! }
//! struct Idle;
//! impl MasterComputable for Idle {
//!     type MasterResult = ();
//!     type WorkerResult = ();
//!     fn compute(&mut self, _: &mut MasterContext<(), ()>) -> Result<Step<()>, BoxError> {
//!         Ok(Step::Continue(()))
//!     }
//! }
//!
//! let err = Job::builder(Idle, |_| Flaky).workers(4).iterations(10).run().unwrap_err();
//! assert_eq!(err.to_string(), "worker 2 failed in compute at iteration 3: disk full");
//! assert_eq!((err.rank(), err.iteration()), (Some(2), Some(3)));
//! ```
//!
//! ## Syncing inside an iteration
//!
//! In barrier mode a worker can call [`WorkerContext::barrier`] and
//! [`WorkerContext::all_gather`] inside its compute, with the rules of Spark's barrier
//! execution mode: the n-th call of every rank meets the n-th call of every other; mixed
//! calls, a rank that never arrives (within `sync_timeout` of the first) and a rank that
//! returns without the call fail every rank of that epoch with an error naming them.
//!
//! ```
//! use superstep::prelude::*;
//!
//! struct Agree;
//! impl WorkerComputable for Agree {
//!     type MasterResult = u64;
//!     type WorkerResult = u64;
//!     fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
//!         // Every rank proposes a value; all see every proposal, in rank order.
//!         let proposals: Vec<u64> = ctx.all_gather(&(ctx.rank() as u64 * 10))?;
//!         ctx.barrier()?;
//!         Ok(*proposals.iter().max().unwrap())
//!     }
//! }
//! struct Max;
//! impl MasterComputable for Max {
//!     type MasterResult = u64;
//!     type WorkerResult = u64;
//!     fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
//!         Ok(Step::Halt(*ctx.worker_results().iter().max().unwrap()))
//!     }
//! }
//!
//! let outcome = Job::builder(Max, |_| Agree).workers(4).barrier_mode(true).run().unwrap();
//! assert_eq!(*outcome.result, 30);
//! ```
//!
//! ## The first master result, settings, and a cluster in one line
//!
//! [`MasterComputable::init`] makes the first master result (an initial model), computed
//! once in the master and broadcast with iteration 1. [`JobConfig`] reads a partial
//! settings document of any serde format (durations written `"30s"`), and
//! [`JobBuilder::settings_from_env`] lets `SUPERSTEP_*` variables override the common
//! settings. With the `tcp` feature (a default), `JobBuilder::cluster_from_env` runs the
//! job as one process of a cluster job when the environment says it is one
//! (`superstep-launch`, torchrun, Slurm, MPI, Kubernetes), and in memory otherwise.
//!
//! ```
//! use superstep::prelude::*;
//!
//! struct Step1;
//! impl WorkerComputable for Step1 {
//!     type MasterResult = Floats;
//!     type WorkerResult = f64;
//!     fn compute(&mut self, ctx: &mut WorkerContext<Floats, f64>) -> Result<f64, BoxError> {
//!         let model = ctx.last_master_result().ok_or("init made the first model")?;
//!         Ok(model.iter().sum::<f64>() + ctx.rank() as f64)
//!     }
//! }
//! struct Scale;
//! impl MasterComputable for Scale {
//!     type MasterResult = Floats;
//!     type WorkerResult = f64;
//!     fn init(&mut self, _: &mut MasterContext<Floats, f64>) -> Result<Option<Floats>, BoxError> {
//!         Ok(Some(Floats::from(vec![0.5; 4])))
//!     }
//!     fn compute(&mut self, ctx: &mut MasterContext<Floats, f64>) -> Result<Step<Floats>, BoxError> {
//!         let total: f64 = ctx.worker_results().iter().sum();
//!         Ok(Step::Halt(Floats::from(vec![total])))
//!     }
//! }
//!
//! let config: superstep::JobConfig = serde_json::from_str(r#"{"workers": 3, "iteration_timeout": "90s"}"#)?;
//! let outcome = Job::builder(Scale, |_| Step1).config(config).settings_from_env()?.run()?;
//! assert_eq!(outcome.result[0], 3.0 * 2.0 + 0.0 + 1.0 + 2.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Cargo features
//!
//! An in-memory job needs none. `tcp` (default): `transport::TcpTransport`, the
//! cluster environment and `JobBuilder::cluster_from_env`. `sim`: the deterministic
//! simulator. `proptest`: its strategies. `pipeline`: CSV / JSONL rows, merged and
//! atomically committed output. `launcher`: the `superstep-launch` binary. `metrics`:
//! the job's numbers through the `metrics` facade (`superstep::metrics`). `object-store`:
//! checkpoints in S3, GCS, Azure Blob Storage or a local directory
//! (`checkpoint::ObjectCheckpointStore`).
//!
//! ## Watching a job
//!
//! [`JobBuilder::on_event`] receives [`JobEvent`]s (iterations started and completed with
//! their durations, workers done, halted, failed) for progress bars and logs.
//! [`IterationTimer`] is an interceptor that records compute times per iteration and
//! side. The work is also `tracing` spans that nest across threads: `job` holds each
//! `iteration` (INFO), and each worker's `compute` (fields `rank`, `iteration`,
//! `attempt`) is a child of its iteration's span in the master's process (in a worker's
//! own process, of that process's `job`), as is the master's `master_compute`;
//! `init`, `post_application` and `sync` waits have theirs (DEBUG). Filter with
//! `RUST_LOG=superstep=info` for the job's shape, `superstep=debug` for every rank's
//! work; `examples/trace.rs` records a run as a Chrome / Perfetto trace. A timeout names
//! what the master's node last heard from each rank it waited on ([`LastHeard`]), and each
//! rank keeps a [`flight`] recorder of its last calls, dumped to a file on request
//! ([`FlightRecorder`], or the job's dump signal, `SIGUSR2` by default).
//!
//! ## Errors from user code
//!
//! Computables and interceptors return [`BoxError`]: that is the edge where foreign error
//! types enter, so it is the one place errors are boxed. The boxed error is kept as the
//! source of the [`Cause`] in a [`JobError`].
//!
//! ## Layers
//!
//! `job` (this API) → `runtime` (actix actors) → [`transport`] (in memory by default;
//! with the `tcp` feature, `transport::TcpTransport` runs the same job across processes
//! and hosts, its roles read from the environment) → `protocol` (sans-IO state machines,
//! the floor every layer above stands on) — with [`events`] on the side, and
//! [`coordinator`] (sharding, merged or atomically committed output, row counts) around a
//! job's life. The protocol's parts and messages are not part of the everyday surface:
//! [`dev`] has them, for tests, tools and transports of your own. See `ARCHITECTURE.md` for
//! the message flow and the semantics users can rely on.

#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]
#![forbid(unsafe_code)]

pub mod checkpoint;
mod codec;
pub mod collective;
mod compute;
mod config;
pub mod coordinator;
mod error;
pub mod events;
pub mod flight;
pub mod graph;
mod group;
mod ids;
pub mod interceptor;
mod job;
mod log;
mod messages;
#[cfg(feature = "metrics")]
pub mod metrics;
mod params;
mod payload;
mod protocol;
mod runtime;
#[cfg(feature = "sim")]
pub mod sim;
mod sync_link;
pub mod transport;

pub use compute::{
    Cancelled, MasterComputable, MasterContext, Step, WorkerComputable, WorkerContext,
};
pub use error::{
    BoxError, Cause, CauseKind, ConfigError, ErrorSource, Heard, Hook, JobError, LastHeard,
    MessageError, Phase, SyncError, Waiting, EXIT_PREEMPTED,
};
pub use events::JobEvent;
pub use ids::{Aggregation, Attempt, CallAt, Epoch, GroupId, Iteration, Rank, SyncKind};
pub use interceptor::{
    Ending, IterationTime, IterationTimer, MasterInterceptor, Side, WorkerInterceptor,
};
pub use job::{Job, JobBuilder};
pub use params::JobParams;
pub use payload::{Element, Floats, Payload};
pub use protocol::{
    Drops, DurationTotals, FailurePolicy, HaltedBy, IterationReport, IterationTotals, JobConfig,
    JobOutcome, JobReport, MailCount, Placement, PreemptSignal, Recover, Recovered, ResumedFrom,
};
pub use runtime::{Cancel, DumpError, FlightRecorder, Preempt};

/// The README's examples compile and pass as doctests.
#[cfg(all(doctest, feature = "tcp", feature = "sim", feature = "pipeline"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// For tests, tools and transports of your own: the protocol's messages and the sans-IO
/// state machines the master's node is made of, each driven by hand.
///
/// Nothing here is needed to write, run or simulate a job. The messages are what a
/// [`Transport`](transport::Transport) carries; the parts — [`Gate`](dev::Gate) (registration,
/// rounds, the drain, every wait's deadline), [`Round`](dev::Round), [`Schedule`](dev::Schedule),
/// [`SyncState`](dev::SyncState) (`barrier()` / `all_gather()` epochs),
/// [`Recovery`](dev::Recovery) (the failure policies), [`WorkerState`](dev::WorkerState) —
/// take time as an argument and do no I/O, so a test can drive them through any order of
/// arrivals:
///
/// ```
/// use std::time::{Duration, Instant};
/// use superstep::dev::{Envelope, Gate, GateConfig, GateOutput, Report, Share, ToMaster};
///
/// let now = Instant::now();
/// let timeouts = [Duration::from_secs(60); 3];
/// let mut gate: Gate<u64> = Gate::new(GateConfig::new(2, 0, timeouts), now);
/// for rank in [1, 0] {
///     let msg = ToMaster::Registered { attempt: 0 };
///     let _ = gate.on_message(now, Envelope { from: rank, msg });
/// }
/// assert!(gate.open(now, 1));
/// for (rank, result) in [(1, 20), (0, 10)] {
///     let result = Share::Own(result);
///     let report = Report { attempt: 0, iteration: 1, result, halt_vote: false, mail: Default::default(), elapsed: Duration::ZERO, saved: None, calls: 0, group_calls: None };
///     if let Some(GateOutput::RoundComplete { gathered, .. }) =
///         gate.on_message(now, Envelope { from: rank, msg: ToMaster::Result(report) })
///     {
///         assert_eq!(gathered.results, [10, 20], "in rank order, whatever the arrival order");
///     }
/// }
/// ```
pub mod dev {
    pub use crate::protocol::{
        Accepted, Buffer, Combiner, Envelope, Exchange, Gate, GateConfig, GateOutput, Gathered,
        GroupCalls, Next, Offer, PeerBody, PeerMessage, Piece, Recovery, Replica, Report, Round,
        Schedule, Share, Spare, SyncResult, SyncState, SyncStep, Tally, ToMaster, ToWorker, Wait,
        WorkerCommand, WorkerState,
    };
    /// The frames of a TCP byte stream, each decoded as far as the wire format goes (for
    /// captures and tests): `Ok` with the message's kind, or why it could not be read.
    #[cfg(feature = "tcp")]
    pub use crate::transport::tcp::wire::decode_stream;
}

/// The names most jobs use.
pub mod prelude {
    pub use crate::{
        Aggregation, BoxError, Ending, FailurePolicy, Floats, Job, JobBuilder, JobError, JobEvent,
        JobOutcome, MasterComputable, MasterContext, MasterInterceptor, MessageError, Phase,
        Placement, Step, SyncError, WorkerComputable, WorkerContext, WorkerInterceptor,
    };
}
