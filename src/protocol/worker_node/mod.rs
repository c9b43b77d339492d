//! A worker's node: its whole lifecycle as one state machine — start-up and
//! registration, iterations (one at a time, a straggler skipping to the newest), sync
//! answers, registering again with a master started again, its own failure, the job's
//! failure (the verdict), its stop, and the timers of each — with no I/O and no clock:
//! time comes in as `now`.
//!
//! Call order: [`WorkerNode::start`] once; then, as they happen,
//! [`handle_message`](WorkerNode::handle_message) (the master's messages, in order),
//! [`handle_worked`](WorkerNode::handle_worked) (a unit of the worker's code came back),
//! [`handle_sent`](WorkerNode::handle_sent) (right after carrying out a
//! [`WorkerAction::SendResult`]) and [`handle_timeout`](WorkerNode::handle_timeout) (once
//! the instant of [`poll_timeout`](WorkerNode::poll_timeout) has passed; calling it early
//! is harmless); after each, carry out every [`poll_action`](WorkerNode::poll_action) in
//! order, then arm one timer for [`poll_timeout`](WorkerNode::poll_timeout). `now` never
//! goes backwards.
//!
//! A driver that runs an iteration at once may take its common case without the action
//! queue: [`iterate_at_once`](WorkerNode::iterate_at_once) in place of `handle_message`
//! (it gives back a message that is not such an iteration), the work run, then
//! [`handle_iterated`](WorkerNode::handle_iterated) with its report in place of
//! `handle_worked`, the report sent and [`handle_sent`](WorkerNode::handle_sent) told;
//! then the actions and the timer as after any input.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::WorkerConfig;
use super::{
    OwnedEnding, Report, SyncResult, ToMaster, ToWorker, Unsent, WorkerCommand, WorkerSave,
    WorkerState,
};

use crate::error::{JobError, Waiting};
use crate::ids::{Attempt, Epoch, FoldRoute, GroupId, Iteration, Rank};

/// One unit of a worker's code.
pub(crate) enum Work<M> {
    Start,
    /// An iteration.
    Iterate(Assignment<M>),
    /// Its end, boxed: a unit of work moves on its way to the code every round, and this
    /// one comes once.
    Stop(Box<OwnedEnding<M>>),
}

/// One iteration for a worker's code to compute, as the master's `Iterate` says it.
pub(crate) struct Assignment<M> {
    pub(crate) iteration: Iteration,
    /// The master result of the iteration before.
    pub(crate) last: Option<Arc<M>>,
    /// How the workers fold their results.
    pub(crate) fold: FoldRoute,
    /// Whether the worker saves what it needs to resume, for the iteration's checkpoint.
    pub(crate) save: bool,
    /// In the first iteration of an attempt resumed from a checkpoint: what this worker
    /// saved in it, restored before the compute.
    pub(crate) restore: Option<Arc<WorkerSave>>,
}

/// What a unit of a worker's code ended with. Its errors are boxed: an iteration's
/// outcome moves a few times on its way home every round, and one that failed is rare.
pub(crate) enum Worked<W> {
    Started(Result<(), Box<JobError>>),
    Iterated(Result<Report<W>, Box<JobError>>),
    /// The iteration was not computed: the job had failed by the time it would start.
    Skipped,
    Stopped(Result<(), Box<JobError>>),
}

/// What a worker's node asks its driver to do, in the order it must be done.
pub(crate) enum WorkerAction<M, W> {
    /// Run this unit of the worker's code (where placement says), and hand back what it
    /// did with [`WorkerNode::handle_worked`].
    Run(Work<M>),
    /// Send this to the master's node.
    Send(ToMaster<W>),
    /// Send this result, then say at once how that went with [`WorkerNode::handle_sent`].
    SendResult(Report<W>),
    /// Send the worker's report, from its code's context (`WorkerTask::done`): its last
    /// message, unless it `awaits_word` on its own failure (`ToMaster::Done`).
    SendDone { awaits_word: bool },
    /// Hand this answer to the compute waiting in a sync call: of this epoch, of this
    /// group's calls.
    Answer((Epoch, GroupId), SyncResult),
    /// The job's first failure is known: a sync call waiting, and every later one, fails
    /// with it, and code given up on ends with it.
    Verdict(JobError),
    /// A sync call waiting, and every later one, fails with this (the worker failed, and
    /// no answer is coming).
    EndSync(JobError),
    /// This worker's failure ends the job (`FailurePolicy::Fail`): no compute of its
    /// process starts from now on.
    EndJob(JobError),
    /// The iteration away belongs to a master this worker left behind: what it brings back
    /// is stale, and its failure ends nothing.
    MarkStale,
    /// How the job ended for this worker: reported once.
    Report(OwnedEnding<M>),
    /// The worker is done; nothing follows.
    Stop,
}

