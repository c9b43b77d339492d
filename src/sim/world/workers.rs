//! The workers' processes in a simulated run: each worker's node (the runtime's
//! `WorkerNode`) driven, its code run as the runtime runs it — in barrier mode on a thread
//! of its own, whose sync calls travel the simulated network while the simulator waits for
//! it, so that one thread runs at a time — its timers, its crashes, and its process started
//! again by a launcher.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::RngExt;

use super::clock::VirtualNow;
use super::*;
use crate::compute::JobEnd;
use crate::protocol::{CallRun, PeerMessage};
use crate::protocol::{FailurePolicy, Report, Unsent, Work, WorkerAction, WorkerNode};
use crate::protocol::{LinkId, ProcessAction, WorkerProcess};
use crate::runtime::sync_calls::SyncAnswers;
use crate::runtime::worker_task::WorkerTask;
use crate::runtime::OwnedEnding;
use crate::sim::lock;
use crate::sync_link::SyncSender;
use crate::transport::{PeerLink, TransportError};

/// A worker's process.
pub(super) struct Node<M, W> {
    /// The worker's generation: what its code's start-up, compute and timers bring is
    /// lost once another worker took its place (in a new process or in this one).
    pub(super) generation: Generation,
    /// The process's generation (its number among the rank's processes): what reaches it
    /// over its connections — to the master's node and to its peers — is lost once the
    /// process died, not when it replaces its worker.
    pub(super) pid: Generation,
    /// The process as the runtime's drives it (`runtime/route.rs`): every rule of what
    /// its link brings — the copy of a checkpoint it keeps, a gang restart, the job's
    /// failure — is its. It dies with the process.
    pub(super) process: WorkerProcess<M>,
    /// The worker's link to the master's node, as the process numbers it.
    pub(super) link: LinkId,
    /// The master's generation it is connected to.
    pub(super) master: Generation,
    pub(super) alive: bool,
    /// The worker's node, as the runtime's worker actor drives it: every decision about
    /// the worker's lifecycle is its.
    pub(super) worker: WorkerNode<M, W>,
    /// The worker's code, interceptors and context, as the runtime runs them (locked by
    /// the compute's own thread in barrier mode, while the simulator waits for it).
    pub(super) task: Arc<Mutex<WorkerTask<M, W>>>,
    /// The job's failure as its process hears of it.
    pub(super) end: JobEnd,
    /// In barrier mode: the ends of its sync calls.
    pub(super) sync: Option<SimSync<W>>,
    /// In barrier mode: the compute under way on its own thread, parked in a sync call or
    /// a collective, and since when (virtual time).
    pub(super) parked: Option<(Computing, Duration)>,
    /// How many times its computes parked: a wake-up is for the wait it was set for.
    pub(super) waits: u64,
    /// Since when the compute, woken at the time it said, has been waiting: until it
    /// waits again or goes on.
    pub(super) woken_since: Option<Duration>,
    /// The failure it reported as its ending, if it did: its process then ends (and may
    /// be started again by its launcher).
    pub(super) failed: Option<JobError>,
    /// It said its last word (`Done` not awaiting the master's): its link does not reach
    /// a master again, as a TCP link whose session ended so does not.
    pub(super) last_word: bool,
    /// Its node said it is done: it does nothing more.
    pub(super) stopped: bool,
    /// It crashes right after its next result left.
    pub(super) crash_after_send: bool,
    /// The deadline of its node its timer is set for.
    pub(super) timer: Option<Instant>,
    /// Calls no rank awaits the word on, held back on its process's link to the master's
    /// node as over TCP (`Lane::defer`): they go ahead of its next message (a carried
    /// message behind them is a broken invariant), or once held
    /// [`HOLD`](crate::protocol::HOLD); those that follow one another as one word.
    pub(super) held: Option<CallRun>,
}

