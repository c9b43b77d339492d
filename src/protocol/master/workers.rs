//! The workers' side of the node: what the gate says (registrations, rounds complete,
//! replacements joined, the drain), failures and the recovery from them under the failure
//! policy, sync answers, and the waits that name whom they wait for.

use super::*;

impl<M, W> MasterNode<M, W> {
    /// Says, at a steady interval ([`WAIT_LOG_INTERVAL`], or a quarter of the wait's
    /// timeout), which ranks a long wait waits for: at WARN for start-up and shutdown,
    /// which should be short; at INFO for an iteration — compute may be long by design —
    /// until half its timeout has passed.
    ///
    /// A rank that has not connected yet is the transport's wait (its connect timeout,
    /// which it says itself), not registration's: registration names only ranks that
    /// connected and have not registered, so that each rank is said by one wait, with
    /// one timeout.
    pub(super) fn say_waiting(&mut self, now: Instant, reach: &dyn Reach) {
        let Some(Wait {
            during,
            missing,
            since,
            timeout,
        }) = self.gate.waiting()
        else {
            return;
        };
        // A rank lost in another process waits for a new process, which only a launcher or
        // a scheduler starts: said at WARN, whatever the wait.
        let (replaced, missing): (Vec<Rank>, Vec<Rank>) = missing.into_iter().partition(|&rank| {
            self.awaiting
                .get(rank)
                .is_some_and(|a| *a != Awaiting::None)
        });
        let missing: Vec<Rank> = match during {
            Waiting::Registration => missing
                .into_iter()
                .filter(|&rank| reach.is_connected(rank))
                .collect(),
            _ => missing,
        };
        if missing.is_empty() && replaced.is_empty() {
            return;
        }
        let waited = now.saturating_duration_since(since);
        let last = self
            .wait_said
            .filter(|&said| said >= since)
            .unwrap_or(since);
        if now.saturating_duration_since(last) < WAIT_LOG_INTERVAL.min(timeout / 4) {
            return;
        }
        self.wait_said = Some(now);
        for &rank in &replaced {
            let left = timeout.saturating_sub(waited);
            say_replacement_awaited(rank, left, during);
        }
        if missing.is_empty() {
            return;
        }
        let quiet = matches!(during, Waiting::Iteration(_)) && waited < timeout / 2;
        if self.failed_ending() {
            // A failed job's short grace for its workers to end: the failure was said at
            // ERROR; the ranks it waits for are most often the failure's own.
            tracing::debug!(%during, ?missing, "waiting {waited:.0?} of {timeout:?} in {during} for worker(s) {missing:?}");
        } else if quiet {
            tracing::info!(%during, ?missing, "waiting {waited:.0?} of {timeout:?} in {during} for worker(s) {missing:?}");
        } else {
            tracing::warn!(%during, ?missing, "waiting {waited:.0?} of {timeout:?} in {during} for worker(s) {missing:?}");
        }
    }

    /// Whether the job is ending with a failure.
    fn failed_ending(&self) -> bool {
        matches!(
            self.stage,
            Stage::Ending {
                ending: OwnedEnding::Failed(_),
                ..
            }
        )
    }

    /// The job ends: a rank that the master's node cannot reach any more (its connection
    /// ended) will not say it is done, and is not waited for. One that may still connect
    /// (a worker of the master's node this one replaced, reconnecting; a process that had
    /// not connected yet when the job failed) is given the reconnect grace (`NodeConfig::reconnect_grace`) to, and hear
    /// how the job ended.
    pub(super) fn forget_unconnected(&mut self, now: Instant, reach: &dyn Reach) {
        let mut later = Vec::new();
        for rank in 0..self.reports.len() {
            if self.gate.is_done(rank) || reach.is_connected(rank) {
                continue;
            }
            if reach.may_reach(rank) {
                later.push(rank);
            } else {
                tracing::debug!(rank, "not connected at the end of the job: not waited for");
                self.not_waited_for(now, rank, reach);
            }
        }
        if !later.is_empty() {
            self.reconnecting = Some((now + self.config.reconnect_grace(), later));
        }
    }

    /// The job ends: a rank whose new process has not registered yet is not waited for
    /// (nothing would tell it the job ended).
    pub(super) fn forget_awaited(&mut self, now: Instant, reach: &dyn Reach) {
        for rank in 0..self.awaiting.len() {
            if self.awaiting[rank] != Awaiting::None {
                self.awaiting[rank] = Awaiting::None;
                tracing::warn!(
                    rank,
                    "the job ended before a new process of the rank joined"
                );
                self.not_waited_for(now, rank, reach);
            }
        }
    }

