//! The node actor: the driver of the master's node. It holds the handles — the link to the
//! workers, the workers of this process, the master's code, the pool, the coordinator —
//! feeds the [`MasterNode`] what happens, and carries out the actions it queues. Every
//! decision about rounds, failures and the end of the job is the node's. When the transport
//! runs the whole job in this process, the actor also hosts its workers (`hosting.rs`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture,
};
use tokio::sync::oneshot;

use super::arrivals::{Arrivals, Arrived, Drain};
use super::coordination::CoordinatorSlot;
use super::dump::{DumpWatch, Dumps};
use super::local::{Hosted, LocalWorkers};
use super::master::MasterTask;
use super::pool::{ComputePool, Placer};
use super::signals::PreemptWatch;
use super::watch::{Watch, Who};
use super::worker::{Homeward, Host, WorkerDriver, WorkerHome};
use super::worker_task::stop_given_up;
use super::Cancel;
use crate::compute::JobEnd;
use crate::error::{Cause, JobError, Waiting};
use crate::events::Events;
use crate::ids::Rank;
use crate::payload::Payload;
use crate::protocol::JobConfig;
use crate::protocol::JobOutcome;
use crate::protocol::{
    Action, Envelope, MasterDone, MasterNode, MasterWork, Reach, ToMaster, ToWorker,
};
use crate::transport::{MasterLink, TransportError, WireCheck};

mod hosting;
mod rescue;

use hosting::TakeInbox;

/// The master's code is back from the pool with what it did.
struct MasterHome<M, W> {
    task: Box<MasterTask<M, W>>,
    done: MasterDone<M, W>,
}

impl<M: 'static, W: 'static> Message for MasterHome<M, W> {
    type Result = ();
}

/// The link to the workers, shared with the thread that called `run`: when user code holds
/// the job's thread past a failed job's grace, that thread tells the workers the job
/// failed.
pub(crate) type SharedLink<M> = Arc<Mutex<Box<dyn MasterLink<M>>>>;

fn lock<M>(link: &SharedLink<M>) -> MutexGuard<'_, Box<dyn MasterLink<M>>> {
    link.lock().unwrap_or_else(|e| e.into_inner())
}

/// The transport's view of which ranks the node reaches. It takes the link's lock only
/// when asked (at a failure, a checkpoint or the end of the job), not for every message.
struct LinkReach<'a, M>(&'a SharedLink<M>);

impl<M: 'static> Reach for LinkReach<'_, M> {
    fn is_connected(&self, rank: Rank) -> bool {
        lock(self.0).is_connected(rank)
    }
    fn may_reach(&self, rank: Rank) -> bool {
        lock(self.0).may_reach(rank)
    }
    fn refusals(&self, ranks: &[Rank]) -> Vec<String> {
        lock(self.0).refusals(ranks)
    }
    fn on_another_host(&self, rank: Rank) -> Option<bool> {
        lock(self.0).on_another_host(rank)
    }
    fn no_new_process(&self, rank: Rank) -> Option<String> {
        lock(self.0).no_new_process(rank)
    }
}

/// What the node actor is made of.
pub(crate) struct NodeParts<M: Payload, W: Payload> {
    pub(crate) config: Arc<JobConfig>,
    pub(crate) node: MasterNode<M, W>,
    pub(crate) link: SharedLink<M>,
    pub(crate) local: LocalWorkers<M, W>,
    pub(crate) task: MasterTask<M, W>,
    pub(crate) pool: Arc<ComputePool>,
    pub(crate) watch: Arc<Watch>,
    pub(crate) events: Events,
    pub(crate) coordination: CoordinatorSlot,
    pub(crate) cancel: Option<Cancel>,
    /// What asks the job to stop for a preemption in this process.
    pub(crate) preempt: PreemptWatch,
    /// What asks for a dump of the flight recorders in this process, and the dumps.
    pub(crate) dumps: (DumpWatch, Dumps),
    pub(crate) outcome: oneshot::Sender<Result<JobOutcome<M>, JobError>>,
    pub(crate) tick: Duration,
    /// The job's failure as this process hears of it.
    pub(crate) end: JobEnd,
    /// Whether what the node hands its hosted workers, and what they send it, goes
    /// through the wire encoding first (the in-memory transport's wire check).
    pub(crate) wire_check: WireCheck,
    /// Where workers' messages from other threads wait for the node.
    pub(crate) arrivals: Arc<Arrivals<W>>,
}

