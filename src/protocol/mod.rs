//! The sans-IO core: message types and pure state machines.
//!
//! Nothing here spawns, sleeps, reads a clock or does I/O: time comes in as an argument
//! (`now: Instant`), and every state machine returns what should happen next instead of
//! doing it. The actix actors of the runtime are thin drivers around these types,
//! and the same types can be driven by a test or a simulator.
//!
//! - [`Round`]: one iteration's results — at most one per rank, stale and duplicate
//!   arrivals dropped and counted, handed over in rank order.
//! - [`Gate`]: the barrier's state machine — registration, one [`Round`] per iteration,
//!   the workers' end-of-job reports, failures and timeouts that name who is missing.
//! - [`Schedule`]: the master's loop — which iteration is next, iteration count, halt.
//! - [`SyncState`]: `barrier()` and `all_gather()` inside compute — epochs counted per
//!   rank, mismatched calls, timeouts from the first arrival, ranks that never call.
//! - [`WorkerState`]: a worker's view — which master messages to act on.
//! - [`Recovery`]: what a job does when a worker fails, under its [`FailurePolicy`].
//! - `MasterNode`: the master's node as one state machine, composing the parts above — the
//!   one place that decides what a round, a failure, a recovery and the end of a job mean.
//!   The runtime's node actor and the simulator both drive it.

mod call_run;
mod collective;
mod config;
mod event;
mod gate;
mod groups;
mod master;
mod recovery;
mod report;
mod round;
mod schedule;
mod settings;
mod sync;
mod worker;
mod worker_node;
mod worker_process;
mod worker_report;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorSource, JobError, SyncError};
use crate::ids::{Attempt, Epoch, FoldRoute, GroupId, Iteration, Rank, SyncKind};

pub(crate) use call_run::MAX_CALLS;
#[cfg(any(feature = "tcp", feature = "sim"))]
pub(crate) use call_run::{CallRun, HOLD};
pub(crate) use collective::CallShape;
pub(crate) use collective::{all_vouch, placed, segment, vouches};
pub(crate) use collective::{
    exchange, CallSetup, CallStart, Carried, Early, Flight, Flights, Flying, RankCall, SendFailure,
};
pub use collective::{Buffer, Exchange, PeerBody, PeerEvent, PeerMessage, Piece};
pub(crate) use config::{Combining, Deployment, NodeConfig, Save, WorkerConfig, Workers};
pub use event::JobEvent;
pub(crate) use gate::ForWorkers;
pub use gate::{Accepted, Combiner, Gate, GateConfig, GateOutput, Gathered, Spare, Tally, Wait};
pub(crate) use groups::GroupEpochs;
pub(crate) use master::{
    Action, Computed, MasterDone, MasterNode, MasterRound, MasterWork, NodeSettings, OwnedEnding,
    Reach, Resumed,
};
pub(crate) use recovery::{attempts_per_process, restarts_all, start_attempt};
pub use recovery::{FailurePolicy, Recover, Recovery};
pub use report::{
    DurationTotals, IterationReport, IterationTotals, JobOutcome, JobReport, MailCount, Recovered,
    ResumedFrom,
};
pub use round::{Drops, Offer, Round};
pub use schedule::{HaltedBy, Next, Schedule};
#[cfg(feature = "tcp")]
pub(crate) use settings::duration;
pub(crate) use settings::parse_duration;
pub use settings::{JobConfig, MalformedRows, Placement, PreemptSignal};
pub use sync::{SyncResult, SyncState, SyncStep};
pub use worker::{WorkerCommand, WorkerState};
pub(crate) use worker_node::{Assignment, Work, Worked, WorkerAction, WorkerNode};
pub(crate) use worker_process::{LinkId, ProcessAction, WorkerProcess};
pub use worker_report::{
    Attachment, AttachmentError, Rejected, RowCounts, WorkerReport, MAX_RECORDED_REJECTS,
};

