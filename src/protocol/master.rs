//! The master's node as one state machine: registration, rounds, sync epochs, recovery,
//! the schedule and the end of the job.
//!
//! [`MasterNode`] composes the parts — [`Gate`], [`SyncState`], [`Recovery`],
//! [`Schedule`] — and owns every fact of the master's node: the attempt (the gate's), the
//! stage, the last master result, the ranks whose new process is awaited, what each worker
//! reported with its `Done`, and the job's report. It reads no clock and does no I/O: its
//! driver (the runtime's node actor, or the simulator) feeds it what happened with
//! `handle_*` and carries out the [`Action`]s it queues.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{NodeConfig, Save};
use super::{
    Combiner, Envelope, FailurePolicy, Gate, GateOutput, Gathered, HaltedBy, IterationReport,
    JobEvent, JobOutcome, JobReport, Next, Recover, Recovered, Recovery, Schedule, SyncState,
    SyncStep, Tally, ToMaster, ToWorker, Unsent, Wait, WorkerReport,
};

use crate::error::{Cause, Hook, JobError, Phase, Waiting};
use crate::ids::{Attempt, Iteration, Rank};

/// How long the end of a job waits for a rank that may still connect (a worker reconnecting
/// to a master's node started again: its backoff is at most about a second).
const RECONNECT_GRACE: Duration = Duration::from_secs(3);

/// At most how long a wait for workers goes on between two lines that say so (it says so
/// every quarter of its timeout when that is shorter).
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(10);

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
    pub(crate) last: Option<Arc<M>>,
}

/// One iteration's input to the master's code.
pub(crate) struct MasterRound<W> {
    pub(crate) iteration: Iteration,
    pub(crate) gathered: Gathered<W>,
    /// The iteration's span, which the master's compute runs in.
    pub(crate) span: tracing::Span,
    /// Whether the workers' votes halt the job after this iteration (the master's own
    /// halt is known once it computed): a checkpoint of it says so.
    pub(crate) workers_halt: bool,
    /// Whether a checkpoint of the iteration is saved once the master computed it.
    pub(crate) save: Save,
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
}

impl<M, W> MasterWork<M, W> {
    /// What the job waits for while this work runs.
    pub(crate) fn during(&self) -> Waiting {
        match self {
            MasterWork::Start | MasterWork::Restart(_) => Waiting::Registration,
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
}

/// What the master's code did, for [`MasterNode::handle_master_done`].
pub(crate) enum MasterDone<M> {
    /// With the master's first master result, if its `init` made one.
    Started(Result<Option<Arc<M>>, JobError>),
    Iterated {
        iteration: Iteration,
        tally: Tally,
        left_out: Vec<Rank>,
        elapsed: Duration,
        result: Result<Computed<M>, JobError>,
    },
    Stopped(Result<(), JobError>),
    Restarted(Result<Resumed<M>, JobError>),
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
    /// Run the coordinator's `on_finish` with these reports; hand back its outcome with
    /// [`MasterNode::handle_committed`].
    Commit(Vec<WorkerReport>),
    /// Run the coordinator's `on_error` with the job's failure.
    CleanUp(JobError),
    /// The job ended with this outcome: the node's last action.
    Finished(Result<JobOutcome<M>, JobError>),
}

/// Where the master's code is.
#[derive(Debug, Clone, Copy)]
enum MasterAt {
    /// With the node: work can be handed to it.
    Home,
    /// Running work the node handed out.
    Away {
        /// When the work (an iteration's) times out, and since when it runs.
        deadline: Option<(Instant, Instant, Iteration)>,
        /// Every worker restarted meanwhile: what it brings back is the old attempt's.
        discard: bool,
    },
    /// Its work outlived its deadline and may never come back.
    Stuck,
}

/// Where the job stands.
enum Stage<M> {
    /// Start-up of an attempt: the master's `pre_application` (or its restart from a
    /// checkpoint) and the workers' registrations.
    Starting {
        master_ready: bool,
        workers_ready: bool,
    },
    /// Iteration `i` is under way: the workers compute, the gate gathers.
    Gathering(Iteration),
    /// The master computes iteration `i`.
    Computing(Iteration),
    /// The job ends: the workers are told, and their `Done` awaited (`drained` once every
    /// one said it, or the shutdown timeout passed).
    Ending {
        ending: OwnedEnding<M>,
        drained: bool,
    },
    /// The master's `post_application` runs.
    Stopping(OwnedEnding<M>),
    /// The coordinator's `on_finish` runs.
    Committing(OwnedEnding<M>),
    /// The job's outcome is out.
    Done,
}

/// Where the replacement of a rank of another process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaiting {
    None,
    /// The old process still talks (it failed but runs on to its `Done`): its messages
    /// are the old one's until its connection ends.
    OldEnd,
    /// The old connection ended: the next messages of the rank are the new process's.
    Replacement,
}

/// What the node is built from besides its settings: what its process is made of.
pub(crate) struct NodeSettings {
    /// By rank: whether its worker runs in this process (the node replaces those itself).
    pub(crate) local: Vec<bool>,
    /// Whether the job has a coordinator, whose `on_finish` or `on_error` ends it.
    pub(crate) coordinated: bool,
    /// Whether anyone listens to the job's events (they are not made otherwise).
    pub(crate) listening: bool,
}

/// The master's node: registration, rounds, sync epochs, recovery, the schedule and the
/// end of the job, as one state machine.
///
/// # Lifecycle
///
/// `Starting` (the master's start-up and every worker's registration) → `Gathering(i)`
/// (the workers compute `i`) → `Computing(i)` (the master folds it) → `Gathering(i + 1)`
/// … → `Ending` (the workers are told the job's end and their `Done` awaited) →
/// `Stopping` (the master's `post_application`) → `Committing` (the coordinator's
/// `on_finish`, if there is one) → `Done`. A failure from any stage before `Ending`
/// either ends the job (`Ending` with the failure) or is recovered from under the failure
/// policy: a replaced or left-out worker keeps the stage; a restart of every worker goes
/// back to `Starting` as a new attempt, the master from its newest checkpoint. A node
/// built from a checkpoint starts at `Starting` too, and one whose checkpoint is the
/// job's last goes straight to `Ending`.
///
/// # Call order
///
/// Build it with [`new`](MasterNode::new); then, after every `handle_*` call (and after
/// `new`), drain [`poll_action`](MasterNode::poll_action) until it returns `None`,
/// carrying each action out in turn — an action's outcome that is fed back
/// (`handle_master_done`, `handle_failure`, `handle_committed`) may be fed back at once,
/// while draining. Call [`handle_timeout`](MasterNode::handle_timeout) once the instant of
/// [`poll_timeout`](MasterNode::poll_timeout) has passed (calling it early is harmless).
/// `now` never goes backwards. [`Action::Finished`] is the last action.
pub(crate) struct MasterNode<M, W> {
    config: Arc<NodeConfig>,
    settings: NodeSettings,
    gate: Gate<W>,
    sync: SyncState,
    recovery: Recovery,
    schedule: Schedule,
    stage: Stage<M>,
    master: MasterAt,
    /// What the current attempt resumed from: the checkpoint's iteration, and whether it
    /// halted the job.
    resumed: Option<(Iteration, Option<HaltedBy>)>,
    /// The master result the current iteration computes with (the newest one).
    last: Option<Arc<M>>,
    /// By rank: a new process of the rank is awaited (another process's worker was
    /// replaced).
    awaiting: Vec<Awaiting>,
    /// By rank: what its worker reported with its `Done` (the newest of the attempt).
    reports: Vec<Option<WorkerReport>>,
    /// Ranks the end of the job gives until the instant to reconnect.
    reconnecting: Option<(Instant, Vec<Rank>)>,
    report: JobReport,
    /// The last iterations' reports, at most `JobConfig::report_iterations`.
    recent: VecDeque<IterationReport>,
    started: Instant,
    iteration_started: Instant,
    span: Option<tracing::Span>,
    cancelled: bool,
    /// When the current wait for workers was last said to be going on.
    wait_said: Option<Instant>,
    actions: VecDeque<Action<M, W>>,
}

impl<M, W> MasterNode<M, W> {
    /// A node that starts `attempt` at `now` with these settings, from what a checkpoint
    /// gave the master's code (`resumed`); with a combiner, the gate folds each result into
    /// the round's fold as it arrives. Its parts — the gate, the sync state, the recovery
    /// and the schedule — are built here from the settings, and again from them for each
    /// restart of every worker. Its first actions: the `Started` event and the master's
    /// start-up.
    pub(crate) fn new(
        config: Arc<NodeConfig>,
        settings: NodeSettings,
        attempt: Attempt,
        combiner: Option<Combiner<W>>,
        resumed: Resumed<M>,
        now: Instant,
    ) -> Self {
        let c = &config;
        let mut gate = Gate::new(c.gate(attempt), now);
        if let Some(combiner) = combiner {
            gate = gate.combining(combiner);
        }
        let workers = c.workers;
        let mut node = MasterNode {
            gate,
            sync: SyncState::new(workers, c.sync_timeout),
            recovery: Recovery::new(c.policy, workers, c.quorum, attempt),
            schedule: Schedule::new(c.iterations, workers, c.worker_halt),
            stage: Stage::Starting {
                master_ready: false,
                workers_ready: false,
            },
            master: MasterAt::Home,
            resumed: resumed.from,
            last: resumed.last,
            awaiting: vec![Awaiting::None; workers],
            reports: vec![None; workers],
            reconnecting: None,
            report: JobReport {
                resumed_from: resumed.from.map(|(i, _)| i),
                ..JobReport::default()
            },
            recent: VecDeque::new(),
            started: now,
            iteration_started: now,
            span: None,
            cancelled: false,
            wait_said: None,
            actions: VecDeque::new(),
            settings,
            config,
        };
        let c = Arc::clone(&node.config);
        node.event(|| JobEvent::Started {
            job_id: c.job_id.clone(),
            workers: c.workers,
            iterations: c.iterations,
        });
        node.run_master(now, MasterWork::Start);
        node
    }

