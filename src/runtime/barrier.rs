//! The barrier actor: the master's node's hub. Every message from a worker arrives here and
//! goes through the [`Gate`]; every message to the workers leaves from here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Handler, Message, Recipient};

use crate::compute::Payload;
use crate::error::{Cause, JobError, Waiting};
use crate::events::{Events, JobEvent};
use crate::protocol::{
    Attempt, Envelope, Gate, GateOutput, Iteration, SyncState, SyncStep, ToMaster, ToWorker,
};
use crate::transport::MasterLink;

/// What the gate said, for the master.
pub(crate) struct FromGate<W>(pub(crate) GateOutput<W>);

impl<W: 'static> Message for FromGate<W> {
    type Result = ();
}

/// Open an iteration and broadcast it.
pub(crate) struct Open<M> {
    pub(crate) iteration: Iteration,
    pub(crate) last: Option<Arc<M>>,
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

pub(crate) struct BarrierActor<M: Payload, W: Payload> {
    gate: Gate<W>,
    sync: SyncState,
    link: Box<dyn MasterLink<M>>,
    master: Recipient<FromGate<W>>,
    attempt: Attempt,
    events: Events,
    tick: Duration,
}

impl<M: Payload, W: Payload> BarrierActor<M, W> {
    pub(crate) fn new(
        gate: Gate<W>,
        sync: SyncState,
        link: Box<dyn MasterLink<M>>,
        master: Recipient<FromGate<W>>,
        attempt: Attempt,
        events: Events,
        tick: Duration,
    ) -> Self {
        BarrierActor {
            gate,
            sync,
            link,
            master,
            attempt,
            events,
            tick,
        }
    }

    fn forward(&self, output: Option<GateOutput<W>>) {
        if let Some(output) = output {
            self.master.do_send(FromGate(output));
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
                attempt: self.attempt,
                epoch,
                result,
            };
            let link = &self.link;
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| link.send(rank, msg))) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(rank, error = %e, "could not answer a sync call"),
                Err(payload) => {
                    tracing::error!(rank, cause = %Cause::from_panic(payload), "the transport panicked answering a sync call")
                }
            }
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
            let now = Instant::now();
            let step = act.sync.handle_timeout(now);
            act.apply(step);
            let output = act.gate.handle_timeout(now);
            act.forward_gate(now, output);
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
                if attempt == self.attempt {
                    let step = self.sync.on_call(msg.at, from, epoch, kind, message);
                    self.apply(step);
                }
                return;
            }
            ToMaster::Result(ref report) if report.attempt == self.attempt => {
                // Its compute returned: it makes no more sync calls this iteration.
                let step = self.sync.on_returned(from, report.iteration);
                self.apply(step);
            }
            _ => {}
        }
        let done_before = self.gate.is_done(from);
        let output = self.gate.on_message(msg.at, msg.env);
        if !done_before && self.gate.is_done(from) {
            self.events.emit(|| JobEvent::WorkerDone { rank: from });
        }
        self.forward_gate(msg.at, output);
    }
}

impl<M: Payload, W: Payload> Handler<Open<M>> for BarrierActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: Open<M>, _: &mut Context<Self>) {
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
            attempt: self.attempt,
            iteration: msg.iteration,
            last: msg.last,
        });
    }
}

impl<M: Payload, W: Payload> Handler<FinishJob<M>> for BarrierActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: FinishJob<M>, _: &mut Context<Self>) {
        self.broadcast(ToWorker::Finish {
            attempt: self.attempt,
            iterations: msg.iterations,
            halted: msg.halted,
            last: msg.last,
        });
        let output = self.gate.drain(Instant::now());
        self.forward(output);
    }
}

impl<M: Payload, W: Payload> Handler<AbortJob> for BarrierActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: AbortJob, _: &mut Context<Self>) {
        // Release every rank waiting in a sync call at once, with the job's failure.
        let step = self.sync.abort(&msg.error);
        self.apply(step);
        self.broadcast(ToWorker::Abort {
            attempt: self.attempt,
            error: msg.error,
        });
        let output = self.gate.drain(Instant::now());
        self.forward(output);
    }
}
