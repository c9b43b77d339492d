//! Runs a job's coordinator hooks, guarded: an `Err` or a panic becomes the job's
//! `JobError::Coordinator`, and a failed start or finish is followed by `on_error`.

use std::sync::{Arc, Mutex};

use super::pool::guarded;
use crate::coordinator::{Coordinator, Input, Shard, WorkerReport};
use crate::error::{Cause, Hook, JobError};

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
                "{} shards for {workers} workers: one per worker",
                shards.len()
            )
            .into(),
        )));
    }
    Ok(Some(shards))
}

/// The job's coordinator, once the master's process has it.
pub(crate) struct Coordination {
    coordinator: Box<dyn Coordinator>,
}

impl Coordination {
    pub(crate) fn new(coordinator: Box<dyn Coordinator>) -> Self {
        Coordination { coordinator }
    }

    /// `on_start`; when it fails, `on_error` with that failure, which is returned.
    pub(crate) fn start(&mut self) -> Result<(), JobError> {
        let c = &mut self.coordinator;
        guarded(|| c.on_start()).map_err(|cause| {
            let error = JobError::Coordinator {
                hook: Hook::OnStart,
                cause,
            };
            self.fail(&error);
            error
        })
    }

    /// `on_finish` with every worker's report; when it fails, `on_error` with that
    /// failure, which is returned.
    pub(crate) fn finish(&mut self, reports: &[WorkerReport]) -> Result<(), JobError> {
        let c = &mut self.coordinator;
        guarded(|| c.on_finish(reports)).map_err(|cause| {
            let error = JobError::Coordinator {
                hook: Hook::OnFinish,
                cause,
            };
            self.fail(&error);
            error
        })
    }

    /// `on_error`: the job failed with `error` (which stays its error; a failure here is
    /// logged).
    pub(crate) fn fail(&mut self, error: &JobError) {
        let c = &mut self.coordinator;
        if let Err(cause) = guarded(|| c.on_error(error)) {
            let failed = JobError::Coordinator {
                hook: Hook::OnError,
                cause,
            };
            tracing::error!(%failed, job_error = %error, "cleaning up after the job's failure failed");
        }
    }
}

/// The job's coordinator, shared by the node actor and the thread that called `run`: the
/// one that ends the job runs its `on_finish` or `on_error`, exactly once (the caller's
/// thread does when a failed job's end is held up by user code on the job's thread).
#[derive(Clone, Default)]
pub(crate) struct CoordinatorSlot(Arc<Mutex<Option<Coordination>>>);

impl CoordinatorSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Coordination>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds the coordinator from now on.
    pub(crate) fn put(&self, coordination: Coordination) {
        *self.lock() = Some(coordination);
    }

    /// Whether it holds a coordinator.
    pub(crate) fn is_set(&self) -> bool {
        self.lock().is_some()
    }

    /// `on_finish` with every worker's report (and `on_error` if it fails); nothing when
    /// there is no coordinator, or its hooks ran already.
    pub(crate) fn finish(&self, reports: &[WorkerReport]) -> Result<(), JobError> {
        // Taken out first: the hook runs without the lock held.
        let taken = self.lock().take();
        match taken {
            Some(mut c) => c.finish(reports),
            None => Ok(()),
        }
    }

    /// `on_error`, once.
    pub(crate) fn fail(&self, error: &JobError) {
        let taken = self.lock().take();
        if let Some(mut c) = taken {
            c.fail(error);
        }
    }
}
