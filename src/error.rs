//! Errors a job can end with, shared by every layer.
//!
//! [`JobError`] is what [`Job::run`](crate::Job::run) returns. Every variant carries the
//! identifiers a person needs to find the fault: the worker rank (or the master), the
//! iteration, the phase of the application, and the cause; a timeout names whom it was
//! waiting for. It is `Clone` and serializable so that the first failure can be sent to
//! every other actor, in-process or over a network.
//!
//! User code returns [`BoxError`]: computables and interceptors are the edge where foreign
//! error types enter, so they are boxed there and nowhere else. The boxed error is kept as
//! the [`source`](std::error::Error::source) of the [`Cause`] for in-process jobs.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{
    CallAt, CollectiveCall, CollectiveKind, Epoch, GroupId, Iteration, Rank, SyncKind,
};

mod heard;
use heard::heard_note;
pub use heard::{Heard, LastHeard};

/// The error type user code returns from computables and interceptors.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Writes an error as a person reads it: its sentence (`Display`), then each cause
/// underneath whose text the sentence above it does not already hold, as `anyhow` does.
/// The `Debug` of every error type of the crate is this, so that
/// `fn main() -> Result<(), Box<dyn Error>>` prints a sentence, not a struct.
pub(crate) fn write_sentence(
    error: &(dyn std::error::Error + 'static),
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let mut above = error.to_string();
    f.write_str(&above)?;
    let mut source = error.source();
    let mut first = true;
    while let Some(cause) = source {
        let text = cause.to_string();
        if !above.contains(&text) {
            if first {
                f.write_str("\n\nCaused by:")?;
                first = false;
            }
            write!(f, "\n    {text}")?;
        }
        above = text;
        source = cause.source();
    }
    Ok(())
}

/// `Debug` as [`write_sentence`]: the sentence and its causes.
macro_rules! debug_as_sentence {
    ($($ty:ty),+ $(,)?) => {$(
        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                $crate::error::write_sentence(self, f)
            }
        }
    )+};
}
pub(crate) use debug_as_sentence;

debug_as_sentence!(ConfigError, JobError, SyncError);

/// The part of the application lifecycle in which user code ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// Making the worker: the worker factory given to `Job::builder` (and the worker
    /// interceptors' factories), before its `pre_application` and `init`.
    Create,
    /// An interceptor's `pre_application`.
    PreApplication,
    /// A worker's [`init`](crate::WorkerComputable::init), which loads its shard, or the
    /// master's [`init`](crate::MasterComputable::init), which makes the first master
    /// result.
    Init,
    /// An interceptor's `pre_iteration`.
    PreIteration,
    /// The computable's `compute`.
    Compute,
    /// An interceptor's `post_iteration`.
    PostIteration,
    /// An interceptor's `post_application`.
    PostApplication,
    /// The job's combiner (see `JobBuilder::combine`): the master's, folding a worker's
    /// result as it arrives, or a worker's, folding results among the workers
    /// (`Aggregation::Tree` and `Ring`).
    Combine,
    /// The master computable's `save_state` or `restore_state`, writing or resuming from
    /// a checkpoint.
    Checkpoint,
    /// A result's `Drop`: the master's result type is the master's, a worker's result
    /// that worker's, wherever the value was last held when it was dropped (a fold of
    /// combined results, or a context let go of whole, is the master's).
    Drop,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Create => "create (the worker factory)",
            Phase::PreApplication => "pre_application",
            Phase::Init => "init",
            Phase::PreIteration => "pre_iteration",
            Phase::Compute => "compute",
            Phase::PostIteration => "post_iteration",
            Phase::PostApplication => "post_application",
            Phase::Combine => "combine",
            Phase::Checkpoint => "checkpoint",
            Phase::Drop => "drop (a result's Drop)",
        })
    }
}

/// Whether user code returned an error or panicked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CauseKind {
    /// The code returned `Err`.
    Error,
    /// The code panicked; the panic was caught and did not unwind into the runtime.
    Panic,
}

/// Why user code failed: its error message or panic message.
///
/// In-process, the original error is kept and returned by
/// [`source`](std::error::Error::source); over a network only the kind, the message,
/// whether it is a mistake in the program ([`Cause::is_mistake`]) and the rule its sync
/// call broke ([`Cause::broken_rule`]) travel.
#[derive(Clone, Serialize, Deserialize)]
pub struct Cause {
    kind: CauseKind,
    message: String,
    /// A mistake in the program ([`Cause::is_mistake`]).
    #[serde(default)]
    mistake: bool,
    /// The sync call's or collective's failure that made it a mistake, when the runtime
    /// saw it ([`Cause::broken_rule`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    broke: Option<Box<SyncError>>,
    #[serde(skip)]
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Cause {
    /// A cause from an error returned by user code.
    pub fn from_error(error: BoxError) -> Self {
        let mistake = is_mistake(&*error);
        Cause {
            kind: CauseKind::Error,
            message: error.to_string(),
            mistake,
            broke: None,
            source: Some(Arc::from(error)),
        }
    }

    /// A cause from a caught panic's payload.
    pub fn from_panic(payload: Box<dyn Any + Send>) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic with a non-string payload".to_string()
        };
        Cause {
            kind: CauseKind::Panic,
            message,
            mistake: false,
            broke: None,
            source: None,
        }
    }

    /// A cause with only a message, as it arrives from a remote peer.
    pub fn message_only(kind: CauseKind, message: impl Into<String>) -> Self {
        Cause {
            kind,
            message: message.into(),
            mistake: false,
            broke: None,
            source: None,
        }
    }

    /// Whether the code returned an error or panicked.
    pub fn kind(&self) -> CauseKind {
        self.kind
    }

    /// The error's or the panic's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether this cause is a caught panic.
    pub fn is_panic(&self) -> bool {
        self.kind == CauseKind::Panic
    }

    /// Whether the code broke a rule every attempt would break again — its ranks made
    /// different sync calls or collectives, it called one where it cannot, it sent a
    /// message to a rank the job does not have or of another type than the job's
    /// ([`SyncError::is_mistake`], [`MessageError`]) — so that no failure policy runs it
    /// again: the job fails at once. Found in the error's chain of sources, and set for any
    /// failure of a compute after one of its sync calls or collectives failed so, however
    /// the code wrapped the error; it crosses a network with the message.
    pub fn is_mistake(&self) -> bool {
        self.mistake
    }

    /// The failure of the sync call or collective whose broken rule made this cause a
    /// mistake ([`is_mistake`](Self::is_mistake)), when the code failed after one: a
    /// [`SyncError::CollectiveMismatch`] naming both calls, say. It crosses a network
    /// with the message, so every rank still waiting in a call when the job fails of it
    /// gets this error, as the rank that met it did.
    pub fn broken_rule(&self) -> Option<&SyncError> {
        self.broke.as_deref()
    }
}

