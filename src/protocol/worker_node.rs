//! A worker's node: its whole lifecycle as one state machine — start-up and
//! registration, iterations (one at a time, a straggler skipping to the newest), sync
//! answers, registering again with a master started again, its own failure, the job's
//! failure (the verdict), and its stop — with no I/O and no clock.
//!
//! Call order: [`WorkerNode::start`] once; then, as they happen,
//! [`handle_message`](WorkerNode::handle_message) (the master's messages, in order),
//! [`handle_worked`](WorkerNode::handle_worked) (a unit of the worker's code came back),
//! [`handle_sent`](WorkerNode::handle_sent) (right after carrying out a
//! [`WorkerAction::SendResult`]) and the three timers it arms
//! ([`handle_grace_over`](WorkerNode::handle_grace_over),
//! [`handle_stop_deadline`](WorkerNode::handle_stop_deadline),
//! [`handle_verdict_over`](WorkerNode::handle_verdict_over)); after each, carry out every
//! [`poll_action`](WorkerNode::poll_action) in order.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{OwnedEnding, Report, SyncResult, ToMaster, ToWorker, WorkerCommand, WorkerState};

use crate::error::{JobError, Waiting};
use crate::ids::{Attempt, Epoch, Iteration, Rank};
use crate::transport::TransportError;

/// One unit of a worker's code.
pub(crate) enum Work<M> {
    Start,
    Iterate(Iteration, Option<Arc<M>>),
    Stop(OwnedEnding<M>),
}

/// What a unit of a worker's code ended with.
pub(crate) enum Worked<W> {
    Started(Result<(), JobError>),
    Iterated(Result<Report<W>, JobError>),
    /// The iteration was not computed: the job had failed by the time it would start.
    Skipped,
    Stopped(Result<(), JobError>),
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
    /// Send the worker's last message: its report, from its code's context
    /// (`WorkerTask::done`).
    SendDone,
    /// Hand this answer to the compute waiting in a sync call.
    Answer(Epoch, SyncResult),
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
    /// The job failed while the worker's code is away: after the failure grace, call
    /// [`WorkerNode::handle_grace_over`].
    ArmGrace,
    /// The worker began to stop: after the shutdown timeout, call
    /// [`WorkerNode::handle_stop_deadline`].
    ArmStopDeadline,
    /// The worker stopped on its own failure: after a short wait for the master's word,
    /// call [`WorkerNode::handle_verdict_over`].
    ArmVerdictGrace,
    /// How the job ended for this worker: reported once.
    Report(OwnedEnding<M>),
    /// The worker is done; nothing follows.
    Stop,
}

/// A worker's lifecycle (see the [module docs](self) for the call order).
pub(crate) struct WorkerNode<M, W> {
    rank: Rank,
    attempt: Attempt,
    state: WorkerState,
    /// Whether a failure of this worker's code ends the job (`FailurePolicy::Fail`).
    own_failure_ends_job: bool,
    /// Whether the job runs in barrier mode: a worker's sync calls cannot be carried over
    /// to a master started again.
    barrier_mode: bool,
    /// Whether the worker's code is here (not away running a unit of work).
    home: bool,
    /// Whether the work away is an iteration.
    iterating: bool,
    /// Whether `init` returned: the worker registers (again) only after it.
    started: bool,
    /// The job's first failure, once the master (or the transport, for a lost master)
    /// said the job failed: the ending this worker reports when it failed too.
    verdict: Option<JobError>,
    /// This worker failed before hearing the job failed: once it stopped, it waits for the
    /// master's word (its abort) to report the job's first failure rather than its own,
    /// which may have come second.
    failed_first: bool,
    awaiting_verdict: Option<OwnedEnding<M>>,
    /// A stop that arrived while the code was away.
    pending_stop: Option<OwnedEnding<M>>,
    /// The newest iteration that arrived while the code was away: a straggler the job
    /// went on without skips to it, past any iteration it missed.
    pending_iterate: Option<(Iteration, Option<Arc<M>>)>,
    /// How the job ended for this worker, once it began to stop.
    ending: Option<OwnedEnding<M>>,
    reported: bool,
    stop_deadline_armed: bool,
    grace_armed: bool,
    actions: VecDeque<WorkerAction<M, W>>,
}

