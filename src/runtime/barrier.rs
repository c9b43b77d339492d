//! The barrier actor: the master's node's hub. Every message from a worker arrives here and
//! goes through the [`Gate`]; every message to the workers leaves from here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Handler, Message, Recipient};

use crate::compute::Payload;
use crate::error::{Cause, JobError, Waiting};
use crate::events::{Events, JobEvent};
use crate::protocol::{
    Attempt, Envelope, FailurePolicy, Gate, GateOutput, Iteration, Recover, Recovery, SyncState,
    SyncStep, ToMaster, ToWorker, Wait,
};
use crate::transport::{MasterLink, TransportError};

use super::local::LocalWorkers;
use crate::coordinator::{RowCounts, WorkerReport};
use crate::job::Cancel;

/// What the gate said, for the master.
pub(crate) struct FromGate<W>(pub(crate) GateOutput<W>);

impl<W: 'static> Message for FromGate<W> {
    type Result = ();
}

/// Open an iteration and broadcast it. An `Open` of an attempt that ended (every worker
/// restarted meanwhile) is dropped.
pub(crate) struct Open<M> {
    pub(crate) attempt: Attempt,
    pub(crate) iteration: Iteration,
    pub(crate) last: Option<Arc<M>>,
}

/// The barrier recovers from a worker's failure under the job's failure policy; after
/// [`Recover::RestartAll`] the master starts over from its newest checkpoint.
pub(crate) struct Recovering {
    pub(crate) cause: JobError,
    pub(crate) action: Recover,
}

impl Message for Recovering {
    type Result = ();
}

/// Every worker's report of what it did, sent to the master just before the end of the
/// drain (only those that reported done, in rank order).
pub(crate) struct WorkerReports(pub(crate) Vec<WorkerReport>);

impl Message for WorkerReports {
    type Result = ();
}

/// The job completed: tell every worker and wait for them to be done.
pub(crate) struct FinishJob<M> {
    pub(crate) iterations: Iteration,
    pub(crate) halted: bool,
    pub(crate) last: Arc<M>,
}

/// The job failed: tell every worker and wait for them to be done.
pub(crate) struct AbortJob {
    pub(crate) error: JobError,
}

impl<M: 'static> Message for Open<M> {
    type Result = ();
}
impl<M: 'static> Message for FinishJob<M> {
    type Result = ();
}
impl Message for AbortJob {
    type Result = ();
}
/// A worker's message, stamped with when the transport handed it over: its deadline is
/// judged by that instant, not by when the barrier got to it (inline compute may have held
/// the thread meanwhile).
pub(crate) struct Arrived<W> {
    pub(crate) env: Envelope<ToMaster<W>>,
    pub(crate) at: Instant,
}

impl<W: 'static> Message for Arrived<W> {
    type Result = ();
}