/// A timer of a worker's node. Each fires at most once; each is armed once, except the
/// wait for the master's word, suspended while the link reaches a master again and
/// armed anew when it did (`Timers::set`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The job failed while the worker's code was away: the failure grace it is given.
    Grace,
    /// The worker began to stop: the shutdown timeout its stop is given.
    StopDeadline,
    /// The worker stopped on its own failure: how long it waits for the master's word.
    Verdict,
}

impl Timer {
    const ALL: [Timer; 3] = [Timer::Grace, Timer::StopDeadline, Timer::Verdict];
}

/// Where one timer stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Deadline {
    #[default]
    Unarmed,
    At(Instant),
    /// Armed with a duration that has no end: it never fires.
    Never,
    Fired,
}

/// The node's timers (quinn-proto's `TimerTable`): when each fires, and the earliest of
/// them, kept as they change (it is read after every input: most never arm one).
#[derive(Debug, Default)]
struct Timers {
    deadlines: [Deadline; 3],
    next: Option<Instant>,
}

impl Timers {
    /// Arms `timer` to fire `after` from `now`, unless it was armed before.
    fn arm(&mut self, timer: Timer, now: Instant, after: Duration) {
        let slot = &mut self.deadlines[timer as usize];
        if *slot == Deadline::Unarmed {
            *slot = now.checked_add(after).map_or(Deadline::Never, Deadline::At);
            self.next = self.earliest();
        }
    }

    /// The earliest instant a timer fires at.
    fn next(&self) -> Option<Instant> {
        self.next
    }

    fn earliest(&self) -> Option<Instant> {
        self.deadlines
            .iter()
            .filter_map(|d| match d {
                Deadline::At(at) => Some(*at),
                _ => None,
            })
            .min()
    }

    /// Sets `timer` anew, armed or not: the one wait that is suspended and resumed (the
    /// wait for the master's word, while its link reaches a master again).
    fn set(&mut self, timer: Timer, deadline: Deadline) {
        self.deadlines[timer as usize] = deadline;
        self.next = self.earliest();
    }

    /// Whether `timer` is due at `now`: if so, it is fired (it never fires again).
    fn fire(&mut self, timer: Timer, now: Instant) -> bool {
        let slot = &mut self.deadlines[timer as usize];
        match *slot {
            Deadline::At(at) if now >= at => {
                *slot = Deadline::Fired;
                self.next = self.earliest();
                true
            }
            _ => false,
        }
    }
}

/// Where the worker stands.
enum Stage<M> {
    /// Its start-up (`pre_application`, `init`) has not returned: it registers once it
    /// has.
    Starting,
    /// It started: it computes the iterations the master sends it.
    Running,
    /// Its stop (`post_application`) was handed out, with how the job ended for it.
    Stopping(OwnedEnding<M>),
    /// It stopped on its own failure, which may not be the job's first: it waits for the
    /// master's word (its abort) to report the job's first failure, else its own.
    AwaitingVerdict(OwnedEnding<M>),
    /// It reported how the job ended for it (or gave up on its code): nothing follows.
    Ended,
}

/// Where the worker's code is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    /// Here: a unit of work can be handed to it.
    Home,
    /// Away, running its start-up.
    Starting,
    /// Away, computing an iteration; `stale` once it belongs to a master this worker left
    /// behind.
    Iterating { stale: bool },
    /// Away, running its stop.
    Stopping,
}

/// What waits for the code to come home.
enum Queued<M> {
    /// The newest iteration that arrived meanwhile: a straggler the job went on without
    /// skips to it, past any iteration it missed.
    Iterate(Assignment<M>),
    /// The worker's stop.
    Stop(OwnedEnding<M>),
}

/// What the worker knows of the job's first failure.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Nothing: the job runs, as far as this worker knows.
    Unknown,
    /// This worker failed before it heard of any failure: its own may be the job's first.
    OwnFirst,
    /// The master (or the transport, for a lost master) said the job failed with this.
    Heard(JobError),
}