impl Cause {
    /// This cause, as a mistake in the program: the code failed after a sync call or
    /// collective broke the job's rules, failing with `broken`.
    pub(crate) fn mistaken(mut self, broken: SyncError) -> Self {
        self.mistake = true;
        self.broke = Some(Box::new(broken));
        self
    }
}

/// Whether `error`, or an error in its chain of sources, is a mistake in the program
/// ([`Cause::is_mistake`]).
fn is_mistake(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(error);
    while let Some(e) = at {
        if e.downcast_ref::<SyncError>()
            .is_some_and(SyncError::is_mistake)
            || e.downcast_ref::<MessageError>().is_some()
            || e.downcast_ref::<GraphError>().is_some()
        {
            return true;
        }
        at = e.source();
    }
    false
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            CauseKind::Error => f.write_str(&self.message),
            CauseKind::Panic => write!(f, "panicked: {}", self.message),
        }
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cause")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .finish()
    }
}

/// Two causes are equal when their kind and message are: the original error is not
/// compared (it may not be comparable, and does not cross a network).
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for Cause {}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// What a timed-out wait was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Waiting {
    /// Start-up across processes: every worker's process connects to the master's node
    /// (within the TCP transport's `connect_timeout`).
    Connection,
    /// Start-up: every worker runs `pre_application` and `init`, then registers.
    Registration,
    /// The results of this iteration (from the workers) or its master compute.
    Iteration(Iteration),
    /// The end of the job: every side runs `post_application` and reports done.
    Shutdown,
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::Connection => {
                f.write_str("start-up (every worker's process connecting to the master's)")
            }
            Waiting::Registration => f.write_str("registration"),
            Waiting::Iteration(i) => write!(f, "iteration {i}"),
            Waiting::Shutdown => f.write_str("shutdown"),
        }
    }
}

/// An invalid job setting: which one, what it was, and what it must be.
#[derive(Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("invalid setting `{setting}` = {value}: {requirement}")]
pub struct ConfigError {
    /// The setting's name, as the builder method that sets it.
    pub setting: String,
    /// The value it was given.
    pub value: String,
    /// What it must be.
    pub requirement: String,
}

impl ConfigError {
    pub(crate) fn new(setting: &str, value: impl fmt::Debug, requirement: &str) -> Self {
        ConfigError {
            setting: setting.to_string(),
            value: format!("{value:?}"),
            requirement: requirement.to_string(),
        }
    }
}

