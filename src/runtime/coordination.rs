//! The job's coordinator: its hooks run guarded (an `Err` or a panic becomes the job's
//! `JobError::Coordinator`, and a failed start, worker report or finish is followed by
//! `on_error`), in the coordinator's own actor, on a thread of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Addr, Arbiter, Context, Handler, Message};

use super::pool::guarded;
use super::SharedStore;
use crate::coordinator::{Coordinator, Input, JobInfo, Lifecycle, Shard, WorkerReport};
use crate::error::{Cause, Hook, JobError};
use crate::ids::{Attempt, Iteration};

/// Each worker's shard: the coordinator's, if it shards, else the input's own split; `None`
/// when the job has no input.
pub(crate) fn shards(
    coordinator: Option<&mut Box<dyn Coordinator>>,
    input: Option<&Input>,
    workers: usize,
) -> Result<Option<Vec<Shard>>, JobError> {
    let Some(input) = input else {
        return Ok(None);
    };
    let failed = |cause: Cause| JobError::Coordinator {
        hook: Hook::PrepareShards,
        cause,
    };
    let prepared = match coordinator {
        Some(c) => guarded(|| c.prepare_shards(input, workers)).map_err(failed)?,
        None => None,
    };
    let shards = match prepared {
        Some(shards) => shards,
        None => input.split(workers).map_err(|e| {
            failed(Cause::from_error(
                format!("cannot split {input:?}: {e}").into(),
            ))
        })?,
    };
    if shards.len() != workers {
        return Err(failed(Cause::from_error(
            format!(
                "{} for {}: one per worker",
                crate::error::counted(shards.len(), "shard"),
                crate::error::counted(workers, "worker")
            )
            .into(),
        )));
    }
    Ok(Some(shards))
}

/// The job's coordinator, once the master's process has it, with the job's context: what
/// each lifecycle message does, whoever drives it (the coordinator's actor, or the
/// simulator).
pub(crate) struct Coordination {
    coordinator: Box<dyn Coordinator>,
    job: JobInfo,
    /// The first `on_worker_done` that failed: the job fails with it at its end.
    failed: Option<JobError>,
    /// `on_finish` or `on_error` ran: nothing runs after them.
    ended: bool,
    /// Where the job's commit is recorded: its checkpoint store, if it keeps one.
    record: Option<SharedStore>,
}

impl Coordination {
    pub(crate) fn new(coordinator: Box<dyn Coordinator>, job: JobInfo) -> Self {
        Coordination {
            coordinator,
            job,
            failed: None,
            ended: false,
            record: None,
        }
    }

    /// Records the job's commit in `store` (its checkpoint store) once `on_finish`
    /// returned: a master started again then ends at once, running no hook again.
    pub(crate) fn recording(mut self, store: Option<SharedStore>) -> Self {
        self.record = store;
        self
    }

    /// The coordinator's `handle` of `event` in `attempt` (the newest known when `None`),
    /// guarded: a failure names `hook`.
    fn deliver(
        &mut self,
        attempt: Option<Attempt>,
        hook: Hook,
        event: Lifecycle<'_>,
    ) -> Result<(), JobError> {
        if let Some(attempt) = attempt {
            self.job.attempt = attempt;
        }
        let (c, job) = (&mut self.coordinator, &self.job);
        guarded(|| c.handle(job, event)).map_err(|cause| JobError::Coordinator { hook, cause })
    }

    /// `on_start`; when it fails, `on_error` with that failure, which is returned.
    pub(crate) fn start(&mut self) -> Result<(), JobError> {
        self.deliver(None, Hook::OnStart, Lifecycle::Started)
            .inspect_err(|error| self.fail(None, error))
    }

