//! The barrier's state machine: registration, rounds, the end of the job, and timeouts.

use std::fmt;
use std::time::{Duration, Instant};

use super::{Drops, Envelope, Report, Round, Share, ToMaster, WorkerSave};

use crate::error::{Cause, JobError, Phase, Waiting};
use crate::ids::{Attempt, FoldRoute, Iteration, Rank};

/// Folds the result of the next rank into the fold of every lower rank's
/// (`combine(&mut fold, next)`); see [`Gate::combining`]. An `Err` fails the round as the
/// master's failure in [`Phase::Combine`].
pub type Combiner<W> = Box<dyn FnMut(&mut W, W) -> Result<(), Cause> + Send>;

/// Makes the final result the worker processes get from the master's (see
/// [`MasterNode::sending_workers`](crate::protocol::MasterNode::sending_workers)). An `Err`
/// fails the job as the master's failure in [`Phase::Compute`](crate::Phase::Compute).
pub(crate) type ForWorkers<M> = Box<dyn Fn(&M) -> Result<M, Cause> + Send>;

/// One completed round, summed up for the master.
#[derive(Debug, Clone, PartialEq)]
pub struct Gathered<W> {
    /// Every rank's result in rank order; empty when the gate combines.
    pub results: Vec<W>,
    /// When the gate combines: every rank's result folded in rank order.
    pub combined: Option<W>,
    /// What the round's reports add up to besides their results.
    pub tally: Tally,
    /// The ranks whose results are in `results` (or in the fold), in rank order: every
    /// rank, unless some were left out.
    pub reported: Vec<Rank>,
    /// The ranks left out of the round, in rank order: stragglers when it completed with
    /// its quorum after the min-workers timeout. Their late results are dropped as stale.
    pub left_out: Vec<Rank>,
    /// What each rank saved for the iteration's checkpoint, by rank, when the workers were
    /// asked to save ([`ToWorker::Iterate`](super::ToWorker::Iterate)'s `save`); empty
    /// when none was.
    pub saved: Vec<Option<WorkerSave>>,
}

/// What a round's reports add up to, besides their results.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// How many ranks voted to halt.
    pub halt_votes: usize,
    /// The slowest rank and its time.
    pub slowest: Option<(Rank, Duration)>,
    /// The most worker results the gate held at once during the round (a fold counts as
    /// one): the workers' count without combining; with it, one more than the results that
    /// arrived ahead of a missing lower rank.
    pub results_held: usize,
    /// The ranks' messages of the round, added up.
    pub mail: crate::protocol::MailCount,
}

impl Tally {
    /// Counts rank `rank`'s report in, as it is taken into the round (in any order of
    /// ranks): of ranks equally slow, the lowest is the slowest, as in rank order.
    fn count<W>(&mut self, rank: Rank, report: &Report<W>) {
        self.halt_votes += report.halt_vote as usize;
        if let Some(mail) = &report.mail {
            self.mail.add(mail);
        }
        let slower = match self.slowest {
            None => true,
            Some((r, t)) => report.elapsed > t || (report.elapsed == t && rank < r),
        };
        if slower {
            self.slowest = Some((rank, report.elapsed));
        }
    }
}

/// The value rank `rank`'s share adds to the round's fold (`None`: its result went into
/// another rank's), or the error if the share does not fit `route`.
fn share_fits<W>(
    route: FoldRoute,
    (rank, iteration): (Rank, Iteration),
    share: Share<W>,
) -> Result<Option<W>, JobError> {
    let root = route.root();
    let expected = match root {
        None => "its own result",
        Some(r) if r == rank => "the fold of every rank's result",
        Some(_) => "nothing (its result going into another rank's fold)",
    };
    let (fits, value, sent) = match share {
        Share::Own(w) => (root.is_none(), Some(w), "its own result"),
        Share::Fold(w) => (root == Some(rank), Some(w), "a fold of every rank's result"),
        Share::Passed => (
            root.is_some_and(|r| r != rank),
            None,
            "nothing (its result gone into another rank's fold)",
        ),
    };
    if fits {
        return Ok(value);
    }
    Err(JobError::Runtime {
        message: format!(
            "worker {rank} sent {sent} in iteration {iteration}, where the iteration's results travel by {route:?} and it was to send {expected}"
        ),
    })
}