/// A compute of barrier mode, on a thread of its own, says what it did: it made a sync
/// call, sent a peer a piece of a collective, waits for what comes next (nothing having
/// come), or returned.
pub(super) enum FromCompute<W> {
    Call(ToMaster<W>),
    /// A call whose word may go soon (`SyncSender::send_call_soon`).
    Soon(ToMaster<W>),
    Peer(Rank, PeerMessage),
    /// It waits, until the instant given at the latest.
    Waiting(Option<Instant>),
    Returned(Worked<W>),
}

/// A worker's sync calls and collectives, as its transport would carry them: to the
/// simulator, with the simulated clock and the most bytes of a piece to a peer.
pub(super) struct CallLink<W>(mpsc::Sender<FromCompute<W>>, VirtualNow, Option<usize>);

impl<W: Payload> SyncSender<W> for CallLink<W> {
    fn send_call(&self, call: ToMaster<W>) -> Result<(), JobError> {
        self.0
            .send(FromCompute::Call(call))
            .map_err(|_| TransportError::Closed.into())
    }

    fn send_call_soon(&self, call: ToMaster<W>) -> Result<(), JobError> {
        self.0
            .send(FromCompute::Soon(call))
            .map_err(|_| TransportError::Closed.into())
    }

    fn waiting(&self, until: Option<Instant>) {
        let _ = self.0.send(FromCompute::Waiting(until));
    }

    fn now(&self) -> Instant {
        self.1.instant()
    }

    /// The simulator wakes a compute at the time it waits until, in virtual time.
    fn wakes(&self) -> bool {
        true
    }
}

impl<W: Payload> PeerLink for CallLink<W> {
    fn send(&self, to: Rank, msg: PeerMessage) -> Result<(), TransportError> {
        if let (Some(limit), crate::protocol::PeerBody::Encoded(body)) = (self.2, &msg.body) {
            if body.len() > limit {
                let bytes = body.len();
                return Err(TransportError::TooLarge { bytes, limit });
            }
        }
        self.0
            .send(FromCompute::Peer(to, msg))
            .map_err(|_| TransportError::Closed)
    }

    /// The simulator hands each worker what its peers send.
    fn join(&self, _: Rank, _: crate::transport::PeerInbox) {}

    fn max_piece(&self) -> Option<usize> {
        self.2
    }
}

/// A worker's end of barrier mode in the simulator.
pub(super) struct SimSync<W> {
    /// What its compute's thread says.
    from: mpsc::Receiver<FromCompute<W>>,
    to_sim: mpsc::Sender<FromCompute<W>>,
    /// Where the answers to its calls go (as the runtime's worker hands them over).
    pub(super) answers: SyncAnswers,
    /// The thread of the compute under way, joined once it returned.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long (in real time) the simulator waits for a compute of barrier mode to call or
/// return before it gives up on it as hung.
const COMPUTE_PATIENCE: Duration = Duration::from_secs(60);

impl<W> SimSync<W> {
    /// What the compute's thread does next: a call, or its return (its thread then
    /// joined); `None` when it does neither within [`COMPUTE_PATIENCE`].
    fn next(&mut self) -> Option<FromCompute<W>> {
        let next = self.from.recv_timeout(COMPUTE_PATIENCE).ok()?;
        if let FromCompute::Returned(_) = next {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
        Some(next)
    }
}

/// A compute under way: its iteration and the faults drawn for it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Computing {
    took: Duration,
    crash: bool,
    during: bool,
    /// It sent a peer a piece of a collective: a crash during the compute may come while
    /// it waits in one.
    in_collective: bool,
}

impl<M: Payload, W: Payload> World<'_, M, W> {
    /// Whether a launcher starts a worker's process again when it ends on a failure
    /// (`superstep-launch --restarts`, under `RestartWorker`): the replacement of a rank
    /// of another process.
    /// Launched ([`Simulation::launched`](crate::sim::Simulation::launched)), every
    /// process of a gang too: the master's node waits for the new one.
    pub(super) fn relaunches(&self) -> bool {
        if self.gang() {
            return self.sim.launched.is_some();
        }
        matches!(self.job.failure_policy, FailurePolicy::RestartWorker { .. })
    }