impl<M, W> WorkerNode<M, W> {
    /// The worker of `rank`, starting in `attempt`.
    pub(crate) fn new(
        rank: Rank,
        attempt: Attempt,
        own_failure_ends_job: bool,
        barrier_mode: bool,
    ) -> Self {
        WorkerNode {
            rank,
            attempt,
            state: WorkerState::new(attempt),
            own_failure_ends_job,
            barrier_mode,
            home: true,
            iterating: false,
            started: false,
            verdict: None,
            failed_first: false,
            awaiting_verdict: None,
            pending_stop: None,
            pending_iterate: None,
            ending: None,
            reported: false,
            stop_deadline_armed: false,
            grace_armed: false,
            actions: VecDeque::new(),
        }
    }

    /// The attempt the worker runs in: its code runs each unit of work in it.
    pub(crate) fn attempt(&self) -> Attempt {
        self.attempt
    }

    /// Whether the job ended for this worker (its verdict is known, or it began to stop):
    /// nothing waits for what it says any more.
    pub(crate) fn has_ended(&self) -> bool {
        self.verdict.is_some() || self.ending.is_some()
    }

    /// The next thing to do.
    pub(crate) fn poll_action(&mut self) -> Option<WorkerAction<M, W>> {
        self.actions.pop_front()
    }

    /// Starts the worker: its `init` (and interceptors' `pre_application`) runs.
    pub(crate) fn start(&mut self) {
        self.dispatch(Work::Start);
    }

    /// A message from the master's node (or the transport's word about it).
    pub(crate) fn handle_message(&mut self, msg: ToWorker<M>) {
        match &msg {
            ToWorker::Abort { attempt, error } if *attempt == self.attempt => {
                let error = error.clone();
                self.hear_verdict(&error);
            }
            // The job completed without this worker's failure mattering (the policy went
            // on without it): its own failure is its ending.
            ToWorker::Finish { attempt, .. }
                if *attempt == self.attempt && self.awaiting_verdict.is_some() =>
            {
                self.end_unheard();
                return;
            }
            _ => {}
        }
        match self.state.on_message(&msg) {
            WorkerCommand::Compute(iteration) => {
                let ToWorker::Iterate { last, .. } = msg else {
                    return;
                };
                if self.home {
                    self.dispatch(Work::Iterate(iteration, last));
                } else if let Some((skipped, _)) = self.pending_iterate.replace((iteration, last)) {
                    // Still computing an iteration the job went on without: it skips to
                    // the newest when it returns (its late result is dropped as stale).
                    tracing::debug!(rank = self.rank, skipped, "a straggler skips an iteration");
                }
            }
            WorkerCommand::Stop => {
                if let Some(ending) = OwnedEnding::told(msg) {
                    self.begin_stop(ending);
                }
            }
            WorkerCommand::Answer => {
                if let ToWorker::SyncReply { epoch, result, .. } = msg {
                    self.actions.push_back(WorkerAction::Answer(epoch, result));
                }
            }
            WorkerCommand::Register(attempt) => self.register_again(attempt),
            WorkerCommand::Proceed => {}
            WorkerCommand::Drop => {
                tracing::trace!(rank = self.rank, %msg, "dropped a message from the master");
            }
        }
    }

    /// A unit of the worker's code came back with `worked`; `stale` when it was marked
    /// stale while away ([`WorkerAction::MarkStale`]).
    pub(crate) fn handle_worked(&mut self, worked: Worked<W>, stale: bool) {
        self.home = true;
        self.iterating = false;
        if stale && matches!(worked, Worked::Iterated(_)) {
            tracing::debug!(
                rank = self.rank,
                "dropped the outcome of an iteration of the master this worker left behind"
            );
            return self.after_work();
        }
        match worked {
            Worked::Started(Ok(())) => {
                self.started = true;
                if self.pending_stop.is_none() {
                    let attempt = self.attempt;
                    self.send(ToMaster::Registered { attempt });
                }
            }
            // Its outcome decides what follows: `handle_sent`.
            Worked::Iterated(Ok(report)) => {
                return self.actions.push_back(WorkerAction::SendResult(report))
            }
            Worked::Started(Err(error)) | Worked::Iterated(Err(error)) => self.fail(error),
            Worked::Skipped => {
                tracing::debug!(
                    rank = self.rank,
                    "the job failed: the iteration is not computed"
                );
            }
            Worked::Stopped(result) => return self.stopped(result),
        }
        self.after_work();
    }