/// A worker's lifecycle (see the [module docs](self) for the call order).
///
/// # Lifecycle
///
/// `Starting` (its `init` runs; it registers once it returns) → `Running` (it computes
/// each iteration it is sent, one at a time; one that arrives while it computes waits, and
/// a newer one replaces it) → `Stopping` (its `post_application` runs, once the master
/// says the job ended or its own code failed) → `Ended` (it reported how the job ended for
/// it). A worker that stopped on its own failure passes through `AwaitingVerdict`: the
/// master's abort says whether another failure came first. Three timers bound the waits:
/// the failure grace for code still away when the job failed, the shutdown timeout for the
/// stop, and the wait for the master's verdict.
pub(crate) struct WorkerNode<M, W> {
    rank: Rank,
    config: Arc<WorkerConfig>,
    /// Which of the master's messages to act on; the attempt the worker runs in.
    state: WorkerState,
    stage: Stage<M>,
    code: Code,
    queued: Option<Queued<M>>,
    /// What the checkpoint the attempt resumes from holds for this worker, until the
    /// attempt's first compute restores it.
    restore: Option<Arc<WorkerSave>>,
    verdict: Verdict,
    /// Its link lost the master's node and tries to reach one again (`Reconnecting`,
    /// until the next `Connected`).
    master_away: bool,
    timers: Timers,
    actions: VecDeque<WorkerAction<M, W>>,
}

impl<M, W> WorkerNode<M, W> {
    /// The worker of `rank`, starting in `attempt`, with the job's settings for workers.
    pub(crate) fn new(rank: Rank, attempt: Attempt, config: Arc<WorkerConfig>) -> Self {
        WorkerNode {
            rank,
            config,
            state: WorkerState::new(attempt),
            stage: Stage::Starting,
            code: Code::Home,
            queued: None,
            restore: None,
            verdict: Verdict::Unknown,
            master_away: false,
            timers: Timers::default(),
            actions: VecDeque::new(),
        }
    }

    /// The attempt the worker runs in: its code runs each unit of work in it.
    pub(crate) fn attempt(&self) -> Attempt {
        self.state.attempt()
    }

    /// Whether the job ended for this worker (its verdict is known, or it began to stop):
    /// nothing waits for what it says any more.
    pub(crate) fn has_ended(&self) -> bool {
        matches!(self.verdict, Verdict::Heard(_))
            || !matches!(self.stage, Stage::Starting | Stage::Running)
    }

