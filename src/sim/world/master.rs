//! The master's process in a simulated run: its node (the runtime's `MasterNode`) fed what
//! happens and its actions carried out, its code run as the runtime runs it (with its
//! checkpoints to the simulator's store), its crashes — while it gathers, around its
//! compute and checkpoint write, in start-up and in the drain — and its restarts.

use std::time::Duration;

use rand::RngExt;

use super::network::{SimReach, Way};
use super::*;
use crate::compute::JobEnd;
use crate::coordinator::JobInfo;
use crate::protocol::{
    Action, Envelope, MasterDone, MasterNode, MasterRound, MasterWork, NodeSettings,
};
use crate::runtime::coordination::Coordination;
use crate::runtime::master::MasterTask;
use crate::runtime::{MasterParts, SharedStore};
use crate::sim::lock;
use crate::sim::{store::WriteCrash, CrashPoint};

/// The master's process: the node the runtime drives, and the master's code as the
/// runtime runs it.
pub(super) struct MasterProcess<M: Payload, W: Payload> {
    pub(super) node: MasterNode<M, W>,
    pub(super) task: Option<Box<MasterTask<M, W>>>,
    /// The job's coordinator, in the master's process.
    pub(super) coordination: Option<Coordination>,
    pub(super) timer: Option<Instant>,
    /// The job's failure as the master's process hears of it.
    pub(super) end: JobEnd,
}