    /// How sending the result of `iteration` went ([`WorkerAction::SendResult`]).
    pub(crate) fn handle_sent(&mut self, iteration: Iteration, sent: Result<(), TransportError>) {
        match sent {
            Ok(()) => {}
            // Replaced: its replacement redoes the iteration, and this worker is told to
            // stop.
            Err(TransportError::Replaced { .. }) => {
                tracing::debug!(
                    rank = self.rank,
                    iteration,
                    "a replaced worker's result is dropped"
                )
            }
            // A result that does not survive the wire encoding fails as the master would
            // see it over a network.
            Err(e @ TransportError::Undecodable { .. }) => self.fail(e.into()),
            // A result that cannot be sent (too large for a frame, say) must not leave the
            // master waiting for it.
            Err(e) => self.fail(JobError::Transport {
                message: format!(
                    "worker {} could not send its result of iteration {iteration}: {e}",
                    self.rank
                ),
            }),
        }
        self.after_work();
    }

    /// The failure grace after the job's failure passed ([`WorkerAction::ArmGrace`]): if
    /// the worker's code is still away, the worker ends with the job's failure, and the
    /// code is left to end on its own thread.
    pub(crate) fn handle_grace_over(&mut self) {
        if self.home || self.reported {
            return;
        }
        let Some(verdict) = self.verdict.clone() else {
            return;
        };
        tracing::warn!(
            rank = self.rank,
            "the job failed and this worker's code still runs after the failure grace: it is left to end on its own thread"
        );
        self.report(OwnedEnding::Failed(verdict));
        self.actions.push_back(WorkerAction::Stop);
    }

    /// The shutdown timeout passed since the worker began to stop
    /// ([`WorkerAction::ArmStopDeadline`]): it reports its ending now, whatever its code is
    /// doing (a process without the master must not wait for it forever).
    pub(crate) fn handle_stop_deadline(&mut self, waited: std::time::Duration) {
        // Stopped, it waited for the master's word: its own failure, then.
        if self.end_unheard() || self.reported {
            return;
        }
        tracing::warn!(
            rank = self.rank,
            "the worker's code outlived the shutdown timeout; giving up on it"
        );
        let ending = self
            .ending
            .clone()
            .or_else(|| self.pending_stop.clone())
            .unwrap_or_else(|| {
                OwnedEnding::Failed(JobError::WorkersTimedOut {
                    during: Waiting::Shutdown,
                    missing: vec![self.rank],
                    waited,
                    refused: Vec::new(),
                })
            });
        self.report(ending);
        self.actions.push_back(WorkerAction::Stop);
    }

    /// The wait for the master's word after the worker stopped on its own failure passed
    /// ([`WorkerAction::ArmVerdictGrace`]): it ends with its own failure.
    pub(crate) fn handle_verdict_over(&mut self) {
        self.end_unheard();
    }

    fn send(&mut self, msg: ToMaster<W>) {
        self.actions.push_back(WorkerAction::Send(msg));
    }

    fn dispatch(&mut self, work: Work<M>) {
        if !self.home {
            // Unreachable by the protocol; fail loudly rather than drop the work.
            let attempt = self.attempt;
            let message = format!("work dispatched to worker {} while it was busy", self.rank);
            let error = JobError::Runtime { message };
            return self.send(ToMaster::Failed { attempt, error });
        }
        self.home = false;
        self.iterating = matches!(work, Work::Iterate(..));
        self.actions.push_back(WorkerAction::Run(work));
    }