/// Who the barrier talks to besides the workers' transport.
pub(crate) struct BarrierPeers<M: Payload, W: Payload> {
    pub(crate) master: Recipient<FromGate<W>>,
    pub(crate) recovering: Recipient<Recovering>,
    pub(crate) reports: Recipient<WorkerReports>,
    /// The workers of this process, which the barrier starts again when the failure
    /// policy replaces them.
    pub(crate) local: LocalWorkers<M, W>,
    /// Cancels the job when set.
    pub(crate) cancel: Option<Cancel>,
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

pub(crate) struct BarrierActor<M: Payload, W: Payload> {
    gate: Gate<W>,
    sync: SyncState,
    link: Box<dyn MasterLink<M>>,
    master: Recipient<FromGate<W>>,
    recovering: Recipient<Recovering>,
    reports: Recipient<WorkerReports>,
    local: LocalWorkers<M, W>,
    recovery: Recovery,
    /// By rank: what its worker reported with its `Done` (the newest of the attempt).
    rows: Vec<Option<RowCounts>>,
    cancel: Option<Cancel>,
    cancelled: bool,
    /// The master result the current iteration computes with: a replacement that rejoins
    /// mid-iteration redoes it with this.
    last: Option<Arc<M>>,
    /// The job is ending (finished or aborted): failures no longer recover.
    ending: bool,
    /// By rank: a new process of the rank is awaited (another process's worker was
    /// replaced).
    awaiting: Vec<Awaiting>,
    events: Events,
    tick: Duration,
    /// When the current wait for workers was last said to be going on.
    wait_said: Option<Instant>,
}

/// How long the end of a job waits for a rank that may still connect (a worker reconnecting
/// to a master's node started again: its backoff is at most about a second).
const RECONNECT_GRACE: Duration = Duration::from_secs(3);

/// At most how long a wait for workers goes on between two lines that say so (it says so
/// every quarter of its timeout when that is shorter).
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl<M: Payload, W: Payload> BarrierActor<M, W> {
    pub(crate) fn new(
        gate: Gate<W>,
        sync: SyncState,
        link: Box<dyn MasterLink<M>>,
        peers: BarrierPeers<M, W>,
        recovery: Recovery,
        events: Events,
        tick: Duration,
    ) -> Self {
        let gate_workers = recovery.workers();
        BarrierActor {
            gate,
            sync,
            link,
            master: peers.master,
            recovering: peers.recovering,
            reports: peers.reports,
            local: peers.local,
            rows: vec![None; gate_workers],
            cancel: peers.cancel,
            cancelled: false,
            recovery,
            last: None,
            ending: false,
            awaiting: vec![Awaiting::None; gate_workers],
            events,
            tick,
            wait_said: None,
        }
    }

    /// Says, at a steady interval ([`WAIT_LOG_INTERVAL`], or a quarter of the wait's
    /// timeout), which ranks a long wait waits for: at WARN for
    /// start-up and shutdown, which should be short; at INFO for an iteration — compute may
    /// be long by design — until half its timeout has passed.
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
    fn forget_unconnected(&mut self, ctx: &mut Context<Self>, now: Instant) {
        let mut later = Vec::new();
        for rank in 0..self.rows.len() {
            if self.gate.is_done(rank) || self.link.is_connected(rank) {
                continue;
            }
            if self.link.may_reach(rank) {
                later.push(rank);
            } else {
                tracing::debug!(rank, "not connected at the end of the job: not waited for");
                self.not_waited_for(now, rank);
            }
        }
        if !later.is_empty() {
            ctx.run_later(RECONNECT_GRACE, move |act, _| {
                let now = Instant::now();
                for rank in later {
                    if !act.gate.is_done(rank) && !act.link.is_connected(rank) {
                        tracing::debug!(rank, "did not reconnect after the job ended");
                        act.not_waited_for(now, rank);
                    }
                }
            });
        }
    }

    /// The rank will not say it is done: the end of the job does not wait for it.
    fn not_waited_for(&mut self, now: Instant, rank: crate::protocol::Rank) {
        let output = self.gate.lose(now, rank);
        self.forward(output);
    }

    fn attempt(&self) -> Attempt {
        self.gate.attempt()
    }

    /// Acts on what the gate said: a failure goes to the failure policy, a rejoined
    /// replacement gets the iteration under way; the master hears the rest.
    fn forward(&mut self, output: Option<GateOutput<W>>) {
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
                        *refused = self.link.refusals(missing);
                    }
                }
                return self.on_failure(error);
            }
            GateOutput::AllRegistered => self.recovery.all_registered(),
            GateOutput::Rejoined { rank, iteration } => {
                self.recovery.rejoined(rank);
                self.awaiting[rank] = Awaiting::None;
                tracing::info!(rank, ?iteration, "a replacement worker joined");
                if let Some(iteration) = iteration {
                    self.send(
                        rank,
                        ToWorker::Iterate {
                            attempt: self.attempt(),
                            iteration,
                            last: self.last.clone(),
                        },
                    );
                }
            }
            GateOutput::Drained { .. } => {
                let reports = (0..self.rows.len())
                    .filter_map(|rank| {
                        let rows = self.rows[rank].take()?;
                        Some(WorkerReport { rank, rows })
                    })
                    .collect();
                self.reports.do_send(WorkerReports(reports));
            }
            _ => {}
        }
        self.master.do_send(FromGate(output));
    }

    /// A failure: the job's end, or one the failure policy recovers from.
    fn on_failure(&mut self, error: JobError) {
        let now = Instant::now();
        if self.ending {
            // A worker the job can do without (a straggler of the last round, say) that
            // fails while the job ends is not waited for; any other failure is the job's.
            let rank = Recovery::recoverable(&error);
            match rank {
                Some(rank) if self.recovery.policy() != FailurePolicy::Fail => {
                    tracing::warn!(rank, %error, "a worker failed while the job ended");
                    self.not_waited_for(now, rank);
                }
                _ => self.fail_job(error),
            }
            return;
        }
        let Some(action) = self.recovery.on_failure(error.clone()) else {
            tracing::debug!(%error, "a further report of a failure being recovered from");
            return;
        };
        match &action {
            Recover::Fail(error) => return self.fail_job(error.clone()),
            Recover::RestartWorker(rank) => {
                let rank = *rank;
                if self.local.is_local(rank) {
                    if let Err(failed) = self.local.replace(rank, self.attempt(), &error) {
                        return self.fail_job(failed);
                    }
                    // The old worker's link is closed: whatever the rank says from now on
                    // is the replacement's, and a failure of it is a new one.
                    self.recovery.rejoined(rank);
                } else {
                    // A new process of the rank connects and registers. Until the old
                    // one's connection ended (its `Done`, or its loss — which may be this
                    // very failure: see the `Arrived` handler), what the rank says is
                    // still the old one's.
                    self.awaiting[rank] = Awaiting::OldEnd;
                    self.dismiss(rank, &error);
                }
                self.gate.rejoin(rank);
            }
            Recover::LeaveOut(rank) => {
                let rank = *rank;
                if !self.local.is_local(rank) {
                    self.dismiss(rank, &error);
                }
            }
            Recover::RestartAll(attempt) => {
                let attempt = *attempt;
                // Release the old attempt's ranks waiting in a sync call first, while their
                // links still reach them.
                let step = self.sync.abort(&error);
                self.apply(step);
                self.gate.restart(now, attempt);
                self.sync.restart();
                self.last = None;
                if let Err(failed) = self.local.replace_all(attempt, &error) {
                    return self.fail_job(failed);
                }
            }
        }
        self.recovering.do_send(Recovering {
            cause: error,
            action: action.clone(),
        });
        if let Recover::LeaveOut(rank) = action {
            let output = self.gate.lose(now, rank);
            self.forward_gate(now, output);
        }
    }

    /// Tells the failed worker of another process, still connected, that the job is over
    /// for it (with its own failure): the job goes on without it, and its process ends
    /// now rather than waiting to hear how the job ends.
    fn dismiss(&mut self, rank: crate::protocol::Rank, error: &JobError) {
        // A lost or refused process has no connection: one of the rank now is a new one.
        let gone = matches!(
            error,
            JobError::WorkerLost { .. } | JobError::Mismatch { .. }
        );
        if !gone && self.link.is_connected(rank) {
            let msg = ToWorker::Abort {
                attempt: self.attempt(),
                error: error.clone(),
            };
            self.send(rank, msg);
        }
    }

    /// Fails the job: the master ends it with `error`.
    fn fail_job(&self, error: JobError) {
        self.master.do_send(FromGate(GateOutput::Failed(error)));
    }

    /// The job ends: a rank whose new process has not registered yet is not waited for
    /// (nothing would tell it the job ended).
    fn forget_awaited(&mut self) {
        let now = Instant::now();
        for rank in 0..self.awaiting.len() {
            if self.awaiting[rank] != Awaiting::None {
                self.awaiting[rank] = Awaiting::None;
                tracing::warn!(
                    rank,
                    "the job ended before a new process of the rank joined"
                );
                self.not_waited_for(now, rank);
            }
        }
    }

    fn send(&mut self, rank: crate::protocol::Rank, msg: ToWorker<M>) {
        let link = &self.link;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| link.send(rank, msg))) {
            Ok(Ok(())) => {}
            // What the worker would not read over a network fails the job, as there.
            Ok(Err(e @ TransportError::Undecodable { .. })) => self.fail_job(e.into()),
            Ok(Err(e)) => tracing::warn!(rank, error = %e, "could not reach a worker"),
            Err(payload) => {
                tracing::error!(rank, cause = %Cause::from_panic(payload), "the transport panicked sending to a worker")
            }
        }
    }

    /// Forwards what the gate said, except that an iteration that timed out while ranks
    /// waited in a sync call fails as that epoch's timeout: it names the ranks that did not
    /// arrive, not every rank of the iteration (the waiting ones had not delivered either).
    fn forward_gate(&mut self, now: Instant, output: Option<GateOutput<W>>) {
        if let Some(GateOutput::Failed(JobError::WorkersTimedOut {
            during: Waiting::Iteration(_),
            ..
        })) = &output
        {
            if self.sync.is_gathering() {
                let step = self.sync.expire(now);
                self.apply(step);
                return;
            }
        }
        self.forward(output);
    }

    /// Sends the answers of a sync step, and fails the job if the step says so.
    fn apply(&mut self, step: SyncStep) {
        for (rank, epoch, result) in step.replies {
            let msg = ToWorker::SyncReply {
                attempt: self.attempt(),
                epoch,
                result,
            };
            self.send(rank, msg);
        }
        if let Some(error) = step.failed {
            self.forward(Some(GateOutput::Failed(JobError::Sync(error))));
        }
    }

    fn broadcast(&mut self, msg: ToWorker<M>) {
        let link = &self.link;
        let error =
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| link.broadcast(msg))) {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e.into(),
                Err(payload) => JobError::Transport {
                    message: format!(
                        "the transport panicked in a broadcast: {}",
                        Cause::from_panic(payload)
                    ),
                },
            };
        self.forward(Some(GateOutput::Failed(error)));
    }
}

