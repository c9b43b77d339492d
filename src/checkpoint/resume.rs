//! Whether a job may resume from a checkpoint, and what it resumes with: another job's is
//! refused, and one of other parameters; one of another shape unless the job re-shards
//! (and then only one that holds no worker's state); one that is committed and covers the
//! job ends it at once with its result. The same rules for the newest checkpoint of the
//! job's store and for a worker's copy offered to a master started again.

use std::sync::Arc;

use super::{Checkpoint, CheckpointStore, JobShape};
use crate::compute::MasterContext;
use crate::error::{ErrorSource, JobError};
use crate::ids::{Attempt, Iteration};
use crate::payload::Payload;
use crate::protocol::JobConfig;
use crate::protocol::{HaltedBy, ResumedFrom, WorkerSave};

/// What a job resumes from: the newest usable checkpoint, decoded.
pub(crate) struct Resume<M> {
    pub(crate) iteration: Iteration,
    /// The attempt that wrote the checkpoint.
    pub(crate) attempt: Attempt,
    pub(crate) last: Arc<M>,
    pub(crate) state: Vec<u8>,
    /// Whether the checkpoint's iteration halted the job.
    pub(crate) halted: Option<HaltedBy>,
    /// What each worker saved, by rank.
    pub(crate) workers: Vec<Option<WorkerSave>>,
    /// Whether the job finished and committed with this checkpoint: it covers the job's
    /// iterations (or halted it) and its commit was recorded. The job then ends at once
    /// with its result, and its coordinator does not run again.
    pub(crate) committed_end: bool,
    /// What the job's report says of it.
    pub(crate) point: ResumedFrom,
}

/// What a checkpoint gives the master's code beyond its context: the master computable's
/// state, whether the checkpoint's iteration halted, and what each worker saved.
pub(crate) struct Restored {
    pub(crate) state: Vec<u8>,
    pub(crate) halted: Option<HaltedBy>,
    pub(crate) workers: Vec<Option<Arc<WorkerSave>>>,
    pub(crate) point: ResumedFrom,
}

impl<M> Resume<M> {
    /// Puts the checkpoint's iteration and master result into `ctx`; returns the rest.
    pub(crate) fn into_context<W>(self, ctx: &mut MasterContext<M, W>) -> Restored {
        ctx.iteration = self.iteration;
        ctx.last = Some(self.last);
        Restored {
            state: self.state,
            halted: self.halted,
            workers: self.workers.into_iter().map(|w| w.map(Arc::new)).collect(),
            point: self.point,
        }
    }
}

/// What a checkpoint must agree with for a job to resume from it: the job's id and
/// shape, and whether the job may resume at another shape (re-sharding its input).
#[derive(Debug, Clone)]
pub(crate) struct Resuming {
    pub(crate) job_id: Arc<str>,
    pub(crate) shape: JobShape,
    pub(crate) reshard: bool,
    /// The job's iteration count: a committed checkpoint that covers it ends the job.
    pub(crate) iterations: Iteration,
}

impl Resuming {
    /// The rules of a job of `config` whose shape is `shape`.
    pub(crate) fn new(config: &JobConfig, shape: JobShape) -> Self {
        Resuming {
            job_id: Arc::from(config.job_id.as_str()),
            shape,
            reshard: config.reshard_on_resume,
            iterations: config.iterations,
        }
    }

    /// Refuses a checkpoint of another shape than this job's, naming both — unless the
    /// job re-shards and the checkpoint holds no worker's state: then returns `true`, and
    /// each worker starts from its `init` on its new shard.
    fn check(&self, c: &Checkpoint, what: &str) -> Result<bool, JobError> {
        let (iteration, here) = (c.iteration, &self.shape);
        // A checkpoint from before checkpoints recorded their shape knows its world size
        // from the states it holds, if any.
        let (workers, input) = match &c.shape {
            Some(shape) => (Some(shape.workers), Some(shape.input.as_str())),
            None => ((!c.workers.is_empty()).then_some(c.workers.len()), None),
        };
        let mut differs = Vec::new();
        if let Some(workers) = workers.filter(|w| *w != here.workers) {
            differs.push(format!(
                "it was written by {}, this job has {}",
                crate::error::counted(workers, "worker"),
                here.workers
            ));
        }
        if let Some(input) = input.filter(|i| *i != here.input) {
            differs.push(format!(
                "its input was {input}, this job's is {}",
                here.input
            ));
        }
        if differs.is_empty() {
            return Ok(false);
        }
        let differs = differs.join("; ");
        let holds_states = c.workers.iter().flatten().any(|save| !save.is_empty());
        let message = if !self.reshard {
            format!(
                "{what} (iteration {iteration}) is of another shape: {differs}. Resume it with the job's old shape, set `reshard_on_resume` to go on re-sharded (each worker starting from its `init` on its new shard), or start afresh with a checkpoint store of its own (another directory or URL)"
            )
        } else if holds_states {
            format!(
                "{what} (iteration {iteration}) is of another shape ({differs}) and holds its workers' states, which belong to the old shards and cannot be re-sharded: resume it with the job's old shape, or start afresh with a checkpoint store of its own (another directory or URL)"
            )
        } else {
            tracing::warn!(
                job = %self.job_id,
                iteration,
                "resuming from a checkpoint of another shape ({differs}): re-sharded, each worker starts from its init on its new shard"
            );
            return Ok(true);
        };
        Err(JobError::checkpoint(message, None))
    }
}