/// Why a job failed.
///
/// The first failure of a job is the one returned; it is also sent to every other actor,
/// which stops. Iteration `0` means before the first iteration (start-up: `pre_application`
/// and `init`).
#[derive(Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum JobError {
    /// A worker's computable or interceptor returned an error or panicked.
    ///
    /// Remedy: fix the worker code; the cause says what it returned or why it panicked.
    #[error("worker {rank} failed in {phase} at iteration {iteration}: {cause}")]
    Worker {
        /// The worker's rank.
        rank: Rank,
        /// The iteration it was in (0 = start-up).
        iteration: Iteration,
        /// The part of the lifecycle that failed.
        phase: Phase,
        /// The error or panic.
        #[source]
        cause: Cause,
    },
    /// The master's computable or interceptor returned an error or panicked.
    ///
    /// Remedy: fix the master code; the cause says what it returned or why it panicked.
    #[error("master failed in {phase} at iteration {iteration}: {cause}")]
    Master {
        /// The iteration it was in (0 = start-up).
        iteration: Iteration,
        /// The part of the lifecycle that failed.
        phase: Phase,
        /// The error or panic.
        #[source]
        cause: Cause,
    },
    /// Some workers did not report within the timeout of that wait.
    ///
    /// Remedy: raise the timeout for that wait (`startup_timeout`, `iteration_timeout` or
    /// `shutdown_timeout`; over TCP, `connect_timeout` for connecting) if the work is
    /// legitimately slow; otherwise find out why the named ranks stall — over TCP, the
    /// peers the master refused meanwhile, and why, are listed.
    #[error(
        "timed out after {waited:?} in {during} waiting for worker(s) {missing:?}{}{}",
        refused_note(refused),
        heard_note(heard)
    )]
    WorkersTimedOut {
        /// What was being waited for.
        during: Waiting,
        /// The ranks that had not reported when the timeout passed.
        missing: Vec<Rank>,
        /// How long the wait lasted.
        waited: Duration,
        /// Over TCP: the connections refused meanwhile that claimed a missing rank, and why
        /// (`rank 2 from 10.0.0.5:41722: wrong secret (3 times)`).
        #[serde(default)]
        refused: Vec<String>,
        /// What the master's node last heard from each missing rank (the first 16), and
        /// when.
        #[serde(default)]
        heard: Vec<LastHeard>,
    },
    /// The master did not finish its part within the timeout of that wait.
    ///
    /// Remedy: raise `iteration_timeout` if the master's compute is legitimately slow.
    #[error("timed out after {waited:?} in {during} waiting for the master")]
    MasterTimedOut {
        /// What was being waited for.
        during: Waiting,
        /// How long the wait lasted.
        waited: Duration,
    },
    /// A `barrier()` or `all_gather()` epoch failed: ranks made different calls, did not
    /// arrive within `sync_timeout`, or returned from compute without the call others made.
    ///
    /// Remedy: every rank must make the same sync calls in the same order each iteration;
    /// the error names the ranks and the epoch.
    #[error("{0}")]
    Sync(#[source] SyncError),
    /// A worker's connection was lost: it stopped sending (not even heartbeats) for longer
    /// than the failure detector allows, its connection closed, or it sent a frame that
    /// could not be read.
    ///
    /// Remedy: find out why the named rank's process died or stalled.
    #[error("worker {rank} was lost: {reason}")]
    WorkerLost {
        /// The rank.
        rank: Rank,
        /// What was observed.
        reason: String,
    },
    /// A worker's process sent the master a frame over the frame limit, which cannot be
    /// read (nor anything after it on that connection): the job fails, since another
    /// process of the rank would send the same.
    ///
    /// Remedy: raise the limit on every process (`TcpSettings::max_frame`,
    /// `SUPERSTEP_MAX_FRAME`), or send less in one result.
    #[error("worker {rank}'s process ({peer}) sent a frame of {bytes} bytes, over the limit of {limit} bytes (max_frame)")]
    FrameTooLarge {
        /// The rank.
        rank: Rank,
        /// The process's address.
        peer: String,
        /// The size the frame's length prefix claimed.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The master could not be reached or was lost, as this worker's process saw it.
    #[error("the master was lost: {reason}")]
    MasterLost {
        /// What was observed.
        reason: String,
    },
    /// A job setting is invalid; the job did not start.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The job's checkpoints could not be read, or belong to another job; the job did not
    /// start. (A checkpoint that cannot be written does not fail the job: it is logged and
    /// the previous one stays.)
    ///
    /// Remedy: check the checkpoint directory, or point the job at its own.
    #[error("checkpoint: {message}")]
    Checkpoint {
        /// What went wrong, naming the file or the job.
        message: String,
        /// The error underneath (the store's, a decoder's), in the process where it
        /// happened: `source()`.
        #[source]
        #[serde(skip)]
        source: Option<ErrorSource>,
    },
    /// A job coordinator's hook returned an error or panicked (see
    /// [`Coordinator`](crate::coordinator::Coordinator)). After a failed `on_start` or
    /// `on_finish`, `on_error` ran.
    ///
    /// Remedy: the cause names what the hook could not do (a directory, a file).
    #[error("coordinator failed in {hook}: {cause}")]
    Coordinator {
        /// The hook.
        hook: Hook,
        /// The error or panic.
        #[source]
        cause: Cause,
    },
    /// The job was cancelled ([`Cancel::cancel`](crate::Cancel::cancel)).
    #[error("the job was cancelled")]
    Cancelled,
    /// The job stopped for a preemption: a process of the job got its preempt signal
    /// ([`JobConfig::preempt_signal`](crate::JobConfig::preempt_signal)), or
    /// [`Preempt::request`](crate::Preempt::request) was called. Every process of the job
    /// ends with this error; its [`exit_code`](JobError::exit_code) is
    /// [`EXIT_PREEMPTED`](crate::EXIT_PREEMPTED) (75), which `superstep-launch` passes on
    /// and never restarts.
    ///
    /// Remedy: none needed — run the job again (requeue it) and it resumes from
    /// `checkpoint`. Without a checkpoint store, it starts over.
    #[error(
        "the job was preempted ({by}) after iteration {iteration}: {}",
        match checkpoint {
            Some(c) => format!("run again, it resumes from the checkpoint of iteration {c}"),
            None => "it has no checkpoint to resume from, and starts over when run again".into(),
        }
    )]
    Preempted {
        /// The last iteration the job completed.
        iteration: Iteration,
        /// The newest checkpoint saved, which a run again resumes from (`None`: none).
        checkpoint: Option<Iteration>,
        /// Who asked: the signal and the rank of the process that got it, or the handle.
        by: String,
    },
    /// A worker's process runs the job differently from the master's: another world size,
    /// other settings that every process must share, another input, other result types,
    /// or another version. It was refused at its handshake, and the job fails — or, under
    /// a failure policy that replaces workers, waits for another process of the rank.
    ///
    /// Remedy: start every process from the same build with the same settings; the error
    /// names the first field that differs and both values.
    #[error("worker {rank}'s process runs another job than the master's: `{field}` is {worker} there and {master} in the master's")]
    Mismatch {
        /// The rank the worker's process claimed.
        rank: Rank,
        /// The setting or property that differs.
        field: String,
        /// Its value in the master's process.
        master: String,
        /// Its value in the worker's process.
        worker: String,
    },
    /// A message of the job's own types could not be decoded where it arrived: the type's
    /// serde form does not survive the encoding (a `Deserialize` that does not read what
    /// its `Serialize` wrote, say), or the two processes run different builds of it.
    ///
    /// Remedy: make the named type round-trip through serde. The in-memory transport
    /// checks every message this way in debug builds (see
    /// [`MemoryTransport::wire_check`](crate::transport::MemoryTransport::wire_check)), so
    /// such a type fails the job's own unit tests; over TCP, run one build everywhere.
    #[error(
        "a message {direction} does not survive the wire as `{type_name}` (from {peer}): {message}"
    )]
    Decode {
        /// Which way the message went: `worker 2 → master`, `master → worker 2`.
        direction: String,
        /// The type it was to be decoded as.
        type_name: String,
        /// Where it came from: the peer's address, or `this process` for the in-memory
        /// transport's wire check.
        peer: String,
        /// What the decoder said.
        message: String,
    },
    /// A message could not be delivered, or a link could not be made.
    #[error("transport failed: {message}")]
    Transport {
        /// What went wrong, naming the peer.
        message: String,
        /// The error underneath (the transport's, the operating system's), in the process
        /// where it happened: `source()`.
        #[source]
        #[serde(skip)]
        source: Option<ErrorSource>,
    },
    /// The runtime itself stopped without an outcome (a bug in superstep, not user code).
    #[error("the job's runtime stopped without an outcome: {message}")]
    Runtime {
        /// What was observed.
        message: String,
    },
}

