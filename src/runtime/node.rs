//! The node actor: the driver of the master's node. It holds the handles — the link to the
//! workers, the workers of this process, the master's code, the pool, the coordinator —
//! feeds the [`MasterNode`] what happens, and carries out the actions it queues. Every
//! decision about rounds, failures and the end of the job is the node's.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture,
};
use tokio::sync::oneshot;

use super::arrivals::{Arrivals, Arrived, Drain};
use super::coordination::CoordinatorSlot;
use super::local::{Hosted, LocalWorkers};
use super::master::MasterTask;
use super::pool::{ComputePool, Placer};
use super::watch::{Watch, Who};
use super::worker::{Homeward, Host, WorkDone as WorkerDone, WorkerDriver};
use super::worker_task::stop_given_up;
use super::Cancel;
use crate::compute::JobEnd;
use crate::config::JobConfig;
use crate::error::{Cause, JobError, Waiting};
use crate::events::Events;
use crate::ids::Rank;
use crate::payload::Payload;
use crate::protocol::JobOutcome;
use crate::protocol::{
    Action, Envelope, MasterDone, MasterNode, MasterWork, Reach, ToMaster, ToWorker,
};
use crate::transport::{wire_checked, MasterLink, TransportError};

/// The master's code is back from the pool with what it did.
struct WorkDone<M, W> {
    task: Box<MasterTask<M, W>>,
    done: MasterDone<M>,
}

impl<M: 'static, W: 'static> Message for WorkDone<M, W> {
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
/// when asked (at a failure or the end of the job), not for every message.
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
    pub(crate) outcome: oneshot::Sender<Result<JobOutcome<M>, JobError>>,
    pub(crate) tick: Duration,
    /// The job's failure as this process hears of it.
    pub(crate) end: JobEnd,
    /// Whether what the node hands its hosted workers, and what they send it, goes
    /// through the wire encoding first (the in-memory transport's wire check).
    pub(crate) wire_check: bool,
    /// Where workers' messages from other threads wait for the node.
    pub(crate) arrivals: Arc<Arrivals<W>>,
}

/// Whether an action was carried out, or waits for the coordinator's actor.
#[derive(PartialEq, Eq)]
enum Carried {
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
    outcome: Option<oneshot::Sender<Result<JobOutcome<M>, JobError>>>,
    tick: Duration,
    end: JobEnd,
    /// What the workers this actor hosts sent the node, in the order they sent it: taken
    /// by the node as one batch, stamped with one clock read, in a buffer reused every
    /// round.
    inbox: Vec<Envelope<ToMaster<W>>>,
    /// Whether a batch is due ([`Gathered`] is queued).
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
    wire_check: bool,
}

/// The hosted workers' messages wait in the inbox: the node takes them as one batch.
struct Gathered;

impl Message for Gathered {
    type Result = ();
}

/// A hosted worker's unit of work came back from the pool.
struct HostedHome<M, W> {
    rank: Rank,
    generation: u64,
    done: WorkerDone<M, W>,
}

impl<M: 'static, W: 'static> Message for HostedHome<M, W> {
    type Result = ();
}

/// The node actor as the host of one of its workers.
struct NodeHost<'a, M: Payload, W: Payload> {
    rank: Rank,
    generation: u64,
    /// Whether no replacement took the rank: a replaced worker's messages no longer reach
    /// the node.
    current: bool,
    inbox: &'a mut Vec<Envelope<ToMaster<W>>>,
    wire_check: bool,
    ctx: &'a mut Context<NodeActor<M, W>>,
    stopped: bool,
    clock: &'a mut Option<Instant>,
    /// The watch entry the node actor made for the whole broadcast, if it is handing one
    /// out.
    watching: Option<(Waiting, Instant)>,
    /// The master's iteration span, if one is under way: what the worker's code runs
    /// under (else the job's), cloned only for a unit of code that runs.
    iteration_span: Option<&'a tracing::Span>,
}