/// Whether an action was carried out, or waits for the coordinator's actor.
#[derive(PartialEq, Eq)]
enum ActionState {
    Done,
    Waiting,
}

/// Drives the master's node.
pub(crate) struct NodeActor<M: Payload, W: Payload> {
    node: MasterNode<M, W>,
    link: SharedLink<M>,
    /// The workers of this process, which the node starts again when the failure policy
    /// replaces them.
    local: LocalWorkers<M, W>,
    /// The master's code, when it is here (not away on the pool).
    task: Option<Box<MasterTask<M, W>>>,
    pool: Arc<ComputePool>,
    placer: Placer,
    watch: Arc<Watch>,
    events: Events,
    coordination: CoordinatorSlot,
    cancel: Option<Cancel>,
    preempt: PreemptWatch,
    dump_watch: DumpWatch,
    dumps: Dumps,
    /// The job's ranks.
    workers: usize,
    outcome: Option<oneshot::Sender<Result<JobOutcome<M>, JobError>>>,
    tick: Duration,
    end: JobEnd,
    /// What the workers this actor hosts sent the node, in the order they sent it: taken
    /// by the node as one batch, stamped with one clock read, in a buffer reused every
    /// round.
    inbox: Vec<Envelope<ToMaster<W>>>,
    /// Whether a batch is due ([`TakeInbox`] is queued).
    gathering: bool,
    /// While a broadcast is handed to the hosted workers: when the last unit of work run
    /// inline ended — the next one's start, so that a round reads the clock once per
    /// worker.
    clock: Option<Instant>,
    /// While a broadcast is handed to the hosted workers (`clock` runs on): the watch
    /// entry made for it, what it waits for and since when.
    chaining: Option<(Waiting, Instant)>,
    arrivals: Arc<Arrivals<W>>,
    /// The job's metrics, recorded from the node's events.
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::JobMetrics,
    /// The buffer the next batch of arrivals is swapped out into.
    spare: Vec<Arrived<W>>,
    wire_check: WireCheck,
    /// The cursor a broadcast's ranks are claimed from under `Placement::Auto`, with a
    /// rescuer thread that hands the ranks not reached yet to the pool when an inline
    /// compute holds the node's thread too long: started at the first round that needs it.
    rescue: Option<Arc<rescue::Rescue<M, W>>>,
    job_id: String,
}

impl<M: Payload, W: Payload> NodeActor<M, W> {
    pub(crate) fn new(parts: NodeParts<M, W>) -> Self {
        NodeActor {
            placer: Placer::new(parts.config.placement, parts.config.inline_threshold),
            node: parts.node,
            link: parts.link,
            local: parts.local,
            task: Some(Box::new(parts.task)),
            pool: parts.pool,
            watch: parts.watch,
            events: parts.events,
            coordination: parts.coordination,
            cancel: parts.cancel,
            preempt: parts.preempt,
            dump_watch: parts.dumps.0,
            dumps: parts.dumps.1,
            workers: parts.config.workers,
            outcome: Some(parts.outcome),
            tick: parts.tick,
            end: parts.end,
            inbox: Vec::new(),
            gathering: false,
            clock: None,
            chaining: None,
            arrivals: parts.arrivals,
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::JobMetrics::new(&parts.config.job_id),
            spare: Vec::new(),
            wire_check: parts.wire_check,
            rescue: None,
            job_id: parts.config.job_id.clone(),
        }
    }