/// Why a message could not be sent, as the nodes need to know it: the transport's error,
/// sorted by the transport (`From<TransportError>`).
#[derive(Debug, Clone)]
pub(crate) enum Unsent {
    /// The sender's link was closed on purpose: a replacement took its rank.
    Replaced,
    /// The message does not survive the wire encoding: its receiver could not read it.
    Undecodable(JobError),
    /// The link could not carry it (closed, not connected, too large for a frame, an I/O
    /// error): the transport's error.
    Failed(ErrorSource),
}

/// A message with the rank of the worker it came from, as the transport stamps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<T> {
    /// The rank of the sending worker.
    pub from: Rank,
    /// The message.
    pub msg: T,
}

/// One worker's result of one iteration, with what the barrier needs to gate it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report<W> {
    /// The attempt it was computed in.
    pub attempt: Attempt,
    /// The iteration it belongs to.
    pub iteration: Iteration,
    /// The user's result, or its part in a fold among the workers.
    pub result: Share<W>,
    /// Whether the worker voted to halt (see `JobConfig::worker_halt`).
    pub halt_vote: bool,
    /// What its messages of the iteration came to (`JobBuilder::messages`; `None`
    /// without). Boxed: a job without messages moves no counts of them.
    #[serde(default)]
    pub mail: Option<Box<crate::protocol::MailCount>>,
    /// How long the worker's iteration (hooks and compute) took.
    pub elapsed: Duration,
    /// What the worker saved for the checkpoint of this iteration, in the iterations a
    /// checkpoint is taken of (`JobBuilder::checkpoint`); `None` in the others. Boxed:
    /// a report moves a few times a round, and one without it stays small.
    #[serde(default)]
    pub saved: Option<Box<WorkerSave>>,
    /// How many sync calls and collectives among every rank the worker had made in its
    /// attempt when its iteration ended (the epoch of its next call): the master's node tells a rank that
    /// returned without a call from one whose call is still on its way — a collective
    /// returns without the node's word, so its call may come after the result.
    #[serde(default)]
    pub calls: Epoch,
    /// The same, of each group of ranks the worker made calls among
    /// (`collective::Group`); `None` when it made none among any. Boxed, as `saved`.
    #[serde(default)]
    pub group_calls: Option<Box<GroupCalls>>,
}

/// How many calls a worker made among each group of ranks in its attempt (the epoch of its
/// next among each), in the order of the groups' ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCalls(pub Vec<(GroupId, Epoch)>);

/// What a worker saves for a checkpoint of an iteration, and is given back when the job
/// resumes from it: its own state (`WorkerComputable::save_state`) and the messages sent
/// to it in that iteration, which it reads in the next (`JobBuilder::messages`), encoded.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSave {
    /// What `WorkerComputable::save_state` returned.
    pub state: Vec<u8>,
    /// The messages on their way to the worker, encoded (empty in a job without them).
    pub messages: Vec<u8>,
}

impl WorkerSave {
    /// Whether it holds nothing: no state of the worker's (the default `save_state`) and
    /// no message on its way.
    pub fn is_empty(&self) -> bool {
        self.state.is_empty() && self.messages.is_empty()
    }
}

impl fmt::Debug for WorkerSave {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerSave")
            .field("state", &format_args!("{} bytes", self.state.len()))
            .field("messages", &format_args!("{} bytes", self.messages.len()))
            .finish()
    }
}

/// A copy of a checkpoint, as its store's file holds it (with its checksum), which a
/// worker's process keeps for a master started again without it
/// (`JobConfig::checkpoint_replicas`): the master's node sends it to the workers that keep
/// copies after each checkpoint, and a worker offers the one it holds each time its link
/// reaches a master's node, before it registers.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    /// The iteration the checkpoint covers.
    pub iteration: Iteration,
    /// The checkpoint's bytes; shared, not copied, by the messages that carry it (one
    /// block of bytes on the wire).
    #[serde(with = "shared_bytes")]
    pub bytes: Arc<Vec<u8>>,
}

/// Shared bytes as one block of bytes (MessagePack's `bin`), not an array of numbers.
mod shared_bytes {
    use std::sync::Arc;

    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &Arc<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(bytes.as_slice(), s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Vec<u8>>, D::Error> {
        serde_bytes::deserialize::<Vec<u8>, D>(d).map(Arc::new)
    }
}

impl fmt::Debug for Replica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replica")
            .field("iteration", &self.iteration)
            .field("bytes", &format_args!("{} bytes", self.bytes.len()))
            .finish()
    }
}