impl<M: Payload, W: Payload> Host<M, W> for NodeHost<'_, M, W> {
    fn span(&self) -> tracing::Span {
        self.iteration_span
            .cloned()
            .unwrap_or_else(tracing::Span::current)
    }

    fn send(&mut self, msg: ToMaster<W>) -> Result<(), TransportError> {
        let rank = self.rank;
        if !self.current {
            return Err(TransportError::Replaced { rank });
        }
        let carries = msg.carries_result();
        let msg = wire_checked(self.wire_check, carries, msg, || {
            format!("worker {rank} → master")
        })?;
        if self.wire_check && carries {
            // The encoding took time no compute should be charged with: the next inline
            // unit reads the clock afresh.
            *self.clock = None;
        }
        self.inbox.push(Envelope { from: rank, msg });
        Ok(())
    }

    fn homeward(&mut self) -> Homeward<M, W> {
        let addr = self.ctx.address();
        let (rank, generation) = (self.rank, self.generation);
        Box::new(move |done| {
            match addr.try_send(HostedHome {
                rank,
                generation,
                done,
            }) {
                Err(actix::dev::SendError::Closed(HostedHome { done, .. })) => Err(done),
                // An unbounded mailbox is never full.
                _ => Ok(()),
            }
        })
    }

    fn arm(&mut self, after: Duration) {
        let (rank, generation) = (self.rank, self.generation);
        self.ctx.run_later(after, move |act, ctx| {
            act.step(ctx, rank, generation, |driver, host| {
                driver.handle_timeout(host)
            });
            act.settle(ctx);
        });
    }

    fn stop(&mut self) {
        self.stopped = true;
    }

    fn now(&mut self) -> Instant {
        *self.clock.get_or_insert_with(Instant::now)
    }

    fn ran_until(&mut self, at: Instant) {
        *self.clock = Some(at);
    }

    fn watching(&self) -> Option<(Waiting, Instant)> {
        self.watching
    }
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
        }
    }

    /// Carries out every action the node queued, in order, feeding back what they did. An
    /// action that waits for the coordinator's actor holds the rest (and every message not
    /// taken yet; a batch taken before it was handed to the node whole) until it is done,
    /// then drives on.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        while let Some(action) = self.node.poll_action() {
            if self.carry_out(ctx, action) == Carried::Waiting {
                break;
            }
        }
        // What the hosted workers sent meanwhile is taken in a handler of its own: a round
        // of inline code yields to the event loop (timers, other messages) before the next.
        if !self.inbox.is_empty() && !self.gathering {
            self.gathering = true;
            ctx.notify(Gathered);
        }
    }

    /// Hands the node what the hosted workers sent, as one batch, then drives on.
    fn settle(&mut self, ctx: &mut Context<Self>) {
        if !self.inbox.is_empty() {
            // The buffer goes back with its capacity: no allocation per round.
            let mut batch = std::mem::take(&mut self.inbox);
            let now = Instant::now();
            let reach = LinkReach(&self.link);
            for env in batch.drain(..) {
                self.node.handle_message(now, env, &reach);
            }
            self.inbox = batch;
        }
        self.drive(ctx);
    }

    /// Steps the hosted worker of `rank`, connection `generation`, if it still runs: `f`
    /// hands it what happened. Returns whether it ran.
    fn step(
        &mut self,
        ctx: &mut Context<Self>,
        rank: Rank,
        generation: u64,
        f: impl FnOnce(&mut WorkerDriver<M, W>, &mut NodeHost<'_, M, W>),
    ) -> bool {
        let current = self.local.is_current(rank, generation);
        let Some(hosted) = self.local.hosted_of(rank, generation) else {
            return false;
        };
        let mut host = NodeHost {
            rank,
            generation,
            current,
            inbox: &mut self.inbox,
            wire_check: self.wire_check,
            ctx,
            stopped: false,
            clock: &mut self.clock,
            watching: self.chaining,
            iteration_span: self.node.iteration_span(),
        };
        f(&mut hosted.driver, &mut host);
        if host.stopped {
            self.local.hosted_stopped(rank, generation);
        }
        if self.chaining.is_none() {
            self.clock = None;
        }
        true
    }

    /// Steps the rank's current hosted worker, if it runs (see [`step`](Self::step)).
    fn step_current(
        &mut self,
        ctx: &mut Context<Self>,
        rank: Rank,
        f: impl FnOnce(&mut WorkerDriver<M, W>, &mut NodeHost<'_, M, W>),
    ) -> bool {
        match self.local.hosted(rank).map(|h| h.generation) {
            Some(generation) => self.step(ctx, rank, generation, f),
            None => false,
        }
    }

    /// Starts the hosted workers made since the last call.
    fn start_fresh(&mut self, ctx: &mut Context<Self>) {
        for rank in self.local.take_fresh() {
            self.step_current(ctx, rank, |driver, host| driver.start(host));
        }
    }

    /// Tells a replaced hosted worker to stop; it runs to its end.
    fn retire(&mut self, ctx: &mut Context<Self>, old: Box<Hosted<M, W>>, msg: ToWorker<M>) {
        let (rank, generation) = (old.rank, old.generation);
        self.local.retire_hosted(old);
        self.step(ctx, rank, generation, |driver, host| {
            driver.handle_message(msg, host)
        });
    }

    /// Hands `msg` to the hosted worker of `rank`.
    fn deliver(&mut self, ctx: &mut Context<Self>, rank: Rank, msg: ToWorker<M>) {
        let carries = msg.carries_result();
        let msg = match wire_checked(self.wire_check, carries, msg, || {
            format!("master → worker {rank}")
        }) {
            Ok(msg) => msg,
            Err(e) => return self.unsent(Some(rank), e),
        };
        if !self.local.is_running(rank) {
            return tracing::debug!(rank, %msg, "the worker stopped: dropped a message for it");
        }
        self.step_current(ctx, rank, |driver, host| driver.handle_message(msg, host));
    }

    /// Hands `msg` to every hosted worker, in rank order: each runs what it asks for (an
    /// iteration's inline compute, at once) and leaves what it sends in the inbox.
    fn deliver_all(&mut self, ctx: &mut Context<Self>, msg: ToWorker<M>) {
        // Checked once, as a broadcast is encoded once; clones share the master result:
        // each is an `Arc` bump, never a copy of `M`.
        let carries = msg.carries_result();
        let msg = match wire_checked(self.wire_check, carries, msg, || {
            "master → every worker".into()
        }) {
            Ok(msg) => msg,
            Err(e) => return self.unsent(None, e),
        };
        // One clock read starts the run; the watch is entered once for it, each worker's
        // inline code saying who runs: their deadline is the broadcast's, as the gate's is.
        let start = Instant::now();
        let during = match &msg {
            ToWorker::Iterate { iteration, .. } => Waiting::Iteration(*iteration),
            ToWorker::Finish { .. } | ToWorker::Abort { .. } => Waiting::Shutdown,
            _ => Waiting::Registration,
        };
        self.watch.enter_at(Who::Worker(0), during, start);
        self.clock = Some(start);
        self.chaining = Some((during, start));
        for rank in 0..self.local.ranks() {
            self.step_current(ctx, rank, |driver, host| {
                driver.handle_message(msg.clone(), host)
            });
        }
        self.chaining = None;
        self.clock = None;
        self.watch.exit();
    }

    fn carry_out(&mut self, ctx: &mut Context<Self>, action: Action<M, W>) -> Carried {
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
            Action::Commit(reports) => {
                // On the coordinator's thread (the transport's keeps up heartbeats); the
                // node takes its next message once it knows the outcome.
                let coordination = self.coordination.clone();
                let attempt = self.node.attempt();
                let committing = async move { coordination.finish(attempt, reports).await };
                ctx.wait(committing.into_actor(self).map(|result, act, ctx| {
                    act.node.handle_committed(Instant::now(), result);
                    act.drive(ctx);
                }));
                return Carried::Waiting;
            }
            Action::CleanUp(error) => {
                let coordination = self.coordination.clone();
                let attempt = self.node.attempt();
                // `run` returns after `on_error` did: the job's outcome waits for it.
                let cleaning = async move { coordination.fail(Some(attempt), error).await };
                ctx.wait(cleaning.into_actor(self).map(|(), act, ctx| act.drive(ctx)));
                return Carried::Waiting;
            }
            Action::Finished(result) => {
                // The receiver is gone only if the caller stopped waiting; nothing to tell
                // then.
                if let Some(outcome) = self.outcome.take() {
                    let _ = outcome.send(result);
                }
                ctx.stop();
            }
        }
        Carried::Done
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
            Err(payload) => TransportError::io(
                format!("the transport panicked: {}", Cause::from_panic(payload)),
                None,
            ),
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
                addr.do_send(WorkDone { task, done });
            });
        }
    }

    fn master_done(&mut self, done: MasterDone<M>) {
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
        self.node.handle_timeout(now, &reach);
        self.drive(ctx);
    }
}