    /// Carries out every action the node queued, in order, feeding back what they did. An
    /// action that waits for the coordinator's actor holds the rest (and every message not
    /// taken yet; a batch taken before it was handed to the node whole) until it is done,
    /// then drives on.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        while let Some(action) = self.node.poll_action() {
            if self.carry_out(ctx, action) == ActionState::Waiting {
                break;
            }
        }
        // What the hosted workers sent meanwhile is taken in a handler of its own: a round
        // of inline code yields to the event loop (timers, other messages) before the next.
        if !self.inbox.is_empty() && !self.gathering {
            self.gathering = true;
            ctx.notify(TakeInbox);
        }
    }

    fn carry_out(&mut self, ctx: &mut Context<Self>, action: Action<M, W>) -> ActionState {
        match action {
            Action::Send { to, msg } if self.local.is_hosted(to) => self.deliver(ctx, to, msg),
            Action::Send { to, msg } => self.send(Some(to), msg),
            // No compute of this process starts from now on, and a long one may stop early.
            Action::EndJob(error) => self.end.end(&error),
            Action::Broadcast(msg) => {
                if self.local.hosts_all() {
                    self.deliver_all(ctx, msg)
                } else {
                    self.send(None, msg)
                }
            }
            Action::RunMaster(work) => self.run_master(ctx, work),
            Action::ReplaceWorker {
                rank,
                attempt,
                cause,
            } => {
                let (replaced, old) = self.local.replace(rank, attempt, &cause);
                self.start_fresh(ctx);
                if let Some((old, msg)) = old {
                    self.retire(ctx, old, msg);
                }
                if let Err(failed) = replaced {
                    self.failed(failed);
                }
            }
            Action::ReplaceAll { attempt, cause } => {
                let (replaced, old) = self.local.replace_all(attempt, &cause);
                self.start_fresh(ctx);
                for (old, msg) in old {
                    self.retire(ctx, old, msg);
                }
                if let Err(failed) = replaced {
                    self.failed(failed);
                }
            }
            Action::Event(event) => {
                #[cfg(feature = "metrics")]
                self.metrics.record(&event, self.node.drops());
                self.events.emit(|| event)
            }
            Action::Report(report) => {
                self.coordination.worker_done(self.node.attempt(), report);
            }
            Action::Commit { iteration, reports } => {
                // On the coordinator's thread (the transport's keeps up heartbeats); the
                // node takes its next message once it knows the outcome.
                let coordination = self.coordination.clone();
                let attempt = self.node.attempt();
                let committing =
                    async move { coordination.finish(attempt, iteration, reports).await };
                ctx.wait(committing.into_actor(self).map(|result, act, ctx| {
                    act.node.handle_committed(Instant::now(), result);
                    act.drive(ctx);
                }));
                return ActionState::Waiting;
            }
            Action::CleanUp(error) => {
                let coordination = self.coordination.clone();
                let attempt = self.node.attempt();
                // `run` returns after `on_error` did: the job's outcome waits for it.
                let cleaning = async move { coordination.fail(Some(attempt), error).await };
                ctx.wait(cleaning.into_actor(self).map(|(), act, ctx| act.drive(ctx)));
                return ActionState::Waiting;
            }
            Action::Finished(result) => {
                // The checkpoints handed to the store's writer are written before the job
                // says it ended: a job run again reads them.
                if let Some(task) = &self.task {
                    task.flush_checkpoints();
                }
                // A dump under way is written with what came: the ranks' processes end.
                self.dumps.settle_now();
                // The receiver is gone only if the caller stopped waiting; nothing to tell
                // then.
                if let Some(outcome) = self.outcome.take() {
                    let _ = outcome.send(*result);
                }
                ctx.stop();
            }
        }
        ActionState::Done
    }

    /// Something done for the node failed: the node decides what follows.
    fn failed(&mut self, error: JobError) {
        let reach = LinkReach(&self.link);
        self.node.handle_failure(Instant::now(), error, &reach);
    }

    /// A message for the worker of `to` (`None`: for every worker) did not go: the node
    /// decides what follows.
    fn unsent(&mut self, to: Option<Rank>, error: TransportError) {
        let reach = LinkReach(&self.link);
        self.node
            .handle_unsent(Instant::now(), to, error.into(), &reach);
    }

    /// Sends `msg` to the worker of `to` (`None`: to every worker) over the link.
    fn send(&mut self, to: Option<Rank>, msg: ToWorker<M>) {
        let sent = {
            let link = lock(&self.link);
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match to {
                Some(rank) => link.send(rank, msg),
                None => link.broadcast(msg),
            }))
        };
        let error = match sent {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(payload) => {
                let cause = Cause::from_panic(payload);
                tracing::error!(rank = ?to, %cause, "the transport panicked sending to a worker");
                TransportError::io(format!("the transport panicked: {cause}"), None)
            }
        };
        self.unsent(to, error);
    }

    /// Runs the master's code: inline on this thread, or on the pool, as placement says.
    /// Its start-up, restart and `post_application` run inline: at those points the
    /// coordination thread has nothing else to do, and they never queue behind workers'
    /// compute on the pool.
    fn run_master(&mut self, ctx: &mut Context<Self>, work: MasterWork<M, W>) {
        let Some(mut task) = self.task.take() else {
            // Unreachable by the node's contract; fail loudly rather than drop the work.
            self.failed(JobError::Runtime {
                message: "work handed to the master while it was busy".into(),
            });
            return;
        };
        let inline = match &work {
            MasterWork::Iterate(_) => self.placer.inline_iteration(),
            _ => true,
        };
        if inline {
            self.watch.enter(Who::Master, work.during());
            let done = task.run(work);
            self.watch.exit();
            self.task = Some(task);
            self.master_done(done);
        } else {
            let addr = ctx.address();
            self.pool.spawn(move || {
                let done = task.run(work);
                addr.do_send(MasterHome { task, done });
            });
        }
    }

    fn master_done(&mut self, done: MasterDone<M, W>) {
        if let MasterDone::Iterated {
            elapsed,
            result: Ok(_),
            ..
        } = &done
        {
            self.placer.observe(*elapsed);
        }
        let reach = LinkReach(&self.link);
        self.node.handle_master_done(Instant::now(), done, &reach);
    }

    fn on_tick(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let reach = LinkReach(&self.link);
        if self.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
            self.node.cancel(now, &reach);
        }
        if let Some(by) = self.preempt.poll() {
            self.node.preempt(now, by, &reach);
        }
        self.node.handle_timeout(now, &reach);
        self.drive(ctx);
        if let Some(asked) = self.dump_watch.poll() {
            self.dump(now, asked);
        }
        self.dumps.settle(now);
    }

    /// A dump of the flight recorders asked for: this process's ranks read now, the
    /// others' processes asked (an unsent request is no failure of the rank's: the dump
    /// names it missing).
    fn dump(&mut self, now: Instant, asked: (String, Vec<super::dump::Reply>)) {
        let workers = self.workers;
        let local = &self.local;
        let ask = self.dumps.begin(now, asked, workers, |r| local.is_local(r));
        let link = lock(&self.link);
        for rank in ask {
            if let Err(error) = link.send(rank, ToWorker::Record) {
                tracing::debug!(rank, %error, "could not ask a rank for its flight recorder");
            }
        }
    }
}