/// Why a sync call failed. Every rank waiting in the epoch gets the same error from the
/// master's node; a rank whose collective met a piece of another call, or lost a peer, says
/// so itself.
#[derive(Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum SyncError {
    /// Ranks made different calls as the same call of an iteration. Every rank must call
    /// the same method in the same order.
    #[error("different calls at {at}: {}; every rank must make the same sync calls and collectives in the same order", Calls(.calls))]
    Mismatch {
        /// Where the call stands.
        at: CallAt,
        /// Who called what, in rank order.
        calls: Vec<(Rank, SyncKind)>,
    },
    /// Not every rank made the call of this epoch within the sync timeout, counted from the
    /// epoch's first arrival. (A rank that returned from compute without the call is not
    /// waited for: that is [`SyncError::Unmatched`], at once.)
    #[error("{kind} ({at}) timed out after {waited:?} from its first arrival: rank(s) {missing:?} did not make it{}", heard_note(heard))]
    TimedOut {
        /// Where the call stands.
        at: CallAt,
        /// The call the others made.
        kind: SyncKind,
        /// The ranks that did not arrive.
        missing: Vec<Rank>,
        /// How long the epoch waited.
        waited: Duration,
        /// What the master's node last heard from each missing rank (the first 16), and
        /// when.
        #[serde(default)]
        heard: Vec<LastHeard>,
    },
    /// Ranks returned from their compute without making the call that others made in this
    /// epoch: the others would wait for them forever, so the epoch fails at once.
    #[error("rank(s) {returned:?} returned from compute without making {kind} ({at}) that rank(s) {waiting:?} made")]
    Unmatched {
        /// Where the call stands.
        at: CallAt,
        /// The call the others made.
        kind: SyncKind,
        /// The ranks that returned without the call.
        returned: Vec<Rank>,
        /// The ranks that made it.
        waiting: Vec<Rank>,
    },
    /// The call's epoch is not the barrier's: the rank is out of step.
    #[error("rank {rank} is out of step: it made its call {epoch} of the attempt among {group} (counted from 0; among every rank, `WorkerContext::sync_epoch`) while the others are at {current}")]
    StaleEpoch {
        /// The rank.
        rank: Rank,
        /// The ranks the call was among.
        group: GroupId,
        /// The epoch it called in.
        epoch: Epoch,
        /// The barrier's epoch.
        current: Epoch,
    },
    /// The job failed (this is its first failure): every waiting rank is released.
    #[error("the job failed: {0}")]
    JobFailed(#[source] Box<JobError>),
    /// A sync call or a collective (the one named) was made outside `compute` (in
    /// `init`): they meet per iteration, so only compute may make them.
    #[error("{0} was called in init: sync calls and collectives meet per iteration, so only compute can make them")]
    OutsideCompute(SyncKind),
    /// A sync call or a collective (the one named) was made in a job without barrier
    /// mode. Remedy: build the job with `barrier_mode(true)`, which gives every worker a
    /// thread of its own so that ranks can wait for each other.
    #[error("{0} needs a job built with barrier_mode(true), which gives every worker a thread of its own so that ranks can wait for each other")]
    NotEnabled(SyncKind),
    /// A value of a sync call or a collective could not be encoded or decoded: the text
    /// names the call, the value's type and the rank it came from.
    #[error("{0}")]
    Codec(String),
    /// No answer came from the barrier (it is gone, or much slower than its timeout).
    #[error("no answer from the barrier within {0:?}")]
    NoAnswer(Duration),
    /// Two ranks made different collective calls at the same point of their sequence of
    /// collectives — another collective, another root, or another length. Every rank must
    /// make the same collective calls, with values of the same length, in the same order.
    #[error("{}", CallsDiffer::new(*.rank, .call, *.peer, .peer_call))]
    CollectiveMismatch {
        /// A rank that made one of the calls.
        rank: Rank,
        /// Its call.
        call: Box<CollectiveCall>,
        /// A rank that made the other.
        peer: Rank,
        /// The peer's call.
        peer_call: Box<CollectiveCall>,
    },
    /// A collective's peers did not send what it waits for within the sync timeout,
    /// counted from the call.
    #[error("{call} timed out on rank {rank} after {waited:?}: rank(s) {waiting_on:?} sent nothing it waits for{}", heard_note(heard))]
    CollectiveTimedOut {
        /// The rank that waited.
        rank: Rank,
        /// Its call.
        call: Box<CollectiveCall>,
        /// The peers it waited for.
        waiting_on: Vec<Rank>,
        /// How long it waited.
        waited: Duration,
        /// What the master's node last heard from each rank waited on (the first 16), and
        /// when: filled in by the node, in the error of the job and of every waiting rank.
        #[serde(default)]
        heard: Vec<LastHeard>,
    },
    /// The connection to a peer was lost, so collectives cannot go on: the peer's process
    /// ended, or the network between them failed.
    #[error("rank {rank} lost its connection to rank {peer}: {reason}")]
    PeerLost {
        /// The rank that noticed.
        rank: Rank,
        /// The peer it lost.
        peer: Rank,
        /// What happened, with the peer's address where it has one.
        reason: String,
    },
    /// A piece of a collective — for the messages between supersteps, a piece holding
    /// one message larger than a frame (a batch of many travels in several) — is larger
    /// than the transport carries in one frame. Remedy: raise the limit
    /// (`TcpSettings::max_frame`, `SUPERSTEP_MAX_FRAME`) on every process, or send less
    /// in one call (in one message).
    #[error("rank {rank}'s piece of {call} for rank {peer} is {bytes} bytes, over the transport's frame limit of {limit} bytes (max_frame, SUPERSTEP_MAX_FRAME)")]
    TooLarge {
        /// The rank that would have sent it.
        rank: Rank,
        /// Its call.
        call: CollectiveCall,
        /// The rank it was for.
        peer: Rank,
        /// The piece's frame, in bytes.
        bytes: usize,
        /// The largest frame the transport carries.
        limit: usize,
    },
    /// The job's transport gives workers no way to each other, so collectives cannot run.
    #[error("collectives need workers that reach each other: {0}")]
    NoPeers(String),
    /// A collective named a rank the job does not have (`broadcast`'s `from`).
    #[error("there is no rank {rank}: the job has {workers} worker(s)")]
    NoSuchRank {
        /// The rank named.
        rank: Rank,
        /// The number of workers.
        workers: usize,
    },
    /// `broadcast` was called without a value on the rank it broadcasts from.
    #[error("rank {0} broadcasts, but was given no value to broadcast")]
    NothingToBroadcast(Rank),
    /// A peer sent a piece of a collective that does not fit the call: a step or a chunk
    /// the call does not have, one already received, or a part of another length. The
    /// peer runs other code, or its bytes were damaged.
    #[error("rank {rank} got a piece of {call} from rank {peer} that does not fit it: {reason}")]
    BadPiece {
        /// The rank that received it.
        rank: Rank,
        /// The call.
        call: CollectiveCall,
        /// The rank that sent it.
        peer: Rank,
        /// What does not fit.
        reason: String,
    },
    /// An `_async` sync call or collective was awaited outside a Tokio runtime: its waits
    /// are bounded by Tokio's timers.
    ///
    /// Remedy: await it on a Tokio runtime built with its timers (`enable_time` or
    /// `enable_all`), or make the blocking call.
    #[error("the _async sync calls and collectives wait on Tokio's timers: await them on a Tokio runtime with its timers enabled, or make the blocking call")]
    NoTimer,
    /// A compute returned with collectives it started
    /// ([`start_all_reduce`](crate::WorkerContext::start_all_reduce)) and did not finish
    /// (never given to `finish`, or its `finish_async` dropped half-way): its peers may
    /// still wait for its part.
    ///
    /// Remedy: [`finish`](crate::WorkerContext::finish) every call a compute starts.
    #[error("rank {rank} returned from compute with {} started and not finished: finish every call a compute starts (WorkerContext::finish)", Started(.calls))]
    Unfinished {
        /// The rank.
        rank: Rank,
        /// The calls, in the order they were started.
        calls: Vec<CollectiveCall>,
    },
    /// A call was to be finished on a rank that does not have it under way: started by
    /// another rank's context, or in another compute.
    #[error("rank {rank} has no call #{epoch} under way to finish: a call is finished in the compute, and on the rank, that started it")]
    NotStarted {
        /// The rank asked to finish it.
        rank: Rank,
        /// The call's number among the rank's sync calls.
        epoch: Epoch,
    },
    /// A group of ranks (`collective::Group`) that cannot be: no ranks, a rank twice, a
    /// rank the job does not have.
    #[error("not a group of ranks: {0}")]
    BadGroup(String),
    /// A rank made a call among a group it is not in, or named as a collective's root a
    /// rank the group does not have.
    #[error("rank {rank} is not in {group}, whose ranks are {ranks:?}: a group's calls are made by its ranks alone, and its root is one of them")]
    NotInGroup {
        /// The rank.
        rank: Rank,
        /// The group.
        group: GroupId,
        /// The group's ranks.
        ranks: Vec<Rank>,
    },
}