/// The fold of a round's prefix, kept while results are combined.
struct Fold<W> {
    combine: Combiner<W>,
    acc: Option<W>,
}

impl<W: fmt::Debug> fmt::Debug for Fold<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fold")
            .field("acc", &self.acc)
            .finish_non_exhaustive()
    }
}

/// What a [`Gate`] needs to know.
#[derive(Debug, Clone)]
pub struct GateConfig {
    /// The number of workers.
    pub workers: usize,
    /// The current attempt; messages of another attempt are stale.
    pub attempt: Attempt,
    /// How long registration may take, counted from [`Gate::new`].
    pub startup_timeout: Duration,
    /// How long a round may wait for its results, counted from [`Gate::open`].
    pub iteration_timeout: Duration,
    /// How long the end may wait for every worker's `Done`, counted from [`Gate::drain`].
    pub shutdown_timeout: Duration,
    /// How many results a round needs once `min_workers_timeout` has passed; `workers`
    /// waits for every rank.
    pub quorum: usize,
    /// How long a round waits for every rank before it may complete with its quorum,
    /// counted from [`Gate::open`].
    pub min_workers_timeout: Duration,
}

impl GateConfig {
    /// A gate of `workers` ranks in `attempt` that waits for every rank, with these
    /// timeouts (start-up, iteration, shutdown).
    pub fn new(workers: usize, attempt: Attempt, timeouts: [Duration; 3]) -> Self {
        let [startup_timeout, iteration_timeout, shutdown_timeout] = timeouts;
        GateConfig {
            workers,
            attempt,
            startup_timeout,
            iteration_timeout,
            shutdown_timeout,
            quorum: workers,
            min_workers_timeout: iteration_timeout,
        }
    }

    /// Lets a round complete with `quorum` results once `after` has passed.
    pub fn with_quorum(mut self, quorum: usize, after: Duration) -> Self {
        self.quorum = quorum.clamp(1, self.workers.max(1));
        self.min_workers_timeout = after;
        self
    }
}

/// A wait of the gate for workers ([`Gate::waiting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// What it waits for.
    pub during: Waiting,
    /// The ranks it waits for, in rank order.
    pub missing: Vec<Rank>,
    /// Since when.
    pub since: Instant,
    /// How long it may last.
    pub timeout: Duration,
}