    /// The process of `rank` ended on a failure (its own, or a crash): the launcher starts
    /// it again after `after`.
    pub(super) fn process_ended(&mut self, rank: Rank, after: Duration) {
        // (A worker of the master's process starts again with it, or when its node says.)
        if self.hosted(rank)
            || !self.relaunches()
            || !self.launcher_restarts(&format!("worker {rank}'s process"))
        {
            return;
        }
        let generation = self.nodes[rank].pid;
        // Its new process connects once the old connection is gone: after everything on
        // it arrived.
        let after = after.max(self.until_delivered(rank))
            + Duration::from_micros(self.rng.random_range(1_000..20_000));
        self.clock.at(after, Event::Relaunch { rank, generation });
    }

    /// A new worker of `rank` (of `generation`, in the process of generation `pid`):
    /// its code starts (`init`), in `attempt`.
    pub(super) fn spawn(
        &mut self,
        rank: Rank,
        (generation, pid): (Generation, Generation),
        attempt: Attempt,
    ) -> Node<M, W> {
        let end = JobEnd::default();
        let mut ctx = crate::runtime::worker_context(
            &self.job,
            &self.job_id,
            rank,
            self.shards.as_ref(),
            end.clone(),
        );
        let sync = self.job.barrier_mode.then(|| {
            let (to_sim, from) = mpsc::channel();
            let link = Arc::new(CallLink(
                to_sim.clone(),
                self.clock.shared(),
                self.sim.max_piece,
            ));
            let config = Arc::clone(&self.worker_config);
            let (link, answers) = crate::runtime::sync_calls::sync_link(
                Arc::clone(&link) as Arc<dyn SyncSender<W>>,
                attempt,
                config,
                Ok(link as Arc<dyn PeerLink>),
                Arc::new(crate::flight::Recorder::new(self.job.flight_events)),
            );
            ctx.sync = Some(link);
            SimSync {
                from,
                to_sim,
                answers,
                thread: None,
            }
        });
        let hooks = self
            .sim
            .worker_hooks
            .iter()
            .map(|make| make(rank))
            .collect();
        let config = Arc::clone(&self.worker_config);
        let task = WorkerTask::new(
            (self.sim.workers)(rank),
            hooks,
            ctx,
            attempt,
            Arc::clone(&config),
        )
        .folding(self.sim.combine.as_ref().map(|c| Arc::clone(&c.among)));
        let mut process = WorkerProcess::new(self.job.workers, Arc::clone(&config));
        let link = process.linked(rank, attempt);
        Node {
            generation,
            pid,
            process,
            link,
            master: self.master_generation,
            alive: true,
            worker: WorkerNode::new(rank, attempt, config),
            task: Arc::new(Mutex::new(task)),
            end,
            sync,
            parked: None,
            waits: 0,
            woken_since: None,
            failed: None,
            last_word: false,
            stopped: false,
            crash_after_send: false,
            timer: None,
            held: None,
        }
    }

    /// Starts the new process of `rank` (in place in `nodes`).
    pub(super) fn start_worker(&mut self, rank: Rank) {
        self.nodes[rank].worker.start();
        if !self.hosted(rank) {
            // A process of its own: its transport says it reached the master, after its
            // first handshake as after each one (as the runtime's does), so that reaching
            // a master again counts as a second connection — one started again in the
            // same attempt (on a fresh host, without the checkpoint it would count on)
            // is registered with anew.
            let attempt = self.nodes[rank].worker.attempt();
            return self.reach_process(rank, ToWorker::Connected { attempt });
        }
        self.drive_worker(rank);
    }

