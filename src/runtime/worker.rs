//! A worker's driver: it feeds the worker's node ([`WorkerNode`]) what happens — the
//! master's messages, what the worker's code did, time — and carries out what the node
//! asks, through its [`Host`]: the node actor (a worker of the master's own process,
//! stepped directly) or a [`WorkerActor`](super::worker_actor::WorkerActor) of its own (a
//! worker reached through a transport).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pool::{Executor, Placer};
use super::sync_calls::SyncAnswers;
use super::watch::{Watch, Who};
use super::worker_task::{spans_recorded, stop_given_up, WorkerTask};
use super::OwnedEnding;
use crate::compute::JobEnd;
use crate::error::{Cause, JobError, Waiting};
use crate::ids::Rank;
use crate::payload::Payload;
use crate::protocol::{
    Report, ToMaster, ToWorker, Unsent, Work, Worked, WorkerAction, WorkerConfig, WorkerNode,
};
use crate::transport::TransportError;

/// Where a worker reports how the job ended for it, and the job's end as its process
/// hears of it.
pub(crate) struct EndingReport<M> {
    /// A process without the master takes its outcome from its workers' endings.
    pub(crate) to: tokio::sync::mpsc::UnboundedSender<Ended<M>>,
    /// Which worker of its rank this one is: the ending of one replaced since counts for
    /// nothing.
    pub(crate) generation: u64,
    /// The job's failure as this process hears of it.
    pub(crate) end: JobEnd,
}

/// A worker's ending, with its rank and which worker of the rank it was
/// ([`EndingReport::generation`]).
pub(crate) type Ended<M> = (Rank, u64, OwnedEnding<M>);

/// A unit of a worker's code, back from the pool: handed to the worker's driver with
/// [`WorkerDriver::handle_done`].
pub(crate) struct WorkerHome<M, W> {
    pub(crate) task: Box<WorkerTask<M, W>>,
    pub(crate) worked: Worked<W>,
}

/// How a unit of work done away gets home: called on the thread it ran on. It gives the
/// work back when nobody takes it (the worker is gone).
pub(crate) type Homeward<M, W> =
    Box<dyn FnOnce(WorkerHome<M, W>) -> Result<(), WorkerHome<M, W>> + Send>;

/// Where a worker's driver lives: its own actor (a worker reached through a transport), or
/// the master's node actor (a worker of the node's own process, stepped directly).
pub(crate) trait Host<M, W> {
    /// Sends `msg` to the master's node. Never panics: a host whose send runs code that
    /// is not its own — a transport's, a user type's encoding — runs it under
    /// [`guarded_send`], so that a panic there is an error of the send.
    fn send(&mut self, msg: ToMaster<W>) -> Result<(), TransportError>;
    /// Where a unit of work run on the pool comes back to.
    fn homeward(&mut self) -> Homeward<M, W>;
    /// Calls [`WorkerDriver::handle_timeout`] on this worker's driver after `after`.
    fn arm(&mut self, after: Duration);
    /// The time now: a host that runs units back to back hands on when the last one
    /// ended ([`ran_until`](Self::ran_until)) instead of reading the clock again.
    fn now(&mut self) -> Instant {
        Instant::now()
    }
    /// A unit of work run inline ended at `at`.
    fn ran_until(&mut self, at: Instant) {
        let _ = at;
    }
    /// The watch entry the host made for a run of units back to back — what they wait
    /// for, and since when — if it made one: a unit of that kind then only says who runs,
    /// one of another kind enters the watch for itself and puts the host's entry back.
    /// The default: none — each unit enters the watch.
    fn watching(&self) -> Option<(Waiting, Instant)> {
        None
    }
    /// Whether the worker's code may run here, on the host's own thread, when placement
    /// says inline. A pool thread that steps a rescued worker (under the lock of its cell)
    /// says no: the code goes to the pool as a unit of its own, so that the lock is never
    /// held while user code runs.
    fn runs_inline(&self) -> bool {
        true
    }
    /// The worker is done: nothing more reaches its driver.
    fn stop(&mut self);
    /// The span a unit of the worker's code runs under, on whichever thread: the default
    /// is the current one (the job's span, on the job's thread).
    fn span(&self) -> tracing::Span {
        tracing::Span::current()
    }
}