    /// The next thing to do.
    pub(crate) fn poll_action(&mut self) -> Option<WorkerAction<M, W>> {
        self.actions.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) should be called next, if a timer
    /// is armed.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.stage {
            Stage::Ended => None,
            _ => self.timers.next(),
        }
    }

    /// Starts the worker: its `init` (and interceptors' `pre_application`) runs.
    pub(crate) fn start(&mut self) {
        self.dispatch(Work::Start);
    }

    /// A message from the master's node (or the transport's word about it), at `now`.
    pub(crate) fn handle_message(&mut self, now: Instant, msg: ToWorker<M>) {
        if let Some(step) = self.iterate_at_once(&msg) {
            return self
                .actions
                .push_back(WorkerAction::Run(Work::Iterate(step)));
        }
        match &msg {
            ToWorker::Abort { attempt, error } if *attempt == self.attempt() => {
                let error = error.clone();
                self.hear_verdict(now, &error);
            }
            ToWorker::Reconnecting { reason } => self.master_away(reason),
            // A master's node reached again will say nothing of the attempt this worker's
            // failure belongs to: it waits the verdict grace from now, and ends with its
            // own failure (in a job whose failures restart every worker, its process
            // replaces it first).
            ToWorker::Connected { .. } => {
                self.master_away = false;
                if matches!(self.stage, Stage::AwaitingVerdict(_)) {
                    let deadline = now
                        .checked_add(self.config.verdict_grace)
                        .map_or(Deadline::Never, Deadline::At);
                    self.timers.set(Timer::Verdict, deadline);
                }
            }
            // The job completed without this worker's failure mattering (the policy went
            // on without it): its own failure is its ending.
            ToWorker::Finish { attempt, .. }
                if *attempt == self.attempt()
                    && matches!(self.stage, Stage::AwaitingVerdict(_)) =>
            {
                self.end_unheard();
                return;
            }
            _ => {}
        }
        match self.state.on_message(&msg) {
            WorkerCommand::Compute(iteration) => {
                let ToWorker::Iterate {
                    last, fold, save, ..
                } = msg
                else {
                    return;
                };
                let step = Assignment {
                    iteration,
                    last,
                    fold,
                    save,
                    restore: None,
                };
                if matches!(self.code, Code::Home) {
                    self.iterate(step);
                } else if let Some(Queued::Iterate(Assignment {
                    iteration: skipped, ..
                })) = self.queued.replace(Queued::Iterate(step))
                {
                    // Still computing an iteration the job went on without: it skips to
                    // the newest when it returns (its late result is dropped as stale).
                    tracing::debug!(rank = self.rank, skipped, "a straggler skips an iteration");
                }
            }
            WorkerCommand::Stop => {
                if let Some(ending) = OwnedEnding::told(msg) {
                    self.begin_stop(now, ending);
                }
            }
            WorkerCommand::Answer => {
                if let ToWorker::SyncReply {
                    epoch,
                    group,
                    result,
                    ..
                } = msg
                {
                    self.actions
                        .push_back(WorkerAction::Answer((epoch, group), result.map_err(|e| *e)));
                }
            }
            WorkerCommand::Restore => {
                if let ToWorker::Restore { save, .. } = msg {
                    self.restore = Some(save);
                }
            }
            WorkerCommand::Register(attempt) => self.register_again(now, attempt),
            WorkerCommand::Proceed => {}
            WorkerCommand::Drop => {
                tracing::trace!(rank = self.rank, %msg, "dropped a message from the master");
            }
        }
    }

    /// The common case of [`handle_message`](Self::handle_message), for a driver that
    /// runs an iteration at once, without the action queue: `msg` is an iteration this
    /// worker computes now — one it takes, its code at home. Returns the iteration's
    /// work (the master result shared, not copied), which the driver runs as it would a
    /// [`WorkerAction::Run`] (its outcome handed to
    /// [`handle_iterated`](Self::handle_iterated) or [`handle_worked`](Self::handle_worked));
    /// else `None`, the node untouched, for `handle_message` to take `msg`.
    /// (`handle_message` takes this way itself: one rule.)
    #[inline]
    pub(crate) fn iterate_at_once(&mut self, msg: &ToWorker<M>) -> Option<Assignment<M>> {
        let ToWorker::Iterate {
            attempt,
            iteration,
            ref last,
            fold,
            save,
        } = *msg
        else {
            return None;
        };
        if self.code != Code::Home || !self.state.takes(attempt, iteration) {
            return None;
        }
        self.code = Code::Iterating { stale: false };
        Some(Assignment {
            iteration,
            last: last.clone(),
            fold,
            save,
            restore: self.restore.take(),
        })
    }

    /// The common case of [`handle_worked`](Self::handle_worked), without the action
    /// queue: an iteration came home with its `report`. Returns the report for the
    /// driver to send at once, then to say how that went with
    /// [`handle_sent`](Self::handle_sent), as it would a [`WorkerAction::SendResult`];
    /// `None` when the report is not to be sent (of a master this worker left behind).
    #[inline]
    pub(crate) fn handle_iterated(&mut self, now: Instant, report: Report<W>) -> Option<Report<W>> {
        let was = std::mem::replace(&mut self.code, Code::Home);
        if matches!(was, Code::Iterating { stale: true }) {
            tracing::debug!(
                rank = self.rank,
                "dropped the outcome of an iteration of the master this worker left behind"
            );
            self.after_work(now);
            return None;
        }
        Some(report)
    }

    /// A unit of the worker's code came back with `worked`, at `now`.
    #[inline]
    pub(crate) fn handle_worked(&mut self, now: Instant, worked: Worked<W>) {
        let worked = match worked {
            Worked::Iterated(Ok(report)) => {
                if let Some(report) = self.handle_iterated(now, report) {
                    self.actions.push_back(WorkerAction::SendResult(report));
                }
                return;
            }
            worked => worked,
        };
        let was = std::mem::replace(&mut self.code, Code::Home);
        if matches!(was, Code::Iterating { stale: true }) && matches!(worked, Worked::Iterated(_)) {
            tracing::debug!(
                rank = self.rank,
                "dropped the outcome of an iteration of the master this worker left behind"
            );
            return self.after_work(now);
        }
        match worked {
            Worked::Started(Ok(())) => {
                if matches!(self.stage, Stage::Starting) {
                    self.stage = Stage::Running;
                }
                if !matches!(self.queued, Some(Queued::Stop(_))) {
                    let attempt = self.attempt();
                    tracing::trace!(rank = self.rank, attempt, "started; registering");
                    self.send(ToMaster::Registered { attempt });
                }
            }
            // (Taken above.)
            Worked::Iterated(Ok(_)) => {}
            Worked::Started(Err(error)) | Worked::Iterated(Err(error)) => self.fail(*error),
            Worked::Skipped => {
                tracing::debug!(
                    rank = self.rank,
                    "the job failed: the iteration is not computed"
                );
            }
            Worked::Stopped(result) => return self.stopped(now, result.map_err(|e| *e)),
        }
        self.after_work(now);
    }

    /// How sending the result of `iteration` went ([`WorkerAction::SendResult`]), at
    /// `now`.
    pub(crate) fn handle_sent(
        &mut self,
        now: Instant,
        iteration: Iteration,
        sent: Result<(), Unsent>,
    ) {
        match sent {
            Ok(()) => {}
            // Replaced: its replacement redoes the iteration, and this worker is told to
            // stop.
            Err(Unsent::Replaced) => {
                tracing::debug!(
                    rank = self.rank,
                    iteration,
                    "a replaced worker's result is dropped"
                )
            }
            // A result that does not survive the wire encoding fails as the master would
            // see it over a network.
            Err(Unsent::Undecodable(error)) => self.fail(error),
            // A result that cannot be sent (too large for a frame, say) must not leave the
            // master waiting for it.
            Err(Unsent::Failed(source)) => self.fail(JobError::transport(
                format!(
                    "worker {} could not send its result of iteration {iteration}: {source}",
                    self.rank
                ),
                Some(source),
            )),
        }
        self.after_work(now);
    }

    /// Time passed: fires the timers due at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        for timer in Timer::ALL {
            if matches!(self.stage, Stage::Ended) {
                return;
            }
            if self.timers.fire(timer, now) {
                match timer {
                    Timer::Grace => self.grace_over(),
                    Timer::StopDeadline => self.stop_deadline_passed(),
                    Timer::Verdict => {
                        self.end_unheard();
                    }
                }
            }
        }
    }

    /// The failure grace after the job's failure passed: if the worker's code is still
    /// away, the worker ends with the job's failure, and the code is left to end on its own
    /// thread.
    fn grace_over(&mut self) {
        let Verdict::Heard(verdict) = &self.verdict else {
            return;
        };
        if matches!(self.code, Code::Home) {
            return;
        }
        tracing::warn!(
            rank = self.rank,
            "the job failed and this worker's code still runs after the failure grace: it is left to end on its own thread"
        );
        let ending = OwnedEnding::Failed(verdict.clone());
        self.end(Some(ending));
    }

    /// The shutdown timeout passed since the worker began to stop: it reports its ending
    /// now, whatever its code is doing (a process without the master must not wait for it
    /// forever).
    fn stop_deadline_passed(&mut self) {
        // Stopped, it waited for the master's word: its own failure, then.
        if self.end_unheard() {
            return;
        }
        tracing::warn!(
            rank = self.rank,
            "the worker's code outlived the shutdown timeout; giving up on it"
        );
        let ending = match (&self.stage, &self.queued) {
            (Stage::Stopping(ending), _) | (_, Some(Queued::Stop(ending))) => ending.clone(),
            _ => OwnedEnding::Failed(JobError::WorkersTimedOut {
                during: Waiting::Shutdown,
                missing: vec![self.rank],
                waited: self.config.job.shutdown_timeout,
                refused: Vec::new(),
                heard: Vec::new(),
            }),
        };
        self.end(Some(ending));
    }

    fn send(&mut self, msg: ToMaster<W>) {
        self.actions.push_back(WorkerAction::Send(msg));
    }

    /// Computes `step`, with what the checkpoint the attempt resumes from holds for this
    /// worker if it was not restored yet.
    fn iterate(&mut self, mut step: Assignment<M>) {
        step.restore = self.restore.take();
        self.dispatch(Work::Iterate(step));
    }

    fn dispatch(&mut self, work: Work<M>) {
        if !matches!(self.code, Code::Home) {
            // Unreachable by the protocol; fail loudly rather than drop the work.
            let attempt = self.attempt();
            let message = format!("work dispatched to worker {} while it was busy", self.rank);
            let error = JobError::Runtime { message };
            return self.send(ToMaster::Failed { attempt, error });
        }
        self.code = match work {
            Work::Start => Code::Starting,
            Work::Iterate(..) => Code::Iterating { stale: false },
            Work::Stop(_) => Code::Stopping,
        };
        self.actions.push_back(WorkerAction::Run(work));
    }

    /// Fails this worker (and so the job): tells the master first, so every peer learns
    /// of it at once, then stops.
    fn fail(&mut self, error: JobError) {
        tracing::debug!(rank = self.rank, %error, "worker failed");
        let error = match &self.verdict {
            // The job had failed already (this failure may be its consequence: a sync call
            // that the job's end answered): the job's first failure is this worker's end.
            Verdict::Heard(first) => first.clone(),
            Verdict::Unknown | Verdict::OwnFirst => {
                if self.config.failure_ends_job {
                    self.actions.push_back(WorkerAction::EndJob(error.clone()));
                }
                let attempt = self.attempt();
                self.send(ToMaster::Failed {
                    attempt,
                    error: error.clone(),
                });
                self.verdict = Verdict::OwnFirst;
                error
            }
        };
        self.state.stop();
        // An abort that arrived meanwhile carries the job's first failure: keep it.
        if !matches!(self.queued, Some(Queued::Stop(_))) {
            self.queued = Some(Queued::Stop(OwnedEnding::Failed(error)));
        }
    }

    /// The master (or the transport, for a lost master) says the job failed with
    /// `error`: the job's first failure.
    fn hear_verdict(&mut self, now: Instant, error: &JobError) {
        if !matches!(self.verdict, Verdict::Heard(_)) {
            self.verdict = Verdict::Heard(error.clone());
            self.actions.push_back(WorkerAction::Verdict(error.clone()));
            // The code away is given the grace to come back.
            if !matches!(self.code, Code::Home) {
                self.timers
                    .arm(Timer::Grace, now, self.config.failure_grace);
            }
        }
        if matches!(self.stage, Stage::AwaitingVerdict(_)) {
            self.end(Some(OwnedEnding::Failed(error.clone())));
        }
    }

    /// The link lost the master's node and tries to reach it again. A worker of a job
    /// whose failures restart every worker, waiting for the master's word on its own
    /// failure, waits for the master started again (which replaces it) rather than end its
    /// process when its grace passes: the transport's reconnect timeout bounds the wait,
    /// and ends it with the master's loss.
    fn master_away(&mut self, reason: &str) {
        self.master_away = true;
        if matches!(self.stage, Stage::AwaitingVerdict(_)) {
            self.keep_failure(reason);
        }
    }

    /// In a job whose failures restart every worker, a failure the master's node did not
    /// answer before it was lost waits for the one started again, without a limit of its
    /// own (the link's reconnect timeout is it).
    fn keep_failure(&mut self, reason: &str) {
        if !self.config.gang {
            return;
        }
        tracing::info!(
            rank = self.rank,
            %reason,
            "the master was lost before it answered this worker's failure; keeping it for the master started again"
        );
        // (The stop's deadline, its code home, bounds only this wait.)
        self.timers.set(Timer::Verdict, Deadline::Never);
        self.timers.set(Timer::StopDeadline, Deadline::Never);
    }

    /// A worker that stopped waiting for the master's verdict ends with its own failure.
    /// Returns whether it was waiting.
    fn end_unheard(&mut self) -> bool {
        let Stage::AwaitingVerdict(own) = &self.stage else {
            return false;
        };
        let own = own.clone();
        self.end(Some(own));
        true
    }

    /// The worker is done: it reports how the job ended for it (when it knows), and stops.
    fn end(&mut self, ending: Option<OwnedEnding<M>>) {
        if matches!(self.stage, Stage::Ended) {
            return;
        }
        self.stage = Stage::Ended;
        if let Some(ending) = ending {
            self.actions.push_back(WorkerAction::Report(ending));
        }
        self.actions.push_back(WorkerAction::Stop);
    }

    /// Starts what waited for the code to come home: a stop, or the newest iteration.
    fn after_work(&mut self, now: Instant) {
        // (Nothing waits, round after round: the slot is not moved out then.)
        if self.queued.is_none() {
            return;
        }
        match self.queued.take() {
            Some(Queued::Stop(ending)) => {
                self.timers
                    .arm(Timer::StopDeadline, now, self.config.job.shutdown_timeout);
                self.stage = Stage::Stopping(ending.clone());
                self.dispatch(Work::Stop(Box::new(ending)));
            }
            Some(Queued::Iterate(step)) => self.iterate(step),
            None => {}
        }
    }

    /// Registers with a master's node that has not seen this worker (a master process
    /// started again): in its attempt, keeping the shard `init` loaded, and dropping what
    /// was under way for the master left behind.
    fn register_again(&mut self, now: Instant, attempt: Attempt) {
        tracing::info!(
            rank = self.rank,
            attempt,
            "reached the master again; registering in its attempt"
        );
        if matches!(self.queued, Some(Queued::Iterate(..))) {
            self.queued = None;
        }
        self.restore = None;
        if self.config.job.barrier_mode {
            // A compute may be waiting in a sync call the new master never saw: it fails
            // now, rather than wait for an answer that is not coming.
            let error = master_lost_in_barrier_mode(self.rank, attempt);
            self.actions.push_back(WorkerAction::EndSync(error.clone()));
            self.fail(error);
            // Idle between iterations, nothing else would start the stop.
            if matches!(self.code, Code::Home) {
                self.after_work(now);
            }
            return;
        }
        if let Code::Iterating { stale } = &mut self.code {
            *stale = true;
            self.actions.push_back(WorkerAction::MarkStale);
        }
        if !matches!(self.stage, Stage::Starting) {
            self.send(ToMaster::Registered { attempt });
        }
    }

    fn begin_stop(&mut self, now: Instant, ending: OwnedEnding<M>) {
        self.timers
            .arm(Timer::StopDeadline, now, self.config.job.shutdown_timeout);
        if matches!(self.code, Code::Home) {
            self.stage = Stage::Stopping(ending.clone());
            self.dispatch(Work::Stop(Box::new(ending)));
        } else {
            self.queued = Some(Queued::Stop(ending));
        }
    }

    /// The worker's code stopped (its `post_application` ran): it says so and ends.
    fn stopped(&mut self, now: Instant, result: Result<(), JobError>) {
        let mut ending = match &self.stage {
            Stage::Stopping(ending) => Some(ending.clone()),
            _ => None,
        };
        if let Err(error) = result {
            let attempt = self.attempt();
            self.send(ToMaster::Failed {
                attempt,
                error: error.clone(),
            });
            if !matches!(ending, Some(OwnedEnding::Failed(_))) {
                ending = Some(OwnedEnding::Failed(error));
            }
        }
        // A failed worker ends with the job's first failure, as the master knows it.
        if let (Some(OwnedEnding::Failed(_)), Verdict::Heard(first)) = (&ending, &self.verdict) {
            ending = Some(OwnedEnding::Failed(first.clone()));
        }
        let awaits = matches!(ending, Some(OwnedEnding::Failed(_)))
            && self.verdict == Verdict::OwnFirst
            && !matches!(self.stage, Stage::Ended);
        // In a job whose failures restart every worker, the master's word may be a
        // restart: the link stays, and reaches a master started again.
        let awaits_word = awaits && self.config.gang;
        self.actions
            .push_back(WorkerAction::SendDone { awaits_word });
        match ending {
            // Its own failure may not be the job's first: the master's abort says.
            Some(failed @ OwnedEnding::Failed(_)) if awaits => {
                self.stage = Stage::AwaitingVerdict(failed);
                self.timers
                    .arm(Timer::Verdict, now, self.config.verdict_grace);
                if self.master_away {
                    self.keep_failure("its link was reaching the master again as it failed");
                }
            }
            ending => self.end(ending),
        }
    }
}

/// Why a worker in barrier mode fails when it reaches a master's node started again: its
/// sync calls cannot be carried over to that node.
fn master_lost_in_barrier_mode(rank: Rank, attempt: Attempt) -> JobError {
    JobError::MasterLost {
        reason: format!(
            "worker {rank} reached a master started again (attempt {attempt}), and a job in barrier mode cannot carry its sync calls over to it"
        ),
    }
}

#[cfg(test)]
mod tests;