    /// Fails this worker (and so the job): tells the master first, so every peer learns
    /// of it at once, then stops.
    fn fail(&mut self, error: JobError) {
        tracing::debug!(rank = self.rank, %error, "worker failed");
        let error = match &self.verdict {
            // The job had failed already (this failure may be its consequence: a sync call
            // that the job's end answered): the job's first failure is this worker's end.
            Some(first) => first.clone(),
            None => {
                if self.own_failure_ends_job {
                    self.actions.push_back(WorkerAction::EndJob(error.clone()));
                }
                let attempt = self.attempt;
                self.send(ToMaster::Failed {
                    attempt,
                    error: error.clone(),
                });
                self.failed_first = true;
                error
            }
        };
        self.state.stop();
        // An abort that arrived meanwhile carries the job's first failure: keep it.
        self.pending_stop.get_or_insert(OwnedEnding::Failed(error));
    }

    /// The master (or the transport, for a lost master) says the job failed with
    /// `error`: the job's first failure.
    fn hear_verdict(&mut self, error: &JobError) {
        if self.verdict.is_none() {
            self.verdict = Some(error.clone());
            self.actions.push_back(WorkerAction::Verdict(error.clone()));
            // The code away is given the grace to come back.
            if !self.home && !self.grace_armed {
                self.grace_armed = true;
                self.actions.push_back(WorkerAction::ArmGrace);
            }
        }
        if self.awaiting_verdict.take().is_some() {
            self.report(OwnedEnding::Failed(error.clone()));
            self.actions.push_back(WorkerAction::Stop);
        }
    }

    /// A worker that stopped waiting for the master's verdict ends with its own failure.
    /// Returns whether it was waiting.
    fn end_unheard(&mut self) -> bool {
        match self.awaiting_verdict.take() {
            Some(own) => {
                self.report(own);
                self.actions.push_back(WorkerAction::Stop);
                true
            }
            None => false,
        }
    }

    fn report(&mut self, ending: OwnedEnding<M>) {
        if !self.reported {
            self.reported = true;
            self.actions.push_back(WorkerAction::Report(ending));
        }
    }

    fn arm_stop_deadline(&mut self) {
        if !self.stop_deadline_armed {
            self.stop_deadline_armed = true;
            self.actions.push_back(WorkerAction::ArmStopDeadline);
        }
    }

    /// Starts what waited for the code to come home: a stop, or the newest iteration.
    fn after_work(&mut self) {
        if let Some(ending) = self.pending_stop.take() {
            self.pending_iterate = None;
            self.ending = Some(ending.clone());
            self.arm_stop_deadline();
            self.dispatch(Work::Stop(ending));
        } else if let Some((iteration, last)) = self.pending_iterate.take() {
            self.dispatch(Work::Iterate(iteration, last));
        }
    }

    /// Registers with a master's node that has not seen this worker (a master process
    /// started again): in its attempt, keeping the shard `init` loaded, and dropping what
    /// was under way for the master left behind.
    fn register_again(&mut self, attempt: Attempt) {
        tracing::info!(
            rank = self.rank,
            attempt,
            "reached the master again; registering in its attempt"
        );
        self.attempt = attempt;
        self.pending_iterate = None;
        if self.barrier_mode {
            // A compute may be waiting in a sync call the new master never saw: it fails
            // now, rather than wait for an answer that is not coming.
            let error = master_lost_in_barrier_mode(self.rank, attempt);
            self.actions.push_back(WorkerAction::EndSync(error.clone()));
            self.fail(error);
            // Idle between iterations, nothing else would start the stop.
            if self.home {
                self.after_work();
            }
            return;
        }
        if !self.home && self.iterating {
            self.actions.push_back(WorkerAction::MarkStale);
        }
        if self.started {
            self.send(ToMaster::Registered { attempt });
        }
    }

    fn begin_stop(&mut self, ending: OwnedEnding<M>) {
        self.arm_stop_deadline();
        if self.home {
            self.ending = Some(ending.clone());
            self.dispatch(Work::Stop(ending));
        } else {
            self.pending_stop = Some(ending);
        }
    }