/// The parent of the spans of a unit of a worker's code about to run on `host`: the
/// host's span, when those spans are recorded ([`spans_recorded`]); else none, and no
/// clone of a span per worker per round.
#[inline]
fn parent_span<M, W>(host: &impl Host<M, W>) -> tracing::Span {
    if spans_recorded() {
        host.span()
    } else {
        tracing::Span::none()
    }
}

/// Runs `send` — a transport's code, or a user type's encoding — with a panic in it
/// turned into the send's error.
pub(crate) fn guarded_send<T>(
    send: impl FnOnce() -> Result<T, TransportError>,
) -> Result<T, TransportError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(send)) {
        Ok(sent) => sent,
        Err(payload) => Err(TransportError::io(
            format!("the transport panicked: {}", Cause::from_panic(payload)),
            None,
        )),
    }
}

/// Drives one worker's node ([`WorkerNode`]): feeds it the master's messages, what the
/// worker's code did and the time, and carries out what it asks — running the code inline
/// or on the pool (see [`Placer`]), sending, answering sync calls, reporting — and arms one
/// timer, for the node's next deadline, through its [`Host`].
pub(crate) struct WorkerDriver<M: Payload, W: Payload> {
    rank: Rank,
    node: WorkerNode<M, W>,
    /// `None` while the task is away on the pool.
    task: Option<Box<WorkerTask<M, W>>>,
    /// In barrier mode: where answers to sync calls go, to the compute waiting for them.
    sync_answers: Option<SyncAnswers>,
    executor: Executor,
    placer: Placer,
    /// Where this worker reports its ending when it stops: a process without the master
    /// takes its outcome from its workers.
    ended: tokio::sync::mpsc::UnboundedSender<Ended<M>>,
    /// Which worker of its rank this is.
    generation: u64,
    watch: Arc<Watch>,
    end: JobEnd,
    /// The task's stale flag (see [`WorkerTask::stale`]): set while the iteration away
    /// belongs to a master this worker left behind, so that its failure ends nothing.
    stale: Arc<std::sync::atomic::AtomicBool>,
    /// The verdict, for code given up on after the grace: its `post_application` runs
    /// with it when it returns.
    heard: Arc<std::sync::OnceLock<JobError>>,
    /// The node's deadline the host's timer is armed for.
    armed: Option<Instant>,
}

impl<M: Payload, W: Payload> WorkerDriver<M, W> {
    pub(crate) fn new(
        task: WorkerTask<M, W>,
        config: Arc<WorkerConfig>,
        sync_answers: Option<SyncAnswers>,
        executor: Executor,
        placer: Placer,
        watch: Arc<Watch>,
        ending: EndingReport<M>,
    ) -> Self {
        WorkerDriver {
            rank: task.ctx.rank,
            node: WorkerNode::new(task.ctx.rank, task.attempt, config),
            ended: ending.to,
            generation: ending.generation,
            end: ending.end,
            stale: Arc::clone(&task.stale),
            heard: Arc::default(),
            sync_answers,
            watch,
            task: Some(Box::new(task)),
            executor,
            placer,
            armed: None,
        }
    }

    /// Starts the worker: its start-up runs.
    pub(crate) fn start(&mut self, host: &mut impl Host<M, W>) {
        self.node.start();
        self.drive(host);
    }

    /// A message from the master's node.
    pub(crate) fn handle_message(&mut self, msg: ToWorker<M>, host: &mut impl Host<M, W>) {
        if !self.iterated_at_once(&msg, host) {
            let now = host.now();
            self.node.handle_message(now, msg);
        }
        self.drive(host);
    }

    /// A message the master's node sent every worker, handed to this one: cloned only if
    /// it is not an iteration this worker computes at once.
    pub(crate) fn handle_broadcast(&mut self, msg: &ToWorker<M>, host: &mut impl Host<M, W>) {
        if !self.iterated_at_once(msg, host) {
            let now = host.now();
            self.node.handle_message(now, msg.clone());
        }
        self.drive(host);
    }