impl SyncError {
    /// Whether this is a mistake in the program rather than a fault: ranks that made
    /// different calls, a call made where it cannot be, a rank that is not there. Another
    /// attempt would make it again, so it fails the job at once under every policy.
    pub fn is_mistake(&self) -> bool {
        matches!(
            self,
            SyncError::Mismatch { .. }
                | SyncError::CollectiveMismatch { .. }
                | SyncError::Unmatched { .. }
                | SyncError::OutsideCompute(_)
                | SyncError::NotEnabled(_)
                | SyncError::NoSuchRank { .. }
                | SyncError::NothingToBroadcast(_)
                | SyncError::Unfinished { .. }
                | SyncError::NotStarted { .. }
                | SyncError::BadGroup(_)
                | SyncError::NotInGroup { .. }
        )
    }
}

/// Two ranks' collective calls, said by what differs: only the length, or the calls.
struct CallsDiffer<'a> {
    rank: Rank,
    call: &'a CollectiveCall,
    peer: Rank,
    peer_call: &'a CollectiveCall,
}

impl<'a> CallsDiffer<'a> {
    fn new(
        rank: Rank,
        call: &'a CollectiveCall,
        peer: Rank,
        peer_call: &'a CollectiveCall,
    ) -> Self {
        // In rank order, whichever rank noticed: every rank says it alike.
        if peer < rank {
            return CallsDiffer {
                rank: peer,
                call: peer_call,
                peer: rank,
                peer_call: call,
            };
        }
        CallsDiffer {
            rank,
            call,
            peer,
            peer_call,
        }
    }
}