    /// The next thing to do, in order.
    pub(crate) fn poll_action(&mut self) -> Option<Action<M, W>> {
        self.actions.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) should be called next, if any wait
    /// is under way.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let master = match self.master {
            MasterAt::Away {
                deadline: Some((at, ..)),
                ..
            } => Some(at),
            _ => None,
        };
        [
            self.gate.poll_timeout(),
            self.sync.poll_timeout(),
            master,
            self.reconnecting.as_ref().map(|(at, _)| *at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The attempt under way.
    pub(crate) fn attempt(&self) -> Attempt {
        self.gate.attempt()
    }

    /// Every arrival the gate dropped so far (stale, duplicate, of an unknown rank).
    #[cfg_attr(not(any(feature = "sim", feature = "metrics")), allow(dead_code))]
    pub(crate) fn drops(&self) -> super::Drops {
        self.gate.drops()
    }

    /// The ranks the job goes on without for good.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn lost(&self) -> Vec<Rank> {
        self.gate.lost()
    }

    /// The span of the iteration under way, if one is: the parent of every span of its
    /// work in this process (the workers' computes, the master's).
    pub(crate) fn iteration_span(&self) -> Option<&tracing::Span> {
        self.span.as_ref()
    }

    /// The iteration being gathered, if one is.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn gathering(&self) -> Option<Iteration> {
        match self.stage {
            Stage::Gathering(i) => Some(i),
            _ => None,
        }
    }

    /// Whether the job ends (finished or failed): failures no longer recover.
    fn ending(&self) -> bool {
        matches!(
            self.stage,
            Stage::Ending { .. } | Stage::Stopping(_) | Stage::Committing(_) | Stage::Done
        )
    }

    fn event(&mut self, make: impl FnOnce() -> JobEvent) {
        if self.settings.listening {
            self.actions.push_back(Action::Event(make()));
        }
    }

    fn send(&mut self, to: Rank, msg: ToWorker<M>) {
        self.actions.push_back(Action::Send { to, msg });
    }

    fn run_master(&mut self, now: Instant, work: MasterWork<M, W>) {
        let deadline = match &work {
            MasterWork::Iterate(round) => now
                .checked_add(self.config.iteration_timeout)
                .map(|at| (at, now, round.iteration)),
            _ => None,
        };
        self.master = MasterAt::Away {
            deadline,
            discard: false,
        };
        self.actions.push_back(Action::RunMaster(work));
    }

    // ---- inputs -------------------------------------------------------------------