impl<M: Payload, W: Payload> Actor for NodeActor<M, W> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Timeouts are checked on a coarse tick rather than one timer per wait: arming and
        // cancelling a timer each round would cost more than the round itself.
        ctx.run_interval(self.tick, |act, ctx| act.on_tick(ctx));
        self.start_fresh(ctx);
        self.drive(ctx);
    }
}

impl<M: Payload, W: Payload> Handler<Gathered> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, _: Gathered, ctx: &mut Context<Self>) {
        self.gathering = false;
        self.settle(ctx);
    }
}

impl<M: Payload, W: Payload> Handler<HostedHome<M, W>> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, home: HostedHome<M, W>, ctx: &mut Context<Self>) {
        let HostedHome {
            rank,
            generation,
            done,
        } = home;
        let mut done = Some(done);
        self.step(ctx, rank, generation, |driver, host| {
            if let Some(done) = done.take() {
                driver.handle_done(done, host)
            }
        });
        if let Some(WorkerDone { mut task, .. }) = done {
            // The worker ended without it (the job failed, and gave up on this code after
            // its grace): the code's interceptors still see the end, on the pool.
            let end = self.end.clone();
            self.pool
                .spawn(move || stop_given_up(&mut task, None, &end));
        }
        self.settle(ctx);
    }
}

impl<M: Payload, W: Payload> Handler<Drain> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, _: Drain, ctx: &mut Context<Self>) {
        // The taken batch's buffer comes back as the next spare: no allocation per batch.
        let spare = std::mem::take(&mut self.spare);
        let mut batch = self.arrivals.take(spare);
        let reach = LinkReach(&self.link);
        for arrived in batch.drain(..) {
            self.node.handle_message(arrived.at, arrived.env, &reach);
        }
        self.spare = batch;
        self.drive(ctx);
    }
}

impl<M: Payload, W: Payload> Handler<WorkDone<M, W>> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: WorkDone<M, W>, ctx: &mut Context<Self>) {
        self.task = Some(msg.task);
        self.master_done(msg.done);
        self.drive(ctx);
    }
}
