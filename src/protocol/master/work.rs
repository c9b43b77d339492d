//! What passes between the master's node and its driver: the actions it asks for, the
//! master's code it hands out and what that code hands back, and what it asks of the
//! transport.

use std::sync::Arc;
use std::time::Duration;

use super::super::{
    Gathered, HaltedBy, JobEvent, JobOutcome, Replica, Spare, Tally, ToWorker, WorkerReport,
    WorkerSave,
};
use super::Save;
use crate::error::{JobError, Waiting};
use crate::ids::{Attempt, Iteration, Rank};

/// How the job ended, owned, as it travels to the master's and the workers' code.
pub(crate) enum OwnedEnding<M> {
    /// It completed after `iterations`, with the final master result.
    Completed {
        iterations: Iteration,
        halted: bool,
        last: Arc<M>,
    },
    /// It failed; its first failure.
    Failed(JobError),
}

impl<M> OwnedEnding<M> {
    /// The ending a master's `Finish` or `Abort` tells a worker; `None` for any other
    /// message.
    pub(crate) fn told(msg: ToWorker<M>) -> Option<Self> {
        match msg {
            ToWorker::Finish {
                iterations,
                halted,
                last,
                ..
            } => Some(OwnedEnding::Completed {
                iterations,
                halted,
                last,
            }),
            ToWorker::Abort { error, .. } => Some(OwnedEnding::Failed(error)),
            _ => None,
        }
    }
}

impl<M> Clone for OwnedEnding<M> {
    fn clone(&self) -> Self {
        match self {
            OwnedEnding::Completed {
                iterations,
                halted,
                last,
            } => OwnedEnding::Completed {
                iterations: *iterations,
                halted: *halted,
                last: Arc::clone(last),
            },
            OwnedEnding::Failed(e) => OwnedEnding::Failed(e.clone()),
        }
    }
}

/// What a checkpoint gave the master's code to start from: its iteration (and whether it
/// halted the job) and its master result. Empty when the attempt starts from scratch.
pub(crate) struct Resumed<M> {
    pub(crate) from: Option<(Iteration, Option<HaltedBy>)>,
    /// What the job's report says of the checkpoint resumed from.
    pub(crate) point: Option<crate::protocol::ResumedFrom>,
    pub(crate) last: Option<Arc<M>>,
    /// What each worker saved in the checkpoint, by rank: each is sent its own before the
    /// attempt's first iteration ([`ToWorker::Restore`]).
    pub(crate) workers: Vec<Option<Arc<WorkerSave>>>,
}

/// One iteration's input to the master's code.
pub(crate) struct MasterRound<W> {
    pub(crate) iteration: Iteration,
    pub(crate) gathered: Gathered<W>,
    /// The iteration's span, which the master's compute runs in.
    pub(crate) span: tracing::Span,
    /// `HaltedBy::Workers` when the workers' votes halt the job after this iteration (the
    /// master's own halt is known once it computed): a checkpoint of it says so.
    pub(crate) halted: Option<crate::protocol::HaltedBy>,
    /// Whether a checkpoint of the iteration is saved once the master computed it.
    pub(crate) save: Save,
    /// Whether a saved checkpoint is also handed back as bytes, for the workers that keep
    /// copies of it ([`Computed::replica`]).
    pub(crate) replicate: bool,
    /// Whether a checkpoint saved of this round ends the job (a preemption): it is then
    /// written before the node hears it was saved, and is not counted saved if it was not.
    pub(crate) ends: bool,
    /// How long the node waits for this work (the iteration timeout): the wait for the
    /// job's last checkpoint to be written takes at most half of what is left of it.
    pub(crate) timeout: std::time::Duration,
}

/// The master's code to run: the driver runs it where placement says and hands back a
/// [`MasterDone`].
pub(crate) enum MasterWork<M, W> {
    /// `pre_application` (after restoring a checkpoint's state).
    Start,
    /// One iteration: interceptors, compute, and the checkpoint when one is due.
    Iterate(MasterRound<W>),
    /// `post_application` with how the job ended.
    Stop(OwnedEnding<M>),
    /// Start over as this attempt, every worker having restarted: from the newest
    /// checkpoint, or from the start.
    Restart(Attempt),
    /// Before the attempt's first iteration: resume from the copy of a checkpoint the
    /// worker of `from` offered, newer than what the master resumed from (its own store
    /// lost it, or never had it) — checked, and saved into the master's store first.
    Adopt { from: Rank, replica: Replica },
}