impl fmt::Display for CallsDiffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (call, peer_call) = (self.call, self.peer_call);
        let same_but_len = CollectiveCall {
            len: peer_call.len,
            ..*call
        } == *peer_call;
        let same_but_chunk = CollectiveCall {
            chunk: peer_call.chunk,
            ..*call
        } == *peer_call;
        let split_otherwise = match (call.kind, peer_call.kind) {
            (
                CollectiveKind::AllReduceMany { op, .. },
                CollectiveKind::AllReduceMany { op: peer_op, .. },
            ) => {
                // The way is chosen by the values' size together: it differs with it.
                op == peer_op
                    && CollectiveCall {
                        kind: peer_call.kind,
                        len: peer_call.len,
                        algorithm: peer_call.algorithm,
                        ..*call
                    } == *peer_call
            }
            _ => false,
        };
        if split_otherwise {
            let values = |kind| match kind {
                CollectiveKind::AllReduceMany {
                    values, lengths, ..
                } => (values, lengths),
                _ => (0, 0),
            };
            let ((values, lengths), (peer_values, peer_lengths)) =
                (values(call.kind), values(peer_call.kind));
            write!(
                f,
                "different collectives at {}: rank {} called all_reduce_many with {} value(s) of {} element(s) in all (lengths #{:016x}), rank {} with {} of {} (lengths #{:016x}); every rank must pass as many values, each as long as the other ranks' value in its place",
                call.at, self.rank, values, call.len, lengths, self.peer, peer_values, peer_call.len, peer_lengths
            )
        } else if same_but_len {
            write!(
                f,
                "different collectives at {}: rank {} called {} with {} element(s), rank {} with {}; every rank must pass a value of the same length",
                call.at, self.rank, call.kind, call.len, self.peer, peer_call.len
            )
        } else if same_but_chunk && call.chunk != 0 && peer_call.chunk != 0 {
            // Pieces of as many bytes hold other numbers of elements: another element type.
            write!(
                f,
                "different collectives at {}: rank {} called {} in pieces of {} element(s), rank {} in pieces of {}: values of another element type; every rank must pass values of the same type",
                call.at, self.rank, Called(call), call.chunk, self.peer, peer_call.chunk
            )
        } else {
            write!(
                f,
                "different collectives at {}: {}, {}; every rank must make the same collective calls in the same order",
                call.at,
                Made(self.rank, &SyncKind::Collective(call.kind), Some(call)),
                Made(self.peer, &SyncKind::Collective(peer_call.kind), Some(peer_call)),
            )
        }
    }
}

/// Why a worker's message could not be sent or read ([`WorkerContext::send`],
/// [`WorkerContext::messages`](crate::WorkerContext::messages)). Returned with `?` it fails
/// the worker's compute, naming the worker's rank and the iteration.
///
/// [`WorkerContext::send`]: crate::WorkerContext::send
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// A message to a rank the job does not have.
    #[error("a message to rank {rank}, but the job has {workers} worker(s): ranks 0 to {}", workers.saturating_sub(1))]
    NoSuchRank {
        /// The rank named.
        rank: Rank,
        /// The number of workers.
        workers: usize,
    },
    /// The job declares no message type: build it with `JobBuilder::messages::<T>()` (or
    /// `combine_messages`).
    #[error("this job has no messages; build it with JobBuilder::messages::<{type_name}>() to send and read them")]
    NotDeclared {
        /// The type the compute used.
        type_name: &'static str,
    },
    /// The compute used another type than the job's message type.
    #[error(
        "a message of type {used}, but the job's messages are of type {job} (JobBuilder::messages)"
    )]
    OtherType {
        /// The type the compute used.
        used: &'static str,
        /// The job's message type.
        job: &'static str,
    },
    /// A message sent outside `compute` (in `init`): messages belong to a superstep.
    #[error("messages are sent in compute, not in init: they belong to a superstep")]
    OutsideCompute,
}