/// What the gate tells its driver.
#[derive(Debug, Clone, PartialEq)]
pub enum GateOutput<W> {
    /// Every worker registered: the first iteration can start.
    AllRegistered,
    /// Every worker delivered its result of `iteration`; the reports are in rank order.
    RoundComplete {
        /// The iteration that completed.
        iteration: Iteration,
        /// What the ranks delivered.
        gathered: Gathered<W>,
    },
    /// A replacement worker registered mid-job (see [`Gate::rejoin`]): send it the
    /// iteration gathering now, if any, to redo with the current master result.
    Rejoined {
        /// Its rank.
        rank: Rank,
        /// The iteration the gate gathers, if it does.
        iteration: Option<Iteration>,
    },
    /// The job must fail, or recover under its failure policy: a worker reported a
    /// failure, or a wait timed out.
    Failed(JobError),
    /// The end of the job: every worker reported done, or the shutdown timeout passed.
    Drained {
        /// The ranks that had not reported done when the shutdown timeout passed; empty
        /// when all did.
        missing: Vec<Rank>,
        /// How long the drain waited.
        waited: Duration,
        /// Every arrival the gate dropped during the job.
        drops: Drops,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Registering,
    /// Between rounds: the master computes, or the job failed and awaits `drain`.
    Idle,
    Gathering,
    Draining,
    Finished,
}

/// The barrier's state machine.
///
/// Call order: [`new`](Gate::new) starts registration; feed every message from a worker to
/// [`on_message`](Gate::on_message) and act on what it returns; after
/// [`GateOutput::AllRegistered`] and after each [`GateOutput::RoundComplete`] the driver
/// either [`open`](Gate::open)s the next iteration or [`drain`](Gate::drain)s; on
/// [`GateOutput::Failed`] it drains. Call [`handle_timeout`](Gate::handle_timeout) when the
/// instant from [`poll_timeout`](Gate::poll_timeout) has passed (calling it early is
/// harmless). [`GateOutput::Drained`] is the last output.
#[derive(Debug)]
pub struct Gate<W> {
    config: GateConfig,
    stage: Stage,
    since: Instant,
    registered: Vec<bool>,
    registered_count: usize,
    /// The round's shares; what else each report says is tallied as it is taken in.
    round: Round<Share<W>>,
    fold: Option<Fold<W>>,
    tally: Tally,
    /// Whether the current round's min-workers timeout has passed.
    quorum_passed: bool,
    done: Vec<bool>,
    done_count: usize,
    /// Ranks the job goes on without for good (`FailurePolicy::ContinueWithout`).
    lost: Vec<bool>,
    other_drops: Drops,
    /// How long the drain under way waits, when not the shutdown timeout.
    drain_timeout: Option<Duration>,
    /// How the workers fold the round's results ([`Gate::open_folding`]).
    route: FoldRoute,
    /// The result the last message brought, once taken into its round
    /// ([`Gate::take_accepted`]).
    accepted: Option<Accepted>,
    /// What the round's ranks saved for its checkpoint, by rank: empty until one did.
    saved: Vec<Option<WorkerSave>>,
    /// The buffers of a round gone by, emptied ([`Gate::recycle`]): the next round's
    /// results and ranks go in them.
    spare: Spare<W>,
}

/// A round's buffers, emptied once the master computed with them and handed back to the
/// gate ([`Gate::recycle`]), so that a round allocates none.
#[derive(Debug)]
pub struct Spare<W> {
    /// [`Gathered::results`], empty.
    pub results: Vec<W>,
    /// [`Gathered::reported`] of the round before, empty.
    pub reported: Vec<Rank>,
}

impl<W> Default for Spare<W> {
    fn default() -> Self {
        Spare {
            results: Vec::new(),
            reported: Vec::new(),
        }
    }
}

/// A worker's result the gate took into its round: who sent it, for which iteration, how
/// long its hooks and compute took, and what its messages came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The worker's rank.
    pub rank: Rank,
    /// The iteration.
    pub iteration: Iteration,
    /// Its hooks and compute.
    pub elapsed: Duration,
    /// Its messages (`JobBuilder::messages`).
    pub mail: crate::protocol::MailCount,
}

impl<W> Gate<W> {
    /// A gate that starts waiting for registrations at `now`.
    pub fn new(config: GateConfig, now: Instant) -> Self {
        let n = config.workers;
        Gate {
            stage: Stage::Registering,
            since: now,
            registered: vec![false; n],
            registered_count: 0,
            round: Round::new(n),
            fold: None,
            tally: Tally::default(),
            quorum_passed: false,
            done: vec![false; n],
            done_count: 0,
            lost: vec![false; n],
            other_drops: Drops::default(),
            drain_timeout: None,
            route: FoldRoute::Star,
            accepted: None,
            saved: Vec::new(),
            spare: Spare::default(),
            config,
        }
    }

    /// Takes back a round's buffers for the rounds to come: kept if empty (what they held
    /// is the workers' and the master's, dropped where their code may run).
    pub fn recycle(&mut self, spare: Spare<W>) {
        if spare.results.is_empty() {
            self.spare.results = spare.results;
        }
        if spare.reported.is_empty() {
            self.spare.reported = spare.reported;
        }
    }

    /// Combines the results of each round as they arrive, in rank order, instead of
    /// keeping every rank's until the round completes: rank `r`'s result is folded into the
    /// fold of ranks `0..r` as soon as those were, so the gate holds the fold and only the
    /// results that arrived ahead of a missing lower rank. The round then completes with
    /// [`Gathered::combined`] and no [`Gathered::results`].
    pub fn combining(mut self, combine: Combiner<W>) -> Self {
        self.fold = Some(Fold { combine, acc: None });
        self
    }

    /// The worker's result the last message brought, if the gate took it into its round
    /// (not stale, not a duplicate); once.
    pub fn take_accepted(&mut self) -> Option<Accepted> {
        self.accepted.take()
    }