/// A worker's part in a round's results: its own result, or — when the workers folded
/// their results among themselves ([`FoldRoute`](crate::ids::FoldRoute)) — the fold of
/// every rank's (at the rank the fold ended at) or nothing (its result went into that
/// fold).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Share<W> {
    /// The worker's own result.
    Own(W),
    /// Every rank's result, folded in rank order among the workers.
    Fold(W),
    /// The worker's result went into another rank's fold.
    Passed,
}

/// Messages from a worker to the master's node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToMaster<W> {
    /// Start-up is done (`pre_application` and `init`); the worker is ready to iterate.
    Registered {
        /// The attempt the worker runs in.
        attempt: Attempt,
    },
    /// The worker's result of one iteration.
    Result(Report<W>),
    /// The worker's code failed; the job must fail at once.
    Failed {
        /// The attempt the worker runs in.
        attempt: Attempt,
        /// What failed, where and why.
        error: JobError,
    },
    /// The worker ran its `post_application` and stopped.
    Done {
        /// The attempt the worker ran in.
        attempt: Attempt,
        /// Whether it stopped on its own failure and waits for the master's word on it —
        /// in a job whose failures restart every worker, a restart may follow — so that
        /// this is not its last word: its link is kept, and made again if the master is
        /// lost meanwhile.
        awaits_word: bool,
        /// What it read, wrote and rejected over the job.
        rows: RowCounts,
        /// What it attached to its report, in order.
        attachments: Vec<Attachment>,
    },
    /// The worker's compute called `barrier()`, `all_gather()` or a collective (or, as
    /// `calls` says, several in a row).
    Sync {
        /// The attempt the worker runs in.
        attempt: Attempt,
        /// The worker's count of its calls, from 0: of the first this word says.
        epoch: Epoch,
        /// How many calls one after the other the word says, from `epoch`: the same kind
        /// and message each, none awaited (1 for a call awaited). A rank's calls that no
        /// rank awaits the word on may be held back a little and said together.
        calls: u32,
        /// Which call.
        kind: SyncKind,
        /// The encoded message (empty for `barrier()`).
        message: Vec<u8>,
        /// Whether the worker waits for the node's word that every rank made the call.
        /// A collective whose result proves it (an `all_reduce`: a piece of every rank's
        /// is in it) does not: the node answers it only with an error.
        awaits: bool,
        /// The ranks the call is among: every rank ([`GroupId::ALL`]), or a group of them
        /// (`collective::Group`), whose calls are counted apart.
        group: GroupId,
        /// The group's ranks, in rank order, with the worker's first call among it in its
        /// attempt (empty otherwise, and for every rank's calls).
        ranks: Vec<Rank>,
    },
    /// The copy of a checkpoint this worker's process keeps, offered to a master's node
    /// its link reached (before the worker registers), for a master that lost its own.
    Replica(Replica),
    /// The worker's process was asked to stop for a preemption (its preempt signal, or
    /// `Preempt::request`): the job stops at its next checkpoint.
    Preempt {
        /// What asked, and where: `SIGTERM in rank 2's process`.
        by: String,
    },
    /// What the rank's flight recorder holds, encoded (`flight::RankLog`), for a dump
    /// ([`ToWorker::Record`]). Its driver takes it before the master's node.
    Recorded {
        /// The encoded log.
        log: Vec<u8>,
    },
    /// The worker's process was asked for a dump of every rank's flight recorder (its
    /// dump signal): the master's process writes it. Its driver takes it before the
    /// master's node.
    Dump {
        /// What asked, and where: `SIGUSR2 in rank 2's process`.
        by: String,
    },
}