/// A vertex program's mistake or its graph's bad input (`superstep::graph`). Returned
/// with `?` it fails the worker's compute, naming the worker's rank and the superstep; a
/// mistake is not run again by any failure policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// A vertex id that no partition owns — a message's or an edge's: outside the graph's
    /// vertices, or one the partitioner gave no rank of the job.
    #[error("no partition owns vertex {vertex}: {why}")]
    NoSuchVertex {
        /// The vertex id named.
        vertex: String,
        /// What named it, and why no partition owns it.
        why: String,
    },
    /// A message reached the rank its partitioner named, whose partition has no such
    /// vertex: the graph has none with that id (a vertex is an edge's end or, with
    /// `GraphBuilder::vertices`, an id below their count), or the partitioner does not
    /// give one id one rank.
    #[error("{count} message(s) to vertex {vertex}, which rank {rank}'s partition does not hold: the graph has no such vertex")]
    NotInPartition {
        /// The vertex id the message was sent to.
        vertex: String,
        /// The rank it reached.
        rank: Rank,
        /// How many messages to vertices not in the partition reached it this superstep.
        count: u64,
    },
    /// A line of an edge list that is not an edge: `source target [value]`, separated by
    /// spaces, tabs or a comma (lines that are empty or start with `#` or `%` are
    /// comments).
    #[error("{path}, line {line}: {why}")]
    MalformedEdge {
        /// The file.
        path: std::path::PathBuf,
        /// The line, counted from 1.
        line: u64,
        /// What was wrong with it.
        why: String,
    },
    /// An edge list that could not be read.
    #[error("the edge list {path} could not be read: {why}")]
    Unreadable {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        why: String,
    },
    /// A value aggregated by a vertex in a job that declares no aggregator
    /// (`GraphBuilder::aggregate`): it would be lost.
    #[error("a vertex aggregated a value, but the job declares no aggregator: build it with GraphBuilder::aggregate")]
    NoAggregator,
    /// A graph job whose iteration count was set on its `JobBuilder`: it runs its
    /// supersteps and one iteration to hand its values in, so it would end cut short,
    /// without its values.
    #[error("a graph job's iterations are its own ({want}: {supersteps} supersteps and one to hand the values in), not {set}: set GraphBuilder::max_supersteps, not the job's iterations")]
    IterationsSet {
        /// The iterations set.
        set: u64,
        /// The graph's `max_supersteps`.
        supersteps: u64,
        /// The iterations the job needs.
        want: u64,
    },
    /// A rank's vertices' values, handed in for the job's result when it ends, are more
    /// than one frame carries to the master's process (`TcpSettings::max_frame`).
    #[error("rank {rank}'s {vertices} vertices' values are {bytes} bytes encoded, over the {limit} bytes one frame carries to the master's process (max_frame, SUPERSTEP_MAX_FRAME): write them with GraphBuilder::write_values and turn keep_values off, raise max_frame, or run more workers")]
    ValuesTooLarge {
        /// The rank.
        rank: Rank,
        /// Its vertices.
        vertices: u64,
        /// Their values, encoded.
        bytes: u64,
        /// What one frame carries.
        limit: u64,
    },
}

/// A call as a mismatch names it: what it is, without the place the message names once.
struct Called<'a>(&'a CollectiveCall);

impl fmt::Display for Called<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let call = self.0;
        if call.chunk == 0
            || matches!(
                call.kind,
                CollectiveKind::Messages | CollectiveKind::Barrier | CollectiveKind::AllGather
            )
        {
            // Known by its kind alone (a broadcast's receiver, a barrier, an all-gather,
            // whose elements are the ranks' messages), or the superstep's messages.
            return write!(f, "{}", call.kind);
        }
        write!(
            f,
            "{} of {} element(s) by {}",
            call.kind, call.len, call.algorithm
        )
    }
}

/// What a rank did, as a mismatch names it: the call it made (`call`: the whole call, where
/// it is known), or — for the calls the runtime makes once compute returned, the
/// superstep's messages and the fold of results among the workers — that it returned.
struct Made<'a>(Rank, &'a SyncKind, Option<&'a CollectiveCall>);

impl fmt::Display for Made<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Made(rank, kind, call) = *self;
        match kind {
            SyncKind::Collective(CollectiveKind::Messages) => write!(
                f,
                "rank {rank} returned from compute (the superstep's messages were to go next)"
            ),
            SyncKind::Collective(CollectiveKind::Reduce { .. }) => write!(
                f,
                "rank {rank} returned from compute (its result's fold among the workers was to go next)"
            ),
            _ => match call {
                Some(call) => write!(f, "rank {rank} called {}", Called(call)),
                None => write!(f, "rank {rank} called {kind}"),
            },
        }
    }
}

/// Calls started and not finished, as an error lists them.
struct Started<'a>(&'a [CollectiveCall]);
impl fmt::Display for Started<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, call) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{call}")?;
        }
        Ok(())
    }
}

struct Calls<'a>(&'a [(Rank, SyncKind)]);
impl fmt::Display for Calls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (rank, kind)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", Made(*rank, kind, None))?;
        }
        Ok(())
    }
}

/// The error underneath a [`JobError`] — an I/O error, a decoder's, a transport's — kept
/// as the job error's [`source`](std::error::Error::source) in the process where it
/// happened, so that a caller can walk the chain or downcast it (to a `std::io::Error`,
/// say). Only its text crosses a network, in the job error's message; two sources compare
/// equal whatever they hold, as a [`Cause`] compares by its message alone.
#[derive(Clone)]
pub struct ErrorSource(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl ErrorSource {
    /// Keeps `error` as a source.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        ErrorSource(Arc::new(error))
    }
}

/// The error itself: what `source()` hands out, so that it downcasts to its own type.
impl std::ops::Deref for ErrorSource {
    type Target = dyn std::error::Error + Send + Sync + 'static;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

/// Always equal: what a source holds is not compared (it may not be comparable, and does
/// not cross a network).
impl PartialEq for ErrorSource {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ErrorSource {}

/// `; refused: …` when connections were refused meanwhile.
fn refused_note(refused: &[String]) -> String {
    if refused.is_empty() {
        String::new()
    } else {
        format!("; refused: {}", refused.join("; "))
    }
}

/// A hook of a job [`Coordinator`](crate::coordinator::Coordinator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hook {
    /// `prepare_shards`.
    PrepareShards,
    /// `on_start`.
    OnStart,
    /// `on_worker_done`.
    OnWorkerDone,
    /// `on_finish`.
    OnFinish,
    /// `on_error`.
    OnError,
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hook::PrepareShards => "prepare_shards",
            Hook::OnStart => "on_start",
            Hook::OnWorkerDone => "on_worker_done",
            Hook::OnFinish => "on_finish",
            Hook::OnError => "on_error",
        })
    }
}