    /// The rank will not say it is done: the end of the job does not wait for it.
    pub(super) fn not_waited_for(&mut self, now: Instant, rank: Rank, reach: &dyn Reach) {
        let output = self.gate.lose(now, rank);
        self.on_gate(now, output, reach);
    }

    /// Acts on what the gate said, except that an iteration that timed out while ranks
    /// waited in a sync call fails as that epoch's timeout: it names the ranks that did not
    /// arrive, not every rank of the iteration (the waiting ones had not delivered either).
    pub(super) fn on_gate_checked(
        &mut self,
        now: Instant,
        output: Option<GateOutput<W>>,
        reach: &dyn Reach,
    ) {
        if let Some(GateOutput::Failed(JobError::WorkersTimedOut {
            during: Waiting::Iteration(_),
            ..
        })) = &output
        {
            if self.sync.is_gathering() || self.groups.is_gathering() {
                let step = self.sync.expire(now);
                self.apply(now, step, reach);
                for (group, step) in self.groups.expire(now) {
                    self.apply_among(now, group, step, reach);
                }
                return;
            }
        }
        self.on_gate(now, output, reach);
    }

    /// Acts on what the gate said.
    pub(super) fn on_gate(
        &mut self,
        now: Instant,
        output: Option<GateOutput<W>>,
        reach: &dyn Reach,
    ) {
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
                        *refused = reach.refusals(missing);
                    }
                }
                self.on_failure(now, error, reach);
            }
            GateOutput::AllRegistered => {
                self.recovery.all_registered();
                if let Stage::Starting { workers_ready, .. } = &mut self.stage {
                    *workers_ready = true;
                }
                self.report.startup = now.saturating_duration_since(self.started);
                let elapsed = self.report.startup;
                tracing::debug!(?elapsed, "every worker registered");
                self.event(|| JobEvent::Registered { elapsed });
                self.maybe_begin(now, reach);
            }
            GateOutput::Rejoined { rank, iteration } => {
                self.recovery.rejoined(rank);
                self.awaiting[rank] = Awaiting::None;
                tracing::info!(rank, ?iteration, "a replacement worker joined");
                if let Some(iteration) = iteration {
                    // It saves as the round's other workers were told to (a preemption's
                    // checkpoint needs every worker's part).
                    let under_way = matches!(self.stage, Stage::Gathering(i) if i == iteration);
                    let msg = ToWorker::Iterate {
                        attempt: self.attempt(),
                        iteration,
                        last: self.last.clone(),
                        fold: self.route,
                        save: if under_way {
                            self.saving
                        } else {
                            self.config.workers_save(iteration)
                        },
                    };
                    self.send(rank, msg);
                }
            }
            GateOutput::RoundComplete {
                iteration,
                gathered,
            } => self.round_complete(now, iteration, gathered, reach),
            GateOutput::Drained {
                missing,
                waited,
                drops,
            } => {
                let reports: Vec<WorkerReport> =
                    self.reports.iter_mut().filter_map(Option::take).collect();
                for worker in &reports {
                    self.report.rows.add(&worker.rows);
                }
                self.report.workers = reports;
                self.report.drops = drops;
                if !missing.is_empty() {
                    let error = JobError::WorkersTimedOut {
                        during: Waiting::Shutdown,
                        missing,
                        waited,
                        refused: Vec::new(),
                        heard: Vec::new(),
                    };
                    let completed = matches!(
                        self.stage,
                        Stage::Ending {
                            ending: OwnedEnding::Completed { .. },
                            ..
                        }
                    );
                    if completed {
                        self.fail(now, error, reach);
                    } else {
                        let ranks = match &error {
                            JobError::WorkersTimedOut { missing, .. } => missing.clone(),
                            _ => Vec::new(),
                        };
                        // Only this process's own workers are known to run user code; of
                        // another process's rank the master knows only that it said
                        // nothing (it may be gone, or no worker at all).
                        let (here, away): (Vec<Rank>, Vec<Rank>) = ranks
                            .into_iter()
                            .partition(|&r| self.settings.local.get(r) == Some(&true));
                        if !here.is_empty() {
                            tracing::warn!(
                                ranks = ?here,
                                "the job failed; worker(s) {here:?} still run user code after the failure grace and are left to end on their own threads"
                            );
                        }
                        // A process still connected that says nothing is odd; one not
                        // connected (refused, gone: most often the failure's own) is not:
                        // the job's failure was said at ERROR.
                        let (silent, gone): (Vec<Rank>, Vec<Rank>) =
                            away.into_iter().partition(|&r| reach.is_connected(r));
                        if !silent.is_empty() {
                            tracing::warn!(
                                ranks = ?silent,
                                "the job failed; the process(es) of worker(s) {silent:?} did not say they ended within the failure grace: not waited for"
                            );
                        }
                        if !gone.is_empty() {
                            tracing::debug!(
                                ranks = ?gone,
                                "the job failed; the process(es) of worker(s) {gone:?}, not connected, did not say they ended within the failure grace: not waited for"
                            );
                        }
                    }
                }
                if let Stage::Ending { drained, .. } = &mut self.stage {
                    *drained = true;
                }
                self.maybe_stop(now);
            }
        }
    }

    /// A failure: the job's end, or one the failure policy recovers from.
    pub(super) fn on_failure(&mut self, now: Instant, error: JobError, reach: &dyn Reach) {
        let error = self.heard.name(now, error);
        if self.ending() {
            // A worker that fails while the job ends is not waited for. Under a policy
            // that can do without a worker (a straggler of the last round, say) the job
            // still ends as it was ending; under `Fail`, and for any failure that is not
            // a worker's, the job fails.
            let rank = Recovery::recoverable(&error);
            match rank {
                Some(rank) if self.recovery.policy() != FailurePolicy::Fail => {
                    tracing::warn!(rank, %error, "a worker failed while the job ended");
                }
                _ => self.fail(now, error, reach),
            }
            if let Some(rank) = rank {
                self.not_waited_for(now, rank, reach);
            }
            return;
        }
        // Restarting every worker, the master waits for each rank to register in the new
        // attempt: the loss of a rank of another process that has not registered in it —
        // its old process, dead before it heard of the restart, or a new one gone before
        // it registered — restarts nothing more. A new process of the rank is waited for,
        // within the registration's timeout.
        if let Some(rank) = self.lost_elsewhere(&error) {
            // A policy that would wait for a new process of the rank, which nothing will
            // start: the job fails now, saying why, rather than wait out its timeout.
            let waits = matches!(
                self.recovery.policy(),
                FailurePolicy::RestartWorker { .. } | FailurePolicy::RestartAll { .. }
            );
            if let (true, Some(why), JobError::WorkerLost { reason, .. }) =
                (waits, reach.no_new_process(rank), &error)
            {
                let error = JobError::WorkerLost {
                    rank,
                    reason: format!("{reason}; {why}"),
                };
                return self.fail(now, error, reach);
            }
            let registering = self
                .gate
                .waiting()
                .filter(|w| w.during == Waiting::Registration);
            if let Some(wait) = registering
                .filter(|_| self.recovery.restarts_all() && !self.gate.is_registered(rank))
            {
                let waited = now.saturating_duration_since(wait.since);
                self.await_new_process(rank, wait.timeout.saturating_sub(waited));
                return;
            }
        }
        let Some(action) = self.recovery.on_failure(error.clone()) else {
            tracing::debug!(%error, "a further report of a failure being recovered from");
            return;
        };
        match &action {
            Recover::Fail(error) => return self.fail(now, error.clone(), reach),
            Recover::RestartWorker(rank) => {
                let rank = *rank;
                if self.settings.local[rank] {
                    self.actions.push_back(Action::ReplaceWorker {
                        rank,
                        attempt: self.attempt(),
                        cause: error.clone(),
                    });
                    // The old worker's link is closed: whatever the rank says from now on
                    // is the replacement's, and a failure of it is a new one.
                    self.recovery.rejoined(rank);
                } else {
                    // A new process of the rank connects and registers. Until the old
                    // one's connection ended (its `Done`, or its loss — which may be this
                    // very failure: see `handle_message`), what the rank says is still
                    // the old one's.
                    self.awaiting[rank] = Awaiting::OldEnd;
                    self.dismiss(rank, &error, reach);
                    if let Some(wait) = self.gate.waiting() {
                        let left = wait
                            .timeout
                            .saturating_sub(now.saturating_duration_since(wait.since));
                        say_replacement_awaited(rank, left, wait.during);
                    }
                }
                self.gate.rejoin(rank);
            }
            Recover::LeaveOut(rank) => {
                let rank = *rank;
                if !self.settings.local[rank] {
                    self.dismiss(rank, &error, reach);
                }
                self.schedule.leave_out();
            }
            Recover::RestartAll(attempt) => {
                let attempt = *attempt;
                // Release the old attempt's ranks waiting in a sync call first, while their
                // links still reach them.
                self.release(now, &error, reach);
                self.gate.restart(now, attempt);
                self.sync.restart();
                self.groups.restart();
                // What the ranks said in the attempt before is its past.
                self.heard = Hearing::new(self.config.job.workers);
                self.last = None;
                self.actions.push_back(Action::ReplaceAll {
                    attempt,
                    cause: error.clone(),
                });
                // Workers reached through a transport — of other processes, or of this one
                // — are replaced by their own process when it hears this; the transport
                // welcomes later connections in the new attempt.
                self.actions.push_back(Action::Broadcast(ToWorker::Restart {
                    attempt,
                    cause: error.clone(),
                }));
                // A rank lost in another process comes back only as a new process, which a
                // launcher or a scheduler starts: said at once, and while registration
                // waits.
                if let Some(rank) = self.lost_elsewhere(&error) {
                    self.await_new_process(rank, self.config.timeout(Waiting::Registration));
                }
                // Every rank is back; the master starts over from its newest checkpoint.
                let c = &self.config;
                self.schedule = Schedule::new(c.job.iterations, c.job.workers, c.job.worker_halt);
                self.span = None;
                self.stage = Stage::Starting {
                    master_ready: false,
                    workers_ready: false,
                };
            }
        }
        tracing::warn!(cause = %error, ?action, "recovering from a worker's failure");
        let recovered = Recovered {
            cause: error,
            action: action.clone(),
        };
        self.event(|| JobEvent::Recovering(recovered.clone()));
        // The last ones only, as of iterations: a long job's report stays small.
        self.report.recovered += 1;
        let keep = self.config.job.report_iterations;
        if keep > 0 {
            if self.report.recoveries.len() >= keep {
                self.report.recoveries.remove(0);
            }
            self.report.recoveries.push(recovered);
        }
        match action {
            Recover::LeaveOut(rank) => {
                let output = self.gate.lose(now, rank);
                self.on_gate_checked(now, output, reach);
            }
            Recover::RestartAll(attempt) => match &mut self.master {
                MasterAt::Home => self.run_master(now, MasterWork::Restart(attempt)),
                MasterAt::Away { discard, .. } => *discard = true,
                MasterAt::Stuck => {}
            },
            _ => {}
        }
    }

    /// The rank `error` says was lost, if it runs in another process: only a new process
    /// of it, which a launcher or a scheduler starts, takes its place.
    fn lost_elsewhere(&self, error: &JobError) -> Option<Rank> {
        match error {
            JobError::WorkerLost { rank, .. } if self.settings.local.get(*rank) == Some(&false) => {
                Some(*rank)
            }
            _ => None,
        }
    }

    /// A gang restart's registration waits for a new process of `rank` (`left` of its
    /// timeout remains): said at once, and at WARN while it waits (`say_waiting`).
    fn await_new_process(&mut self, rank: Rank, left: Duration) {
        self.awaiting[rank] = Awaiting::Replacement;
        say_replacement_awaited(rank, left, Waiting::Registration);
    }

    /// Tells the failed worker of another process, still connected, that the job is over
    /// for it (with its own failure): the job goes on without it, and its process ends
    /// now rather than waiting to hear how the job ends.
    pub(super) fn dismiss(&mut self, rank: Rank, error: &JobError, reach: &dyn Reach) {
        // A lost or refused process has no connection: one of the rank now is a new one.
        let gone = matches!(
            error,
            JobError::WorkerLost { .. } | JobError::Mismatch { .. }
        );
        if !gone && reach.is_connected(rank) {
            let msg = ToWorker::Abort {
                attempt: self.attempt(),
                error: error.clone(),
            };
            self.send(rank, msg);
        }
    }

    /// Releases every rank waiting in a sync call or a collective, of every group, with
    /// the job's failure `error`.
    pub(super) fn release(&mut self, now: Instant, error: &JobError, reach: &dyn Reach) {
        let step = self.sync.abort(error);
        self.apply(now, step, reach);
        for (group, step) in self.groups.abort(error) {
            self.apply_among(now, group, step, reach);
        }
    }

    /// Rank `from`'s `calls` calls from `epoch` among `group` (`ranks`: its ranks, said
    /// with the rank's first call among it), each of `kind` with `message`, awaited or not:
    /// taken one by one, as each would be alone, until one fails. A word of no calls, of
    /// more than a worker says in one ([`MAX_CALLS`](crate::protocol::MAX_CALLS)), or of
    /// several that await the node's word, is not a worker's: it fails the job, naming the
    /// rank.
    pub(super) fn on_calls(
        &mut self,
        now: Instant,
        from: Rank,
        ((epoch, group, ranks), calls): ((Epoch, GroupId, &[Rank]), u32),
        (kind, mut message, awaits): (SyncKind, Vec<u8>, bool),
        reach: &dyn Reach,
    ) {
        let wrong = if calls == 0 || calls > crate::protocol::MAX_CALLS {
            Some(format!(
                "a word of {calls} calls, where a worker says 1 to {} in one",
                crate::protocol::MAX_CALLS
            ))
        } else if calls > 1 && awaits {
            // Only calls no rank awaits the node's word on go several in one
            // (`CallRun`): which of them would the word answer?
            Some(format!(
                "a word of {calls} calls that awaits the master's word, where only calls that do not await it go several in one"
            ))
        } else {
            None
        };
        if let Some(message) = wrong {
            let error = JobError::Decode {
                direction: format!("worker {from} → master"),
                type_name: "ToMaster::Sync".to_string(),
                peer: format!("rank {from}"),
                message,
            };
            self.fail(now, error, reach);
            return;
        }
        for i in 0..calls {
            let message = match i + 1 == calls {
                true => std::mem::take(&mut message),
                false => message.clone(),
            };
            let epoch = epoch.saturating_add(u64::from(i));
            let ranks = if i == 0 { ranks } else { &[] };
            let step = if group == GroupId::ALL {
                self.sync.on_call(now, from, epoch, kind, message, awaits)
            } else {
                let call = (epoch, group, ranks);
                self.groups.on_call(now, from, call, kind, message, awaits)
            };
            // After a failure every later call is answered with it: once is enough.
            let failed = step.failed.is_some() || step.replies.iter().any(|(_, _, r)| r.is_err());
            self.apply_among(now, group, step, reach);
            if failed {
                return;
            }
        }
    }

    /// Sends the answers of a sync step of the calls among every rank, and fails the job
    /// if the step says so.
    pub(super) fn apply(&mut self, now: Instant, step: SyncStep, reach: &dyn Reach) {
        self.apply_among(now, GroupId::ALL, step, reach);
    }

    /// Sends the answers of a sync step of the calls among `group`, and fails the job if
    /// the step says so.
    pub(super) fn apply_among(
        &mut self,
        now: Instant,
        group: GroupId,
        step: SyncStep,
        reach: &dyn Reach,
    ) {
        // A timeout names what was last heard from the ranks it waited on, in the error
        // every waiting rank gets as in the job's.
        let failed = step
            .failed
            .map(|e| (self.heard.name_sync(now, e.clone()), e));
        for (rank, epoch, result) in step.replies {
            let result = result.map_err(|e| match &failed {
                Some((named, plain)) if *plain == e => Box::new(named.clone()),
                _ => Box::new(e),
            });
            let msg = ToWorker::SyncReply {
                attempt: self.attempt(),
                epoch,
                group,
                result,
            };
            self.send(rank, msg);
        }
        if let Some((error, _)) = failed {
            self.on_gate(now, Some(GateOutput::Failed(JobError::Sync(error))), reach);
        }
    }
}

/// Says that the master waits for a new process of `rank`, lost in another process: only
/// a launcher or a scheduler starts one, and without one the wait ends only with its
/// timeout (`left` of it remains).
fn say_replacement_awaited(rank: Rank, left: Duration, during: Waiting) {
    tracing::warn!(
        rank,
        %during,
        "rank {rank} lost; waiting up to {left:.0?} for a new process of rank {rank}, which only a launcher or scheduler starts (as rank {rank} of this job, with a restart count above 0: SUPERSTEP_RESTART_COUNT=1, say); the job fails when the wait ends"
    );
}
