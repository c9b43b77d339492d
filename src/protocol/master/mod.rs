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
    Combiner, Envelope, FailurePolicy, ForWorkers, Gate, GateOutput, Gathered, GroupEpochs,
    HaltedBy, IterationReport, JobEvent, JobOutcome, JobReport, Next, Recover, Recovered, Recovery,
    Replica, Schedule, SyncState, SyncStep, Tally, ToMaster, ToWorker, Unsent, Wait, WorkerReport,
    WorkerSave,
};

use crate::error::{Cause, Heard, Hook, JobError, Phase, Waiting};
use crate::ids::{Attempt, Epoch, FoldRoute, GroupId, Iteration, Rank, SyncKind};

/// At most how long a wait for workers goes on between two lines that say so (it says so
/// every quarter of its timeout when that is shorter).
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(10);

mod heard;
mod held;
mod progress;
mod replicas;
mod rounds;
#[cfg(test)]
mod tests;
mod work;
mod workers;

use heard::Hearing;
use held::HeldSpan;
use progress::Progress;

pub(crate) use work::{
    Action, Computed, MasterDone, MasterRound, MasterWork, OwnedEnding, Reach, Resumed,
};

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

/// A preemption under way: who asked, and until when the job may take to stop.
#[derive(Debug, Clone)]
struct Preempting {
    by: String,
    until: Instant,
}

/// What the node is built from besides its settings: what its process is made of.
pub(crate) struct NodeSettings {
    /// By rank: whether its worker runs in this process (the node replaces those itself).
    pub(crate) local: Vec<bool>,
    /// Whether the job has a coordinator, whose `on_finish` or `on_error` ends it.
    pub(crate) coordinated: bool,
    /// Whether someone subscribed to the job's events: then every event is made.
    pub(crate) listening: bool,
    /// Whether the driver records metrics from the events of iterations and recoveries:
    /// then those are made, with nobody subscribed — not the per-worker ones, which would
    /// cost every worker's round for nothing.
    pub(crate) metrics: bool,
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
    /// The epochs of the calls among groups of ranks.
    groups: GroupEpochs,
    /// What each rank last said: named by a wait for it that fails.
    heard: Hearing,
    recovery: Recovery,
    schedule: Schedule,
    stage: Stage<M>,
    master: MasterAt,
    /// What the current attempt resumed from: the checkpoint's iteration, and whether it
    /// halted the job.
    resumed: Option<(Iteration, Option<HaltedBy>)>,
    /// What each worker saved in the checkpoint the attempt resumes from, by rank: sent
    /// to each before the attempt's first iteration, then forgotten.
    restore: Vec<Option<Arc<WorkerSave>>>,
    /// The master result the current iteration computes with (the newest one).
    last: Option<Arc<M>>,
    /// The copies of checkpoints workers offered before the first iteration, newer than
    /// what the master resumed from, each with the rank that offered it (one per rank).
    offers: Vec<(Rank, Replica)>,
    /// The copy the master's code is resuming from, until it is back.
    adopting: Option<(Rank, Replica)>,
    /// Whether an iteration began on this node: from then on its own checkpoints are the
    /// newest, and copies offered are old.
    begun: bool,
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
    /// The iteration under way's span, entered on the node's thread until it ends.
    span: Option<HeldSpan>,
    /// The INFO lines of completed iterations, at most one per `progress_interval`.
    progress: Progress,
    cancelled: bool,
    /// The preemption asked for, if one was: the job stops at the next checkpoint.
    preempt: Option<Preempting>,
    /// Whether the broadcast of the iteration under way asked the workers to save what
    /// they need to resume (a checkpoint of it can be taken).
    saving: bool,
    /// Whether a halt vote in a job without `worker_halt` was warned of (it is, once).
    votes_ignored: bool,
    /// When the current wait for workers was last said to be going on.
    wait_said: Option<Instant>,
    /// How many bytes a fold encodes to, where `Aggregation::Auto` chooses by it.
    measure_fold: Option<fn(&W) -> usize>,
    /// Makes the final result the workers get, if not the master's.
    for_workers: Option<ForWorkers<M>>,
    /// The encoded size of the last iteration's fold, where measured.
    last_fold: Option<usize>,
    /// How the workers fold the results of the iteration under way.
    route: FoldRoute,
    actions: VecDeque<Action<M, W>>,
}