    /// A worker's message, as the transport handed it over at `now`.
    pub(crate) fn handle_message(
        &mut self,
        now: Instant,
        env: Envelope<ToMaster<W>>,
        reach: &dyn Reach,
    ) {
        let from = env.from;
        match env.msg {
            ToMaster::Sync {
                attempt,
                epoch,
                kind,
                message,
            } => {
                if attempt == self.attempt() {
                    let step = self.sync.on_call(now, from, epoch, kind, message);
                    self.apply(now, step, reach);
                }
                return;
            }
            // (Only barrier mode makes sync calls.)
            ToMaster::Result(ref report)
                if report.attempt == self.attempt() && self.config.barrier_mode =>
            {
                // Its compute returned: it makes no more sync calls this iteration.
                let step = self.sync.on_returned(from, report.iteration);
                self.apply(now, step, reach);
            }
            ToMaster::Done {
                attempt,
                ref rows,
                ref attachments,
            } if attempt == self.attempt() => {
                // A worker that failed runs on to its `Done`: a rank left out, or one whose
                // failed process is still the one talking, never reports as completed.
                let failed =
                    self.gate.is_lost(from) || self.awaiting.get(from) == Some(&Awaiting::OldEnd);
                if let Some(slot) = self.reports.get_mut(from).filter(|_| !failed) {
                    let report = WorkerReport {
                        rank: from,
                        rows: rows.clone(),
                        attachments: attachments.clone(),
                    };
                    if self.settings.coordinated {
                        self.actions.push_back(Action::Report(report.clone()));
                    }
                    *slot = Some(report);
                }
            }
            _ => {}
        }
        // The last message of a connection: its `Done`, or its loss (or its refusal).
        let ends_connection = matches!(
            env.msg,
            ToMaster::Done { .. }
                | ToMaster::Failed {
                    error: JobError::WorkerLost { .. } | JobError::Mismatch { .. },
                    ..
                }
        );
        let done_before = self.gate.is_done(from);
        let registered_before = self.gate.is_registered(from);
        let output = self.gate.on_message(now, env);
        if !done_before && self.gate.is_done(from) {
            self.event(|| JobEvent::WorkerDone { rank: from });
        }
        if !registered_before
            && self.gate.is_registered(from)
            && self.awaiting.get(from) != Some(&Awaiting::None)
        {
            // The new process of a rank replaced before the job started registered: it
            // is the rank's worker now (mid-job, `Rejoined` says the same).
            self.awaiting[from] = Awaiting::None;
            self.recovery.rejoined(from);
            tracing::info!(rank = from, "a replacement worker registered");
        }
        self.on_gate_checked(now, output, reach);
        if ends_connection && self.awaiting.get(from) == Some(&Awaiting::OldEnd) {
            self.awaiting[from] = Awaiting::Replacement;
            self.recovery.rejoined(from);
        }
    }

    /// Time passed: fails waits that timed out, completes rounds with their quorum, gives
    /// up on ranks that did not reconnect, and says which ranks a long wait waits for.
    pub(crate) fn handle_timeout(&mut self, now: Instant, reach: &dyn Reach) {
        if let MasterAt::Away {
            deadline: Some((at, since, iteration)),
            ..
        } = self.master
        {
            if now >= at {
                self.master = MasterAt::Stuck;
                self.fail(
                    now,
                    JobError::MasterTimedOut {
                        during: Waiting::Iteration(iteration),
                        waited: now.saturating_duration_since(since),
                    },
                    reach,
                );
                self.maybe_stop(now);
            }
        }
        let grace_over = self.reconnecting.as_ref().is_some_and(|(at, _)| now >= *at);
        if let Some((_, ranks)) = self.reconnecting.take_if(|_| grace_over) {
            for rank in ranks {
                if !self.gate.is_done(rank) && !reach.is_connected(rank) {
                    tracing::debug!(rank, "did not reconnect after the job ended");
                    self.not_waited_for(now, rank, reach);
                }
            }
        }
        let step = self.sync.handle_timeout(now);
        self.apply(now, step, reach);
        let output = self.gate.handle_timeout(now);
        self.on_gate_checked(now, output, reach);
        self.say_waiting(now);
    }

    /// The job was cancelled: it fails with [`JobError::Cancelled`] (once).
    pub(crate) fn cancel(&mut self, now: Instant, reach: &dyn Reach) {
        if std::mem::replace(&mut self.cancelled, true) {
            return;
        }
        tracing::warn!("the job was cancelled");
        self.fail(now, JobError::Cancelled, reach);
    }

    /// Something the driver did for the node failed (a send, a replacement): the job fails
    /// with `error`, or recovers under its failure policy.
    pub(crate) fn handle_failure(&mut self, now: Instant, error: JobError, reach: &dyn Reach) {
        self.on_failure(now, error, reach);
    }

    /// A message the node asked to send did not go: to the worker of `to`, or (`None`)
    /// to every worker. A message its worker could not read fails the job (or is recovered
    /// from), as it would over a network; a broadcast that does not go fails it; one
    /// worker out of reach is not a failure of its own — the transport reports its loss
    /// when it sees it (its connection closed, its heartbeats gone).
    pub(crate) fn handle_unsent(
        &mut self,
        now: Instant,
        to: Option<Rank>,
        why: Unsent,
        reach: &dyn Reach,
    ) {
        match (to, why) {
            (_, Unsent::Undecodable(error)) => self.on_failure(now, error, reach),
            (Some(rank), Unsent::Replaced) => {
                tracing::debug!(rank, "a message for a worker replaced meanwhile is dropped")
            }
            (Some(rank), Unsent::Failed(error)) => {
                tracing::warn!(rank, %error, "could not reach a worker")
            }
            (None, Unsent::Replaced) => {}
            (None, Unsent::Failed(source)) => {
                let message = format!("could not send to every worker: {source}");
                self.on_failure(now, JobError::transport(message, Some(source)), reach)
            }
        }
    }

    /// The master's code is back with what it did.
    pub(crate) fn handle_master_done(
        &mut self,
        now: Instant,
        done: MasterDone<M>,
        reach: &dyn Reach,
    ) {
        let discard = matches!(self.master, MasterAt::Away { discard: true, .. });
        self.master = MasterAt::Home;
        if discard && !self.ending() {
            // The work was the old attempt's: discarded; the master starts over.
            let attempt = self.attempt();
            self.run_master(now, MasterWork::Restart(attempt));
            return;
        }
        match done {
            MasterDone::Started(Ok(first)) => {
                if first.is_some() {
                    self.last = first;
                }
                self.master_ready(now, reach)
            }
            MasterDone::Restarted(Ok(resumed)) => {
                tracing::info!(attempt = self.attempt(), resumed_from = ?resumed.from.map(|(i, _)| i), "the job starts over as a new attempt");
                self.resumed = resumed.from;
                self.last = resumed.last;
                self.master_ready(now, reach);
            }
            MasterDone::Started(Err(e))
            | MasterDone::Restarted(Err(e))
            | MasterDone::Iterated { result: Err(e), .. } => self.fail(now, e, reach),
            MasterDone::Iterated {
                iteration,
                tally,
                left_out,
                elapsed,
                result:
                    Ok(Computed {
                        result,
                        halt,
                        checkpointed,
                    }),
            } => {
                if checkpointed {
                    self.report.checkpoints.push(iteration);
                }
                if elapsed > self.config.iteration_timeout {
                    // Inline work cannot be timed out while it runs (it holds the thread
                    // the timer would fire on); the deadline still holds once it returns.
                    self.fail(
                        now,
                        JobError::MasterTimedOut {
                            during: Waiting::Iteration(iteration),
                            waited: elapsed,
                        },
                        reach,
                    );
                } else if matches!(self.stage, Stage::Computing(i) if i == iteration) {
                    self.iterated(
                        now, iteration, tally, left_out, elapsed, result, halt, reach,
                    );
                }
            }
            MasterDone::Stopped(result) => {
                if let Err(e) = result {
                    self.fail(now, e, reach);
                }
                self.complete(now);
                return;
            }
        }
        self.maybe_stop(now);
    }