    /// What the link of `rank`'s process brings, as its process takes it.
    pub(super) fn reach_process(&mut self, rank: Rank, msg: ToWorker<M>) {
        let node = &mut self.nodes[rank];
        node.process.handle_message(rank, node.link, msg);
        self.carry_process(rank);
    }

    /// Carries out what the process of `rank` asks, in order, as `runtime/route.rs` does.
    fn carry_process(&mut self, rank: Rank) {
        // What a process asked dies with it: a delivery may crash it.
        let generation = self.nodes[rank].pid;
        while let Some(action) = self.nodes[rank].process.poll_action() {
            match action {
                ProcessAction::Deliver { rank, msg } => {
                    let now = self.clock.instant();
                    self.nodes[rank].worker.handle_message(now, msg);
                    self.drive_worker(rank);
                }
                ProcessAction::EndJob(error) => self.nodes[rank].end.end(&error),
                ProcessAction::Offer { rank, replica } => {
                    self.send_to_master(rank, ToMaster::Replica(replica));
                }
                // The simulator asks for no dump.
                ProcessAction::Record { .. } => {}
                ProcessAction::Replace { rank, attempt, .. } => {
                    self.restart_in_process(rank, attempt)
                }
            }
            if !self.process_current(rank, generation) {
                return;
            }
        }
    }

    /// A new worker of `rank` in `attempt` in the same process, on the same link (a gang
    /// restart its process carries out): the old one stops; the new one starts and takes
    /// what its process held for it.
    fn restart_in_process(&mut self, rank: Rank, attempt: Attempt) {
        self.log(|| format!("worker {rank}'s process replaces it for attempt {attempt}"));
        self.settle(rank, &JobError::Cancelled);
        let generation = self.nodes[rank].generation + 1;
        let pid = self.nodes[rank].pid;
        let mut new = self.spawn(rank, (generation, pid), attempt);
        let old = &mut self.nodes[rank];
        std::mem::swap(&mut new.process, &mut old.process);
        new.link = old.link;
        new.master = old.master;
        self.nodes[rank] = new;
        self.nodes[rank].worker.start();
        self.drive_worker(rank);
        if self.nodes[rank].process.handle_replaced(rank, attempt) {
            self.carry_process(rank);
        }
    }

    /// A new process for `rank`, in the place of the old one (which stops).
    pub(super) fn replace(&mut self, rank: Rank, attempt: Attempt) {
        self.settle(rank, &JobError::Cancelled);
        let node = &self.nodes[rank];
        let generations = (node.generation + 1, node.pid + 1);
        self.nodes[rank] = self.spawn(rank, generations, attempt);
        self.start_worker(rank);
    }

    /// Whether the worker of `generation` is the running worker of `rank`: alive, and
    /// not done.
    pub(super) fn is_current(&self, rank: Rank, generation: Generation) -> bool {
        let node = &self.nodes[rank];
        node.alive && !node.stopped && node.generation == generation
    }

    /// Whether the process of `generation` is the running process of `rank`, and its
    /// worker not done.
    pub(super) fn process_current(&self, rank: Rank, generation: Generation) -> bool {
        let node = &self.nodes[rank];
        node.alive && !node.stopped && node.pid == generation
    }

