//! A checkpoint holds each worker's own state (`WorkerComputable::save_state`) and the
//! messages on their way to it: a job resumed from it — every worker restarted under
//! `RestartAll` or, since a job with messages is in barrier mode, under `RestartWorker`;
//! or the job started again — gives each worker back what it saved, and ends with the
//! fault-free result.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use common::summing_master;
use superstep::checkpoint::MemoryCheckpointStore;
use superstep::prelude::*;
use superstep::{Iteration, JobBuilder, Recover};

/// A worker whose state is its own: a running total it keeps in itself, made of what its
/// neighbour sent it and of its rank and iteration. It sends its total to the next rank
/// and returns it. `fail` makes rank 1 fail at that iteration, as many times as its
/// count says (once, from [`once`]).
struct Running {
    total: u64,
    fail: Option<(Iteration, Arc<AtomicU32>)>,
    saves: bool,
}

impl WorkerComputable for Running {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        let (rank, i, n) = (ctx.rank(), ctx.iteration(), ctx.workers());
        if let Some((at, left)) = &self.fail {
            let fails =
                || left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if rank == 1 && i == *at && fails().is_ok() {
                return Err(format!("rank 1 fails at iteration {i}").into());
            }
        }
        let told: u64 = ctx.messages::<u64>()?.iter().sum();
        self.total = self.total.wrapping_mul(3).wrapping_add(told) + rank as u64 + i;
        ctx.send((rank + 1) % n, self.total)?;
        Ok(self.total)
    }

    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        Ok(if self.saves {
            self.total.to_le_bytes().to_vec()
        } else {
            Vec::new()
        })
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), BoxError> {
        if self.saves {
            self.total = u64::from_le_bytes(state.try_into()?);
        }
        Ok(())
    }
}

const WORKERS: usize = 3;

/// One failure.
fn once() -> Arc<AtomicU32> {
    Arc::new(AtomicU32::new(1))
}
const ITERATIONS: Iteration = 7;

fn running(fail: Option<(Iteration, Arc<AtomicU32>)>, saves: bool) -> JobBuilder<u64, u64> {
    Job::builder(summing_master(), move |_| Running {
        total: 0,
        fail: fail.clone(),
        saves,
    })
    .workers(WORKERS)
    .iterations(ITERATIONS)
    .messages::<u64>()
}

fn fault_free() -> u64 {
    *running(None, true).run().unwrap().result
}

/// The job with rank 1 failing once at iteration 5 under `policy`, every worker restarted
/// from the checkpoint of 4 in `store`; its workers save their totals if `saves`.
fn restarted_at_5(
    saves: bool,
    store: MemoryCheckpointStore,
    policy: FailurePolicy,
) -> superstep::JobOutcome<u64> {
    running(Some((5, once())), saves)
        .checkpoint(store, 2)
        .failure_policy(policy)
        .run()
        .unwrap()
}

/// The job recovered once, restarting every worker as attempt 1 (under `policy`).
fn assert_one_gang_restart(outcome: &superstep::JobOutcome<u64>, policy: FailurePolicy) {
    let actions: Vec<_> = outcome
        .report
        .recoveries
        .iter()
        .map(|r| &r.action)
        .collect();
    assert_eq!(actions, [&Recover::RestartAll(1)], "{policy:?}");
}

#[test]
fn every_worker_restarted_from_a_checkpoint_gets_back_its_state_and_its_messages() {
    let want = fault_free();
    // A job with messages is in barrier mode, where a replacement takes every rank back
    // to the checkpoint with it: `RestartWorker` recovers as `RestartAll` does.
    for policy in [
        FailurePolicy::RestartAll { max_attempts: 2 },
        FailurePolicy::RestartWorker { max_restarts: 1 },
    ] {
        let store = MemoryCheckpointStore::new();
        let outcome = restarted_at_5(true, store.clone(), policy);
        assert_eq!(*outcome.result, want, "{policy:?}");
        assert_one_gang_restart(&outcome, policy);
        // The redo starts after the checkpoint of 4.
        let ran: Vec<Iteration> = outcome
            .report
            .iterations
            .iter()
            .map(|i| i.iteration)
            .collect();
        assert_eq!(ran, [1, 2, 3, 4, 5, 6, 7], "{policy:?}");
        // Checkpoints of iterations 2, 4, 6 and the last, 7, hold every worker's part.
        let saved: Vec<(Iteration, usize)> = store
            .checkpoints()
            .iter()
            .map(|c| (c.iteration, c.workers.iter().flatten().count()))
            .collect();
        assert_eq!(saved, [(2, 3), (4, 3), (6, 3), (7, 3)]);
        let fourth = &store.checkpoints()[1];
        assert!(fourth.workers.iter().flatten().all(|w| w.state.len() == 8));
        assert!(fourth
            .workers
            .iter()
            .flatten()
            .all(|w| !w.messages.is_empty()));
    }
}