/// Messages from the master's node to a worker.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub enum ToWorker<M> {
    /// Compute iteration `iteration` with the master result of the iteration before.
    Iterate {
        /// The attempt of the job.
        attempt: Attempt,
        /// The iteration to compute.
        iteration: Iteration,
        /// The master result of `iteration - 1`; `None` in iteration 1. Shared, not copied
        /// per worker, in-process.
        last: Option<Arc<M>>,
        /// How the workers fold their results of this iteration.
        fold: FoldRoute,
        /// Whether a checkpoint of this iteration is taken, for which each worker saves
        /// what it needs to resume ([`WorkerSave`]) with its result.
        #[serde(default)]
        save: bool,
    },
    /// The job completed: run `post_application` and stop.
    Finish {
        /// The attempt of the job.
        attempt: Attempt,
        /// How many iterations ran.
        iterations: Iteration,
        /// Whether the job halted before its iteration count.
        halted: bool,
        /// The final master result.
        last: Arc<M>,
    },
    /// The job failed: run `post_application` with the cause and stop.
    Abort {
        /// The attempt of the job.
        attempt: Attempt,
        /// The job's first failure.
        error: JobError,
    },
    /// The answer to the worker's sync call `epoch` of `group`'s calls.
    SyncReply {
        /// The attempt of the job.
        attempt: Attempt,
        /// The call answered.
        epoch: Epoch,
        /// The ranks it was among.
        group: GroupId,
        /// Every rank's message in rank order, or why the epoch failed (boxed: a reply
        /// that says every rank made the call stays small).
        result: Result<Arc<Vec<Vec<u8>>>, Box<SyncError>>,
    },
    /// Before the first iteration of an attempt that resumes from a checkpoint: what this
    /// worker saved in it, to restore before that iteration's compute.
    Restore {
        /// The attempt of the job.
        attempt: Attempt,
        /// What the worker of this rank saved.
        save: Arc<WorkerSave>,
    },
    /// The worker's link reached a master's node that runs `attempt` — at start, or again
    /// after it lost the master (a master process started again, say). Not sent by the
    /// master: the worker's transport delivers it after each handshake. A worker that was
    /// connected before registers again, in `attempt`, and waits for its next iteration.
    Connected {
        /// The attempt the master's node runs.
        attempt: Attempt,
    },
    /// The worker's link lost the master's node and tries to reach it again, within the
    /// transport's reconnect timeout (giving up, it says so with an `Abort`). Not sent by
    /// the master: the worker's transport delivers it. A worker of a job whose failures
    /// restart every worker, stopped on its own failure, keeps that failure for the master
    /// started again — which replaces it — rather than end its process.
    Reconnecting {
        /// How the master was lost.
        reason: String,
    },
    /// Every worker starts over in `attempt`, from the newest checkpoint, after `cause`
    /// (a gang restart: `FailurePolicy::RestartAll`, or `RestartWorker` in barrier mode).
    /// Broadcast by the master's node; the process of a worker reached through a transport
    /// replaces it — a new one from the factory, whose `init` runs — and the old one stops
    /// with `cause`. A worker the master's node hosts was replaced already, and runs in
    /// `attempt`.
    Restart {
        /// The attempt every worker starts over in.
        attempt: Attempt,
        /// The failure the job recovers from.
        cause: JobError,
    },
    /// A copy of the newest checkpoint, for this worker's process to keep (in place of
    /// the one it kept) and offer to a master's node started again.
    Replica(Replica),
    /// Asks the worker's process for the rank's flight recorder (a dump is being
    /// written): it answers with [`ToMaster::Recorded`], its worker never hears of it.
    /// Not a word of the master's node: its driver sends it.
    Record,
}

impl<W> ToMaster<W> {
    /// Whether it carries a worker's result (what the wire check sends through the wire
    /// encoding).
    pub fn carries_result(&self) -> bool {
        matches!(self, ToMaster::Result(_))
    }
}

/// A message as the wire check names what it carries when that does not survive the
/// wire: the user's type, and which value of it.
pub(crate) trait Carrying {
    /// Whether it carries a user's value, which the wire check encodes.
    fn carries_result(&self) -> bool;

    /// The type of the user's value it carries, and which value it is (`the master result
    /// of iteration 2`).
    fn carried(&self) -> (&'static str, String);
}

impl<M> Carrying for ToWorker<M> {
    fn carries_result(&self) -> bool {
        ToWorker::carries_result(self)
    }