    /// Carries out what the worker's node of `rank` asks, in order, as the runtime's
    /// worker actor does — in virtual time.
    pub(super) fn drive_worker(&mut self, rank: Rank) {
        loop {
            let node = &mut self.nodes[rank];
            if !node.alive || node.stopped {
                return;
            }
            let Some(action) = node.worker.poll_action() else {
                return self.arm(rank);
            };
            let attempt = node.worker.attempt();
            match action {
                WorkerAction::Run(Work::Start) => self.start_up(rank),
                WorkerAction::Run(work @ Work::Iterate(..)) => self.compute(rank, work),
                WorkerAction::Run(work @ Work::Stop(_)) => {
                    // `post_application` takes no time worth simulating.
                    let worked = {
                        let mut task = lock(&node.task);
                        task.attempt = attempt;
                        task.run(work)
                    };
                    node.worker.handle_worked(self.clock.instant(), worked);
                }
                WorkerAction::Send(msg) => {
                    if let ToMaster::Registered { attempt } = msg {
                        self.log(|| format!("worker {rank} registers in attempt {attempt}"));
                    }
                    self.send_to_master(rank, msg);
                }
                WorkerAction::SendResult(report) => {
                    let iteration = report.iteration;
                    self.sent[rank].push((report.attempt, iteration));
                    // The calls its link held back go first, as over TCP.
                    self.send_held(rank);
                    // A result that does not survive the wire encoding is the worker's
                    // failure, as its transport reports it.
                    let direction = || format!("worker {rank} → master");
                    let sent = match crate::codec::through_wire(ToMaster::Result(report), direction)
                    {
                        Ok(copy) => {
                            self.carry_to_master(rank, copy);
                            Ok(())
                        }
                        Err(undecodable) => Err(Unsent::from(TransportError::from(undecodable))),
                    };
                    if std::mem::take(&mut self.nodes[rank].crash_after_send) {
                        return self.crash_worker(rank, "right after its result left");
                    }
                    let now = self.clock.instant();
                    self.nodes[rank].worker.handle_sent(now, iteration, sent);
                }
                WorkerAction::SendDone { awaits_word } => {
                    node.last_word = !awaits_word;
                    let done = lock(&node.task).done(attempt, awaits_word);
                    self.send_to_master(rank, done);
                }
                WorkerAction::Answer(epoch, result) => {
                    if let Some(sync) = &node.sync {
                        sync.answers.answer(epoch, result);
                    }
                    self.unpark(rank);
                }
                WorkerAction::Verdict(error) | WorkerAction::EndSync(error) => {
                    // A call waiting fails, and the compute goes on to return.
                    if let Some(sync) = &node.sync {
                        sync.answers.end(&error);
                    }
                    self.unpark(rank);
                }
                WorkerAction::EndJob(error) => node.end.end(&error),
                WorkerAction::MarkStale => {
                    let task = lock(&node.task);
                    task.stale.store(true, std::sync::atomic::Ordering::Release);
                }
                WorkerAction::Report(ending) => {
                    node.failed = match ending {
                        OwnedEnding::Failed(error) => Some(error),
                        _ => None,
                    };
                }
                WorkerAction::Stop => return self.worker_stopped(rank),
            }
        }
    }

    /// Sets the timer of the worker's node of `rank` for its next deadline, if it moved.
    pub(super) fn arm(&mut self, rank: Rank) {
        let node = &mut self.nodes[rank];
        let next = node.worker.poll_timeout();
        let Some(at) = next.filter(|_| next != node.timer) else {
            return;
        };
        node.timer = next;
        let generation = node.generation;
        let after = at.saturating_duration_since(self.clock.instant());
        self.clock.at(
            after,
            Event::WorkerTimer {
                rank,
                generation,
                at,
            },
        );
    }

    /// The worker of `rank` is done. One that failed ends its process (unless it runs in
    /// the master's), which its launcher may start again once the network lets it
    /// connect.
    pub(super) fn worker_stopped(&mut self, rank: Rank) {
        self.nodes[rank].stopped = true;
        let Some(failure) = self.nodes[rank].failed.clone() else {
            return;
        };
        if self.hosted(rank) {
            return;
        }
        if self.gang() {
            self.log(|| format!("worker {rank}'s process ends on its failure: {failure}"));
            self.ended_on_failure.push(format!(
                "worker {rank}'s process ended on its failure ({failure})"
            ));
        }
        self.nodes[rank].alive = false;
        self.settle(rank, &JobError::Cancelled);
        let heals = self.cuts[rank].map_or(Duration::ZERO, |(_, heal, _)| {
            heal.saturating_sub(self.clock.now)
        });
        self.process_ended(rank, heals);
    }