    /// Runs `msg` here, inline, if it is an iteration this worker computes at once, its
    /// report sent — without the node's action queue (the node's rule is the same:
    /// `WorkerNode::iterate_at_once`). Returns whether it did.
    #[inline]
    fn iterated_at_once(&mut self, msg: &ToWorker<M>, host: &mut impl Host<M, W>) -> bool {
        if self.task.is_none() || !host.runs_inline() || !self.placer.inline_iteration() {
            return false;
        }
        let Some(step) = self.node.iterate_at_once(msg) else {
            return false;
        };
        if let Some(mut task) = self.task.take() {
            task.attempt = self.node.attempt();
            task.parent = parent_span(host);
            self.inline(host, task, Work::Iterate(step));
        }
        true
    }

    /// A unit of work came back from the pool.
    pub(crate) fn handle_done(&mut self, done: WorkerHome<M, W>, host: &mut impl Host<M, W>) {
        self.task = Some(done.task);
        let now = host.now();
        self.worked(host, now, done.worked);
        self.drive(host);
    }

    /// The host's timer went off.
    pub(crate) fn handle_timeout(&mut self, host: &mut impl Host<M, W>) {
        // The host's timer is spent; `drive` arms another if a deadline is still ahead (a
        // timer that fired a hair early included).
        self.armed = None;
        let now = host.now();
        self.node.handle_timeout(now);
        self.drive(host);
    }

    fn send(&self, host: &mut impl Host<M, W>, msg: ToMaster<W>) {
        match host.send(msg) {
            Ok(()) => {}
            // A replacement took this worker's rank: its link is closed on purpose.
            Err(TransportError::Replaced { .. }) => {
                tracing::debug!(rank = self.rank, "this worker's link is closed")
            }
            // The job ended for this worker (its link may be closed with it): nothing waits
            // for what it says now. A link closed under it is the transport's end of the
            // job for this worker — the master refused it, or was lost — which the
            // transport says itself, and whose word (`ToWorker::Abort`) may still be on its
            // way to the node.
            Err(error @ TransportError::Closed) => {
                tracing::debug!(rank = self.rank, %error, "could not reach the master")
            }
            Err(error) if self.node.has_ended() => {
                tracing::debug!(rank = self.rank, %error, "could not reach the master")
            }
            // The master's node is gone: nothing is waiting for this worker any more.
            Err(error) => tracing::warn!(rank = self.rank, %error, "could not reach the master"),
        }
    }

    /// Sends the iteration's `report`, and tells the node how that went.
    fn send_result(&mut self, host: &mut impl Host<M, W>, report: Report<W>) {
        let iteration = report.iteration;
        let sent = host.send(ToMaster::Result(report));
        let now = host.now();
        self.node
            .handle_sent(now, iteration, sent.map_err(Unsent::from));
    }

    /// Carries out every action the node queued, in order, feeding back what they did;
    /// then arms the host's timer for the node's next deadline, if it moved.
    fn drive(&mut self, host: &mut impl Host<M, W>) {
        while let Some(action) = self.node.poll_action() {
            match action {
                WorkerAction::Run(work) => self.run(host, work),
                WorkerAction::Send(msg) => self.send(host, msg),
                WorkerAction::SendResult(report) => self.send_result(host, report),
                WorkerAction::SendDone { awaits_word } => {
                    let attempt = self.node.attempt();
                    let done = match self.task.as_mut() {
                        Some(task) => task.done(attempt, awaits_word),
                        None => ToMaster::Done {
                            attempt,
                            awaits_word,
                            rows: Default::default(),
                            attachments: Vec::new(),
                        },
                    };
                    self.send(host, done);
                }
                WorkerAction::Answer(epoch, result) => {
                    if let Some(answers) = &self.sync_answers {
                        answers.answer(epoch, result);
                    }
                }
                WorkerAction::Verdict(error) => {
                    // (The process's `JobEnd` is not set here: an abort may only retire
                    // this worker. For a job's failure it is set by the master's node
                    // (`Action::EndJob`) in its own process, and by the worker process
                    // (`ProcessAction::EndJob`) in another.)
                    let _ = self.heard.set(error.clone());
                    if let Some(sync) = &self.sync_answers {
                        sync.end(&error);
                    }
                }
                WorkerAction::EndSync(error) => {
                    if let Some(sync) = &self.sync_answers {
                        sync.end(&error);
                    }
                }
                // No compute of this process starts from now on.
                WorkerAction::EndJob(error) => self.end.end(&error),
                WorkerAction::MarkStale => {
                    self.stale.store(true, std::sync::atomic::Ordering::Release)
                }
                WorkerAction::Report(ending) => {
                    // Nobody listens only when the job is over already.
                    let _ = self.ended.send((self.rank, self.generation, ending));
                }
                WorkerAction::Stop => host.stop(),
            }
        }
        let next = self.node.poll_timeout();
        if let Some(at) = next.filter(|_| next != self.armed) {
            self.armed = next;
            let now = host.now();
            host.arm(at.saturating_duration_since(now));
        }
    }