impl<M, W> MasterNode<M, W> {
    /// A node that starts `attempt` at `now` with these settings, from what a checkpoint
    /// gave the master's code (`resumed`); with a combiner, the gate folds each result into
    /// the round's fold as it arrives. Its parts — the gate, the sync state, the recovery
    /// and the schedule — are built here from the settings; a restart of every worker
    /// builds the schedule again from them, restarts the gate and the sync state in the
    /// new attempt, and keeps the recovery (which counts the attempts). Its first actions:
    /// the `Started` event and the master's start-up.
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
        let workers = c.job.workers;
        let mut node = MasterNode {
            gate,
            sync: SyncState::new(workers, c.job.sync_timeout),
            groups: GroupEpochs::new(workers, c.job.sync_timeout),
            heard: Hearing::new(workers),
            recovery: Recovery::new(c.job.failure_policy, workers, c.quorum(), attempt)
                .barrier_mode(c.job.barrier_mode),
            schedule: Schedule::new(c.job.iterations, workers, c.job.worker_halt),
            stage: Stage::Starting {
                master_ready: false,
                workers_ready: false,
            },
            master: MasterAt::Home,
            resumed: resumed.from,
            restore: resumed.workers,
            last: resumed.last,
            offers: Vec::new(),
            adopting: None,
            begun: false,
            awaiting: vec![Awaiting::None; workers],
            reports: vec![None; workers],
            reconnecting: None,
            report: JobReport {
                resumed: resumed.point.clone(),
                ..JobReport::default()
            },
            recent: VecDeque::new(),
            started: now,
            iteration_started: now,
            span: None,
            progress: Progress::default(),
            cancelled: false,
            preempt: None,
            saving: false,
            votes_ignored: false,
            wait_said: None,
            measure_fold: None,
            for_workers: None,
            last_fold: None,
            route: FoldRoute::Star,
            actions: VecDeque::new(),
            settings,
            config,
        };
        let c = Arc::clone(&node.config);
        node.event(|| JobEvent::Started {
            job_id: c.job.job_id.clone(),
            workers: c.job.workers,
            iterations: c.job.iterations,
        });
        node.run_master(now, MasterWork::Start);
        node
    }

    /// Sends the workers, when the job completes, the final result `make` makes from the
    /// master's (`None`: the master's itself); the node's outcome keeps the master's.
    pub(crate) fn sending_workers(mut self, make: Option<ForWorkers<M>>) -> Self {
        self.for_workers = make;
        self
    }

    /// Measures each iteration's fold with `measure` (its encoded size), where the job's
    /// aggregation chooses by it.
    pub(crate) fn measuring_folds(mut self, measure: fn(&W) -> usize) -> Self {
        if self.config.measures_folds() {
            self.measure_fold = Some(measure);
        }
        self
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
            self.groups.poll_timeout(),
            master,
            self.reconnecting.as_ref().map(|(at, _)| *at),
            self.preempt
                .as_ref()
                .filter(|_| !self.ending())
                .map(|p| p.until),
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
        self.span.as_ref().map(HeldSpan::span)
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
        if self.settings.listening || self.settings.metrics {
            self.actions.push_back(Action::Event(make()));
        }
    }

    /// An event of one worker's (its result taken, its end): made only for subscribers.
    fn worker_event(&mut self, make: impl FnOnce() -> JobEvent) {
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
                .checked_add(self.config.job.iteration_timeout)
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
        let env = match env.msg {
            ToMaster::Replica(replica) => return self.offered(from, replica),
            ToMaster::Preempt { by } => return self.preempt(now, by, reach),
            // The driver's: a dump of the flight recorders.
            ToMaster::Recorded { .. } | ToMaster::Dump { .. } => return,
            msg => Envelope { from, msg },
        };
        self.hear(now, from, &env.msg);
        if let ToMaster::Failed {
            attempt,
            error: error @ JobError::Mismatch { rank, .. },
        } = &env.msg
        {
            // A process the transport refused for the rank (it runs the job otherwise) never
            // was the rank's worker. Under a policy that can wait for another process of
            // the rank it is no failure, and no restart: the wait goes on, and names the
            // refusal if it times out (the transport logs refusals, rate-limited). Under
            // `Fail`, or for a rank outside the world (another world size), it fails the
            // job.
            let waits =
                self.recovery.policy() != FailurePolicy::Fail && *rank < self.config.job.workers;
            if *attempt == self.attempt() && waits && !self.ending() {
                tracing::debug!(rank, %error, "a process refused for the rank; waiting on for a right one");
                return;
            }
        }
        match env.msg {
            ToMaster::Sync {
                attempt,
                epoch,
                calls,
                kind,
                message,
                awaits,
                group,
                ranks,
            } => {
                if attempt == self.attempt() {
                    let call = (epoch, group, &ranks[..]);
                    self.on_calls(now, from, (call, calls), (kind, message, awaits), reach);
                }
                return;
            }
            // (Only barrier mode makes sync calls.)
            ToMaster::Result(ref report)
                if report.attempt == self.attempt() && self.config.job.barrier_mode =>
            {
                // Its compute returned: it makes no more sync calls this iteration.
                let step = self.sync.on_returned(from, report.iteration, report.calls);
                self.apply(now, step, reach);
                let counts = report.group_calls.as_deref().map_or(&[][..], |g| &g.0);
                for (group, step) in self.groups.on_returned(from, report.iteration, counts) {
                    self.apply_among(now, group, step, reach);
                }
            }
            ToMaster::Done {
                attempt,
                ref rows,
                ref attachments,
                ..
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
        if let Some(taken) = self.gate.take_accepted() {
            self.worker_event(|| JobEvent::WorkerReported {
                rank: taken.rank,
                iteration: taken.iteration,
                elapsed: taken.elapsed,
                messages: taken.mail,
            });
        }
        if !done_before && self.gate.is_done(from) {
            self.worker_event(|| JobEvent::WorkerDone { rank: from });
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

    /// Messages from workers that arrived together at `now`, in the order they were sent
    /// (the workers this process hosts, after a broadcast): as
    /// [`handle_message`](Self::handle_message) of each in turn, with a run of results
    /// offered to the gate as one batch ([`Gate::on_results`]) where nothing is asked of
    /// each one on its own — no sync calls to close (barrier mode), no event for each
    /// (`JobSettings::listening`). Takes every message out of `batch`.
    pub(crate) fn handle_messages(
        &mut self,
        now: Instant,
        batch: &mut Vec<Envelope<ToMaster<W>>>,
        reach: &dyn Reach,
    ) {
        if self.config.job.barrier_mode || self.settings.listening {
            for env in batch.drain(..) {
                self.handle_message(now, env, reach);
            }
            return;
        }
        let mut at = 0;
        while at < batch.len() {
            if !matches!(batch[at].msg, ToMaster::Result(_)) {
                // (Left in its place, taken: the batch is cleared at the end.)
                let msg =
                    std::mem::replace(&mut batch[at].msg, ToMaster::Registered { attempt: 0 });
                let from = batch[at].from;
                at += 1;
                self.handle_message(now, Envelope { from, msg }, reach);
                continue;
            }
            for env in batch[at..].iter() {
                let ToMaster::Result(report) = &env.msg else {
                    break;
                };
                self.heard.result(env.from, report.iteration, now);
            }
            let (taken, output) = self.gate.on_results(now, &mut batch[at..]);
            at += taken;
            self.on_gate_checked(now, output, reach);
        }
        batch.clear();
    }

    /// Keeps what `from` said with `msg`, for a wait for it that fails to name.
    /// (Of the attempt under way: an older one's words are its process's past. Failures
    /// the transport says for the rank — its loss, a wait for its connection, a process
    /// refused in its name — are what happened to it, not what it said.)
    fn hear(&mut self, now: Instant, from: Rank, msg: &ToMaster<W>) {
        let current = self.attempt();
        let heard = match msg {
            ToMaster::Registered { attempt } if *attempt == current => Heard::Registered,
            ToMaster::Result(report) if report.attempt == current => Heard::Result {
                iteration: report.iteration,
            },
            ToMaster::Sync {
                attempt,
                epoch: first,
                calls,
                kind,
                group,
                ..
            } if *attempt == current => {
                // Of a word of several calls, the last.
                let epoch = first.saturating_add(u64::from(*calls).saturating_sub(1));
                Heard::Call {
                    at: match *group {
                        GroupId::ALL => self.sync.call_at(epoch),
                        group => self.groups.call_at(group, (*first, epoch)),
                    },
                    kind: *kind,
                    epoch,
                }
            }
            ToMaster::Done { attempt, .. } if *attempt == current => Heard::Done,
            ToMaster::Failed {
                error: JobError::WorkerLost { .. },
                ..
            } => Heard::Lost,
            ToMaster::Failed {
                error: JobError::WorkersTimedOut { .. } | JobError::Mismatch { .. },
                ..
            } => return,
            ToMaster::Failed { attempt, .. } if *attempt == current => Heard::Failed,
            _ => return,
        };
        self.heard.hear(from, heard, now);
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
        if self.preempt.as_ref().is_some_and(|p| now >= p.until) && !self.ending() {
            tracing::warn!(
                grace = ?self.config.job.preempt_grace,
                "the preemption's grace ran out before a checkpoint: the job stops now"
            );
            self.stop_preempted(now, self.completed(), reach);
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
        for (group, step) in self.groups.handle_timeout(now) {
            self.apply_among(now, group, step, reach);
        }
        let output = self.gate.handle_timeout(now);
        self.on_gate_checked(now, output, reach);
        self.say_waiting(now, reach);
    }

    /// The job was cancelled: it fails with [`JobError::Cancelled`] (once).
    pub(crate) fn cancel(&mut self, now: Instant, reach: &dyn Reach) {
        if std::mem::replace(&mut self.cancelled, true) {
            return;
        }
        tracing::warn!("the job was cancelled");
        self.fail(now, JobError::Cancelled, reach);
    }

    /// A process of the job was asked to stop for a preemption (`by`: what asked, where):
    /// the job checkpoints at the next iteration boundary — or at the end of the one under
    /// way, when its workers save for a checkpoint — and ends with
    /// [`JobError::Preempted`]; at once when it has not begun iterating. Once: a later
    /// request is logged.
    pub(crate) fn preempt(&mut self, now: Instant, by: String, reach: &dyn Reach) {
        if self.ending() || self.preempt.is_some() {
            tracing::debug!(by, "a further request to stop for a preemption");
            return;
        }
        if matches!(self.stage, Stage::Starting { .. }) {
            tracing::warn!(
                by,
                "the job stops for a preemption before its first iteration"
            );
        } else {
            tracing::warn!(by, "the job stops for a preemption at its next checkpoint");
        }
        let until = now + self.config.job.preempt_grace;
        self.preempt = Some(Preempting { by, until });
        if matches!(self.stage, Stage::Starting { .. }) {
            self.stop_preempted(now, self.completed(), reach);
        }
    }

    /// Something the driver did for the node failed (a replacement, a message the wire
    /// check refused to hand over): the job fails
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
            (None, Unsent::Replaced) => {
                let message = "could not send to every worker: a link was closed".to_string();
                self.on_failure(now, JobError::transport(message, None), reach)
            }
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
        done: MasterDone<M, W>,
        reach: &dyn Reach,
    ) {
        let discard = matches!(self.master, MasterAt::Away { discard: true, .. });
        self.master = MasterAt::Home;
        if discard && !self.ending() {
            // The work was the old attempt's: discarded; the master starts over (a copy
            // it was resuming from is offered again).
            if let Some(offer) = self.adopting.take() {
                self.offers.push(offer);
            }
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
                self.resume_with(resumed);
                self.master_ready(now, reach);
            }
            MasterDone::Adopted(Ok(resumed)) => {
                // Taken, or damaged (and dropped): either way the next newer copy, if
                // any, is tried next.
                self.adopting = None;
                if let Some(resumed) = resumed {
                    self.report.resumed = resumed.point.clone();
                    self.resume_with(resumed);
                }
                self.master_ready(now, reach);
            }
            MasterDone::Started(Err(e))
            | MasterDone::Restarted(Err(e))
            | MasterDone::Adopted(Err(e))
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
                        replica,
                    }),
                spare,
            } => {
                self.gate.recycle(spare);
                if checkpointed {
                    self.report.checkpoints.push(iteration);
                }
                if elapsed > self.config.job.iteration_timeout {
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
                    let done = (elapsed, result, halt, checkpointed);
                    self.iterated(now, iteration, tally, left_out, done, reach);
                    // After the next iteration's broadcast: a copy crosses while the
                    // workers compute.
                    if let Some(replica) = replica.filter(|_| !self.ending()) {
                        self.replicate(replica, reach);
                    }
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

    /// What the master's code resumed from is what the attempt starts from: its
    /// checkpoint's iteration, the workers' saves, the master result.
    fn resume_with(&mut self, resumed: Resumed<M>) {
        self.resumed = resumed.from;
        self.restore = resumed.workers;
        self.last = resumed.last;
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
}