    /// Feeds one message from a worker.
    pub fn on_message(
        &mut self,
        now: Instant,
        env: Envelope<ToMaster<W>>,
    ) -> Option<GateOutput<W>> {
        let from = env.from;
        if from >= self.config.workers {
            self.other_drops.unknown_rank += 1;
            return None;
        }
        // A wait's deadline holds at arrival too, not only when the driver's timer fires:
        // a result or registration that arrives late fails the wait instead of ending it,
        // however coarse (or stalled) the timer is.
        let due = match (&env.msg, self.stage) {
            (ToMaster::Registered { .. }, Stage::Registering) => true,
            (ToMaster::Result(_), Stage::Gathering) => self.round_due(now),
            _ => false,
        };
        if due {
            if let Some(timed_out) = self.handle_timeout(now) {
                return Some(timed_out);
            }
        }
        match env.msg {
            ToMaster::Registered { attempt } => {
                let rejoining = matches!(self.stage, Stage::Idle | Stage::Gathering)
                    && !self.registered[from]
                    && !self.lost[from];
                if attempt != self.config.attempt
                    || !(self.stage == Stage::Registering || rejoining)
                {
                    self.other_drops.stale += 1;
                    return None;
                }
                if self.registered[from] {
                    self.other_drops.duplicate += 1;
                    return None;
                }
                self.registered[from] = true;
                self.registered_count += 1;
                // A replacement: what its rank's failed worker said before it (its `Done`
                // after its failure) was about the old one.
                if self.done[from] {
                    self.done[from] = false;
                    self.done_count -= 1;
                }
                if rejoining {
                    return Some(GateOutput::Rejoined {
                        rank: from,
                        iteration: (self.stage == Stage::Gathering).then(|| self.round.iteration()),
                    });
                }
                self.all_registered()
            }
            ToMaster::Result(mut report) => {
                if !self.offer(from, &mut report) {
                    return None;
                }
                self.accepted = Some(Accepted {
                    rank: from,
                    iteration: report.iteration,
                    elapsed: report.elapsed,
                    mail: report.mail.as_deref().copied().unwrap_or_default(),
                });
                self.after_offer(now)
            }
            ToMaster::Failed { attempt, error } => {
                if attempt != self.config.attempt {
                    self.other_drops.stale += 1;
                    return None;
                }
                // A worker's failure is the rank's it came from, whatever rank it names.
                let error = error.attributed_to(from);
                // A lost worker will never report done: do not wait for it at the end. The
                // failure is still the output (never a `Drained` it completes: that would
                // hide it); a drain it completed ends at the driver's next move — `lose`
                // of the rank, say.
                if matches!(error, JobError::WorkerLost { rank, .. } if rank == from)
                    && !self.done[from]
                {
                    self.done[from] = true;
                    self.done_count += 1;
                }
                Some(GateOutput::Failed(error))
            }
            // Sync calls are the barrier's `SyncState`'s, not the gate's.
            ToMaster::Sync { .. } => None,
            // Copies of checkpoints are the master's node's, taken before the gate.
            ToMaster::Replica(_)
            | ToMaster::Preempt { .. }
            | ToMaster::Recorded { .. }
            | ToMaster::Dump { .. } => None,
            ToMaster::Done { attempt, .. } => {
                if attempt != self.config.attempt {
                    self.other_drops.stale += 1;
                    return None;
                }
                if self.done[from] {
                    self.other_drops.duplicate += 1;
                    return None;
                }
                self.done[from] = true;
                self.done_count += 1;
                self.drained_if_all_done(now)
            }
        }
    }