    /// The worker's code stopped (its `post_application` ran): it says so and ends.
    fn stopped(&mut self, result: Result<(), JobError>) {
        let mut ending = self.ending.take();
        if let Err(error) = result {
            let attempt = self.attempt;
            self.send(ToMaster::Failed {
                attempt,
                error: error.clone(),
            });
            if !matches!(ending, Some(OwnedEnding::Failed(_))) {
                ending = Some(OwnedEnding::Failed(error));
            }
        }
        // A failed worker ends with the job's first failure, as the master knows it.
        if let (Some(OwnedEnding::Failed(_)), Some(first)) = (&ending, &self.verdict) {
            ending = Some(OwnedEnding::Failed(first.clone()));
        }
        self.actions.push_back(WorkerAction::SendDone);
        match ending {
            // Its own failure may not be the job's first: the master's abort says.
            Some(failed @ OwnedEnding::Failed(_))
                if self.failed_first && self.verdict.is_none() && !self.reported =>
            {
                self.awaiting_verdict = Some(failed);
                self.actions.push_back(WorkerAction::ArmVerdictGrace);
                return;
            }
            Some(ending) => self.report(ending),
            None => {}
        }
        self.actions.push_back(WorkerAction::Stop);
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
mod tests {
    use super::*;

    type Node = WorkerNode<u64, u64>;

    /// A runtime error's message; another error as it displays.
    fn short(e: &JobError) -> String {
        match e {
            JobError::Runtime { message } => message.clone(),
            other => other.to_string(),
        }
    }

    fn actions(node: &mut Node) -> Vec<String> {
        std::iter::from_fn(|| node.poll_action())
            .map(|a| match a {
                WorkerAction::Run(Work::Start) => "run start".to_string(),
                WorkerAction::Run(Work::Iterate(i, _)) => format!("run {i}"),
                WorkerAction::Run(Work::Stop(OwnedEnding::Completed { .. })) => {
                    "run stop (completed)".into()
                }
                WorkerAction::Run(Work::Stop(OwnedEnding::Failed(e))) => {
                    format!("run stop ({})", short(&e))
                }
                WorkerAction::Send(ToMaster::Registered { attempt }) => {
                    format!("registered {attempt}")
                }
                WorkerAction::Send(ToMaster::Failed { error, .. }) => {
                    format!("failed ({})", short(&error))
                }
                WorkerAction::Send(_) => "send".into(),
                WorkerAction::SendResult(r) => format!("result {}", r.iteration),
                WorkerAction::SendDone => "done".into(),
                WorkerAction::Answer(epoch, _) => format!("answer {epoch}"),
                WorkerAction::Verdict(e) => format!("verdict ({})", short(&e)),
                WorkerAction::EndSync(_) => "end sync".into(),
                WorkerAction::EndJob(_) => "end job".into(),
                WorkerAction::MarkStale => "stale".into(),
                WorkerAction::ArmGrace => "arm grace".into(),
                WorkerAction::ArmStopDeadline => "arm stop deadline".into(),
                WorkerAction::ArmVerdictGrace => "arm verdict grace".into(),
                WorkerAction::Report(OwnedEnding::Completed { .. }) => "report completed".into(),
                WorkerAction::Report(OwnedEnding::Failed(e)) => format!("report ({})", short(&e)),
                WorkerAction::Stop => "stop".into(),
            })
            .collect()
    }

    fn error(what: &str) -> JobError {
        JobError::Runtime {
            message: what.into(),
        }
    }

    fn report(iteration: Iteration) -> Worked<u64> {
        Worked::Iterated(Ok(Report {
            attempt: 0,
            iteration,
            result: 1,
            halt_vote: false,
            elapsed: std::time::Duration::ZERO,
        }))
    }

    fn iterate(iteration: Iteration) -> ToWorker<u64> {
        ToWorker::Iterate {
            attempt: 0,
            iteration,
            last: None,
        }
    }

    fn started(node: &mut Node) {
        node.start();
        assert_eq!(actions(node), ["run start"]);
        node.handle_worked(Worked::Started(Ok(())), false);
        assert_eq!(actions(node), ["registered 0"]);
    }

    #[test]
    fn a_straggler_skips_to_the_newest_iteration_once_its_code_is_back() {
        let mut node = Node::new(1, 0, false, false);
        started(&mut node);
        node.handle_message(iterate(1));
        assert_eq!(actions(&mut node), ["run 1"]);
        node.handle_message(iterate(2));
        node.handle_message(iterate(3));
        assert!(actions(&mut node).is_empty(), "the code is away");
        node.handle_worked(report(1), false);
        assert_eq!(actions(&mut node), ["result 1"]);
        node.handle_sent(1, Ok(()));
        assert_eq!(actions(&mut node), ["run 3"]);
    }

    #[test]
    fn a_worker_that_failed_first_reports_the_jobs_first_failure_once_the_master_says_it() {
        let mut node = Node::new(2, 0, true, false);
        started(&mut node);
        node.handle_message(iterate(1));
        assert_eq!(actions(&mut node), ["run 1"]);
        node.handle_worked(Worked::Iterated(Err(error("mine"))), false);
        assert_eq!(
            actions(&mut node),
            [
                "end job",
                "failed (mine)",
                "arm stop deadline",
                "run stop (mine)"
            ]
        );
        node.handle_worked(Worked::Stopped(Ok(())), false);
        assert_eq!(actions(&mut node), ["done", "arm verdict grace"]);
        // Another rank's failure came first: that is this worker's ending too.
        node.handle_message(ToWorker::Abort {
            attempt: 0,
            error: error("first"),
        });
        assert_eq!(
            actions(&mut node),
            ["verdict (first)", "report (first)", "stop"]
        );
    }

    #[test]
    fn without_the_masters_word_a_worker_ends_with_its_own_failure() {
        let mut node = Node::new(0, 0, false, false);
        started(&mut node);
        node.handle_message(iterate(1));
        node.handle_worked(Worked::Iterated(Err(error("mine"))), false);
        node.handle_worked(Worked::Stopped(Ok(())), false);
        let _ = actions(&mut node);
        node.handle_verdict_over();
        assert_eq!(actions(&mut node), ["report (mine)", "stop"]);
    }

    #[test]
    fn the_jobs_failure_gives_code_away_the_grace_then_the_worker_ends_without_it() {
        let mut node = Node::new(0, 0, false, false);
        started(&mut node);
        node.handle_message(iterate(1));
        let _ = actions(&mut node);
        node.handle_message(ToWorker::Abort {
            attempt: 0,
            error: error("first"),
        });
        assert_eq!(
            actions(&mut node),
            ["verdict (first)", "arm grace", "arm stop deadline"]
        );
        node.handle_grace_over();
        assert_eq!(actions(&mut node), ["report (first)", "stop"]);
    }

    #[test]
    fn a_result_that_cannot_be_sent_fails_the_worker() {
        let mut node = Node::new(3, 0, false, false);
        started(&mut node);
        node.handle_message(iterate(1));
        node.handle_worked(report(1), false);
        let _ = actions(&mut node);
        node.handle_sent(1, Err(TransportError::Encode("too large".into())));
        let got = actions(&mut node);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].starts_with("failed (transport"), "{got:?}");
        assert!(got[0].contains("worker 3 could not send its result of iteration 1"));
        assert_eq!(got[1], "arm stop deadline");
        assert!(got[2].starts_with("run stop (transport"), "{got:?}");
    }

    #[test]
    fn reaching_a_master_started_again_drops_the_work_of_the_old_one() {
        let mut node = Node::new(0, 0, false, false);
        started(&mut node);
        node.handle_message(ToWorker::Connected { attempt: 0 });
        node.handle_message(iterate(1));
        let _ = actions(&mut node);
        node.handle_message(ToWorker::Connected { attempt: 1 });
        assert_eq!(actions(&mut node), ["stale", "registered 1"]);
        node.handle_worked(report(1), true);
        assert!(actions(&mut node).is_empty(), "its result is not sent");
        assert_eq!(node.attempt(), 1);
        // In barrier mode the worker fails instead, and its sync calls with it.
        let mut node = Node::new(0, 0, false, true);
        started(&mut node);
        node.handle_message(ToWorker::Connected { attempt: 0 });
        node.handle_message(ToWorker::Connected { attempt: 1 });
        let got = actions(&mut node);
        assert_eq!(got[0], "end sync");
        assert!(got[1].starts_with("failed (the master"), "{got:?}");
        assert_eq!(got[2..4], ["arm stop deadline".to_string(), got[3].clone()]);
        assert!(got[3].starts_with("run stop"), "{got:?}");
    }
}