impl<M: Payload, W: Payload> Actor for BarrierActor<M, W> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Timeouts are checked on a coarse tick rather than one timer per wait: arming and
        // cancelling a timer each round would cost more than the round itself.
        ctx.run_interval(self.tick, |act, _| {
            if !act.cancelled && act.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
                act.cancelled = true;
                tracing::warn!("the job was cancelled");
                act.fail_job(JobError::Cancelled);
            }
            let now = Instant::now();
            let step = act.sync.handle_timeout(now);
            act.apply(step);
            let output = act.gate.handle_timeout(now);
            act.forward_gate(now, output);
            act.say_waiting(now);
        });
    }
}

impl<M: Payload, W: Payload> Handler<Arrived<W>> for BarrierActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: Arrived<W>, _: &mut Context<Self>) {
        let from = msg.env.from;
        match msg.env.msg {
            ToMaster::Sync {
                attempt,
                epoch,
                kind,
                message,
            } => {
                if attempt == self.attempt() {
                    let step = self.sync.on_call(msg.at, from, epoch, kind, message);
                    self.apply(step);
                }
                return;
            }
            ToMaster::Result(ref report) if report.attempt == self.attempt() => {
                // Its compute returned: it makes no more sync calls this iteration.
                let step = self.sync.on_returned(from, report.iteration);
                self.apply(step);
            }
            ToMaster::Done {
                attempt, ref rows, ..
            } if attempt == self.attempt() => {
                // A worker that failed runs on to its `Done`: a rank left out, or one whose
                // failed process is still the one talking, never reports as completed.
                let failed =
                    self.gate.is_lost(from) || self.awaiting.get(from) == Some(&Awaiting::OldEnd);
                if let Some(slot) = self.rows.get_mut(from).filter(|_| !failed) {
                    *slot = Some(rows.clone());
                }
            }
            _ => {}
        }
        // The last message of a connection: its `Done`, or its loss (or its refusal).
        let ends_connection = matches!(
            msg.env.msg,
            ToMaster::Done { .. }
                | ToMaster::Failed {
                    error: JobError::WorkerLost { .. } | JobError::Mismatch { .. },
                    ..
                }
        );
        let done_before = self.gate.is_done(from);
        let registered_before = self.gate.is_registered(from);
        let output = self.gate.on_message(msg.at, msg.env);
        if !done_before && self.gate.is_done(from) {
            self.events.emit(|| JobEvent::WorkerDone { rank: from });
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
        self.forward_gate(msg.at, output);
        if ends_connection && self.awaiting.get(from) == Some(&Awaiting::OldEnd) {
            self.awaiting[from] = Awaiting::Replacement;
            self.recovery.rejoined(from);
        }
    }
}