    /// Feeds the results of workers that arrived together at `now` (the workers this
    /// process hosts, after a broadcast), as [`on_message`](Gate::on_message) would one
    /// at a time: the results at the start of `arrivals`, in order, up to the first
    /// other message or the first output, which is returned. Returns how many messages it
    /// took: each result's share and what it saved are taken out of its message, in
    /// place (the rest is the caller's to drop), and what follows — from the message
    /// that was not a result, or after the one that brought the output — is left to be
    /// fed after the driver acted on the output. What the gate took is not kept for
    /// [`take_accepted`](Gate::take_accepted): a driver that makes an event of each result
    /// feeds them one at a time.
    pub fn on_results(
        &mut self,
        now: Instant,
        arrivals: &mut [Envelope<ToMaster<W>>],
    ) -> (usize, Option<GateOutput<W>>) {
        // Every arrival has the same `now`, and nothing but an output moves the round's
        // deadline: it is checked once, before the first result of a rank.
        let mut checked = false;
        for (taken, env) in arrivals.iter_mut().enumerate() {
            let ToMaster::Result(report) = &mut env.msg else {
                return (taken, None);
            };
            let from = env.from;
            if from >= self.config.workers {
                self.other_drops.unknown_rank += 1;
                continue;
            }
            if !std::mem::replace(&mut checked, true)
                && self.stage == Stage::Gathering
                && self.round_due(now)
            {
                if let Some(timed_out) = self.handle_timeout(now) {
                    // (The result that met the wait's end goes with it, as one at a time.)
                    return (taken + 1, Some(timed_out));
                }
            }
            if !self.offer(from, report) {
                continue;
            }
            if let Some(output) = self.after_offer(now) {
                return (taken + 1, Some(output));
            }
        }
        (arrivals.len(), None)
    }

    /// Whether the round gathering has passed its iteration timeout at `now`.
    fn round_due(&self, now: Instant) -> bool {
        self.since
            .checked_add(self.config.iteration_timeout)
            .is_some_and(|deadline| now >= deadline)
    }

    /// Takes rank `from`'s `report` into the round, if it belongs there (not stale, not a
    /// duplicate): its share taken out and kept, the rest tallied, what it saved taken
    /// out and kept for the checkpoint. Returns whether it was taken.
    #[inline]
    fn offer(&mut self, from: Rank, report: &mut Report<W>) -> bool {
        let (attempt, iteration) = (report.attempt, report.iteration);
        // (A share the round drops goes with its report either way.)
        let share = std::mem::replace(&mut report.result, Share::Passed);
        match self.round.offer(from, attempt, iteration, share) {
            super::Offer::Accepted | super::Offer::Completed => {}
            _ => return false,
        }
        self.tally.count(from, report);
        if let Some(saved) = report.saved.take() {
            if self.saved.is_empty() {
                self.saved = vec![None; self.config.workers];
            }
            self.saved[from] = Some(*saved);
        }
        true
    }

    /// After a result was taken in: folds what is ready, and completes the round if it is
    /// (or has its quorum past the min-workers timeout).
    #[inline]
    fn after_offer(&mut self, now: Instant) -> Option<GateOutput<W>> {
        if let Err(failed) = self.take_ready() {
            return Some(GateOutput::Failed(failed));
        }
        if self.round.is_complete() {
            return Some(self.complete(self.round.iteration()));
        }
        self.complete_with_quorum(now)
    }

    /// Tallies (and when combining, folds) the results that can be taken in rank order.
    fn all_registered(&mut self) -> Option<GateOutput<W>> {
        let lost = self.lost.iter().filter(|&&l| l).count();
        if self.stage == Stage::Registering && self.registered_count + lost == self.config.workers {
            self.stage = Stage::Idle;
            return Some(GateOutput::AllRegistered);
        }
        None
    }

    /// A replacement for the worker of `rank` is on its way (`FailurePolicy::RestartWorker`):
    /// its registration is accepted again, also mid-job, and answered with
    /// [`GateOutput::Rejoined`]. The round still waits for the rank's result; one that
    /// arrived already is kept (a redone iteration's result is then a duplicate). The
    /// failed worker's `Done`, if it comes after this call but before the replacement's
    /// registration (messages of one rank arrive in order), is forgotten when the
    /// replacement registers.
    pub fn rejoin(&mut self, rank: Rank) {
        if self.registered.get(rank).copied().unwrap_or(false) {
            self.registered[rank] = false;
            self.registered_count -= 1;
        }
        if self.done.get(rank).copied().unwrap_or(false) {
            self.done[rank] = false;
            self.done_count -= 1;
        }
    }

