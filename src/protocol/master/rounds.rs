//! The master's side of the node: start-up, each round from its broadcast to the master's
//! result of it, and the end of the job — completed or failed — down to its outcome.

use super::*;

impl<M, W> MasterNode<M, W> {
    pub(super) fn master_ready(&mut self, now: Instant, reach: &dyn Reach) {
        if let Stage::Starting { master_ready, .. } = &mut self.stage {
            *master_ready = true;
        }
        self.maybe_begin(now, reach);
    }

    pub(super) fn maybe_begin(&mut self, now: Instant, reach: &dyn Reach) {
        let Stage::Starting {
            master_ready: true,
            workers_ready,
        } = self.stage
        else {
            return;
        };
        if workers_ready && self.adopt_offer(now) {
            return;
        }
        // The checkpoint covers every iteration, or its iteration halted: the job is
        // complete, and ends now with its result — no worker need register (a master
        // started again after its job ended would wait for workers long gone). With a
        // coordinator it waits for them: their reports are what it commits.
        let iterations = self.config.job.iterations;
        let complete = self
            .resumed
            .is_some_and(|(r, halted)| r >= iterations || halted.is_some());
        let at_once = !self.settings.coordinated || workers_ready;
        match (self.resumed, self.last.clone()) {
            (Some((resumed, halted)), Some(last)) if complete && at_once => {
                tracing::info!(
                    iteration = resumed,
                    "the newest checkpoint is the job's last: the job ends with its result"
                );
                self.finish(now, resumed, halted, last, reach)
            }
            _ if !workers_ready => {}
            (Some((resumed, _)), _) => {
                // Each worker gets what it saved before the iteration it resumes with (a
                // checkpoint of another world size was refused, or its states dropped when
                // the job re-shards, as it was read: `runtime::resume`).
                let attempt = self.attempt();
                for (rank, save) in std::mem::take(&mut self.restore).into_iter().enumerate() {
                    if let Some(save) = save {
                        self.send(rank, ToWorker::Restore { attempt, save });
                    }
                }
                self.begin(now, resumed + 1, reach)
            }
            (None, _) => {
                let first = self.schedule.first();
                self.begin(now, first, reach)
            }
        }
    }

    /// Opens `iteration` and broadcasts it.
    pub(super) fn begin(&mut self, now: Instant, iteration: Iteration, reach: &dyn Reach) {
        self.iteration_started = now;
        self.begun = true;
        self.offers.clear();
        let attempt = self.attempt();
        // The last iteration's span is exited before this one is entered.
        self.span = None;
        let span =
            tracing::info_span!("iteration", job = %self.config.job.job_id, iteration, attempt);
        tracing::debug!(parent: &span, "iteration started");
        self.span = Some(HeldSpan::enter(span));
        self.event(|| JobEvent::IterationStarted { iteration });
        self.stage = Stage::Gathering(iteration);
        // Open before broadcasting, so no result can arrive before its round.
        self.sync.new_iteration(iteration);
        self.groups.new_iteration(iteration);
        let fold = self.config.fold_route(self.last_fold);
        self.route = fold;
        if !self.gate.open_folding(now, iteration, fold) {
            let error = JobError::Runtime {
                message: format!("iteration {iteration} opened while a wait was under way"),
            };
            return self.on_failure(now, error, reach);
        }
        // A preemption stops the job at a checkpoint: the workers save for this one.
        self.saving = self.config.workers_save(iteration)
            || (self.preempt.is_some() && self.config.checkpoint_every.is_some());
        self.actions.push_back(Action::Broadcast(ToWorker::Iterate {
            attempt: self.attempt(),
            iteration,
            last: self.last.clone(),
            fold,
            save: self.saving,
        }));
    }