impl<M: Payload, W: Payload> Handler<Open<M>> for BarrierActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: Open<M>, _: &mut Context<Self>) {
        if msg.attempt != self.attempt() {
            // Every worker restarted while the master computed: it starts over.
            return;
        }
        self.last = msg.last.clone();
        // Open before broadcasting, so no result can arrive before its round.
        self.sync.new_iteration(msg.iteration);
        if !self.gate.open(Instant::now(), msg.iteration) {
            self.forward(Some(GateOutput::Failed(JobError::Runtime {
                message: format!(
                    "iteration {} opened while a wait was under way",
                    msg.iteration
                ),
            })));
            return;
        }
        self.broadcast(ToWorker::Iterate {
            attempt: self.attempt(),
            iteration: msg.iteration,
            last: msg.last,
        });
    }
}

impl<M: Payload, W: Payload> Handler<FinishJob<M>> for BarrierActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: FinishJob<M>, ctx: &mut Context<Self>) {
        self.ending = true;
        self.forget_awaited();
        self.broadcast(ToWorker::Finish {
            attempt: self.attempt(),
            iterations: msg.iterations,
            halted: msg.halted,
            last: msg.last,
        });
        let now = Instant::now();
        let output = self.gate.drain(now);
        self.forward(output);
        self.forget_unconnected(ctx, now);
    }
}

impl<M: Payload, W: Payload> Handler<AbortJob> for BarrierActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: AbortJob, ctx: &mut Context<Self>) {
        self.ending = true;
        self.forget_awaited();
        // Release every rank waiting in a sync call at once, with the job's failure.
        let step = self.sync.abort(&msg.error);
        self.apply(step);
        self.broadcast(ToWorker::Abort {
            attempt: self.attempt(),
            error: msg.error,
        });
        let now = Instant::now();
        let output = self.gate.drain(now);
        self.forward(output);
        self.forget_unconnected(ctx, now);
    }
}