    /// The job goes on without the worker of `rank` for good
    /// (`FailurePolicy::ContinueWithout`): no round waits for it from now on, nor does
    /// registration or the end of the job. May complete the round that waited only for it.
    pub fn lose(&mut self, now: Instant, rank: Rank) -> Option<GateOutput<W>> {
        if self.lost.get(rank).copied().unwrap_or(true) {
            return None;
        }
        self.lost[rank] = true;
        if !self.done[rank] {
            self.done[rank] = true;
            self.done_count += 1;
        }
        match self.stage {
            Stage::Registering => {
                if self.registered[rank] {
                    self.registered[rank] = false;
                    self.registered_count -= 1;
                }
                self.all_registered()
            }
            Stage::Gathering => {
                self.round.leave_out(rank);
                if let Err(failed) = self.take_ready() {
                    return Some(GateOutput::Failed(failed));
                }
                if self.round.is_complete() {
                    return Some(self.complete(self.round.iteration()));
                }
                self.complete_with_quorum(now)
            }
            Stage::Draining => self.drained_if_all_done(now),
            Stage::Idle | Stage::Finished => None,
        }
    }

    /// Whether the job goes on without the worker of `rank` for good.
    pub fn is_lost(&self, rank: Rank) -> bool {
        self.lost.get(rank).copied().unwrap_or(false)
    }

    /// The ranks the job goes on without for good, in rank order.
    pub fn lost(&self) -> Vec<Rank> {
        missing(&self.lost.iter().map(|l| !l).collect::<Vec<_>>())
    }

    /// Starts attempt `attempt` from registration (a gang restart, or a restarted master):
    /// every message of an earlier attempt is stale from now on. Lost ranks are forgotten;
    /// what was dropped so far stays counted.
    pub fn restart(&mut self, now: Instant, attempt: Attempt) {
        let n = self.config.workers;
        self.config.attempt = attempt;
        self.stage = Stage::Registering;
        self.since = now;
        self.registered = vec![false; n];
        self.registered_count = 0;
        if self.round.is_open() {
            self.round.close();
        }
        self.reset_tally();
        self.done = vec![false; n];
        self.done_count = 0;
        self.lost = vec![false; n];
        self.drain_timeout = None;
    }

    /// The attempt whose messages the gate accepts.
    pub fn attempt(&self) -> Attempt {
        self.config.attempt
    }

