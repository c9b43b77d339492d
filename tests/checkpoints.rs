//! Checkpoints: a job that fails resumes from its newest usable checkpoint and ends with
//! the result of the run without the failure; before the first checkpoint it starts over.

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use superstep::checkpoint::{
    Checkpoint, CheckpointStore, FsCheckpointStore, JobShape, MemoryCheckpointStore,
};
use superstep::coordinator::Input;
use superstep::prelude::*;
use superstep::{HaltedBy, Iteration, JobBuilder, Phase};

/// A master with state of its own beyond its result: how many iterations it folded and a
/// running checksum of the workers' results. Fails once at `fail_at`, if set.
struct Stateful {
    folded: u64,
    checksum: u64,
    fail_at: Option<Iteration>,
    failed: Arc<AtomicU64>,
    broken_save: bool,
    broken_restore: bool,
    /// Halts the job after this iteration.
    halt_at: Option<Iteration>,
}

impl MasterComputable for Stateful {
    type MasterResult = (u64, u64);
    type WorkerResult = u64;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<(u64, u64), u64>,
    ) -> Result<Step<(u64, u64)>, BoxError> {
        if Some(ctx.iteration()) == self.fail_at && self.failed.fetch_add(1, Ordering::SeqCst) == 0
        {
            return Err(format!("the master dies at iteration {}", ctx.iteration()).into());
        }
        self.folded += 1;
        for &r in ctx.worker_results() {
            self.checksum = self.checksum.wrapping_mul(31).wrapping_add(r);
        }
        let (sum, _) = ctx.last_master_result().copied().unwrap_or((0, 0));
        let total: u64 = ctx.worker_results().iter().sum();
        let result = (sum + total, self.checksum ^ self.folded);
        if Some(ctx.iteration()) == self.halt_at {
            return Ok(Step::Halt(result));
        }
        Ok(Step::Continue(result))
    }

    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        if self.broken_save {
            return Err("cannot save".into());
        }
        Ok(rmp_serde::to_vec(&(self.folded, self.checksum))?)
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), BoxError> {
        if self.broken_restore {
            return Err("cannot restore".into());
        }
        (self.folded, self.checksum) = rmp_serde::from_slice(state)?;
        Ok(())
    }
}

/// Returns a value that depends on its rank, the iteration and the master result it got.
struct Worker;

impl WorkerComputable for Worker {
    type MasterResult = (u64, u64);
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<(u64, u64), u64>) -> Result<u64, BoxError> {
        worker_result(ctx)
    }
}

/// Every one votes to halt at iteration `at`.
struct Voting {
    at: Iteration,
}

impl WorkerComputable for Voting {
    type MasterResult = (u64, u64);
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<(u64, u64), u64>) -> Result<u64, BoxError> {
        if ctx.iteration() == self.at {
            ctx.vote_halt();
        }
        worker_result(ctx)
    }
}

fn worker_result(ctx: &WorkerContext<(u64, u64), u64>) -> Result<u64, BoxError> {
    let (sum, check) = ctx.last_master_result().copied().unwrap_or((0, 0));
    Ok((sum % 1_000) + (check % 7) + ctx.rank() as u64 * 10 + ctx.iteration())
}

fn master(fail_at: Option<Iteration>) -> Stateful {
    Stateful {
        folded: 0,
        checksum: 0,
        fail_at,
        failed: Arc::new(AtomicU64::new(0)),
        broken_save: false,
        broken_restore: false,
        halt_at: None,
    }
}

fn job(m: Stateful, store: impl CheckpointStore, every: Iteration) -> JobBuilder<(u64, u64), u64> {
    Job::builder(m, |_| Worker)
        .workers(3)
        .iterations(12)
        .job_id("ckpt")
        .iteration_timeout(Duration::from_secs(20))
        .checkpoint(store, every)
}

fn fault_free() -> (u64, u64) {
    *job(master(None), MemoryCheckpointStore::new(), 100)
        .run()
        .unwrap()
        .result
}