    /// `on_worker_done` with one worker's report, as it stops. A failure is kept: the job
    /// fails with it at its end.
    pub(crate) fn worker_done(&mut self, attempt: Attempt, report: &WorkerReport) {
        if self.ended || self.failed.is_some() {
            return;
        }
        if let Err(error) = self.deliver(
            Some(attempt),
            Hook::OnWorkerDone,
            Lifecycle::WorkerDone(report),
        ) {
            tracing::error!(rank = report.rank, %error, "the coordinator failed a worker's report: the job fails at its end");
            self.failed = Some(error);
        }
    }

    /// `on_finish` with every worker's report, the job having ended after `iteration`;
    /// when it fails (or a worker's report failed before), `on_error` with that failure,
    /// which is returned. When it returns, the commit is recorded with the checkpoint of
    /// `iteration`. Nothing when the job's end ran already.
    pub(crate) fn finish(
        &mut self,
        attempt: Attempt,
        iteration: Iteration,
        reports: &[WorkerReport],
    ) -> Result<(), JobError> {
        if self.ended {
            return Ok(());
        }
        let finished = match self.failed.take() {
            Some(error) => Err(error),
            None => self.deliver(Some(attempt), Hook::OnFinish, Lifecycle::Finished(reports)),
        };
        self.ended = true;
        match finished {
            Ok(()) => {
                if let Some(store) = &self.record {
                    store.record_commit(&self.job.job_id, iteration);
                }
                Ok(())
            }
            Err(error) => {
                self.clean_up(&error);
                Err(error)
            }
        }
    }

    /// `on_error`: the job failed with `error` (which stays its error; a failure here is
    /// logged). Once; nothing after `on_finish`.
    pub(crate) fn fail(&mut self, attempt: Option<Attempt>, error: &JobError) {
        if self.ended {
            return;
        }
        if let Some(attempt) = attempt {
            self.job.attempt = attempt;
        }
        self.ended = true;
        self.clean_up(error);
    }

    fn clean_up(&mut self, error: &JobError) {
        if let Err(failed) = self.deliver(None, Hook::OnError, Lifecycle::Failed(error)) {
            tracing::error!(%failed, job_error = %error, "cleaning up after the job's failure failed");
        }
    }
}

/// The coordinator's actor: it receives the job's lifecycle messages, in order, and runs
/// each hook on its own thread, so a hook's I/O never holds up the job's coordination.
struct CoordinatorActor(Coordination);

impl Actor for CoordinatorActor {
    type Context = Context<Self>;
}

/// Before any worker starts: `on_start`.
struct Start;

impl Message for Start {
    type Result = Result<(), JobError>;
}

impl Handler<Start> for CoordinatorActor {
    type Result = Result<(), JobError>;
    fn handle(&mut self, _: Start, _: &mut Context<Self>) -> Self::Result {
        self.0.start()
    }
}

/// One worker stopped: `on_worker_done`.
struct WorkerDone(Attempt, WorkerReport);

impl Message for WorkerDone {
    type Result = ();
}

impl Handler<WorkerDone> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, WorkerDone(attempt, report): WorkerDone, _: &mut Context<Self>) {
        self.0.worker_done(attempt, &report);
    }
}

/// Every worker succeeded, the job having ended after an iteration: `on_finish`.
struct Finish(Attempt, Iteration, Vec<WorkerReport>);

impl Message for Finish {
    type Result = Result<(), JobError>;
}

impl Handler<Finish> for CoordinatorActor {
    type Result = Result<(), JobError>;
    fn handle(
        &mut self,
        Finish(attempt, iteration, reports): Finish,
        _: &mut Context<Self>,
    ) -> Self::Result {
        self.0.finish(attempt, iteration, &reports)
    }
}

/// The job failed: `on_error`; then a word to whoever waits outside the job's system.
struct Fail(
    Option<Attempt>,
    JobError,
    Option<std::sync::mpsc::Sender<()>>,
);

impl Message for Fail {
    type Result = ();
}

impl Handler<Fail> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, Fail(attempt, error, ran): Fail, _: &mut Context<Self>) {
        self.0.fail(attempt, &error);
        if let Some(ran) = ran {
            let _ = ran.send(());
        }
    }
}