impl<M: Payload, W: Payload> World<'_, M, W> {
    /// Starts the master's process, as the runtime does: the newest checkpoint read, the
    /// attempt chosen, the master's code and node built from them. `restarted`: how many
    /// processes died before this one.
    pub(super) fn start_master(&mut self, restarted: u32) {
        let mut store = self.store.clone();
        let resuming = crate::checkpoint::Resuming::new(&self.job, self.sim.shape());
        let resumed = match crate::checkpoint::resume::<M>(&mut store, &resuming) {
            Ok(resumed) => resumed,
            Err(error) => {
                self.log(|| format!("the master cannot resume: {error}"));
                self.outcome = Some(Err(error));
                return;
            }
        };
        let skipped = std::mem::take(&mut *lock(&self.store.skipped));
        if skipped > 0 {
            self.stats.skipped_checkpoints += skipped;
            self.log(|| format!("the master skips {skipped} damaged checkpoint(s)"));
        }
        let per_process =
            crate::protocol::attempts_per_process(self.job.failure_policy, self.job.barrier_mode);
        let attempt = crate::protocol::start_attempt(
            restarted,
            resumed.as_ref().map(|r| r.attempt),
            per_process,
        );
        if let Some(r) = &resumed {
            let iteration = r.iteration;
            self.log(|| format!("the master resumes from the checkpoint of iteration {iteration}"));
        }
        let mut made = (self.sim.master)();
        // Sharded as every process shards, with the coordinator that then starts.
        let shards = crate::runtime::coordination::shards(
            made.coordinator.as_mut(),
            self.sim.input.as_ref(),
            self.job.workers,
        );
        match shards {
            Ok(shards) => self.shards = shards.map(Arc::new),
            Err(error) => {
                self.log(|| format!("the input cannot be sharded: {error}"));
                self.outcome = Some(Err(error));
                return;
            }
        }
        let keeps = self.node_config.checkpoint_every.is_some();
        let store = keeps.then(|| SharedStore::new(Box::new(store)));
        // A job that committed ends with its result: its coordinator runs no hook again.
        let committed = resumed.as_ref().is_some_and(|r| r.committed_end);
        if committed && made.coordinator.take().is_some() {
            self.log(|| "the job committed before: its coordinator does not run again".into());
        }
        // The coordinator starts before anything else of the process, as in the runtime.
        let info = JobInfo::new(&*self.job_id, self.job.workers, attempt);
        let mut coordination = made
            .coordinator
            .map(|c| Coordination::new(c, info).recording(store.clone()));
        if let Some(c) = &mut coordination {
            if let Err(error) = c.start() {
                self.log(|| format!("the coordinator cannot start: {error}"));
                self.outcome = Some(Err(error));
                return;
            }
        }
        let end = JobEnd::default();
        let (task, node) = crate::runtime::master_process(
            MasterParts {
                master: made.master,
                hooks: made.hooks,
                combine: self.sim.combine.as_ref().map(|c| Arc::clone(&c.fold)),
                for_workers: made.for_workers,
                store,
                resuming,
                resumed,
                attempt,
                end: end.clone(),
            },
            Arc::clone(&self.node_config),
            NodeSettings {
                local: (0..self.job.workers).map(|r| self.hosted(r)).collect(),
                coordinated: coordination.is_some(),
                listening: false,
                metrics: false,
            },
            &self.job_id,
            self.clock.instant(),
        );
        self.master = Some(MasterProcess {
            node,
            task: Some(Box::new(task)),
            coordination,
            timer: None,
            end,
        });
    }

    /// Feeds the master's node (if its process runs), then carries out what it asks.
    pub(super) fn feed(&mut self, input: impl FnOnce(&mut MasterNode<M, W>, Instant, &SimReach)) {
        let reach = self.reach();
        let now = self.clock.instant();
        let Some(master) = self.master.as_mut() else {
            return;
        };
        input(&mut master.node, now, &reach);
        self.drive();
    }

    pub(super) fn drive(&mut self) {
        loop {
            let Some(action) = self.master.as_mut().and_then(|m| m.node.poll_action()) else {
                return;
            };
            self.carry_out(action);
        }
    }

    pub(super) fn carry_out(&mut self, action: Action<M, W>) {
        match action {
            Action::Send { to, msg } => self.send_to_worker(to, msg),
            Action::Broadcast(msg) => {
                let begins = matches!(msg, ToWorker::Iterate { .. });
                if let (ToWorker::Iterate { iteration, .. }, false) = (&msg, self.gang()) {
                    let iteration = *iteration;
                    let cut = self.scheduled(
                        |f| matches!(f, Fault::Partition { iteration: i, .. } if *i == iteration),
                    );
                    if let Some(Fault::Partition { rank, millis, .. }) = cut {
                        self.cut(rank, millis);
                    }
                }
                let ends = matches!(msg, ToWorker::Finish { .. } | ToWorker::Abort { .. });
                if ends
                    && self
                        .scheduled(|f| *f == Fault::MasterCrashInDrain)
                        .is_some()
                {
                    // Before any worker's word that it stopped can be in: each way takes
                    // 50 µs at least.
                    let at = Duration::from_micros(self.rng.random_range(0..90));
                    let master = self.master_generation;
                    let when = "during the drain, before any worker said it stopped";
                    self.clock.at(at, Event::MasterCrashNow { master, when });
                }
                for rank in 0..self.job.workers {
                    self.send_to_worker(rank, msg.clone());
                }
                // The master's process may crash while it gathers the round it began.
                let iteration = match msg {
                    ToWorker::Iterate { iteration, .. } => iteration,
                    _ => 0,
                };
                let scheduled = if begins {
                    self.scheduled(|f| {
                        *f == Fault::MasterCrash {
                            iteration,
                            point: CrashPoint::Gathering,
                        } || *f == Fault::MasterHostLost { iteration }
                    })
                } else {
                    None
                };
                let master = self.master_generation;
                if let Some(fault) = scheduled {
                    // Before the first result can be in (compute takes 1 ms at least).
                    let at = Duration::from_micros(self.rng.random_range(0..500));
                    let host = matches!(fault, Fault::MasterHostLost { .. });
                    self.clock.at(at, Event::MasterCrash { master, host });
                } else if begins && self.master_may_crash() && self.rng.random_bool(0.5) {
                    let at = Duration::from_micros(self.rng.random_range(0..10_000));
                    let host = false;
                    self.clock.at(at, Event::MasterCrash { master, host });
                }
            }
            Action::RunMaster(work) => self.run_master(work),
            Action::ReplaceWorker { rank, attempt, .. } => {
                self.stats.worker_restarts += 1;
                self.log(|| format!("worker {rank} is replaced"));
                self.replace(rank, attempt);
            }
            Action::ReplaceAll { attempt, .. } => {
                self.stats.new_attempts += 1;
                self.log(|| format!("every worker restarts as attempt {attempt}"));
                // Those of the master's process; each other process replaces its own
                // when the `Restart` that follows reaches it.
                for rank in 0..self.job.workers {
                    if self.hosted(rank) {
                        self.replace(rank, attempt);
                    }
                }
            }
            Action::Event(_) => {}
            Action::EndJob(error) => {
                if let Some(master) = &self.master {
                    master.end.end(&error);
                }
            }
            Action::Report(report) => {
                if let Some(master) = self.master.as_mut() {
                    let attempt = master.node.attempt();
                    if let Some(c) = master.coordination.as_mut() {
                        c.worker_done(attempt, &report);
                    }
                }
            }
            Action::Commit { iteration, reports } => {
                let committed = match self.master.as_mut() {
                    Some(MasterProcess {
                        node,
                        coordination: Some(c),
                        ..
                    }) => c.finish(node.attempt(), iteration, &reports),
                    _ => Ok(()),
                };
                self.feed(|node, now, _| node.handle_committed(now, committed));
            }
            Action::CleanUp(error) => {
                if let Some(master) = self.master.as_mut() {
                    let attempt = master.node.attempt();
                    if let Some(c) = master.coordination.as_mut() {
                        c.fail(Some(attempt), &error);
                    }
                }
            }
            Action::Finished(outcome) => {
                let outcome = *outcome;
                if let Some(master) = &self.master {
                    self.stats.drops += master.node.drops();
                    self.stats.lost = master.node.lost();
                }
                self.log(|| match &outcome {
                    Ok(o) => format!("the job completes after {} iterations", o.iterations),
                    Err(e) => format!("the job fails: {e}"),
                });
                self.outcome = Some(outcome.map(|o| SimOutcome {
                    result: o.result,
                    iterations: o.iterations,
                    halted: o.halted,
                }));
            }
        }
    }

    /// Runs the master's code as the runtime does (its process may crash before its
    /// compute, or around its checkpoint write), and hands back what it did.
    pub(super) fn run_master(&mut self, work: MasterWork<M, W>) {
        let mut crash = None;
        if let MasterWork::Iterate(round) = &work {
            self.check_round(round);
            let iteration = round.iteration;
            let scheduled = self.scheduled(|f| {
                matches!(f, Fault::MasterCrash { iteration: i, point } if *i == iteration && *point != CrashPoint::Gathering)
            });
            crash = match scheduled {
                Some(Fault::MasterCrash { point, .. }) => Some(match point {
                    CrashPoint::BeforeCompute | CrashPoint::Gathering => 0,
                    CrashPoint::BeforeCheckpoint => 1,
                    CrashPoint::DuringCheckpoint => 2,
                    CrashPoint::AfterCheckpoint => 3,
                    CrashPoint::TornCheckpoint => 4,
                }),
                _ if self.master_may_crash() => Some(self.rng.random_range(0..4u8)),
                _ => None,
            };
        }
        if crash == Some(0) {
            return self.crash_master("before its compute");
        }
        let write_crash = match crash {
            Some(1) => Some(WriteCrash::Before),
            Some(2) => Some(WriteCrash::During),
            Some(3) => Some(WriteCrash::After),
            Some(4) => Some(WriteCrash::Torn),
            _ => None,
        };
        *self.store.plan.lock().unwrap_or_else(|e| e.into_inner()) = (write_crash, false);
        let Some(mut task) = self.master.as_mut().and_then(|m| m.task.take()) else {
            self.violations
                .push("work handed to the master while it was busy".into());
            return;
        };
        let done = task.run(work);
        if let MasterDone::Adopted(Ok(Some(resumed))) = &done {
            self.stats.resumed_from_copies += 1;
            let from = resumed.from.map(|(i, _)| i);
            self.log(|| format!("the master resumes from a worker's copy of the checkpoint of iteration {from:?}"));
        }
        let (unused, crashed) = {
            let mut plan = self.store.plan.lock().unwrap_or_else(|e| e.into_inner());
            (plan.0.take(), std::mem::take(&mut plan.1))
        };
        if unused.is_some() {
            // No checkpoint was due: the process crashes once its compute is done.
            return self.crash_master("after its compute (no checkpoint was due)");
        }
        if crashed {
            let when = match write_crash {
                Some(WriteCrash::Before) => "before its checkpoint write",
                Some(WriteCrash::During) => "during its checkpoint write",
                Some(WriteCrash::Torn) => "during its checkpoint write, leaving the file torn",
                _ => "after its checkpoint write",
            };
            return self.crash_master(when);
        }
        if let MasterDone::Iterated {
            result: Ok(computed),
            iteration,
            ..
        } = &done
        {
            if computed.checkpointed {
                self.stats.checkpoints += 1;
                let iteration = *iteration;
                self.log(|| format!("checkpoint of iteration {iteration} saved"));
            }
        }
        if let Some(master) = self.master.as_mut() {
            master.task = Some(task);
        }
        self.feed(|node, now, reach| node.handle_master_done(now, done, reach));
    }

    /// The invariants of a round the master is handed: its quorum, and only results
    /// its ranks sent in its attempt.
    pub(super) fn check_round(&mut self, round: &MasterRound<W>) {
        let iteration = round.iteration;
        let gathered = &round.gathered;
        self.stats.rounds += 1;
        let quorum = self.job.quorum();
        if gathered.reported.len() < quorum {
            self.violations.push(format!(
                "iteration {iteration} completed with ranks {:?}, short of its quorum {quorum}",
                gathered.reported
            ));
        }
        let attempt = self.master.as_ref().map_or(0, |m| m.node.attempt());
        for &rank in &gathered.reported {
            if !self.sent[rank].contains(&(attempt, iteration)) {
                self.violations.push(format!(
                    "iteration {iteration} folded a result rank {rank} never sent in attempt {attempt}"
                ));
            }
        }
        if !gathered.left_out.is_empty() {
            self.stats.partial_rounds += 1;
        }
        let (reported, left_out) = (gathered.reported.clone(), gathered.left_out.clone());
        self.log(|| {
            format!(
                "iteration {iteration} complete with ranks {reported:?} (left out {left_out:?})"
            )
        });
    }

    /// Whether the job's failures restart every worker (`RestartAll`, or `RestartWorker`
    /// in barrier mode).
    pub(super) fn gang(&self) -> bool {
        crate::protocol::restarts_all(self.job.failure_policy, self.job.barrier_mode)
    }

    /// Whether every worker runs in the master's process, as a gang does unless
    /// launched: then they die and start again with it. Otherwise they are processes of
    /// their own, which reconnect to a master started again.
    pub(super) fn together(&self) -> bool {
        self.gang() && self.sim.launched.is_none()
    }

    /// Whether the worker of `rank` runs in the master's process (every worker of a gang
    /// together; rank 0's of a gang launched), dying and starting again with it.
    pub(super) fn hosted(&self, rank: Rank) -> bool {
        self.together() || (self.gang() && rank == 0)
    }

    /// Whether the launcher starts `what`, which died, again: always, unless it counts its
    /// restarts ([`Simulation::launched`](crate::sim::Simulation::launched)) and has none
    /// left.
    pub(super) fn launcher_restarts(&mut self, what: &str) -> bool {
        match &mut self.restarts_left {
            None => true,
            Some(0) => {
                self.log(|| format!("the launcher does not start {what} again: no restarts left"));
                false
            }
            Some(left) => {
                *left -= 1;
                true
            }
        }
    }

    pub(super) fn master_may_crash(&mut self) -> bool {
        self.stats.master_crashes < self.sim.faults.max_crashes
            && self.chance(self.sim.faults.master_crash)
    }

    /// The master's host is lost: its checkpoint store with it, unless the store outlives
    /// it (its process crashes next, and with it the copies of workers it runs:
    /// `crash_master`).
    pub(super) fn lose_host(&mut self) {
        self.stats.hosts_lost += 1;
        if self.node_config.store_outlives_host {
            self.log(|| {
                "the master's host is lost; its checkpoints are in a store that outlives it".into()
            });
            return;
        }
        self.log(|| "the master's host is lost, with its checkpoints".into());
        lock(&self.store.files).clear();
    }

    pub(super) fn crash_master(&mut self, when: &str) {
        // (An empty store, lost already or never written, has nothing to lose.)
        let holds = !lock(&self.store.files).is_empty();
        if self.master.is_some() && holds && self.chance(self.sim.faults.host_lost) {
            self.lose_host();
        }
        if let Some(master) = self.master.take() {
            self.stats.drops += master.node.drops();
        }
        self.master_generation += 1;
        self.stats.master_crashes += 1;
        self.log(|| format!("the master crashes {when}"));
        // The workers of its process die with it; their peers' connections to them break.
        for rank in 0..self.nodes.len() {
            if self.hosted(rank) {
                self.settle(rank, &JobError::Cancelled);
                self.nodes[rank].alive = false;
                if !self.together() {
                    for peer in self.live_peers(rank) {
                        let reason = format!(
                            "worker {rank}'s process ended (the master's, which crashed {when})"
                        );
                        self.peer_lost(peer, rank, reason);
                    }
                }
            }
        }
        // Each other worker's link finds its connection closed and reaches for the master
        // again, as the TCP client says (`ToWorker::Reconnecting`) — after what the
        // connection still carried, and not once its worker said its last word.
        for rank in 0..self.nodes.len() {
            let node = &self.nodes[rank];
            if !node.alive || node.stopped || node.last_word {
                continue;
            }
            let reason = format!("the master crashed {when}");
            let msg = ToWorker::Reconnecting { reason };
            if self.sim.launched.is_none() {
                self.reach_process(rank, msg);
                continue;
            }
            let generation = node.pid;
            let latency = self.latency();
            let after = self.in_order(rank, Way::ToWorker, latency);
            self.clock.at(
                after,
                Event::ToWorker {
                    rank,
                    generation,
                    msg,
                },
            );
        }
        if !self.launcher_restarts("the master's process") {
            self.outcome = Some(Err(JobError::MasterLost {
                reason: format!(
                    "the master's process crashed {when}, and its launcher has no restart left"
                ),
            }));
            return;
        }
        let after = Duration::from_micros(self.rng.random_range(20_000..100_000));
        self.clock.at(after, Event::MasterRestart);
    }

    pub(super) fn restart_master(&mut self) {
        self.stats.new_attempts += 1;
        self.start_master(self.stats.master_crashes);
        let Some(master) = &self.master else {
            return;
        };
        let attempt = master.node.attempt();
        self.log(|| format!("the master restarts as attempt {attempt}"));
        // Its process starts its workers anew.
        for rank in 0..self.job.workers {
            if self.hosted(rank) {
                self.replace(rank, attempt);
            }
        }
        self.drive();
        for rank in 0..self.job.workers {
            let node = &self.nodes[rank];
            if node.alive && !self.hosted(rank) {
                let backoff = Duration::from_micros(self.rng.random_range(1_000..30_000));
                let generation = node.pid;
                self.clock
                    .at(backoff, Event::Reconnect { rank, generation });
            }
            // A rank whose process is gone connects when the launcher starts it again (or
            // never: the start-up timeout then names it).
        }
    }

    pub(super) fn arm_timer(&mut self) {
        if self.outcome.is_some() {
            return;
        }
        let now = self.clock.instant();
        let generation = self.master_generation;
        let Some(master) = self.master.as_mut() else {
            return;
        };
        let deadline = master.node.poll_timeout();
        if deadline != master.timer {
            master.timer = deadline;
            if let Some(at) = deadline {
                let after = at.saturating_duration_since(now);
                self.clock.at(
                    after,
                    Event::Timer {
                        master: generation,
                        at,
                    },
                );
            }
        }
    }

    pub(super) fn deliver_to_master(&mut self, from: Rank, msg: ToMaster<W>) {
        let checked = match &msg {
            ToMaster::Result(r) => Some((r.attempt, r.iteration)),
            _ => None,
        };
        let Some(master) = &self.master else {
            return;
        };
        let before = master.node.drops().total();
        let current = (master.node.attempt(), master.node.gathering());
        // Through the batch the runtime's hosted workers' messages take (a batch of one
        // here: each arrives as an event of its own), so that a result goes the way of
        // the runtime's, offered to the gate by `Gate::on_results`.
        self.feed(|node, now, reach| {
            node.handle_messages(now, &mut vec![Envelope { from, msg }], reach)
        });
        if let (Some((attempt, iteration)), Some(master)) = (checked, &self.master) {
            let kept = master.node.drops().total() == before;
            if kept && Some((attempt, iteration)) != current.1.map(|i| (current.0, i)) {
                self.violations.push(format!(
                    "a result of rank {from} for attempt {attempt} iteration {iteration} was kept while the master's node was at {current:?}"
                ));
            }
        }
    }
}