/// The exit code of a process whose job was preempted ([`JobError::Preempted`]): 75,
/// `EX_TEMPFAIL` ("try again later"). `superstep-launch` passes it on and never restarts a
/// process that exits with it; a Slurm batch script or a Kubernetes `podFailurePolicy`
/// can requeue on it (README, "Preemption").
pub const EXIT_PREEMPTED: u8 = 75;

impl JobError {
    /// The exit code a process whose job ended with this error should exit with:
    /// [`EXIT_PREEMPTED`] for [`Preempted`](JobError::Preempted), 1 for anything else.
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # fn job() -> Result<JobOutcome<u64>, JobError> { unimplemented!() }
    /// fn main() -> std::process::ExitCode {
    ///     match job() {
    ///         Ok(_) => std::process::ExitCode::SUCCESS,
    ///         Err(error) => {
    ///             eprintln!("{error}");
    ///             std::process::ExitCode::from(error.exit_code())
    ///         }
    ///     }
    /// }
    /// ```
    pub fn exit_code(&self) -> u8 {
        match self {
            JobError::Preempted { .. } => EXIT_PREEMPTED,
            _ => 1,
        }
    }

    /// Whether the job stopped for a preemption ([`JobError::Preempted`]).
    pub fn is_preempted(&self) -> bool {
        matches!(self, JobError::Preempted { .. })
    }
}

impl JobError {
    /// This failure of the job as a rank waiting in a sync call or collective gets it,
    /// whether from the master's node (its answer to a call it holds) or from the job's
    /// end: a sync failure as it is; a rank's compute that failed after its call met two
    /// calls that differ ([`Cause::broken_rule`]) as that mismatch, so that every rank
    /// gets the same typed error whichever saw the mistake first; any other wrapped in
    /// [`SyncError::JobFailed`].
    pub(crate) fn as_sync_failure(&self) -> SyncError {
        match self {
            JobError::Sync(failed) => failed.clone(),
            JobError::Worker { cause, .. } => match cause.broken_rule() {
                Some(
                    broken @ (SyncError::Mismatch { .. } | SyncError::CollectiveMismatch { .. }),
                ) => broken.clone(),
                _ => SyncError::JobFailed(Box::new(self.clone())),
            },
            other => SyncError::JobFailed(Box::new(other.clone())),
        }
    }

    /// A transport's failure: `message` names the peer and what was done; `source` is the
    /// error underneath, if there is one.
    pub(crate) fn transport(message: impl Into<String>, source: Option<ErrorSource>) -> Self {
        JobError::Transport {
            message: message.into(),
            source,
        }
    }

    /// The checkpoints' failure: `message` names the file or the job; `source` is the
    /// error underneath, if there is one.
    pub(crate) fn checkpoint(message: impl Into<String>, source: Option<ErrorSource>) -> Self {
        JobError::Checkpoint {
            message: message.into(),
            source,
        }
    }

    /// The worker rank this error is about, if it is about one worker.
    pub fn rank(&self) -> Option<Rank> {
        match self {
            JobError::Worker { rank, .. }
            | JobError::WorkerLost { rank, .. }
            | JobError::FrameTooLarge { rank, .. }
            | JobError::Mismatch { rank, .. } => Some(*rank),
            _ => None,
        }
    }

    /// This error as reported by the worker of `rank`: a worker's failure names the rank
    /// it came from, whatever rank its message named (a worker cannot blame another).
    pub(crate) fn attributed_to(mut self, from: Rank) -> Self {
        if let JobError::Worker { rank, .. } | JobError::WorkerLost { rank, .. } = &mut self {
            if *rank != from {
                tracing::warn!(
                    from,
                    named = *rank,
                    "a worker's failure named another rank; it is the sender's"
                );
                *rank = from;
            }
        }
        self
    }

    /// The iteration this error happened in, where it names one.
    pub fn iteration(&self) -> Option<Iteration> {
        match self {
            JobError::Worker { iteration, .. } | JobError::Master { iteration, .. } => {
                Some(*iteration)
            }
            JobError::WorkersTimedOut {
                during: Waiting::Iteration(i),
                ..
            }
            | JobError::MasterTimedOut {
                during: Waiting::Iteration(i),
                ..
            } => Some(*i),
            _ => None,
        }
    }
}

/// `n` of a thing, in words that agree with `n`: "1 worker", "3 workers".
pub(crate) fn counted(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// Drops `value` under a guard: a panic in its `Drop` — user code — becomes a [`Cause`],
/// to be named as the failure of the side whose type it is ([`Phase::Drop`]), not of
/// the code that happened to hold it last, and never unwinds into the runtime.
pub(crate) fn drop_guarded<T>(value: T) -> Result<(), Cause> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(value)))
        .map_err(Cause::from_panic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_the_sentence_then_each_cause_it_does_not_already_say() {
        let io = std::io::Error::other("connection reset by peer");
        let held = JobError::Transport {
            message: "worker 2's link: connection reset by peer".into(),
            source: Some(ErrorSource::new(std::io::Error::other(
                "connection reset by peer",
            ))),
        };
        assert_eq!(format!("{held:?}"), held.to_string());

        let new = JobError::Transport {
            message: "worker 2's link failed".into(),
            source: Some(ErrorSource::new(io)),
        };
        assert_eq!(
            format!("{new:?}"),
            format!("{new}\n\nCaused by:\n    connection reset by peer")
        );
        let config = ConfigError::new("workers", 0, "at least 1");
        assert_eq!(format!("{config:?}"), config.to_string());
        assert_eq!(format!("{config:#?}"), config.to_string());
    }
}
