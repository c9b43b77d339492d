//! The node actor as the host of this process's workers, when the transport runs the
//! whole job here (the in-process fast path): each worker's driver is stepped directly,
//! a broadcast handed to every worker in rank order, and what they send gathered into the
//! node actor's inbox, taken by the node as one batch.

use super::rescue::{homeward, HostedArm, HostedHome, HostedStopped, Rescue};
use super::*;
use crate::runtime::local::lock_cell;
use crate::runtime::worker::guarded_send;
use crate::runtime::worker_task::spans_recorded;

/// The hosted workers' messages wait in the inbox: the node takes them as one batch.
pub(super) struct TakeInbox;

impl Message for TakeInbox {
    type Result = ();
}

/// The node actor as the host of one of its workers.
pub(super) struct NodeHost<'a, M: Payload, W: Payload> {
    rank: Rank,
    generation: u64,
    /// Whether no replacement took the rank: a replaced worker's messages no longer reach
    /// the node.
    current: bool,
    inbox: &'a mut Vec<Envelope<ToMaster<W>>>,
    wire_check: WireCheck,
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
        let msg = if self.wire_check.applies_to(&msg) {
            // The encoding took time no compute should be charged with: the next inline
            // unit reads the clock afresh.
            *self.clock = None;
            let wire_check = self.wire_check;
            guarded_send(|| wire_check.apply(msg, || format!("worker {rank} → master")))?
        } else {
            msg
        };
        self.inbox.push(Envelope { from: rank, msg });
        Ok(())
    }

    fn homeward(&mut self) -> Homeward<M, W> {
        homeward(self.ctx.address(), self.rank, self.generation)
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
    /// Hands the node what the hosted workers sent, as one batch, then drives on.
    pub(super) fn settle(&mut self, ctx: &mut Context<Self>) {
        if !self.inbox.is_empty() {
            // The buffer goes back with its capacity: no allocation per round.
            let mut batch = std::mem::take(&mut self.inbox);
            let now = Instant::now();
            let reach = LinkReach(&self.link);
            self.node.handle_messages(now, &mut batch, &reach);
            self.inbox = batch;
        }
        self.drive(ctx);
    }

    /// Steps the hosted worker of `rank`, connection `generation`, if it still runs: `f`
    /// hands it what happened. Returns whether it ran.
    pub(super) fn step(
        &mut self,
        ctx: &mut Context<Self>,
        rank: Rank,
        generation: u64,
        f: impl FnOnce(&mut WorkerDriver<M, W>, &mut NodeHost<'_, M, W>),
    ) -> bool {
        self.step_with(ctx, rank, Some(generation), f)
    }

    /// Steps the rank's current hosted worker, if it runs (see [`step`](Self::step)).
    pub(super) fn step_current(
        &mut self,
        ctx: &mut Context<Self>,
        rank: Rank,
        f: impl FnOnce(&mut WorkerDriver<M, W>, &mut NodeHost<'_, M, W>),
    ) -> bool {
        self.step_with(ctx, rank, None, f)
    }

    /// Steps the hosted worker of `rank` of connection `want` (`None`: the current one),
    /// the current one under the lock of its cell.
    fn step_with(
        &mut self,
        ctx: &mut Context<Self>,
        rank: Rank,
        want: Option<u64>,
        f: impl FnOnce(&mut WorkerDriver<M, W>, &mut NodeHost<'_, M, W>),
    ) -> bool {
        macro_rules! host {
            ($generation:expr, $current:expr) => {
                NodeHost {
                    rank,
                    generation: $generation,
                    current: $current,
                    inbox: &mut self.inbox,
                    wire_check: self.wire_check,
                    ctx,
                    stopped: false,
                    clock: &mut self.clock,
                    watching: self.chaining,
                    iteration_span: self.node.iteration_span(),
                }
            };
        }
        if let Some(cell) = self.local.current_cell(rank) {
            let mut guard = lock_cell(cell);
            if let Some(hosted) = guard
                .as_deref_mut()
                .filter(|h| want.is_none_or(|g| g == h.generation))
            {
                let generation = hosted.generation;
                let current = self.local.is_current(rank, generation);
                let mut host = host!(generation, current);
                f(&mut hosted.driver, &mut host);
                let stopped = host.stopped;
                drop(guard);
                return self.stepped(rank, generation, stopped);
            }
        }
        let Some(generation) = want else {
            return false;
        };
        let current = self.local.is_current(rank, generation);
        let Some(hosted) = self.local.retired_of(rank, generation) else {
            return false;
        };
        let mut host = host!(generation, current);
        f(&mut hosted.driver, &mut host);
        let stopped = host.stopped;
        self.stepped(rank, generation, stopped)
    }

    fn stepped(&mut self, rank: Rank, generation: u64, stopped: bool) -> bool {
        if stopped {
            self.local.hosted_stopped(rank, generation);
        }
        if self.chaining.is_none() {
            self.clock = None;
        }
        true
    }

    /// Starts the hosted workers made since the last call.
    pub(super) fn start_fresh(&mut self, ctx: &mut Context<Self>) {
        for rank in self.local.take_fresh() {
            self.step_current(ctx, rank, |driver, host| driver.start(host));
        }
    }

    /// Tells a replaced hosted worker to stop; it runs to its end.
    pub(super) fn retire(
        &mut self,
        ctx: &mut Context<Self>,
        old: Box<Hosted<M, W>>,
        msg: ToWorker<M>,
    ) {
        let (rank, generation) = (old.rank, old.generation);
        self.local.retire_hosted(old);
        self.step(ctx, rank, generation, |driver, host| {
            driver.handle_message(msg, host)
        });
    }

    /// Hands `msg` to the hosted worker of `rank`.
    pub(super) fn deliver(&mut self, ctx: &mut Context<Self>, rank: Rank, msg: ToWorker<M>) {
        let msg = match self
            .wire_check
            .apply(msg, || format!("master → worker {rank}"))
        {
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
    pub(super) fn deliver_all(&mut self, ctx: &mut Context<Self>, msg: ToWorker<M>) {
        // Checked once, as a broadcast is encoded once; clones share the master result:
        // each is an `Arc` bump, never a copy of `M`.
        let msg = match self
            .wire_check
            .apply(msg, || "master → every worker".into())
        {
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
        // Under `Auto`, each rank is claimed from the round's cursor before it is handed
        // the broadcast, so that the rescuer can take the ranks not reached yet when an
        // inline compute holds this thread (`rescue.rs`).
        let rescue = match &msg {
            ToWorker::Iterate { .. } if self.placer.defers() && self.local.ranks() > 1 => {
                self.rescue(ctx)
            }
            _ => None,
        };
        match rescue {
            Some(rescue) => {
                // (The span is the parent of rescued ranks' spans: cloned only if they
                // may be recorded.)
                let span = self.node.iteration_span().filter(|_| spans_recorded());
                rescue.begin(&msg, span, self.local.ranks());
                while let Some(rank) = rescue.claim() {
                    self.step_current(ctx, rank, |driver, host| {
                        driver.handle_broadcast(&msg, host)
                    });
                }
                rescue.end();
            }
            None => {
                for rank in 0..self.local.ranks() {
                    self.step_current(ctx, rank, |driver, host| {
                        driver.handle_broadcast(&msg, host)
                    });
                }
            }
        }
        self.chaining = None;
        self.clock = None;
        self.watch.exit();
    }

    /// The round's cursor and its rescuer, started at the first round that needs it.
    fn rescue(&mut self, ctx: &mut Context<Self>) -> Option<Arc<Rescue<M, W>>> {
        if self.rescue.is_none() {
            let name = format!("{}-rescuer", crate::config::thread_prefix(&self.job_id));
            match Rescue::start(
                name,
                self.placer.threshold(),
                super::rescue::Parts {
                    cells: Arc::clone(self.local.cells()),
                    generations: Arc::clone(self.local.generations()),
                    arrivals: Arc::clone(&self.arrivals),
                    wire_check: self.wire_check,
                    home: ctx.address(),
                    pool: Arc::clone(&self.pool),
                },
            ) {
                Ok(rescue) => self.rescue = Some(rescue),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start the rescuer thread: a slow inline compute holds up the rest of its round");
                    return None;
                }
            }
        }
        self.rescue.clone()
    }
}

impl<M: Payload, W: Payload> Handler<HostedArm> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, arm: HostedArm, ctx: &mut Context<Self>) {
        let HostedArm {
            rank,
            generation,
            after,
        } = arm;
        ctx.run_later(after, move |act, ctx| {
            act.step(ctx, rank, generation, |driver, host| {
                driver.handle_timeout(host)
            });
            act.settle(ctx);
        });
    }
}

impl<M: Payload, W: Payload> Handler<HostedStopped> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, stopped: HostedStopped, _: &mut Context<Self>) {
        self.local.hosted_stopped(stopped.rank, stopped.generation);
    }
}

impl<M: Payload, W: Payload> Handler<TakeInbox> for NodeActor<M, W> {
    type Result = ();

    fn handle(&mut self, _: TakeInbox, ctx: &mut Context<Self>) {
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
        if let Some(WorkerHome { mut task, .. }) = done {
            // The worker ended without it (the job failed, and gave up on this code after
            // its grace): the code's interceptors still see the end, on the pool.
            let end = self.end.clone();
            self.pool
                .spawn(move || stop_given_up(&mut task, None, &end));
        }
        self.settle(ctx);
    }
}