    /// The coordinator's `on_finish` returned: the job completes, or fails with its error.
    pub(crate) fn handle_committed(&mut self, now: Instant, result: Result<(), JobError>) {
        let Stage::Committing(ending) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        let ending = match result {
            Ok(()) => ending,
            Err(error) => OwnedEnding::Failed(error),
        };
        self.finalize(now, ending);
    }

    // ---- the master's side --------------------------------------------------------

    fn master_ready(&mut self, now: Instant, reach: &dyn Reach) {
        if let Stage::Starting { master_ready, .. } = &mut self.stage {
            *master_ready = true;
        }
        self.maybe_begin(now, reach);
    }

    fn maybe_begin(&mut self, now: Instant, reach: &dyn Reach) {
        let Stage::Starting {
            master_ready: true,
            workers_ready,
        } = self.stage
        else {
            return;
        };
        // The checkpoint covers every iteration, or its iteration halted: the job is
        // complete, and ends now with its result — no worker need register (a master
        // started again after its job ended would wait for workers long gone). With a
        // coordinator it waits for them: their reports are what it commits.
        let iterations = self.config.iterations;
        let complete = self
            .resumed
            .is_some_and(|(r, halted)| r >= iterations || halted.is_some());
        let at_once = !self.settings.coordinated || workers_ready;
        match (self.resumed, self.last.clone()) {
            (Some((resumed, halted)), Some(last)) if complete && at_once => {
                tracing::info!(
                    iteration = resumed,
                    "the newest checkpoint is the job's last: the job ends with its result"
                );
                self.finish(now, resumed, halted, last, reach)
            }
            _ if !workers_ready => {}
            (Some((resumed, _)), _) => self.begin(now, resumed + 1, reach),
            (None, _) => {
                let first = self.schedule.first();
                self.begin(now, first, reach)
            }
        }
    }

    /// Opens `iteration` and broadcasts it.
    fn begin(&mut self, now: Instant, iteration: Iteration, reach: &dyn Reach) {
        self.iteration_started = now;
        let attempt = self.attempt();
        let span = tracing::info_span!("iteration", job = %self.config.job_id, iteration, attempt);
        span.in_scope(|| tracing::debug!("iteration started"));
        self.span = Some(span);
        self.event(|| JobEvent::IterationStarted { iteration });
        self.stage = Stage::Gathering(iteration);
        // Open before broadcasting, so no result can arrive before its round.
        self.sync.new_iteration(iteration);
        if !self.gate.open(now, iteration) {
            let error = JobError::Runtime {
                message: format!("iteration {iteration} opened while a wait was under way"),
            };
            return self.on_failure(now, error, reach);
        }
        self.actions.push_back(Action::Broadcast(ToWorker::Iterate {
            attempt: self.attempt(),
            iteration,
            last: self.last.clone(),
        }));
    }