#[test]
fn a_job_that_fails_resumes_from_its_last_checkpoint_with_the_fault_free_result() {
    let expected = fault_free();
    for (fail_at, every, resumed_from) in [(10, 4, 8), (9, 3, 6), (12, 1, 11), (5, 4, 4)] {
        let store = MemoryCheckpointStore::keeping(2);
        let err = job(master(Some(fail_at)), store.clone(), every)
            .run()
            .unwrap_err();
        assert_eq!(err.iteration(), Some(fail_at), "{err}");
        let outcome = job(master(None), store.clone(), every).run().unwrap();
        assert_eq!(
            *outcome.result, expected,
            "failing at {fail_at}, every {every}"
        );
        assert_eq!(outcome.report.resumed_from(), Some(resumed_from));
        assert_eq!(outcome.iterations, 12);
        let ran: Vec<_> = outcome
            .report
            .iterations
            .iter()
            .map(|i| i.iteration)
            .collect();
        assert_eq!(ran, (resumed_from + 1..=12).collect::<Vec<_>>());
        assert!(store.checkpoints().len() <= 2, "keeps the last two");
    }
}

/// The job's result folded by hand, iteration `i + 1` run by `sizes[i]` workers: what
/// `Stateful` and `Worker` compute, without the runtime.
fn by_hand(sizes: &[usize]) -> (u64, u64) {
    let (mut folded, mut checksum, mut last) = (0u64, 0u64, (0u64, 0u64));
    for (i, &workers) in sizes.iter().enumerate() {
        let iteration = i as u64 + 1;
        let results: Vec<u64> = (0..workers as u64)
            .map(|rank| (last.0 % 1_000) + (last.1 % 7) + rank * 10 + iteration)
            .collect();
        folded += 1;
        for &r in &results {
            checksum = checksum.wrapping_mul(31).wrapping_add(r);
        }
        last = (last.0 + results.iter().sum::<u64>(), checksum ^ folded);
    }
    last
}

#[test]
fn a_checkpoint_records_the_world_size_and_input_it_was_written_by() {
    let store = MemoryCheckpointStore::new();
    job(master(None), store.clone(), 4)
        .input(Input::Rows(100))
        .run()
        .unwrap();
    let shapes: Vec<_> = store.checkpoints().into_iter().map(|c| c.shape).collect();
    let shape = JobShape::new(3, Some(&Input::Rows(100)));
    assert_eq!(shape.input, "rows 0..100");
    assert_eq!(shapes, vec![Some(shape); 3]);
}

#[test]
fn resuming_at_another_world_size_is_refused_naming_both_sizes() {
    let store = MemoryCheckpointStore::new();
    job(master(Some(8)), store.clone(), 3).run().unwrap_err();
    for workers in [2, 4] {
        let err = job(master(None), store.clone(), 3)
            .workers(workers)
            .run()
            .unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, JobError::Checkpoint { .. }), "{message}");
        assert!(
            message.contains(&format!(
                "(iteration 6) is of another shape: it was written by 3 workers, this job has {workers}"
            )),
            "{message}"
        );
        assert!(message.contains("`reshard_on_resume`"), "{message}");
    }
    // Nothing was written over: the job at its own size still resumes.
    let outcome = job(master(None), store, 3).run().unwrap();
    assert_eq!(outcome.report.resumed_from(), Some(6));
    assert_eq!(*outcome.result, fault_free());
}

#[test]
fn resuming_with_another_input_is_refused_naming_both() {
    let store = MemoryCheckpointStore::new();
    job(master(Some(5)), store.clone(), 2)
        .input(Input::Rows(100))
        .run()
        .unwrap_err();
    let err = job(master(None), store, 2)
        .input(Input::Rows(120))
        .run()
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, JobError::Checkpoint { .. }), "{message}");
    assert!(
        message.contains("its input was rows 0..100, this job's is rows 0..120"),
        "{message}"
    );
}

/// A worker that counts the states it is given back (`restore_state`) in `restored`.
struct Counting {
    restored: Arc<AtomicU64>,
}