    fn carried(&self) -> (&'static str, String) {
        let what = match self {
            ToWorker::Iterate { iteration, .. } => {
                format!(
                    "the master result of iteration {}",
                    iteration.saturating_sub(1)
                )
            }
            ToWorker::Finish { iterations, .. } => {
                format!("the final master result (iteration {iterations})")
            }
            _ => return (std::any::type_name::<Self>(), "a message".to_owned()),
        };
        (std::any::type_name::<M>(), what)
    }
}

impl<W> Carrying for ToMaster<W> {
    fn carries_result(&self) -> bool {
        ToMaster::carries_result(self)
    }

    fn carried(&self) -> (&'static str, String) {
        match self {
            ToMaster::Result(report) => (
                std::any::type_name::<W>(),
                format!("its result of iteration {}", report.iteration),
            ),
            _ => (std::any::type_name::<Self>(), "a message".to_owned()),
        }
    }
}

impl<M> ToWorker<M> {
    /// Whether it carries a master result (what the wire check sends through the wire
    /// encoding).
    pub fn carries_result(&self) -> bool {
        matches!(
            self,
            ToWorker::Iterate { last: Some(_), .. } | ToWorker::Finish { .. }
        )
    }
}

// Not derived: a derive would ask for `M: Clone`, but only the `Arc` is cloned.
impl<M> Clone for ToWorker<M> {
    fn clone(&self) -> Self {
        match self {
            ToWorker::Iterate {
                attempt,
                iteration,
                last,
                fold,
                save,
            } => ToWorker::Iterate {
                attempt: *attempt,
                iteration: *iteration,
                last: last.clone(),
                fold: *fold,
                save: *save,
            },
            ToWorker::Finish {
                attempt,
                iterations,
                halted,
                last,
            } => ToWorker::Finish {
                attempt: *attempt,
                iterations: *iterations,
                halted: *halted,
                last: last.clone(),
            },
            ToWorker::Abort { attempt, error } => ToWorker::Abort {
                attempt: *attempt,
                error: error.clone(),
            },
            ToWorker::SyncReply {
                attempt,
                epoch,
                group,
                result,
            } => ToWorker::SyncReply {
                attempt: *attempt,
                epoch: *epoch,
                group: *group,
                result: result.clone(),
            },
            ToWorker::Restore { attempt, save } => ToWorker::Restore {
                attempt: *attempt,
                save: Arc::clone(save),
            },
            ToWorker::Connected { attempt } => ToWorker::Connected { attempt: *attempt },
            ToWorker::Reconnecting { reason } => ToWorker::Reconnecting {
                reason: reason.clone(),
            },
            ToWorker::Restart { attempt, cause } => ToWorker::Restart {
                attempt: *attempt,
                cause: cause.clone(),
            },
            ToWorker::Replica(replica) => ToWorker::Replica(replica.clone()),
            ToWorker::Record => ToWorker::Record,
        }
    }
}

impl<M> fmt::Display for ToWorker<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToWorker::Iterate { iteration, .. } => write!(f, "iterate {iteration}"),
            ToWorker::Finish { iterations, .. } => write!(f, "finish after {iterations}"),
            ToWorker::Abort { error, .. } => write!(f, "abort: {error}"),
            ToWorker::SyncReply { epoch, group, .. } if *group == GroupId::ALL => {
                write!(f, "answer to sync call {epoch}")
            }
            ToWorker::SyncReply { epoch, group, .. } => {
                write!(f, "answer to sync call {epoch} among {group}")
            }
            ToWorker::Restore { save, .. } => write!(
                f,
                "restore {} bytes of state and {} of messages",
                save.state.len(),
                save.messages.len()
            ),
            ToWorker::Connected { attempt } => write!(f, "connected in attempt {attempt}"),
            ToWorker::Reconnecting { reason } => write!(f, "reaching the master again: {reason}"),
            ToWorker::Restart { attempt, cause } => {
                write!(f, "restart in attempt {attempt} after: {cause}")
            }
            ToWorker::Record => f.write_str("send the flight recorder"),
            ToWorker::Replica(replica) => write!(
                f,
                "keep a copy of the checkpoint of iteration {} ({} bytes)",
                replica.iteration,
                replica.bytes.len()
            ),
        }
    }
}