impl<M, W> MasterWork<M, W> {
    /// What the job waits for while this work runs.
    pub(crate) fn during(&self) -> Waiting {
        match self {
            MasterWork::Start | MasterWork::Restart(_) | MasterWork::Adopt { .. } => {
                Waiting::Registration
            }
            MasterWork::Iterate(round) => Waiting::Iteration(round.iteration),
            MasterWork::Stop(_) => Waiting::Shutdown,
        }
    }
}

/// What one iteration's master code produced.
pub(crate) struct Computed<M> {
    pub(crate) result: Arc<M>,
    pub(crate) halt: bool,
    /// Whether a checkpoint of this iteration was saved.
    pub(crate) checkpointed: bool,
    /// The saved checkpoint's bytes, for the workers that keep copies, when the round
    /// asked for them.
    pub(crate) replica: Option<Replica>,
}

/// What the master's code did, for [`MasterNode::handle_master_done`].
pub(crate) enum MasterDone<M, W> {
    /// With the master's first master result, if its `init` made one.
    Started(Result<Option<Arc<M>>, JobError>),
    Iterated {
        iteration: Iteration,
        tally: Tally,
        left_out: Vec<Rank>,
        elapsed: Duration,
        result: Result<Computed<M>, JobError>,
        /// The round's buffers, emptied, for the gate's next rounds.
        spare: Spare<W>,
    },
    Stopped(Result<(), JobError>),
    Restarted(Result<Resumed<M>, JobError>),
    /// What the copy of a checkpoint resumed the master from; `None` when the copy was
    /// damaged (the master goes on from what it had, as a store falls back past a damaged
    /// file).
    Adopted(Result<Option<Resumed<M>>, JobError>),
}

/// What the master's node asks of its transport: which ranks it can reach.
pub(crate) trait Reach {
    /// Whether a message sent to the worker of `rank` can reach it now.
    fn is_connected(&self, rank: Rank) -> bool;
    /// Whether the worker of `rank` may still hear from the master's node: it is
    /// connected, or may yet connect.
    fn may_reach(&self, rank: Rank) -> bool;
    /// What the transport turned away lately that claimed one of `ranks`.
    fn refusals(&self, ranks: &[Rank]) -> Vec<String>;
    /// Whether the worker of `rank` runs on another host than the master's node (`None`:
    /// not known). The default: not known.
    fn on_another_host(&self, rank: Rank) -> Option<bool> {
        let _ = rank;
        None
    }
    /// Why no new process of `rank` will take the place of the one lost, if none will
    /// (its launcher has no restarts left, or starts none again). The default: not known.
    fn no_new_process(&self, rank: Rank) -> Option<String> {
        let _ = rank;
        None
    }
}

/// What the master's node asks its driver to do, in the order it must be done.
pub(crate) enum Action<M, W> {
    /// Send this to the worker of `to`.
    Send { to: Rank, msg: ToWorker<M> },
    /// Send this to every worker.
    Broadcast(ToWorker<M>),
    /// Run the master's code; hand back what it did with
    /// [`MasterNode::handle_master_done`].
    RunMaster(MasterWork<M, W>),
    /// Start a new worker of `rank` (of this process) in `attempt`, in the place of the
    /// one that failed with `cause`. When it cannot be made, say so with
    /// [`MasterNode::handle_failure`].
    ReplaceWorker {
        rank: Rank,
        attempt: Attempt,
        cause: JobError,
    },
    /// Start every worker of this process again in `attempt`.
    ReplaceAll { attempt: Attempt, cause: JobError },
    /// The job failed with this, its first failure: no compute of this process starts
    /// from now on (every worker is told next, with [`ToWorker::Abort`]).
    EndJob(JobError),
    /// Tell the job's subscribers.
    Event(JobEvent),
    /// Give the coordinator this worker's report as it stops (`on_worker_done`).
    Report(WorkerReport),
    /// Run the coordinator's `on_finish` with these reports, the job having ended after
    /// `iteration` (whose checkpoint then records the commit); hand back its outcome with
    /// [`MasterNode::handle_committed`].
    Commit {
        iteration: Iteration,
        reports: Vec<WorkerReport>,
    },
    /// Run the coordinator's `on_error` with the job's failure.
    CleanUp(JobError),
    /// The job ended with this outcome: the node's last action (boxed: the report is
    /// large, and the other actions are many).
    Finished(Box<Result<JobOutcome<M>, JobError>>),
}