impl WorkerComputable for Counting {
    type MasterResult = (u64, u64);
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<(u64, u64), u64>) -> Result<u64, BoxError> {
        worker_result(ctx)
    }

    fn restore_state(&mut self, _: &[u8]) -> Result<(), BoxError> {
        self.restored.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn a_job_resharded_over_another_input_gives_no_worker_a_state_of_the_old_shards() {
    let store = MemoryCheckpointStore::new();
    let restored = Arc::new(AtomicU64::new(0));
    let counting = |rows: u64, iterations: Iteration, reshard: bool| {
        let restored = Arc::clone(&restored);
        Job::builder(master(None), move |_| Counting {
            restored: Arc::clone(&restored),
        })
        .workers(3)
        .iterations(iterations)
        .job_id("ckpt")
        .input(Input::Rows(rows))
        .checkpoint(store.clone(), 3)
        .reshard_on_resume(reshard)
    };
    counting(100, 6, false).run().unwrap();
    // Run again with more iterations on its own input: each worker gets its save back.
    counting(100, 9, false).run().unwrap();
    assert_eq!(restored.swap(0, Ordering::SeqCst), 3);
    // Re-sharded over another input: none does, though the world size is the same.
    let outcome = counting(120, 12, true).run().unwrap();
    assert_eq!(outcome.report.resumed_from(), Some(9));
    assert_eq!(restored.load(Ordering::SeqCst), 0);
}

#[test]
fn a_job_that_reshards_on_resume_goes_on_at_another_size_from_the_masters_state() {
    assert_eq!(by_hand(&[3; 12]), fault_free(), "the model is the job's");
    let store = MemoryCheckpointStore::new();
    job(master(None), store.clone(), 3)
        .iterations(6)
        .run()
        .unwrap();
    let outcome = job(master(None), store.clone(), 3)
        .workers(2)
        .input(Input::Rows(10))
        .reshard_on_resume(true)
        .run()
        .unwrap();
    assert_eq!(outcome.report.resumed_from(), Some(6));
    let sizes: Vec<usize> = [3; 6].into_iter().chain([2; 6]).collect();
    assert_eq!(*outcome.result, by_hand(&sizes));
    // Its checkpoints are of its own shape now.
    let newest = store.checkpoints().pop().unwrap();
    assert_eq!(newest.shape, Some(JobShape::new(2, Some(&Input::Rows(10)))));
}

#[test]
fn a_failure_before_the_first_checkpoint_starts_over_instead_of_crashing() {
    let store = MemoryCheckpointStore::new();
    job(master(Some(2)), store.clone(), 5).run().unwrap_err();
    assert!(store.checkpoints().is_empty());
    let outcome = job(master(None), store, 5).run().unwrap();
    assert_eq!(outcome.report.resumed_from(), None);
    // Every 5, and the last: a master started again after the end ends at once.
    assert_eq!(outcome.report.checkpoints, vec![5, 10, 12]);
    assert_eq!(*outcome.result, fault_free());
}

#[test]
fn a_job_whose_checkpoint_covers_every_iteration_completes_at_once_with_its_result() {
    let store = MemoryCheckpointStore::new();
    let first = job(master(None), store.clone(), 4).run().unwrap();
    let again = job(master(None), store, 4).run().unwrap();
    assert_eq!(again.report.resumed_from(), Some(12));
    assert!(again.report.iterations.is_empty());
    assert_eq!(again.result, first.result);
    assert_eq!(again.iterations, 12);
}

#[test]
fn a_job_resumed_from_the_checkpoint_of_its_halt_completes_at_once_halted() {
    // Halted by the master, and by the workers' vote, at a checkpointed iteration: a
    // master started again from that checkpoint must not run on past the halt.
    for by in [HaltedBy::Master, HaltedBy::Workers] {
        let run = |store: MemoryCheckpointStore| {
            let mut m = master(None);
            if by == HaltedBy::Master {
                m.halt_at = Some(6);
            }
            Job::builder(m, move |_| Voting {
                at: if by == HaltedBy::Workers { 6 } else { 0 },
            })
            .workers(3)
            .iterations(12)
            .job_id("ckpt")
            .worker_halt(true)
            .checkpoint(store, 3)
            .run()
            .unwrap()
        };
        let store = MemoryCheckpointStore::new();
        let first = run(store.clone());
        assert_eq!((first.iterations, first.report.halted_by), (6, Some(by)));
        assert_eq!(store.checkpoints().last().unwrap().halted, Some(by));
        let again = run(store);
        assert_eq!(again.report.resumed_from(), Some(6), "{by:?}");
        assert!(again.report.iterations.is_empty(), "{by:?}");
        assert_eq!(again.result, first.result, "{by:?}");
        assert_eq!((again.iterations, again.report.halted_by), (6, Some(by)));
    }
}

#[test]
fn on_disk_a_damaged_newest_checkpoint_falls_back_to_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let store = || FsCheckpointStore::new(dir.path(), 3).unwrap();
    job(master(Some(11)), store(), 2).run().unwrap_err();
    let files = store().files().unwrap();
    let iterations: Vec<_> = files.iter().map(|f| f.0).collect();
    assert_eq!(iterations, vec![6, 8, 10]);
    // A torn write of the newest: the job resumes from 8, not 10, and still ends right.
    let newest = &files[2].1;
    let bytes = fs::read(newest).unwrap();
    fs::write(newest, &bytes[..bytes.len() - 3]).unwrap();
    let outcome = job(master(None), store(), 2).run().unwrap();
    assert_eq!(outcome.report.resumed_from(), Some(8));
    assert_eq!(*outcome.result, fault_free());
}