    /// Runs one unit of the worker's code, inline or on the pool.
    fn run(&mut self, host: &mut impl Host<M, W>, work: Work<M>) {
        let Some(mut task) = self.task.take() else {
            // The node hands out work only while the code is here.
            tracing::error!(rank = self.rank, "work for a worker whose code is away");
            return;
        };
        task.attempt = self.node.attempt();
        task.parent = parent_span(host);
        let inline = host.runs_inline()
            && match work {
                Work::Iterate(..) => self.placer.inline_iteration(),
                Work::Start | Work::Stop(_) => self.placer.inline_lifecycle(),
            };
        if inline {
            self.inline(host, task, work);
        } else {
            // The pool thread owns the task until it sends it back with the outcome. If the
            // worker is gone by then (the job failed, and gave up on this code after its
            // grace), the code's interceptors still see the end, here.
            let home = host.homeward();
            let (heard, end) = (Arc::clone(&self.heard), self.end.clone());
            self.executor.spawn(move || {
                let worked = task.run(work);
                if let Err(WorkerHome { mut task, .. }) = home(WorkerHome { task, worked }) {
                    stop_given_up(&mut task, heard.get().cloned(), &end);
                }
            });
        }
    }

    /// Runs one unit of the worker's code here, on the host's thread.
    #[inline]
    fn inline(
        &mut self,
        host: &mut impl Host<M, W>,
        mut task: Box<WorkerTask<M, W>>,
        work: Work<M>,
    ) {
        let during = match work {
            Work::Iterate(ref step) => Waiting::Iteration(step.iteration),
            Work::Start => Waiting::Registration,
            Work::Stop(_) => Waiting::Shutdown,
        };
        let started = host.now();
        let who = Who::Worker(self.rank);
        // A unit of the run's own kind shares its deadline; another (a stop after a
        // failure, say) has its own, from its own start.
        let watching = host.watching();
        let chained = watching
            .filter(|(kind, _)| std::mem::discriminant(kind) == std::mem::discriminant(&during));
        if chained.is_some() {
            self.watch.rename(who, during);
        } else {
            self.watch.enter_at(who, during, started);
        }
        let (worked, ended) = task.run_at(work, started);
        match (chained, watching) {
            (Some(_), _) => {}
            (None, Some((kind, since))) => self.watch.enter_at(who, kind, since),
            (None, None) => self.watch.exit(),
        }
        host.ran_until(ended);
        self.task = Some(task);
        self.worked(host, ended, worked);
    }

    /// The worker's code is home, at `now`, with what it did: an iteration's report is
    /// sent at once, the rest handed to the node.
    fn worked(&mut self, host: &mut impl Host<M, W>, now: Instant, worked: Worked<W>) {
        let stale = self.stale.swap(false, std::sync::atomic::Ordering::AcqRel);
        match worked {
            Worked::Iterated(Ok(report)) => {
                // (An iteration of a master left behind tells nothing about the next
                // one's time.)
                if !stale {
                    self.placer.observe(report.elapsed);
                }
                if let Some(report) = self.node.handle_iterated(now, report) {
                    self.send_result(host, report);
                }
            }
            worked => self.node.handle_worked(now, worked),
        }
    }
}