/// The job's coordinator actor, shared by the node actor and the thread that called `run`:
/// the first of them to end the job has the coordinator run `on_finish` or `on_error`,
/// exactly once (the caller's thread does when a failed job's end is held up by user code
/// on the job's thread).
#[derive(Clone, Default)]
pub(crate) struct CoordinatorSlot(Arc<Mutex<Option<Running>>>);

/// The coordinator's actor, and the thread it runs on.
type Running = (Addr<CoordinatorActor>, Arbiter);

/// What went wrong reaching the coordinator's actor: it is gone (a bug, or the job ended).
fn unreachable(error: actix::MailboxError) -> JobError {
    JobError::Runtime {
        message: format!("the job's coordinator could not be reached: {error}"),
    }
}

impl CoordinatorSlot {
    fn addr(&self) -> Option<Addr<CoordinatorActor>> {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().map(|(addr, _)| addr.clone())
    }

    /// Starts the coordinator's actor on a thread of its own, and runs its `on_start`
    /// there (and `on_error` when that fails). Called inside the job's system.
    pub(crate) async fn start(&self, coordination: Coordination) -> Result<(), JobError> {
        let arbiter = Arbiter::new();
        // It logs where the job's thread does.
        let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
        arbiter.spawn_fn(move || crate::log::adopt(&dispatch));
        let addr = CoordinatorActor::start_in_arbiter(&arbiter.handle(), move |_| {
            CoordinatorActor(coordination)
        });
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((addr.clone(), arbiter));
        addr.send(Start).await.map_err(unreachable)?
    }

    /// Whether it holds a coordinator.
    pub(crate) fn is_set(&self) -> bool {
        self.addr().is_some()
    }

    /// Gives the coordinator one worker's report, as that worker stops.
    pub(crate) fn worker_done(&self, attempt: Attempt, report: WorkerReport) {
        if let Some(addr) = self.addr() {
            addr.do_send(WorkerDone(attempt, report));
        }
    }

    /// `on_finish` with every worker's report (and `on_error` if it fails), after every
    /// report before them, the job having ended after `iteration`; `Ok` when there is no
    /// coordinator, or its end ran already.
    pub(crate) async fn finish(
        &self,
        attempt: Attempt,
        iteration: Iteration,
        reports: Vec<WorkerReport>,
    ) -> Result<(), JobError> {
        match self.addr() {
            Some(addr) => addr
                .send(Finish(attempt, iteration, reports))
                .await
                .map_err(unreachable)?,
            None => Ok(()),
        }
    }

    /// `on_error`, once; returns when it ran.
    pub(crate) async fn fail(&self, attempt: Option<Attempt>, error: JobError) {
        if let Some(addr) = self.addr() {
            if let Err(e) = addr.send(Fail(attempt, error, None)).await {
                tracing::error!(error = %e, "the job's coordinator could not be reached to clean up");
            }
        }
    }

    /// `on_error`, once, from a thread outside the job's system (the caller's, giving up
    /// on a job whose thread is held by user code); waits at most `wait` for it to run.
    pub(crate) fn fail_from_outside(&self, error: &JobError, wait: Duration) {
        let Some(addr) = self.addr() else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel();
        addr.do_send(Fail(None, error.clone(), Some(tx)));
        match rx.recv_timeout(wait) {
            Ok(()) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => tracing::error!(
                ?wait,
                "the coordinator's on_error did not return in time; it is left to run"
            ),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                tracing::error!("the job's coordinator is gone: its on_error could not run")
            }
        }
    }

    /// Stops the coordinator's actor and waits for its thread to end: the job is over.
    pub(crate) fn close(&self) {
        let taken = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((addr, arbiter)) = taken {
            drop(addr);
            arbiter.stop();
            let _ = arbiter.join();
        }
    }
}