    /// The start-up of the worker of `rank` runs (`init`, interceptors'
    /// `pre_application`) and returns after its (virtual) time; it may crash meanwhile.
    pub(super) fn start_up(&mut self, rank: Rank) {
        let node = &self.nodes[rank];
        let generation = node.generation;
        let worked = {
            let mut task = lock(&node.task);
            task.attempt = node.worker.attempt();
            task.run(Work::Start)
        };
        let startup = Duration::from_micros(self.rng.random_range(500..5_000));
        // A crash scheduled in iteration 0: during start-up, before it registers.
        let crashes = self
            .scheduled(
                |f| matches!(f, Fault::WorkerCrash { rank: r, iteration: 0, .. } if *r == rank),
            )
            .is_some();
        if crashes {
            self.worker_crashes += 1;
            self.clock
                .at(startup / 2, Event::WorkerCrash { rank, generation });
        }
        self.clock.at(
            startup,
            Event::WorkerStarted {
                rank,
                generation,
                worked,
            },
        );
    }

    /// Ends the compute of `rank` parked in a sync call, if any, as the runtime's worker
    /// does when the job fails: the call fails with `error`; the simulator waits for the
    /// compute to return (what it returns is of no use).
    pub(super) fn settle(&mut self, rank: Rank, error: &JobError) {
        // (Only barrier mode parks a compute: then the node has its sync.)
        if self.unparked(rank).is_none() {
            return;
        }
        let Some(sync) = &mut self.nodes[rank].sync else {
            return;
        };
        sync.answers.end(error);
        // Every call after the end fails at once, without a word: the next is its return.
        loop {
            match sync.next() {
                Some(FromCompute::Returned(_)) => break,
                Some(
                    FromCompute::Call(_)
                    | FromCompute::Soon(_)
                    | FromCompute::Peer(..)
                    | FromCompute::Waiting(_),
                ) => continue,
                None => {
                    self.violations.push(format!(
                        "worker {rank}'s compute did not return within {COMPUTE_PATIENCE:?} once its sync call failed"
                    ));
                    break;
                }
            }
        }
    }

    /// The time the compute of `rank` said it waits until came: woken, unless something
    /// came first (or it is another worker's), it goes on.
    pub(super) fn wake(&mut self, rank: Rank, generation: Generation, wait: u64) {
        let node = &self.nodes[rank];
        if node.generation != generation || node.waits != wait || node.parked.is_none() {
            return;
        }
        if let Some(sync) = &node.sync {
            sync.answers.wake();
        }
        // A wake-up before the call's own deadline (its word that it still waits) leaves
        // it waiting: its wait goes on from when it began.
        let Some((computing, since)) = self.nodes[rank].parked.take() else {
            return;
        };
        self.nodes[rank].woken_since = Some(since);
        self.follow(rank, computing);
    }

    /// The compute of `rank`, woken at the time it said, did not wait again: its wait
    /// ended now.
    fn woken_went_on(&mut self, rank: Rank) {
        if let Some(since) = self.nodes[rank].woken_since.take() {
            let waited = self.clock.now.saturating_sub(since);
            self.stats.longest_wait = self.stats.longest_wait.max(waited);
        }
    }

    /// What the compute of `rank`, parked, waited for came: it goes on.
    pub(super) fn unpark(&mut self, rank: Rank) {
        if let Some(computing) = self.unparked(rank) {
            self.follow(rank, computing);
        }
    }

    /// The compute of `rank` parked, if it is, taken out of its wait, which counts in
    /// [`SimStats::longest_wait`](crate::sim::SimStats::longest_wait).
    fn unparked(&mut self, rank: Rank) -> Option<Computing> {
        let (computing, since) = self.nodes.get_mut(rank)?.parked.take()?;
        let waited = self.clock.now.saturating_sub(since);
        self.stats.longest_wait = self.stats.longest_wait.max(waited);
        Some(computing)
    }