#[test]
fn checkpoints_of_another_job_are_refused_naming_both_jobs() {
    let mut store = MemoryCheckpointStore::new();
    store
        .save(&Checkpoint {
            job_id: "someone-else".into(),
            iteration: 3,
            attempt: 0,
            master_result: rmp_serde::to_vec(&(1u64, 2u64)).unwrap(),
            master_state: Vec::new(),
            halted: None,
            workers: Vec::new(),
            shape: None,
            committed: false,
        })
        .unwrap();
    let err = job(master(None), store, 2).run().unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, JobError::Checkpoint { .. }), "{message}");
    assert!(
        message.contains("someone-else") && message.contains("ckpt"),
        "{message}"
    );
}

/// The parameters a program starts its job with.
#[derive(serde::Serialize)]
struct Args {
    seed: u64,
    rows: usize,
}

#[test]
fn a_finished_job_of_other_parameters_is_refused_naming_the_parameter_and_the_directory() {
    // The stale answer: a directory left by a run with `--seed 7`, finished; the run with
    // `--seed 8` must not return seed 7's result.
    let dir = tempfile::tempdir().unwrap();
    let store = || FsCheckpointStore::new(dir.path(), 3).unwrap();
    let with = |seed| job(master(None), store(), 4).params(&Args { seed, rows: 100 });
    let first = with(7).run().unwrap();
    let resumed = first.report.resumed.clone();
    assert_eq!(resumed, None);
    let err = with(8).run().unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, JobError::Checkpoint { .. }), "{message}");
    assert!(
        message.contains(&format!(
            "the newest checkpoint in {} (iteration 12) was written by this job with other parameters: `seed` is 7 there and 8 in this job",
            dir.path().display()
        )),
        "{message}"
    );
    // Without parameters, the job is one of other parameters too.
    let bare = job(master(None), store(), 4).run().unwrap_err().to_string();
    assert!(
        bare.contains("`rows` is 100 there and (none) in this job"),
        "{bare}"
    );
    // With seed 7's parameters, the job is seed 7's: it ends at once with its result, and
    // its report says where it came from.
    let again = with(7).run().unwrap();
    assert_eq!(again.result, first.result);
    let point = again.report.resumed.expect("resumed");
    assert_eq!(point.iteration, 12);
    assert!(point.finished);
    assert_eq!(
        point.source,
        format!("the newest checkpoint in {}", dir.path().display())
    );
}

#[test]
fn an_unfinished_job_of_other_parameters_is_refused_and_its_checkpoint_kept() {
    let store = MemoryCheckpointStore::new();
    let with = |m, seed| job(m, store.clone(), 3).params(&Args { seed, rows: 10 });
    // The master fails in iteration 8, after the checkpoint of 6.
    with(master(Some(8)), 1).run().unwrap_err();
    let err = with(master(None), 2).run().unwrap_err().to_string();
    assert!(
        err.contains("(iteration 6) was written by this job with other parameters: `seed` is 1 there and 2 in this job"),
        "{err}"
    );
    // Nothing was written over: with its own parameters the job goes on from iteration 6.
    let outcome = with(master(None), 1).run().unwrap();
    assert_eq!(*outcome.result, fault_free());
    let point = outcome.report.resumed.expect("resumed");
    assert_eq!((point.iteration, point.finished), (6, false));
    assert_eq!(
        point.source,
        "the newest checkpoint in memory (a MemoryCheckpointStore)"
    );
}