impl<M: Payload, W: Payload> Actor for NodeActor<M, W> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Timeouts are checked on a coarse tick rather than one timer per wait: arming and
        // cancelling a timer each round would cost more than the round itself.
        ctx.run_interval(self.tick, |act, ctx| act.on_tick(ctx));
        self.start_fresh(ctx);
        // Asked before the job started: it stops before its first iteration.
        if let Some(by) = self.preempt.poll() {
            self.node
                .preempt(Instant::now(), by, &LinkReach(&self.link));
        }
        self.drive(ctx);
    }
}

impl<M: Payload, W: Payload> Handler<Drain> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, _: Drain, ctx: &mut Context<Self>) {
        // The taken batch's buffer comes back as the next spare: no allocation per batch.
        let spare = std::mem::take(&mut self.spare);
        let mut batch = self.arrivals.take(spare);
        let reach = LinkReach(&self.link);
        let mut dumps = Vec::new();
        for arrived in batch.drain(..) {
            match arrived.env.msg {
                ToMaster::Recorded { log } => {
                    self.dumps.recorded(arrived.at, arrived.env.from, &log)
                }
                ToMaster::Dump { by } => dumps.push((arrived.at, by)),
                msg => {
                    let env = Envelope {
                        from: arrived.env.from,
                        msg,
                    };
                    self.node.handle_message(arrived.at, env, &reach);
                }
            }
        }
        for (at, by) in dumps {
            tracing::warn!(by, "a dump of the flight recorders asked");
            self.dump(at, (by, Vec::new()));
        }
        self.spare = batch;
        self.drive(ctx);
    }
}

/// A worker of this process reached through the transport heard of a gang restart into
/// `attempt`, after `cause` (its route holds its messages meanwhile): it is replaced.
pub(crate) struct RestartLinked {
    pub(crate) rank: Rank,
    pub(crate) attempt: crate::ids::Attempt,
    pub(crate) cause: JobError,
}

impl Message for RestartLinked {
    type Result = ();
}

impl<M: Payload, W: Payload> Handler<RestartLinked> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: RestartLinked, ctx: &mut Context<Self>) {
        if let Err(error) = self.local.restart_linked(msg.rank, msg.attempt, &msg.cause) {
            self.failed(error);
        }
        self.drive(ctx);
    }
}

impl<M: Payload, W: Payload> Handler<MasterHome<M, W>> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: MasterHome<M, W>, ctx: &mut Context<Self>) {
        self.task = Some(msg.task);
        self.master_done(msg.done);
        self.drive(ctx);
    }
}