    /// The ranks other than `rank` whose processes are alive: its peers.
    pub(super) fn live_peers(&self, rank: Rank) -> Vec<Rank> {
        (0..self.nodes.len())
            .filter(|&peer| peer != rank && self.nodes[peer].alive)
            .collect()
    }

    /// Waits for what the compute of `rank` (on its own thread, in barrier mode) does next:
    /// a sync call goes to the master and a piece of a collective to its peer, and it goes
    /// on; once it waits, it parks; a return ends the compute.
    pub(super) fn follow(&mut self, rank: Rank, mut computing: Computing) {
        loop {
            let Some(sync) = &mut self.nodes[rank].sync else {
                return;
            };
            let next = sync.next();
            if !matches!(next, Some(FromCompute::Waiting(_))) {
                self.woken_went_on(rank);
            }
            match next {
                Some(FromCompute::Call(msg)) => self.send_to_master(rank, msg),
                Some(FromCompute::Soon(msg)) => self.send_soon(rank, msg),
                Some(FromCompute::Peer(to, msg)) => {
                    computing.in_collective = true;
                    self.send_to_peer(rank, to, msg);
                }
                Some(FromCompute::Waiting(until)) => {
                    if computing.during && computing.in_collective {
                        // The crash drawn for this compute comes while it waits in a
                        // collective, its peers waiting for what it has not sent yet.
                        computing.during = false;
                        computing.crash = false;
                        self.worker_crashes += 1;
                        let generation = self.nodes[rank].generation;
                        let at = Duration::from_micros(self.rng.random_range(0..2_000));
                        self.clock.at(at, Event::WorkerCrash { rank, generation });
                    }
                    let node = &mut self.nodes[rank];
                    let since = node.woken_since.take().unwrap_or(self.clock.now);
                    node.parked = Some((computing, since));
                    node.waits += 1;
                    if let Some(until) = until {
                        let (generation, wait) = (node.generation, node.waits);
                        let after = self.clock.since_start(until).saturating_sub(self.clock.now);
                        self.clock.at(
                            after,
                            Event::ComputeWake {
                                rank,
                                generation,
                                wait,
                            },
                        );
                    }
                    return;
                }
                Some(FromCompute::Returned(worked)) => {
                    return self.computed(rank, computing, worked)
                }
                None => {
                    self.violations.push(format!(
                    "worker {rank}'s compute neither called, waited nor returned within {COMPUTE_PATIENCE:?}"
                ));
                    let worked = Worked::Iterated(Err(Box::new(JobError::Runtime {
                        message: format!("worker {rank}'s compute hung"),
                    })));
                    return self.computed(rank, computing, worked);
                }
            }
        }
    }