#[test]
fn replacements_in_a_job_with_messages_stop_at_the_most_restarts() {
    // Rank 1 fails at iteration 5 twice: the first failure takes every rank back to the
    // checkpoint of 4, the second is past `max_restarts` and fails the job.
    let err = running(Some((5, Arc::new(AtomicU32::new(2)))), true)
        .checkpoint(MemoryCheckpointStore::new(), 2)
        .failure_policy(FailurePolicy::RestartWorker { max_restarts: 1 })
        .run()
        .unwrap_err();
    assert!(
        matches!(
            err,
            JobError::Worker {
                rank: 1,
                iteration: 5,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_worker_that_saves_nothing_resumes_without_its_state_and_the_result_shows_it() {
    // The same job whose workers keep their total but do not save it: resumed from the
    // checkpoint of iteration 4, they start again from 0 and end with another result —
    // the rule the docs give for a worker's state.
    let want = fault_free();
    let outcome = restarted_at_5(
        false,
        MemoryCheckpointStore::new(),
        FailurePolicy::RestartAll { max_attempts: 2 },
    );
    assert_ne!(*outcome.result, want);
}

#[test]
fn a_job_started_again_resumes_its_workers_from_the_newest_checkpoint() {
    let want = fault_free();
    let store = MemoryCheckpointStore::new();
    let err = running(Some((6, once())), true)
        .checkpoint(store.clone(), 2)
        .run()
        .unwrap_err();
    assert!(
        err.to_string().contains("rank 1 fails at iteration 6"),
        "{err}"
    );
    // Started again, it goes on from iteration 5 with what each worker saved in 4.
    let outcome = running(None, true).checkpoint(store, 2).run().unwrap();
    assert_eq!(outcome.report.resumed_from(), Some(4));
    assert_eq!(*outcome.result, want);
}

#[test]
fn a_job_run_again_with_more_iterations_goes_on_from_its_last_with_every_workers_state() {
    let want = fault_free();
    let store = MemoryCheckpointStore::new();
    let first = running(None, true)
        .iterations(4)
        .checkpoint(store.clone(), 3)
        .run()
        .unwrap();
    assert_eq!(first.report.checkpoints, [3, 4]);
    let outcome = running(None, true).checkpoint(store, 3).run().unwrap();
    assert_eq!(outcome.report.resumed_from(), Some(4));
    assert_eq!(*outcome.result, want);
}

#[test]
fn a_checkpoint_of_another_worker_count_is_refused_naming_both_even_when_the_job_reshards() {
    let store = MemoryCheckpointStore::new();
    running(Some((6, once())), true)
        .checkpoint(store.clone(), 2)
        .run()
        .unwrap_err();
    for reshard in [false, true] {
        let err = running(None, true)
            .workers(2)
            .checkpoint(store.clone(), 2)
            .reshard_on_resume(reshard)
            .run()
            .unwrap_err();
        assert!(matches!(err, JobError::Checkpoint { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("it was written by 3 workers, this job has 2"),
            "{message}"
        );
        // The workers' states belong to their old shards: re-sharding cannot split them.
        assert_eq!(
            message.contains("holds its workers' states"),
            reshard,
            "{message}"
        );
    }
}

/// A worker whose `save_state` or `restore_state` fails.
struct Broken {
    save: bool,
}

impl WorkerComputable for Broken {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(1)
    }

    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        if self.save {
            Err("no room for my state".into())
        } else {
            Ok(Vec::new())
        }
    }

    fn restore_state(&mut self, _: &[u8]) -> Result<(), BoxError> {
        Err("my state is from another version".into())
    }
}

/// Asserts that `err` is a worker's failure in `Phase::Checkpoint` at `iteration`, saying
/// `why`.
fn failed_in_checkpoint(err: &JobError, iteration: Iteration, why: &str) {
    assert!(
        matches!(
            err,
            JobError::Worker { iteration: i, phase: Phase::Checkpoint, .. } if *i == iteration
        ),
        "{err}"
    );
    assert!(err.to_string().contains(why), "{err}");
}

#[test]
fn a_worker_state_that_cannot_be_saved_or_restored_fails_the_job_naming_the_worker() {
    let err = Job::builder(summing_master(), |_| Broken { save: true })
        .workers(2)
        .iterations(4)
        .checkpoint(MemoryCheckpointStore::new(), 2)
        .failure_policy(FailurePolicy::RestartAll { max_attempts: 5 })
        .run()
        .unwrap_err();
    failed_in_checkpoint(&err, 2, "no room for my state");

    let store = MemoryCheckpointStore::new();
    let saved = Job::builder(summing_master(), |_| Broken { save: false })
        .workers(2)
        .iterations(6)
        .checkpoint(store.clone(), 2)
        .run()
        .unwrap();
    assert_eq!(*saved.result, 12);
    // Resumed from the checkpoint of iteration 4, whose workers' states are empty, the
    // workers' restore fails, which fails the job rather than restarting it again.
    let mut fresh = MemoryCheckpointStore::new();
    let fourth = store.checkpoints().into_iter().find(|c| c.iteration == 4);
    superstep::checkpoint::CheckpointStore::save(&mut fresh, &fourth.unwrap()).unwrap();
    let err = Job::builder(summing_master(), |_| Broken { save: false })
        .workers(2)
        .iterations(6)
        .checkpoint(fresh, 2)
        .failure_policy(FailurePolicy::RestartAll { max_attempts: 5 })
        .run()
        .unwrap_err();
    failed_in_checkpoint(&err, 5, "another version");
}

#[cfg(feature = "tcp")]
#[test]
fn workers_in_other_processes_get_back_their_state_and_messages_over_the_wire() {
    let want = fault_free();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let failed = once();
    // The first run fails at iteration 6, after the checkpoint of 4; the master's process
    // alone keeps checkpoints.
    let run = |fail: Option<(Iteration, Arc<AtomicU32>)>| {
        let path = path.clone();
        common::over_tcp(WORKERS, "worker-checkpoints", move |rank, transport| {
            let mut job = running(fail.clone(), true).transport(transport);
            if rank == 0 {
                let store = superstep::checkpoint::FsCheckpointStore::new(&path, 3).unwrap();
                job = job.checkpoint(store, 2);
            }
            job.run()
        })
    };
    let first = run(Some((6, Arc::clone(&failed))));
    assert!(first[0].is_err(), "the first run must fail");
    let second = run(None);
    for (rank, outcome) in second.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(*outcome.result, want, "rank {rank}");
    }
}

#[cfg(feature = "tcp")]
#[test]
fn every_worker_across_processes_restarts_from_the_checkpoint_with_its_state_and_messages() {
    // Rank 1 fails at iteration 5, its process alive: each process replaces its own worker
    // (from the factory, `init` again) in the new attempt, the master's process resumes
    // from its checkpoint of 4 and hands every worker its saved state and messages over
    // the wire. Under both policies that restart every worker.
    let want = fault_free();
    for policy in [
        FailurePolicy::RestartAll { max_attempts: 2 },
        FailurePolicy::RestartWorker { max_restarts: 1 },
    ] {
        let failed = once();
        let outcomes = common::over_tcp(WORKERS, "worker-checkpoints-gang", move |rank, t| {
            let mut job = running(Some((5, Arc::clone(&failed))), true)
                .failure_policy(policy)
                .transport(t);
            if rank == 0 {
                job = job.checkpoint(MemoryCheckpointStore::new(), 2);
            }
            job.run()
        });
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let outcome = outcome.unwrap_or_else(|e| panic!("{policy:?}, rank {rank}: {e}"));
            assert_eq!(*outcome.result, want, "{policy:?}, rank {rank}");
            if rank == 0 {
                assert_one_gang_restart(&outcome, policy);
            }
        }
    }
}