/// Reads the newest usable checkpoint of the job, if any, refusing one of another job or
/// (unless the job re-shards) of another shape.
pub(crate) fn resume<M: Payload>(
    store: &mut dyn CheckpointStore,
    resuming: &Resuming,
) -> Result<Option<Resume<M>>, JobError> {
    let Some(loaded) = store
        .latest()
        .map_err(|e| JobError::checkpoint(e.to_string(), Some(ErrorSource::new(e))))?
    else {
        return Ok(None);
    };
    let what = format!("the newest checkpoint in {}", store.location());
    resume_from(loaded.checkpoint, &what, resuming).map(Some)
}

/// How a checkpoint fits the job that would resume from it ([`fit`]).
pub(crate) struct Fit {
    /// It is committed and covers the job: the job ends at once with its result.
    pub(crate) committed_end: bool,
    /// The job re-shards: nothing of the old shards is given back.
    pub(crate) resharded: bool,
}

/// Whether the job may resume from `c` (`what` names it in errors: the newest checkpoint
/// of its store, or a worker's copy): another job's is refused, and (unless the job
/// re-shards) one of another shape. It reads nothing, so it may be asked before `c` is
/// kept anywhere.
pub(crate) fn fit(c: &Checkpoint, what: &str, resuming: &Resuming) -> Result<Fit, JobError> {
    let job_id = &*resuming.job_id;
    if c.job_id != job_id {
        return Err(JobError::checkpoint(
            format!(
                "{what} (iteration {}) belongs to job {:?}, not to this job {job_id:?}: give this job a checkpoint store of its own (another directory or URL), or run it as {:?} to resume it",
                c.iteration, c.job_id, c.job_id
            ),
            None,
        ));
    }
    // Another job's parameters make another job, finished or not, whatever its shape.
    let theirs = c.shape.as_ref().and_then(|s| s.params.as_ref());
    if let (Some(theirs), Some(ours)) = (theirs, resuming.shape.params.as_ref()) {
        if let Some((field, there, here)) = theirs.first_difference(ours) {
            return Err(JobError::checkpoint(
                format!(
                    "{what} (iteration {}) was written by this job with other parameters: `{field}` is {there} there and {here} in this job. Run it with the checkpoint's parameters to resume it, or give it a checkpoint store of its own (another directory or URL) to run afresh",
                    c.iteration
                ),
                None,
            ));
        }
    }
    // A job that finished and committed ends with its result whatever its input is now
    // (its commit may have moved it): only a checkpoint it goes on from must fit its shape.
    let committed_end = c.committed && (c.iteration >= resuming.iterations || c.halted.is_some());
    let resharded = !committed_end && resuming.check(c, what)?;
    Ok(Fit {
        committed_end,
        resharded,
    })
}