#[test]
fn a_state_that_cannot_be_saved_skips_the_checkpoint_and_one_that_cannot_be_restored_fails() {
    let store = MemoryCheckpointStore::new();
    let mut m = master(None);
    m.broken_save = true;
    let outcome = job(m, store.clone(), 3).run().unwrap();
    assert!(outcome.report.checkpoints.is_empty());
    assert!(store.checkpoints().is_empty(), "nothing half-saved");

    job(master(None), store.clone(), 3).run().unwrap();
    let mut m = master(None);
    m.broken_restore = true;
    match job(m, store, 3).run().unwrap_err() {
        JobError::Master {
            iteration, phase, ..
        } => {
            assert_eq!(phase, Phase::Checkpoint);
            assert_eq!(iteration, 12);
        }
        other => panic!("unexpected {other}"),
    }
    let err = job(master(None), MemoryCheckpointStore::new(), 0)
        .build()
        .unwrap_err();
    assert_eq!(err.setting, "checkpoint");
}

/// A memory store whose write of iteration `slow_at` takes `delay`.
#[derive(Clone)]
struct SlowAt {
    inner: MemoryCheckpointStore,
    slow_at: Iteration,
    delay: Duration,
}

impl CheckpointStore for SlowAt {
    fn save(&mut self, c: &Checkpoint) -> Result<(), superstep::checkpoint::CheckpointError> {
        if c.iteration == self.slow_at {
            std::thread::sleep(self.delay);
        }
        self.inner.save(c)
    }

    fn latest(
        &mut self,
    ) -> Result<Option<superstep::checkpoint::Loaded>, superstep::checkpoint::CheckpointError> {
        self.inner.latest()
    }
}

/// A store over `memory` whose write of the job's last checkpoint (12) takes `delay`.
fn slow_last(memory: &MemoryCheckpointStore, delay: Duration) -> SlowAt {
    SlowAt {
        inner: memory.clone(),
        slow_at: 12,
        delay,
    }
}

/// Fails a worker's end unless its store already holds the job's last checkpoint.
struct EndsAfter {
    store: MemoryCheckpointStore,
    last: Iteration,
}

impl superstep::WorkerInterceptor<(u64, u64), u64> for EndsAfter {
    fn post_application(
        &mut self,
        _: &WorkerContext<(u64, u64), u64>,
        _: superstep::Ending<'_>,
    ) -> Result<(), BoxError> {
        let held: Vec<Iteration> = self
            .store
            .checkpoints()
            .iter()
            .map(|c| c.iteration)
            .collect();
        if held.contains(&self.last) {
            Ok(())
        } else {
            Err(format!("the job ended with checkpoints {held:?} in its store").into())
        }
    }
}

/// A worker hears of the job's end only once its last checkpoint is in the store (its
/// write is off the master's path): a master lost after its workers ended finds the end
/// there when started again, instead of waiting for workers long gone.
#[test]
fn a_worker_hears_of_the_end_only_once_the_last_checkpoint_is_in_the_store() {
    let memory = MemoryCheckpointStore::new();
    let store = slow_last(&memory, Duration::from_millis(300));
    let seen = memory.clone();
    let outcome = job(master(None), store, 5)
        .worker_interceptor(move |_| EndsAfter {
            store: seen.clone(),
            last: 12,
        })
        .run()
        .unwrap();
    assert_eq!(outcome.report.checkpoints, vec![5, 10, 12]);
    assert_eq!(*outcome.result, fault_free());
}

/// The wait for the last checkpoint is not the master's compute: a write slower than the
/// iteration timeout does not time the job out (it is waited for as the job ends).
#[test]
fn a_last_checkpoint_slower_than_the_iteration_timeout_does_not_time_the_job_out() {
    let memory = MemoryCheckpointStore::new();
    let store = slow_last(&memory, Duration::from_millis(600));
    let outcome = job(master(None), store, 5)
        .iteration_timeout(Duration::from_millis(300))
        .run()
        .unwrap();
    assert_eq!(*outcome.result, fault_free());
    let held: Vec<Iteration> = memory.checkpoints().iter().map(|c| c.iteration).collect();
    assert!(held.contains(&12), "{held:?}");
}