    /// The round of `iteration` is in: the master computes it.
    pub(super) fn round_complete(
        &mut self,
        now: Instant,
        iteration: Iteration,
        gathered: Gathered<W>,
        reach: &dyn Reach,
    ) {
        if !matches!(self.stage, Stage::Gathering(i) if i == iteration) {
            // The job ends (or started over) meanwhile: nothing computes the round.
            return;
        }
        let span = self
            .span
            .as_ref()
            .map_or_else(tracing::Span::none, |held| held.span().clone());
        if let Some(measure) = self.measure_fold {
            self.last_fold = gathered.combined.as_ref().map(measure);
        }
        let votes = gathered.tally.halt_votes;
        if votes > 0 && !self.schedule.counts_votes() && !self.votes_ignored {
            self.votes_ignored = true;
            tracing::warn!(
                iteration,
                votes,
                "{votes} worker(s) voted to halt in iteration {iteration}, but the job was \
                 built without worker_halt(true): votes are ignored (this is said once)"
            );
        }
        let halted = match self.schedule.decide(iteration, false, &gathered.tally) {
            Next::Finish {
                halted: Some(HaltedBy::Workers),
                ..
            } => Some(HaltedBy::Workers),
            _ => None,
        };
        self.stage = Stage::Computing(iteration);
        // A preemption takes the first checkpoint it can: one whose workers saved.
        let save = if self.preempt.is_some() && self.saving {
            Save::Yes
        } else {
            self.config.checkpoint(iteration, halted)
        };
        // Copies of a checkpoint the job goes on after (not of its last iteration: the
        // workers stop with it), where some rank keeps them.
        let replicate = save == Save::Yes
            && iteration < self.config.job.iterations
            && halted.is_none()
            && self.preempt.is_none()
            && !self.replica_holders(reach).is_empty();
        self.run_master(
            now,
            MasterWork::Iterate(MasterRound {
                iteration,
                gathered,
                span,
                halted,
                save,
                replicate,
                ends: self.preempt.is_some(),
                timeout: self.config.job.iteration_timeout,
            }),
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn iterated(
        &mut self,
        now: Instant,
        iteration: Iteration,
        tally: Tally,
        left_out: Vec<Rank>,
        (master_elapsed, result, halt, checkpointed): (Duration, Arc<M>, bool, bool),
        reach: &dyn Reach,
    ) {
        if !left_out.is_empty() {
            tracing::warn!(
                iteration,
                ?left_out,
                "the iteration went on without its stragglers (min-workers ratio)"
            );
        }
        let report = IterationReport {
            iteration,
            elapsed: now.saturating_duration_since(self.iteration_started),
            master_elapsed,
            slowest: tally.slowest,
            results_held: tally.results_held,
            left_out,
            aggregation: self.route,
            messages: tally.mail,
        };
        if let Some(held) = self.span.take() {
            tracing::debug!(parent: held.span(), elapsed = ?report.elapsed, "iteration completed");
        }
        self.progress
            .completed(now, self.config.job.progress_interval, &report);
        self.event(|| JobEvent::IterationCompleted(report.clone()));
        self.report.totals.add(&report);
        let keep = self.config.job.report_iterations;
        if keep > 0 {
            if self.recent.len() >= keep {
                self.recent.pop_front();
            }
            self.recent.push_back(report);
        }
        // The result it replaces may be the last reference to it: its `Drop` is the
        // master's code, and must not unwind into the node's driver.
        let previous = self.last.replace(Arc::clone(&result));
        if let Err(cause) = crate::error::drop_guarded(previous) {
            let phase = Phase::Drop;
            return self.fail(
                now,
                JobError::Master {
                    iteration,
                    phase,
                    cause,
                },
                reach,
            );
        }
        match self.schedule.decide(iteration, halt, &tally) {
            // A preemption stops at the first checkpoint taken (at once without a store).
            Next::Iterate(_)
                if self.preempt.is_some()
                    && (checkpointed || self.config.checkpoint_every.is_none()) =>
            {
                self.stop_preempted(now, iteration, reach)
            }
            Next::Iterate(next) => self.begin(now, next, reach),
            Next::Finish { iterations, halted } => {
                self.finish(now, iterations, halted, result, reach)
            }
        }
    }

    /// The job completed after `iterations`: every worker is told, and their `Done`
    /// awaited.
    pub(super) fn finish(
        &mut self,
        now: Instant,
        iterations: Iteration,
        halted: Option<HaltedBy>,
        last: Arc<M>,
        reach: &dyn Reach,
    ) {
        // What the workers get, made first: where it fails, the job fails as it runs.
        let theirs = match &self.for_workers {
            Some(make) => match make(&last) {
                Ok(theirs) => Arc::new(theirs),
                Err(cause) => {
                    let (iteration, phase) = (iterations, Phase::Compute);
                    let error = JobError::Master {
                        iteration,
                        phase,
                        cause,
                    };
                    return self.fail(now, error, reach);
                }
            },
            None => Arc::clone(&last),
        };
        self.report.halted_by = halted;
        if let Some(by) = halted {
            tracing::info!(iteration = iterations, ?by, "job halted");
            self.event(|| JobEvent::Halted {
                iteration: iterations,
                by,
            });
        }
        self.stage = Stage::Ending {
            ending: OwnedEnding::Completed {
                iterations,
                halted: halted.is_some(),
                last: Arc::clone(&last),
            },
            drained: false,
        };
        self.forget_awaited(now, reach);
        self.actions.push_back(Action::Broadcast(ToWorker::Finish {
            attempt: self.attempt(),
            iterations,
            halted: halted.is_some(),
            last: theirs,
        }));
        let output = self.gate.drain(now);
        self.on_gate(now, output, reach);
        self.forget_unconnected(now, reach);
    }

    /// The last iteration the job completed (the checkpoint's it resumed from before
    /// its first).
    pub(super) fn completed(&self) -> Iteration {
        let resumed = self.resumed.map_or(0, |(i, _)| i);
        match self.stage {
            Stage::Gathering(i) | Stage::Computing(i) => i.saturating_sub(1).max(resumed),
            _ => resumed,
        }
    }

    /// The job stops for the preemption asked for, after `iteration`: it ends as a failure
    /// does, with [`JobError::Preempted`] naming its newest checkpoint and who asked.
    pub(super) fn stop_preempted(&mut self, now: Instant, iteration: Iteration, reach: &dyn Reach) {
        let by = self
            .preempt
            .as_ref()
            .map(|p| p.by.clone())
            .unwrap_or_default();
        let checkpoint = self
            .report
            .checkpoints
            .last()
            .copied()
            .or(self.resumed.map(|(i, _)| i));
        let error = JobError::Preempted {
            iteration,
            checkpoint,
            by,
        };
        self.fail(now, error, reach);
    }

    /// Fails the job: the first failure is kept and sent to every worker at once; later
    /// ones are logged. A failure while a completed job shuts down fails it.
    pub(super) fn fail(&mut self, now: Instant, error: JobError, reach: &dyn Reach) {
        let error = self.heard.name(now, error);
        match &mut self.stage {
            Stage::Ending {
                ending: ending @ OwnedEnding::Completed { .. },
                ..
            }
            | Stage::Stopping(ending @ OwnedEnding::Completed { .. }) => {
                // Every worker is stopping already; the job fails in its shutdown.
                tracing::error!(%error, "job failed during shutdown");
                *ending = OwnedEnding::Failed(error.clone());
                self.event(|| JobEvent::Failed { error });
            }
            Stage::Ending { .. } | Stage::Stopping(_) | Stage::Committing(_) | Stage::Done => {
                tracing::debug!(%error, "a further failure after the job failed");
            }
            Stage::Starting { .. } | Stage::Gathering(_) | Stage::Computing(_) => {
                if error.is_preempted() {
                    tracing::warn!(%error, "job stopped");
                } else {
                    tracing::error!(%error, "job failed");
                }
                self.span = None;
                self.event(|| JobEvent::Failed {
                    error: error.clone(),
                });
                self.stage = Stage::Ending {
                    ending: OwnedEnding::Failed(error.clone()),
                    drained: false,
                };
                self.forget_awaited(now, reach);
                self.actions.push_back(Action::EndJob(error.clone()));
                // Release every rank waiting in a sync call at once, with the job's failure.
                self.release(now, &error, reach);
                self.actions.push_back(Action::Broadcast(ToWorker::Abort {
                    attempt: self.attempt(),
                    error,
                }));
                // A failed job waits only its grace for workers still running user code,
                // and for the master's own code away on the pool (its deadline comes
                // sooner: past it, its `post_application` is skipped).
                let grace = self.config.failure_grace();
                if let MasterAt::Away {
                    deadline: Some((at, ..)),
                    ..
                } = &mut self.master
                {
                    *at = (*at).min(now + grace);
                }
                let output = self.gate.drain_within(now, grace);
                self.on_gate(now, output, reach);
                self.forget_unconnected(now, reach);
            }
        }
    }

    /// Every worker is done: the master's `post_application` runs once its code is home
    /// (or is skipped when that code is stuck).
    pub(super) fn maybe_stop(&mut self, now: Instant) {
        let drained = matches!(self.stage, Stage::Ending { drained: true, .. });
        if !drained || matches!(self.master, MasterAt::Away { .. }) {
            return;
        }
        let Stage::Ending { ending, .. } = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        self.stage = Stage::Stopping(ending.clone());
        if let MasterAt::Stuck = self.master {
            tracing::warn!("the master's code is still running; its post_application is skipped");
            self.complete(now);
        } else {
            self.run_master(now, MasterWork::Stop(ending));
        }
    }

    /// Every worker stopped by now (or the shutdown timeout passed): the coordinator
    /// commits only what every worker completed, and cleans up after anything else.
    pub(super) fn complete(&mut self, now: Instant) {
        let Stage::Stopping(ending) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        self.report.attempt = self.attempt();
        if !self.settings.coordinated {
            return self.finalize(now, ending);
        }
        let workers = self.config.job.workers;
        match ending {
            OwnedEnding::Completed { .. } if self.report.workers.len() < workers => {
                let reported: Vec<Rank> = self.report.workers.iter().map(|w| w.rank).collect();
                let error = JobError::Coordinator {
                    hook: Hook::OnFinish,
                    cause: Cause::from_error(
                        format!(
                            "not run: only worker(s) {reported:?} of {workers} completed, so nothing is committed"
                        )
                        .into(),
                    ),
                };
                self.actions.push_back(Action::CleanUp(error.clone()));
                self.finalize(now, OwnedEnding::Failed(error));
            }
            completed @ OwnedEnding::Completed { iterations, .. } => {
                self.stage = Stage::Committing(completed);
                self.actions.push_back(Action::Commit {
                    iteration: iterations,
                    reports: self.report.workers.clone(),
                });
            }
            OwnedEnding::Failed(error) => {
                self.actions.push_back(Action::CleanUp(error.clone()));
                self.finalize(now, OwnedEnding::Failed(error));
            }
        }
    }

    /// The job's outcome.
    pub(super) fn finalize(&mut self, now: Instant, ending: OwnedEnding<M>) {
        self.stage = Stage::Done;
        self.report.elapsed = now.saturating_duration_since(self.started);
        let outcome = match ending {
            OwnedEnding::Completed {
                iterations,
                halted,
                last,
            } => {
                let elapsed = self.report.elapsed;
                tracing::info!(iterations, halted, ?elapsed, "job completed");
                self.event(|| JobEvent::Completed {
                    iterations,
                    halted,
                    elapsed,
                });
                Ok(JobOutcome {
                    result: last,
                    iterations,
                    halted,
                    report: JobReport {
                        iterations: self.recent.drain(..).collect(),
                        ..std::mem::take(&mut self.report)
                    },
                })
            }
            OwnedEnding::Failed(error) => Err(error),
        };
        self.actions.push_back(Action::Finished(Box::new(outcome)));
    }
}