/// What the job resumes with from `c`, if it [`fit`]s.
pub(crate) fn resume_from<M: Payload>(
    mut c: Checkpoint,
    what: &str,
    resuming: &Resuming,
) -> Result<Resume<M>, JobError> {
    let Fit {
        committed_end,
        resharded,
    } = fit(&c, what, resuming)?;
    if resharded {
        // Re-sharded (none holds a state): nothing of the old shards is given back.
        c.workers.clear();
    }
    let last: M = crate::codec::from_slice(&c.master_result).map_err(|e| {
        let message = format!(
            "the master result of the checkpoint of iteration {} cannot be decoded as this job's: {e}",
            c.iteration
        );
        JobError::checkpoint(message, Some(ErrorSource::new(e)))
    })?;
    let finished = c.halted.is_some() || c.iteration >= resuming.iterations;
    if finished {
        tracing::info!(
            job = &*resuming.job_id,
            iteration = c.iteration,
            "the job finished at iteration {} ({what}); returning its result",
            c.iteration
        );
    } else {
        tracing::info!(
            job = &*resuming.job_id,
            iteration = c.iteration,
            "resuming from {what}, of iteration {}: the job goes on with iteration {}",
            c.iteration,
            c.iteration + 1
        );
    }
    let point = ResumedFrom {
        iteration: c.iteration,
        source: what.to_string(),
        finished,
    };
    Ok(Resume {
        iteration: c.iteration,
        attempt: c.attempt,
        last: Arc::new(last),
        state: c.master_state,
        halted: c.halted,
        workers: c.workers,
        committed_end,
        point,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::JobParams;

    /// The rules of job `job` of 2 workers over no input, running 10 iterations.
    fn resuming(reshard: bool) -> Resuming {
        let config = JobConfig {
            job_id: "job".into(),
            workers: 2,
            iterations: 10,
            reshard_on_resume: reshard,
            ..JobConfig::default()
        };
        Resuming::new(&config, JobShape::new(2, None))
    }

    /// A checkpoint of job `job` at `iteration` by `workers` workers, whose master result
    /// is `iteration` as a `u64`.
    fn written(iteration: Iteration, workers: usize) -> Checkpoint {
        Checkpoint {
            job_id: "job".into(),
            iteration,
            attempt: 1,
            master_result: crate::codec::to_vec(&iteration).unwrap(),
            master_state: b"state".to_vec(),
            halted: None,
            workers: vec![None; workers],
            shape: Some(JobShape::new(workers, None)),
            committed: false,
        }
    }

    fn saved() -> Option<WorkerSave> {
        Some(WorkerSave {
            state: vec![1],
            messages: Vec::new(),
        })
    }

    #[test]
    fn a_checkpoint_of_this_job_resumes_after_its_iteration() {
        let mut c = written(4, 2);
        c.workers = vec![saved(), None];
        let r = resume_from::<u64>(c, "the newest checkpoint in /ckpt", &resuming(false)).unwrap();
        assert_eq!((r.iteration, r.attempt, *r.last), (4, 1, 4));
        assert_eq!(
            r.workers,
            vec![saved(), None],
            "each worker's own state back"
        );
        assert!(!r.committed_end && !r.point.finished);
        assert_eq!(r.point.source, "the newest checkpoint in /ckpt");
    }

    #[test]
    fn another_jobs_checkpoint_is_refused_naming_both() {
        let mut c = written(4, 2);
        c.job_id = "other".into();
        let err = fit(&c, "the copy offered by worker 1", &resuming(false))
            .err()
            .unwrap();
        let text = err.to_string();
        assert!(
            text.contains("the copy offered by worker 1 (iteration 4)"),
            "{text}"
        );
        assert!(
            text.contains("\"other\"") && text.contains("\"job\""),
            "{text}"
        );
    }

    #[test]
    fn other_parameters_make_another_job_even_finished() {
        let mut c = written(10, 2);
        c.committed = true;
        let theirs = JobParams::of(&serde_json::json!({"rate": 0.5})).unwrap();
        c.shape = Some(JobShape::new(2, None).with_params(theirs));
        let err = fit(&c, "it", &resuming(false)).err().unwrap();
        assert!(err.to_string().contains("`rate`"), "{err}");
    }

    #[test]
    fn another_shape_is_refused_unless_the_job_reshards_and_no_worker_state_is_held() {
        let c = written(4, 3);
        let err = fit(&c, "it", &resuming(false)).err().unwrap();
        assert!(
            err.to_string()
                .contains("written by 3 workers, this job has 2"),
            "{err}"
        );
        assert!(err.to_string().contains("reshard_on_resume"), "{err}");
        // Re-sharded: nothing of the old shards is given back.
        let r = resume_from::<u64>(c.clone(), "it", &resuming(true)).unwrap();
        assert!(r.workers.is_empty());
        // Workers' states belong to the old shards: never re-sharded.
        let mut holding = c;
        holding.workers[0] = saved();
        let err = fit(&holding, "it", &resuming(true)).err().unwrap();
        assert!(
            err.to_string().contains("holds its workers' states"),
            "{err}"
        );
    }

    #[test]
    fn a_committed_checkpoint_that_covers_the_job_ends_it_whatever_its_shape() {
        let mut c = written(10, 5);
        c.committed = true;
        let fits = fit(&c, "it", &resuming(false)).unwrap();
        assert!(fits.committed_end && !fits.resharded);
        // Not committed: a job that goes on from it must fit.
        c.committed = false;
        c.iteration = 6;
        assert!(fit(&c, "it", &resuming(false)).is_err());
    }

    #[test]
    fn a_master_result_of_another_type_is_an_error_naming_the_iteration() {
        let mut c = written(4, 2);
        c.master_result = crate::codec::to_vec(&"text").unwrap();
        let err = resume_from::<u64>(c, "it", &resuming(false)).err().unwrap();
        assert!(
            err.to_string()
                .contains("the master result of the checkpoint of iteration 4 cannot be decoded"),
            "{err}"
        );
    }

    #[test]
    fn an_empty_store_resumes_nothing() {
        let mut store = super::super::MemoryCheckpointStore::keeping(2);
        assert!(resume::<u64>(&mut store, &resuming(false))
            .unwrap()
            .is_none());
        store.save(&written(2, 2)).unwrap();
        let r = resume::<u64>(&mut store, &resuming(false))
            .unwrap()
            .unwrap();
        assert_eq!(r.iteration, 2);
        assert!(
            r.point.source.starts_with("the newest checkpoint in"),
            "{}",
            r.point.source
        );
    }
}