    fn take_ready(&mut self) -> Result<(), JobError> {
        // Results are what a worker sent: its own, or — folded among the workers — the one
        // fold, from the rank the route ends at (the others sent nothing).
        let results = match self.route.root() {
            None => self.round.held(),
            Some(root) => usize::from(self.round.holds(root)),
        };
        let held = results + self.fold.as_ref().map_or(0, |f| f.acc.is_some() as usize);
        self.tally.results_held = self.tally.results_held.max(held);
        let Some(fold) = &mut self.fold else {
            return Ok(());
        };
        let iteration = self.round.iteration();
        while let Some((rank, share)) = self.round.take_next() {
            let value = match share_fits(self.route, (rank, iteration), share) {
                Ok(Some(value)) => value,
                Ok(None) => continue,
                Err(error) => {
                    fold.acc = None;
                    self.stage = Stage::Idle;
                    self.round.close();
                    return Err(error);
                }
            };
            match &mut fold.acc {
                None => fold.acc = Some(value),
                Some(acc) => {
                    if let Err(cause) = (fold.combine)(acc, value) {
                        fold.acc = None;
                        self.stage = Stage::Idle;
                        self.round.close();
                        return Err(JobError::Master {
                            iteration,
                            phase: Phase::Combine,
                            cause,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Closes the complete round and sums it up.
    fn complete(&mut self, iteration: Iteration) -> GateOutput<W> {
        self.stage = Stage::Idle;
        let route = self.route;
        let mut results = std::mem::take(&mut self.spare.results);
        results.reserve(self.round.held());
        let mut reported = std::mem::take(&mut self.spare.reported);
        let mut failed = None;
        let left_out = self.round.close_into(&mut reported, |rank, share| {
            if failed.is_none() {
                match share_fits(route, (rank, iteration), share) {
                    Ok(value) => results.extend(value),
                    Err(error) => failed = Some(error),
                }
            }
        });
        if let Some(error) = failed {
            return GateOutput::Failed(error);
        }
        let gathered = Gathered {
            results,
            combined: self.fold.as_mut().and_then(|f| f.acc.take()),
            tally: std::mem::take(&mut self.tally),
            reported,
            left_out,
            saved: std::mem::take(&mut self.saved),
        };
        GateOutput::RoundComplete {
            iteration,
            gathered,
        }
    }

    /// When the round may complete with its quorum: `None` when it waits for every rank.
    fn quorum_deadline(&self) -> Option<Instant> {
        if self.stage != Stage::Gathering || self.config.quorum >= self.config.workers {
            return None;
        }
        self.since.checked_add(self.config.min_workers_timeout)
    }

    /// Completes the round with the results in, if the min-workers timeout has passed and
    /// they are its quorum: the ranks still missing are left out.
    fn complete_with_quorum(&mut self, now: Instant) -> Option<GateOutput<W>> {
        let deadline = self.quorum_deadline()?;
        if now < deadline || self.round.filled() < self.config.quorum {
            return None;
        }
        for rank in self.round.missing() {
            self.round.leave_out(rank);
        }
        if let Err(failed) = self.take_ready() {
            return Some(GateOutput::Failed(failed));
        }
        Some(self.complete(self.round.iteration()))
    }

    /// Opens `iteration`: results for it are accepted from now on, and the iteration
    /// timeout starts.
    ///
    /// Returns `false` and does nothing unless the gate is between rounds (after
    /// [`GateOutput::AllRegistered`] or [`GateOutput::RoundComplete`]).
    pub fn open(&mut self, now: Instant, iteration: Iteration) -> bool {
        self.open_folding(now, iteration, FoldRoute::Star)
    }

    /// As [`open`](Gate::open), with the workers folding their results as `route` says
    /// (a combining gate only): the rank the fold ends at — rank 0, by the tree and by the
    /// ring — reports [`Share::Fold`], every other [`Share::Passed`]. A share that
    /// does not fit the route fails the round naming the rank.
    pub fn open_folding(&mut self, now: Instant, iteration: Iteration, route: FoldRoute) -> bool {
        if self.stage != Stage::Idle {
            return false;
        }
        self.route = if self.fold.is_some() {
            route
        } else {
            FoldRoute::Star
        };
        self.round.open(self.config.attempt, iteration);
        for rank in 0..self.config.workers {
            if self.lost[rank] {
                self.round.leave_out(rank);
            }
        }
        self.reset_tally();
        self.quorum_passed = false;
        self.stage = Stage::Gathering;
        self.since = now;
        true
    }

    /// Forgets what an unfinished round tallied and folded.
    fn reset_tally(&mut self) {
        self.tally = Tally::default();
        self.saved = Vec::new();
        if let Some(fold) = &mut self.fold {
            fold.acc = None;
        }
    }

    /// Whether the worker of `rank` reported done.
    pub fn is_done(&self, rank: Rank) -> bool {
        self.done.get(rank).copied().unwrap_or(false)
    }

    /// Whether the worker of `rank` is registered (in this attempt, since it was last
    /// replaced).
    pub fn is_registered(&self, rank: Rank) -> bool {
        self.registered.get(rank).copied().unwrap_or(false)
    }

    /// What the gate waits for now, if it waits for workers.
    pub fn waiting(&self) -> Option<Wait> {
        let c = &self.config;
        let (during, missing, timeout) = match self.stage {
            Stage::Registering => {
                let waiting: Vec<bool> = (0..c.workers)
                    .map(|r| self.registered[r] || self.lost[r])
                    .collect();
                (Waiting::Registration, missing(&waiting), c.startup_timeout)
            }
            Stage::Gathering => (
                Waiting::Iteration(self.round.iteration()),
                self.round.missing(),
                c.iteration_timeout,
            ),
            Stage::Draining => (
                Waiting::Shutdown,
                missing(&self.done),
                self.shutdown_timeout(),
            ),
            Stage::Idle | Stage::Finished => return None,
        };
        (!missing.is_empty()).then_some(Wait {
            during,
            missing,
            since: self.since,
            timeout,
        })
    }

    /// Ends the job: no more results are accepted, and the gate waits for every worker's
    /// `Done` until the shutdown timeout. Returns [`GateOutput::Drained`] at once if every
    /// worker is done already.
    pub fn drain(&mut self, now: Instant) -> Option<GateOutput<W>> {
        self.drain_within(now, self.config.shutdown_timeout)
    }

    /// Like [`drain`](Gate::drain), waiting at most `timeout` (a failed job's grace, say)
    /// instead of the shutdown timeout.
    pub fn drain_within(&mut self, now: Instant, timeout: Duration) -> Option<GateOutput<W>> {
        if matches!(self.stage, Stage::Draining | Stage::Finished) {
            return None;
        }
        if self.round.is_open() {
            self.round.close();
        }
        self.reset_tally();
        self.stage = Stage::Draining;
        self.since = now;
        self.drain_timeout = Some(timeout);
        self.drained_if_all_done(now)
    }

    fn shutdown_timeout(&self) -> Duration {
        self.drain_timeout.unwrap_or(self.config.shutdown_timeout)
    }

    fn drained_if_all_done(&mut self, now: Instant) -> Option<GateOutput<W>> {
        if self.stage == Stage::Draining && self.done_count == self.config.workers {
            self.stage = Stage::Finished;
            return Some(GateOutput::Drained {
                missing: Vec::new(),
                waited: now.saturating_duration_since(self.since),
                drops: self.drops(),
            });
        }
        None
    }

    /// When the current wait times out, if the gate is waiting for workers (a timeout too
    /// long to add to `now`, such as `Duration::MAX`, never does).
    ///
    /// While a round gathers with a quorum below every rank, that is first the
    /// min-workers timeout, then — once it passed without the quorum — the iteration
    /// timeout.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = match self.stage {
            Stage::Registering => self.config.startup_timeout,
            Stage::Gathering => self.config.iteration_timeout,
            Stage::Draining => self.shutdown_timeout(),
            Stage::Idle | Stage::Finished => return None,
        };
        let hard = self.since.checked_add(timeout);
        match (self.quorum_deadline(), hard) {
            (Some(soft), Some(hard)) if !self.quorum_passed && soft < hard => Some(soft),
            (Some(soft), None) if !self.quorum_passed => Some(soft),
            _ => hard,
        }
    }

    /// Fails the current wait if its timeout has passed at `now`, naming the missing ranks.
    ///
    /// A round past its min-workers timeout completes instead if its quorum is in (see
    /// [`GateConfig::quorum`]), leaving out the ranks still missing.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<GateOutput<W>> {
        if let Some(soft) = self.quorum_deadline() {
            if now >= soft {
                self.quorum_passed = true;
                if let Some(completed) = self.complete_with_quorum(now) {
                    return Some(completed);
                }
            }
        }
        let deadline = self.poll_timeout()?;
        if now < deadline {
            return None;
        }
        let waited = now.saturating_duration_since(self.since);
        match self.stage {
            Stage::Registering => {
                self.stage = Stage::Idle;
                Some(GateOutput::Failed(JobError::WorkersTimedOut {
                    during: Waiting::Registration,
                    missing: missing(&self.registered),
                    waited,
                    refused: Vec::new(),
                    heard: Vec::new(),
                }))
            }
            Stage::Gathering => {
                self.stage = Stage::Idle;
                let missing = self.round.missing();
                self.round.close();
                self.reset_tally();
                Some(GateOutput::Failed(JobError::WorkersTimedOut {
                    during: Waiting::Iteration(self.round.iteration()),
                    missing,
                    waited,
                    refused: Vec::new(),
                    heard: Vec::new(),
                }))
            }
            Stage::Draining => {
                self.stage = Stage::Finished;
                Some(GateOutput::Drained {
                    missing: missing(&self.done),
                    waited,
                    drops: self.drops(),
                })
            }
            Stage::Idle | Stage::Finished => None,
        }
    }

    /// Every arrival dropped so far.
    pub fn drops(&self) -> Drops {
        let mut drops = self.round.drops();
        drops += self.other_drops;
        drops
    }
}

fn missing(flags: &[bool]) -> Vec<Rank> {
    flags
        .iter()
        .enumerate()
        .filter(|(_, &f)| !f)
        .map(|(r, _)| r)
        .collect()
}

#[cfg(test)]
mod tests;