    pub(super) fn compute(&mut self, rank: Rank, work: Work<M>) {
        let Work::Iterate(ref step) = work else {
            return;
        };
        let iteration = step.iteration;
        let faults = self.sim.faults;
        let slow = self
            .scheduled(|f| *f == Fault::Slow { rank, iteration })
            .is_some()
            || self.chance(faults.slow);
        let scheduled = self.scheduled(|f| {
            matches!(f, Fault::WorkerCrash { rank: r, iteration: i, .. } if *r == rank && *i == iteration)
        });
        let (crash, during) = match scheduled {
            Some(Fault::WorkerCrash { after_result, .. }) => (true, !after_result),
            _ => {
                let crash =
                    self.worker_crashes < faults.max_crashes && self.chance(faults.worker_crash);
                (crash, crash && self.rng.random_bool(0.5))
            }
        };
        let mut took = Duration::from_micros(self.rng.random_range(1_000..10_000));
        if slow {
            took *= 20;
        }
        let node = &mut self.nodes[rank];
        let attempt = node.worker.attempt();
        lock(&node.task).attempt = attempt;
        self.log(|| {
            format!(
                "worker {rank} computes iteration {iteration} of attempt {attempt}{}",
                if slow { " (slowly)" } else { "" }
            )
        });
        let computing = Computing {
            took,
            crash,
            during,
            in_collective: false,
        };
        let node = &self.nodes[rank];
        match &node.sync {
            // Interceptors and compute, as the runtime runs them.
            None => {
                let worked = lock(&node.task).run(work);
                self.computed(rank, computing, worked);
            }
            // On a thread of its own, as in the runtime; the simulator waits for it to
            // call or return, so one thread runs at a time.
            Some(sync) => {
                let (task, to_sim) = (Arc::clone(&node.task), sync.to_sim.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("superstep-sim-worker-{rank}"))
                    .spawn(move || {
                        let worked = lock(&task).run(work);
                        let _ = to_sim.send(FromCompute::Returned(worked));
                    });
                match spawned {
                    Ok(thread) => {
                        if let Some(sync) = &mut self.nodes[rank].sync {
                            sync.thread = Some(thread);
                        }
                    }
                    Err(e) => {
                        let worked = Worked::Iterated(Err(Box::new(JobError::Runtime {
                            message: format!("could not start worker {rank}'s compute thread: {e}"),
                        })));
                        return self.computed(rank, computing, worked);
                    }
                }
                self.follow(rank, computing);
            }
        }
    }

    /// The compute of `rank` returned `worked`: its result leaves once its (virtual)
    /// compute time passed, unless it crashes first.
    pub(super) fn computed(&mut self, rank: Rank, computing: Computing, worked: Worked<W>) {
        let Computing {
            took,
            crash,
            during,
            ..
        } = computing;
        let generation = self.nodes[rank].generation;
        let worked = match worked {
            Worked::Iterated(Ok(report)) => Worked::Iterated(Ok(Report {
                // Virtual time, so that a seed replays the same run.
                elapsed: took,
                ..report
            })),
            other => other,
        };
        if during {
            self.worker_crashes += 1;
            let at = Duration::from_micros(self.rng.random_range(0..took.as_micros() as u64));
            self.clock.at(at, Event::WorkerCrash { rank, generation });
        } else {
            if crash {
                self.worker_crashes += 1;
            }
            self.clock.at(
                took,
                Event::Computed {
                    rank,
                    generation,
                    worked,
                    then_crash: crash,
                },
            );
        }
    }

    pub(super) fn crash_worker(&mut self, rank: Rank, when: &str) {
        self.settle(rank, &JobError::Cancelled);
        let node = &mut self.nodes[rank];
        node.alive = false;
        // What its link held back dies with it.
        node.held = None;
        let generation = node.pid;
        self.stats.worker_crashes += 1;
        self.log(|| format!("worker {rank} crashes {when}"));
        let master = self.master_generation;
        // The loss is noticed after the heartbeat timeout, and after everything the
        // connection carried arrived (the transport reports it when its reading ends).
        let noticed = self.until_delivered(rank).max(HEARTBEAT_TIMEOUT);
        self.clock.at(
            noticed,
            Event::Noticed {
                rank,
                generation,
                master,
            },
        );
        // Its peers' connections to it break: each hears at once (as a process's sockets
        // close with it), and a collective waiting for it fails naming it. A launched
        // process's host may be lost with it: a peer then finds the loss only once its
        // heartbeats stop — perhaps after the master restarted the gang.
        for peer in self.live_peers(rank) {
            let reason = format!("worker {rank}'s process ended ({when})");
            let wait = if self.sim.launched.is_some() && self.rng.random_bool(0.5) {
                HEARTBEAT_TIMEOUT
            } else {
                Duration::ZERO
            };
            self.peer_lost_after(peer, rank, reason, wait);
        }
        // A new process of the rank can connect once the old connection is gone.
        self.process_ended(rank, noticed);
    }
}