    /// The round of `iteration` is in: the master computes it.
    fn round_complete(&mut self, now: Instant, iteration: Iteration, gathered: Gathered<W>) {
        if !matches!(self.stage, Stage::Gathering(i) if i == iteration) {
            // The job ends (or started over) meanwhile: nothing computes the round.
            return;
        }
        let span = self.span.clone().unwrap_or_else(tracing::Span::none);
        let workers_halt = matches!(
            self.schedule
                .decide(iteration, false, gathered.tally.halt_votes),
            Next::Finish {
                halted: Some(HaltedBy::Workers),
                ..
            }
        );
        self.stage = Stage::Computing(iteration);
        let save = self.config.checkpoint(iteration, workers_halt);
        self.run_master(
            now,
            MasterWork::Iterate(MasterRound {
                iteration,
                gathered,
                span,
                workers_halt,
                save,
            }),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn iterated(
        &mut self,
        now: Instant,
        iteration: Iteration,
        tally: Tally,
        left_out: Vec<Rank>,
        master_elapsed: Duration,
        result: Arc<M>,
        halt: bool,
        reach: &dyn Reach,
    ) {
        if !left_out.is_empty() {
            tracing::warn!(
                iteration,
                ?left_out,
                "the iteration went on without its stragglers (min-workers ratio)"
            );
        }
        let report = IterationReport {
            iteration,
            elapsed: now.saturating_duration_since(self.iteration_started),
            master_elapsed,
            slowest: tally.slowest,
            results_held: tally.results_held,
            left_out,
        };
        if let Some(span) = self.span.take() {
            span.in_scope(|| tracing::debug!(elapsed = ?report.elapsed, "iteration completed"));
        }
        self.event(|| JobEvent::IterationCompleted(report.clone()));
        self.report.totals.add(&report);
        let keep = self.config.report_iterations;
        if keep > 0 {
            if self.recent.len() >= keep {
                self.recent.pop_front();
            }
            self.recent.push_back(report);
        }
        // The result it replaces may be the last reference to it: its `Drop` is the
        // master's code, and must not unwind into the node's driver.
        let previous = self.last.replace(Arc::clone(&result));
        if let Err(cause) = crate::error::drop_guarded(previous) {
            let phase = Phase::Drop;
            return self.fail(
                now,
                JobError::Master {
                    iteration,
                    phase,
                    cause,
                },
                reach,
            );
        }
        match self.schedule.decide(iteration, halt, tally.halt_votes) {
            Next::Iterate(next) => self.begin(now, next, reach),
            Next::Finish { iterations, halted } => {
                self.finish(now, iterations, halted, result, reach)
            }
        }
    }

    /// The job completed after `iterations`: every worker is told, and their `Done`
    /// awaited.
    fn finish(
        &mut self,
        now: Instant,
        iterations: Iteration,
        halted: Option<HaltedBy>,
        last: Arc<M>,
        reach: &dyn Reach,
    ) {
        self.report.halted_by = halted;
        if let Some(by) = halted {
            tracing::info!(iteration = iterations, ?by, "job halted");
            self.event(|| JobEvent::Halted {
                iteration: iterations,
                by,
            });
        }
        self.stage = Stage::Ending {
            ending: OwnedEnding::Completed {
                iterations,
                halted: halted.is_some(),
                last: Arc::clone(&last),
            },
            drained: false,
        };
        self.forget_awaited(now, reach);
        self.actions.push_back(Action::Broadcast(ToWorker::Finish {
            attempt: self.attempt(),
            iterations,
            halted: halted.is_some(),
            last,
        }));
        let output = self.gate.drain(now);
        self.on_gate(now, output, reach);
        self.forget_unconnected(now, reach);
    }

    /// Fails the job: the first failure is kept and sent to every worker at once; later
    /// ones are logged. A failure while a completed job shuts down fails it.
    fn fail(&mut self, now: Instant, error: JobError, reach: &dyn Reach) {
        match &mut self.stage {
            Stage::Ending {
                ending: ending @ OwnedEnding::Completed { .. },
                ..
            }
            | Stage::Stopping(ending @ OwnedEnding::Completed { .. }) => {
                // Every worker is stopping already; the job fails in its shutdown.
                tracing::error!(%error, "job failed during shutdown");
                *ending = OwnedEnding::Failed(error.clone());
                self.event(|| JobEvent::Failed { error });
            }
            Stage::Ending { .. } | Stage::Stopping(_) | Stage::Committing(_) | Stage::Done => {
                tracing::debug!(%error, "a further failure after the job failed");
            }
            Stage::Starting { .. } | Stage::Gathering(_) | Stage::Computing(_) => {
                tracing::error!(%error, "job failed");
                self.event(|| JobEvent::Failed {
                    error: error.clone(),
                });
                self.stage = Stage::Ending {
                    ending: OwnedEnding::Failed(error.clone()),
                    drained: false,
                };
                self.forget_awaited(now, reach);
                self.actions.push_back(Action::EndJob(error.clone()));
                // Release every rank waiting in a sync call at once, with the job's failure.
                let step = self.sync.abort(&error);
                self.apply(now, step, reach);
                self.actions.push_back(Action::Broadcast(ToWorker::Abort {
                    attempt: self.attempt(),
                    error,
                }));
                // A failed job waits only its grace for workers still running user code,
                // and for the master's own code away on the pool (its deadline comes
                // sooner: past it, its `post_application` is skipped).
                let grace = self.config.failure_grace;
                if let MasterAt::Away {
                    deadline: Some((at, ..)),
                    ..
                } = &mut self.master
                {
                    *at = (*at).min(now + grace);
                }
                let output = self.gate.drain_within(now, grace);
                self.on_gate(now, output, reach);
                self.forget_unconnected(now, reach);
            }
        }
    }

    /// Every worker is done: the master's `post_application` runs once its code is home
    /// (or is skipped when that code is stuck).
    fn maybe_stop(&mut self, now: Instant) {
        let drained = matches!(self.stage, Stage::Ending { drained: true, .. });
        if !drained || matches!(self.master, MasterAt::Away { .. }) {
            return;
        }
        let Stage::Ending { ending, .. } = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        self.stage = Stage::Stopping(ending.clone());
        if let MasterAt::Stuck = self.master {
            tracing::warn!("the master's code is still running; its post_application is skipped");
            self.complete(now);
        } else {
            self.run_master(now, MasterWork::Stop(ending));
        }
    }

    /// Every worker stopped by now (or the shutdown timeout passed): the coordinator
    /// commits only what every worker completed, and cleans up after anything else.
    fn complete(&mut self, now: Instant) {
        let Stage::Stopping(ending) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        self.report.attempt = self.attempt();
        if !self.settings.coordinated {
            return self.finalize(now, ending);
        }
        let workers = self.config.workers;
        match ending {
            OwnedEnding::Completed { .. } if self.report.workers.len() < workers => {
                let reported: Vec<Rank> = self.report.workers.iter().map(|w| w.rank).collect();
                let error = JobError::Coordinator {
                    hook: Hook::OnFinish,
                    cause: Cause::from_error(
                        format!(
                            "not run: only worker(s) {reported:?} of {workers} completed, so nothing is committed"
                        )
                        .into(),
                    ),
                };
                self.actions.push_back(Action::CleanUp(error.clone()));
                self.finalize(now, OwnedEnding::Failed(error));
            }
            completed @ OwnedEnding::Completed { .. } => {
                self.stage = Stage::Committing(completed);
                self.actions
                    .push_back(Action::Commit(self.report.workers.clone()));
            }
            OwnedEnding::Failed(error) => {
                self.actions.push_back(Action::CleanUp(error.clone()));
                self.finalize(now, OwnedEnding::Failed(error));
            }
        }
    }

    /// The job's outcome.
    fn finalize(&mut self, now: Instant, ending: OwnedEnding<M>) {
        self.stage = Stage::Done;
        self.report.elapsed = now.saturating_duration_since(self.started);
        let outcome = match ending {
            OwnedEnding::Completed {
                iterations,
                halted,
                last,
            } => {
                let elapsed = self.report.elapsed;
                tracing::info!(iterations, halted, ?elapsed, "job completed");
                self.event(|| JobEvent::Completed {
                    iterations,
                    halted,
                    elapsed,
                });
                Ok(JobOutcome {
                    result: last,
                    iterations,
                    halted,
                    report: JobReport {
                        iterations: self.recent.drain(..).collect(),
                        ..std::mem::take(&mut self.report)
                    },
                })
            }
            OwnedEnding::Failed(error) => Err(error),
        };
        self.actions.push_back(Action::Finished(outcome));
    }

    // ---- the workers' side ----------------------------------------------------------

    /// Says, at a steady interval ([`WAIT_LOG_INTERVAL`], or a quarter of the wait's
    /// timeout), which ranks a long wait waits for: at WARN for start-up and shutdown,
    /// which should be short; at INFO for an iteration — compute may be long by design —
    /// until half its timeout has passed.
    fn say_waiting(&mut self, now: Instant) {
        let Some(Wait {
            during,
            missing,
            since,
            timeout,
        }) = self.gate.waiting()
        else {
            return;
        };
        let waited = now.saturating_duration_since(since);
        let last = self
            .wait_said
            .filter(|&said| said >= since)
            .unwrap_or(since);
        if now.saturating_duration_since(last) < WAIT_LOG_INTERVAL.min(timeout / 4) {
            return;
        }
        self.wait_said = Some(now);
        let quiet = matches!(during, Waiting::Iteration(_)) && waited < timeout / 2;
        if quiet {
            tracing::info!(%during, ?missing, "waiting {waited:.0?} of {timeout:?} in {during} for worker(s) {missing:?}");
        } else {
            tracing::warn!(%during, ?missing, "waiting {waited:.0?} of {timeout:?} in {during} for worker(s) {missing:?}");
        }
    }

    /// The job ends: a rank that the master's node cannot reach any more (its process is
    /// gone, or — on a first master's node — never connected) will not say it is done,
    /// and is not waited for. One that may still connect (a worker of the master's node
    /// this one replaced, reconnecting) is given [`RECONNECT_GRACE`] to, and hear how the
    /// job ended.
    fn forget_unconnected(&mut self, now: Instant, reach: &dyn Reach) {
        let mut later = Vec::new();
        for rank in 0..self.reports.len() {
            if self.gate.is_done(rank) || reach.is_connected(rank) {
                continue;
            }
            if reach.may_reach(rank) {
                later.push(rank);
            } else {
                tracing::debug!(rank, "not connected at the end of the job: not waited for");
                self.not_waited_for(now, rank, reach);
            }
        }
        if !later.is_empty() {
            self.reconnecting = Some((now + RECONNECT_GRACE, later));
        }
    }

    /// The job ends: a rank whose new process has not registered yet is not waited for
    /// (nothing would tell it the job ended).
    fn forget_awaited(&mut self, now: Instant, reach: &dyn Reach) {
        for rank in 0..self.awaiting.len() {
            if self.awaiting[rank] != Awaiting::None {
                self.awaiting[rank] = Awaiting::None;
                tracing::warn!(
                    rank,
                    "the job ended before a new process of the rank joined"
                );
                self.not_waited_for(now, rank, reach);
            }
        }
    }

    /// The rank will not say it is done: the end of the job does not wait for it.
    fn not_waited_for(&mut self, now: Instant, rank: Rank, reach: &dyn Reach) {
        let output = self.gate.lose(now, rank);
        self.on_gate(now, output, reach);
    }

    /// Acts on what the gate said, except that an iteration that timed out while ranks
    /// waited in a sync call fails as that epoch's timeout: it names the ranks that did not
    /// arrive, not every rank of the iteration (the waiting ones had not delivered either).
    fn on_gate_checked(&mut self, now: Instant, output: Option<GateOutput<W>>, reach: &dyn Reach) {
        if let Some(GateOutput::Failed(JobError::WorkersTimedOut {
            during: Waiting::Iteration(_),
            ..
        })) = &output
        {
            if self.sync.is_gathering() {
                let step = self.sync.expire(now);
                self.apply(now, step, reach);
                return;
            }
        }
        self.on_gate(now, output, reach);
    }

    /// Acts on what the gate said.
    fn on_gate(&mut self, now: Instant, output: Option<GateOutput<W>>, reach: &dyn Reach) {
        let Some(output) = output else {
            return;
        };
        match output {
            GateOutput::Failed(mut error) => {
                // A wait for ranks that timed out names what the transport turned away
                // that claimed them (a wrong secret, another job's process).
                if let JobError::WorkersTimedOut {
                    missing, refused, ..
                } = &mut error
                {
                    if refused.is_empty() {
                        *refused = reach.refusals(missing);
                    }
                }
                self.on_failure(now, error, reach);
            }
            GateOutput::AllRegistered => {
                self.recovery.all_registered();
                if let Stage::Starting { workers_ready, .. } = &mut self.stage {
                    *workers_ready = true;
                }
                self.report.startup = now.saturating_duration_since(self.started);
                let elapsed = self.report.startup;
                tracing::debug!(?elapsed, "every worker registered");
                self.event(|| JobEvent::Registered { elapsed });
                self.maybe_begin(now, reach);
            }
            GateOutput::Rejoined { rank, iteration } => {
                self.recovery.rejoined(rank);
                self.awaiting[rank] = Awaiting::None;
                tracing::info!(rank, ?iteration, "a replacement worker joined");
                if let Some(iteration) = iteration {
                    let msg = ToWorker::Iterate {
                        attempt: self.attempt(),
                        iteration,
                        last: self.last.clone(),
                    };
                    self.send(rank, msg);
                }
            }
            GateOutput::RoundComplete {
                iteration,
                gathered,
            } => self.round_complete(now, iteration, gathered),
            GateOutput::Drained {
                missing,
                waited,
                drops,
            } => {
                let reports: Vec<WorkerReport> =
                    self.reports.iter_mut().filter_map(Option::take).collect();
                for worker in &reports {
                    self.report.rows.add(&worker.rows);
                }
                self.report.workers = reports;
                self.report.drops = drops;
                if !missing.is_empty() {
                    let error = JobError::WorkersTimedOut {
                        during: Waiting::Shutdown,
                        missing,
                        waited,
                        refused: Vec::new(),
                    };
                    let completed = matches!(
                        self.stage,
                        Stage::Ending {
                            ending: OwnedEnding::Completed { .. },
                            ..
                        }
                    );
                    if completed {
                        self.fail(now, error, reach);
                    } else {
                        let ranks = match &error {
                            JobError::WorkersTimedOut { missing, .. } => missing.clone(),
                            _ => Vec::new(),
                        };
                        tracing::warn!(
                            ?ranks,
                            "the job failed; worker(s) {ranks:?} still run user code after the failure grace and are left to end on their own threads"
                        );
                    }
                }
                if let Stage::Ending { drained, .. } = &mut self.stage {
                    *drained = true;
                }
                self.maybe_stop(now);
            }
        }
    }

    /// A failure: the job's end, or one the failure policy recovers from.
    fn on_failure(&mut self, now: Instant, error: JobError, reach: &dyn Reach) {
        if self.ending() {
            // A worker that fails while the job ends is not waited for. Under a policy
            // that can do without a worker (a straggler of the last round, say) the job
            // still ends as it was ending; under `Fail`, and for any failure that is not
            // a worker's, the job fails.
            let rank = Recovery::recoverable(&error);
            match rank {
                Some(rank) if self.recovery.policy() != FailurePolicy::Fail => {
                    tracing::warn!(rank, %error, "a worker failed while the job ended");
                }
                _ => self.fail(now, error, reach),
            }
            if let Some(rank) = rank {
                self.not_waited_for(now, rank, reach);
            }
            return;
        }
        let Some(action) = self.recovery.on_failure(error.clone()) else {
            tracing::debug!(%error, "a further report of a failure being recovered from");
            return;
        };
        match &action {
            Recover::Fail(error) => return self.fail(now, error.clone(), reach),
            Recover::RestartWorker(rank) => {
                let rank = *rank;
                if self.settings.local[rank] {
                    self.actions.push_back(Action::ReplaceWorker {
                        rank,
                        attempt: self.attempt(),
                        cause: error.clone(),
                    });
                    // The old worker's link is closed: whatever the rank says from now on
                    // is the replacement's, and a failure of it is a new one.
                    self.recovery.rejoined(rank);
                } else {
                    // A new process of the rank connects and registers. Until the old
                    // one's connection ended (its `Done`, or its loss — which may be this
                    // very failure: see `handle_message`), what the rank says is still
                    // the old one's.
                    self.awaiting[rank] = Awaiting::OldEnd;
                    self.dismiss(rank, &error, reach);
                }
                self.gate.rejoin(rank);
            }
            Recover::LeaveOut(rank) => {
                let rank = *rank;
                if !self.settings.local[rank] {
                    self.dismiss(rank, &error, reach);
                }
                self.schedule.leave_out();
            }
            Recover::RestartAll(attempt) => {
                let attempt = *attempt;
                // Release the old attempt's ranks waiting in a sync call first, while their
                // links still reach them.
                let step = self.sync.abort(&error);
                self.apply(now, step, reach);
                self.gate.restart(now, attempt);
                self.sync.restart();
                self.last = None;
                self.actions.push_back(Action::ReplaceAll {
                    attempt,
                    cause: error.clone(),
                });
                // Every rank is back; the master starts over from its newest checkpoint.
                let c = &self.config;
                self.schedule = Schedule::new(c.iterations, c.workers, c.worker_halt);
                self.span = None;
                self.stage = Stage::Starting {
                    master_ready: false,
                    workers_ready: false,
                };
            }
        }
        tracing::warn!(cause = %error, ?action, "recovering from a worker's failure");
        let recovered = Recovered {
            cause: error,
            action: action.clone(),
        };
        self.event(|| JobEvent::Recovering(recovered.clone()));
        self.report.recoveries.push(recovered);
        match action {
            Recover::LeaveOut(rank) => {
                let output = self.gate.lose(now, rank);
                self.on_gate_checked(now, output, reach);
            }
            Recover::RestartAll(attempt) => match &mut self.master {
                MasterAt::Home => self.run_master(now, MasterWork::Restart(attempt)),
                MasterAt::Away { discard, .. } => *discard = true,
                MasterAt::Stuck => {}
            },
            _ => {}
        }
    }

    /// Tells the failed worker of another process, still connected, that the job is over
    /// for it (with its own failure): the job goes on without it, and its process ends
    /// now rather than waiting to hear how the job ends.
    fn dismiss(&mut self, rank: Rank, error: &JobError, reach: &dyn Reach) {
        // A lost or refused process has no connection: one of the rank now is a new one.
        let gone = matches!(
            error,
            JobError::WorkerLost { .. } | JobError::Mismatch { .. }
        );
        if !gone && reach.is_connected(rank) {
            let msg = ToWorker::Abort {
                attempt: self.attempt(),
                error: error.clone(),
            };
            self.send(rank, msg);
        }
    }

    /// Sends the answers of a sync step, and fails the job if the step says so.
    fn apply(&mut self, now: Instant, step: SyncStep, reach: &dyn Reach) {
        for (rank, epoch, result) in step.replies {
            let msg = ToWorker::SyncReply {
                attempt: self.attempt(),
                epoch,
                result,
            };
            self.send(rank, msg);
        }
        if let Some(error) = step.failed {
            self.on_gate(now, Some(GateOutput::Failed(JobError::Sync(error))), reach);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Report, RowCounts};

    /// Every rank connected.
    struct Connected;

    impl Reach for Connected {
        fn is_connected(&self, _: Rank) -> bool {
            true
        }
        fn may_reach(&self, _: Rank) -> bool {
            true
        }
        fn refusals(&self, _: &[Rank]) -> Vec<String> {
            Vec::new()
        }
    }

    type Node = MasterNode<u32, u32>;

    /// A driver that carries out nothing but the master's code, which returns the sum of
    /// the workers' results and never halts.
    struct Harness {
        node: Node,
        t: Instant,
        sent: Vec<ToWorker<u32>>,
        /// The job's failure, each time the node said it, and where in what was sent.
        ended: Vec<(JobError, usize)>,
        /// Each round handed to the master's code, and whether its checkpoint was due.
        rounds: Vec<(Iteration, Save)>,
        finished: Option<Result<JobOutcome<u32>, JobError>>,
    }

    impl Harness {
        fn new(workers: usize, iterations: Iteration, policy: FailurePolicy) -> Self {
            Harness::with(NodeConfig {
                workers,
                iterations,
                policy,
                quorum: workers,
                ..NodeConfig::for_tests()
            })
        }

        fn with(config: NodeConfig) -> Self {
            let workers = config.workers;
            let t = Instant::now();
            let node = MasterNode::new(
                Arc::new(config),
                NodeSettings {
                    local: vec![true; workers],
                    coordinated: false,
                    listening: false,
                },
                0,
                None,
                Resumed {
                    from: None,
                    last: None,
                },
                t,
            );
            let mut h = Harness {
                node,
                t,
                sent: Vec::new(),
                ended: Vec::new(),
                rounds: Vec::new(),
                finished: None,
            };
            h.drive();
            h
        }

        fn drive(&mut self) {
            while let Some(action) = self.node.poll_action() {
                match action {
                    Action::Send { msg, .. } | Action::Broadcast(msg) => self.sent.push(msg),
                    Action::EndJob(error) => self.ended.push((error, self.sent.len())),
                    Action::RunMaster(work) => {
                        if let MasterWork::Iterate(round) = &work {
                            self.rounds.push((round.iteration, round.save));
                        }
                        let done = match work {
                            MasterWork::Start => MasterDone::Started(Ok(None)),
                            MasterWork::Restart(_) => MasterDone::Restarted(Ok(Resumed {
                                from: None,
                                last: None,
                            })),
                            MasterWork::Stop(_) => MasterDone::Stopped(Ok(())),
                            MasterWork::Iterate(round) => MasterDone::Iterated {
                                iteration: round.iteration,
                                tally: round.gathered.tally,
                                left_out: Vec::new(),
                                elapsed: Duration::ZERO,
                                result: Ok(Computed {
                                    result: Arc::new(round.gathered.results.iter().sum()),
                                    halt: false,
                                    checkpointed: false,
                                }),
                            },
                        };
                        self.node.handle_master_done(self.t, done, &Connected);
                    }
                    Action::Finished(outcome) => self.finished = Some(outcome),
                    _ => {}
                }
            }
        }

        fn from(&mut self, rank: Rank, msg: ToMaster<u32>) {
            self.node
                .handle_message(self.t, Envelope { from: rank, msg }, &Connected);
            self.drive();
        }

        fn result(&mut self, rank: Rank, iteration: Iteration, result: u32) {
            let report = Report {
                attempt: 0,
                iteration,
                result,
                halt_vote: false,
                elapsed: Duration::ZERO,
            };
            self.from(rank, ToMaster::Result(report));
        }

        fn done(&mut self, rank: Rank) {
            let done = ToMaster::Done {
                attempt: 0,
                rows: RowCounts::default(),
                attachments: Vec::new(),
            };
            self.from(rank, done);
        }
    }

    fn lost(rank: Rank) -> ToMaster<u32> {
        ToMaster::Failed {
            attempt: 0,
            error: JobError::WorkerLost {
                rank,
                reason: "its connection closed".into(),
            },
        }
    }

    #[test]
    fn a_job_runs_from_registration_through_its_rounds_to_the_drain() {
        let mut h = Harness::new(2, 2, FailurePolicy::Fail);
        h.from(0, ToMaster::Registered { attempt: 0 });
        assert!(
            h.sent.is_empty(),
            "no iteration before every rank registered"
        );
        h.from(1, ToMaster::Registered { attempt: 0 });
        assert!(matches!(
            h.sent[..],
            [ToWorker::Iterate { iteration: 1, .. }]
        ));
        h.result(1, 1, 5);
        h.result(0, 1, 2);
        assert!(matches!(
            h.sent[1],
            ToWorker::Iterate { iteration: 2, last: Some(ref last), .. } if **last == 7
        ));
        h.result(0, 2, 1);
        h.result(1, 2, 1);
        assert!(matches!(h.sent[2], ToWorker::Finish { iterations: 2, .. }));
        assert!(
            h.finished.is_none(),
            "the job waits for every worker's Done"
        );
        h.done(0);
        h.done(1);
        let outcome = h.finished.take().expect("finished").expect("completed");
        assert_eq!(*outcome.result, 2);
        assert_eq!(outcome.report.iterations.len(), 2);
    }

    /// Regression: the gate answered one output per message, so a worker lost during the
    /// drain — the last rank it waited for — ended the drain and its failure was dropped:
    /// the job completed under `Fail` though a worker never finished.
    #[test]
    fn under_fail_a_worker_lost_during_the_drain_fails_the_job_instead_of_ending_the_drain() {
        let mut h = Harness::new(2, 1, FailurePolicy::Fail);
        h.from(0, ToMaster::Registered { attempt: 0 });
        h.from(1, ToMaster::Registered { attempt: 0 });
        h.result(0, 1, 1);
        h.result(1, 1, 1);
        assert!(matches!(h.sent.last(), Some(ToWorker::Finish { .. })));
        h.done(0);
        h.from(1, lost(1));
        match h.finished.take() {
            Some(Err(JobError::WorkerLost { rank: 1, .. })) => {}
            other => panic!("expected the job to fail with worker 1's loss, got {other:?}"),
        }
    }

    #[test]
    fn under_continue_without_a_worker_lost_during_the_drain_is_not_waited_for() {
        let mut h = Harness::new(2, 1, FailurePolicy::ContinueWithout);
        h.from(0, ToMaster::Registered { attempt: 0 });
        h.from(1, ToMaster::Registered { attempt: 0 });
        h.result(0, 1, 1);
        h.result(1, 1, 1);
        h.done(0);
        h.from(1, lost(1));
        assert!(matches!(h.finished.take(), Some(Ok(_))));
    }

    #[test]
    fn the_first_failure_is_the_job_s_and_every_worker_is_told_at_once() {
        let mut h = Harness::new(3, 5, FailurePolicy::Fail);
        for rank in 0..3 {
            h.from(rank, ToMaster::Registered { attempt: 0 });
        }
        h.result(0, 1, 1);
        h.from(2, lost(2));
        h.from(1, lost(1));
        assert!(
            matches!(
                h.sent.last(),
                Some(ToWorker::Abort {
                    error: JobError::WorkerLost { rank: 2, .. },
                    ..
                })
            ),
            "{:?}",
            h.sent.last()
        );
        h.done(0);
        match h.finished.take() {
            Some(Err(JobError::WorkerLost { rank: 2, .. })) => {}
            other => panic!("expected worker 2's loss, got {other:?}"),
        }
    }

    #[test]
    fn a_round_completed_after_the_job_failed_is_never_computed() {
        let mut h = Harness::new(2, 5, FailurePolicy::Fail);
        h.from(0, ToMaster::Registered { attempt: 0 });
        h.from(1, ToMaster::Registered { attempt: 0 });
        let error = JobError::Cancelled;
        h.node.cancel(h.t, &Connected);
        h.drive();
        assert!(matches!(h.sent.last(), Some(ToWorker::Abort { .. })));
        h.result(0, 1, 1);
        h.result(1, 1, 1);
        h.done(0);
        h.done(1);
        assert_eq!(h.finished.take().map(|r| r.err()), Some(Some(error)));
    }

    fn registered(h: &mut Harness) {
        for rank in 0..h.node.config.workers {
            h.from(rank, ToMaster::Registered { attempt: 0 });
        }
    }

    #[test]
    fn the_job_s_end_is_said_once_before_any_worker_is_told_of_it() {
        let mut h = Harness::new(3, 5, FailurePolicy::Fail);
        registered(&mut h);
        h.from(2, lost(2));
        h.from(1, lost(1));
        assert_eq!(h.ended.len(), 1, "once: {:?}", h.ended);
        let (error, at) = &h.ended[0];
        assert_eq!(error.rank(), Some(2));
        assert!(
            matches!(h.sent[*at], ToWorker::Abort { .. }),
            "the abort is the next message: {:?}",
            &h.sent[*at..]
        );
    }

    #[test]
    fn a_message_a_worker_cannot_read_fails_the_job_and_a_worker_out_of_reach_does_not() {
        let mut h = Harness::new(2, 5, FailurePolicy::Fail);
        registered(&mut h);
        let gone = Unsent::Failed(crate::ErrorSource::new(std::io::Error::other("reset")));
        h.node.handle_unsent(h.t, Some(1), gone, &Connected);
        h.node
            .handle_unsent(h.t, Some(1), Unsent::Replaced, &Connected);
        h.drive();
        assert!(h.ended.is_empty(), "its loss is the transport's to report");
        let unreadable = JobError::Decode {
            direction: "master → worker 1".into(),
            type_name: "u32".into(),
            peer: "10.0.0.2:7000".into(),
            message: "invalid type".into(),
        };
        h.node.handle_unsent(
            h.t,
            Some(1),
            Unsent::Undecodable(unreadable.clone()),
            &Connected,
        );
        h.drive();
        assert_eq!(h.ended.first().map(|(e, _)| e), Some(&unreadable));
    }

    #[test]
    fn a_broadcast_that_does_not_go_fails_the_job_keeping_the_transports_error() {
        let mut h = Harness::new(2, 5, FailurePolicy::Fail);
        registered(&mut h);
        let closed = Unsent::Failed(crate::ErrorSource::new(std::io::Error::other("closed")));
        h.node.handle_unsent(h.t, None, closed, &Connected);
        h.drive();
        let (error, _) = h.ended.first().expect("the job failed");
        assert!(matches!(error, JobError::Transport { .. }), "{error}");
        let source = std::error::Error::source(error).expect("its source");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
    }

    #[test]
    fn each_round_goes_to_the_master_with_whether_its_checkpoint_is_due() {
        let mut h = Harness::with(NodeConfig {
            workers: 1,
            iterations: 5,
            checkpoint_every: Some(2),
            ..NodeConfig::for_tests()
        });
        registered(&mut h);
        for iteration in 1..=5 {
            h.result(0, iteration, 1);
        }
        use Save::{IfMasterHalts as Halts, Yes};
        assert_eq!(
            h.rounds,
            [(1, Halts), (2, Yes), (3, Halts), (4, Yes), (5, Yes)]
        );
    }
}
