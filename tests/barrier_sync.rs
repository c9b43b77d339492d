//! barrier() and all_gather() inside a worker's compute, with Spark's barrier rules.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::Duration;

use common::{barrier_job, summing_master, FnWorker};
use superstep::prelude::*;
use superstep::{CallAt, SyncError, SyncKind};
use superstep::{Phase, Placement};

/// Longer still, for the waits these tests are not about.
const NEVER: Duration = Duration::from_secs(3600);

/// A rank and what its sync call returned.
type Call = (usize, Result<(), SyncError>);

/// What each rank's sync calls returned.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record(&self, rank: usize, result: &Result<impl Sized, SyncError>) {
        let result = result.as_ref().map(|_| ()).map_err(Clone::clone);
        self.0.lock().unwrap().push((rank, result));
    }
    fn all(&self) -> Vec<Call> {
        let mut calls = self.0.lock().unwrap().clone();
        calls.sort_by_key(|(r, _)| *r);
        calls
    }
}

#[test]
fn all_gather_returns_every_rank_message_in_rank_order_and_barrier_waits_for_the_last() {
    let workers = 5;
    let arrived = Arc::new(AtomicUsize::new(0));
    let outcome = barrier_job(workers, 4, move |rank| {
        let arrived = Arc::clone(&arrived);
        FnWorker {
            f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
                // Ranks arrive in reverse order, some much later than others.
                sleep(Duration::from_millis(3 * (workers - rank) as u64));
                // One barrier per iteration: after the i-th, every rank has arrived i times.
                let i = ctx.iteration();
                arrived.fetch_add(1, Ordering::SeqCst);
                ctx.barrier()?;
                assert!(
                    arrived.load(Ordering::SeqCst) >= workers * i as usize,
                    "rank {rank} left the barrier before every rank arrived"
                );
                let all = ctx.all_gather(&(rank as u64 * 100 + i))?;
                let expected: Vec<u64> = (0..workers as u64).map(|r| r * 100 + i).collect();
                assert_eq!(all, expected);
                Ok(all.iter().sum())
            }),
        }
    })
    .run()
    .unwrap();
    let expected: u64 = (1..=4u64)
        .map(|i| workers as u64 * (0..workers as u64).map(|r| r * 100 + i).sum::<u64>())
        .sum();
    assert_eq!(*outcome.result, expected);
}

#[test]
fn all_gather_takes_borrowed_messages_and_gives_them_back_owned() {
    let outcome = barrier_job(3, 2, |rank| FnWorker {
        f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
            let name = format!("rank-{rank}");
            let names: Vec<String> = ctx.all_gather(name.as_str())?;
            assert_eq!(names, ["rank-0", "rank-1", "rank-2"]);
            let hello: Vec<String> = ctx.all_gather("hello")?;
            assert_eq!(hello, ["hello"; 3]);
            let rows: Vec<Vec<u64>> = ctx.all_gather(&[rank as u64, 7][..])?;
            assert_eq!(rows, [vec![0, 7], vec![1, 7], vec![2, 7]]);
            Ok(names.len() as u64)
        }),
    })
    .run()
    .unwrap();
    assert_eq!(*outcome.result, 2 * 3 * 3);
}

#[test]
fn several_calls_in_one_compute_across_many_iterations_meet_their_epochs() {
    let workers = 4;
    barrier_job(workers, 6, move |rank| FnWorker {
        f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
            let i = ctx.iteration();
            assert_eq!(ctx.sync_epoch(), 4 * (i - 1));
            ctx.barrier()?;
            let names: Vec<String> = ctx.all_gather(&format!("host-{rank}:{i}"))?;
            assert_eq!(
                names,
                (0..workers)
                    .map(|r| format!("host-{r}:{i}"))
                    .collect::<Vec<_>>()
            );
            ctx.barrier()?;
            let agreed = ctx.all_gather(&(i * 7))?;
            assert!(agreed.iter().all(|&v| v == i * 7));
            Ok(0)
        }),
    })
    .run()
    .unwrap();
}

#[test]
fn mixed_calls_fail_every_rank_of_that_epoch_saying_which_rank_called_what() {
    let calls = Calls::default();
    let seen = calls.clone();
    let err = barrier_job(3, 3, move |rank| {
        let seen = seen.clone();
        FnWorker {
            f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
                if rank == 2 {
                    sleep(Duration::from_millis(50)); // the others are waiting by then
                    let r = ctx.all_gather(&1u64);
                    seen.record(rank, &r);
                    r?;
                } else {
                    let r = ctx.barrier();
                    seen.record(rank, &r);
                    r?;
                }
                Ok(0)
            }),
        }
    })
    .run()
    .unwrap_err();
    // Every rank's call fails naming rank 2's all_gather against a barrier: the master's
    // node's word naming every rank's call, or — where a rank met the other call's piece
    // first — the two calls it met.
    let named = |e: &SyncError| {
        let text = e.to_string();
        e.is_mistake()
            && text.contains("at call 1 of iteration 1")
            && text.contains("rank 2 called all_gather()")
            && text.contains("called barrier()")
    };
    let JobError::Sync(e) = &err else {
        let JobError::Worker { cause, .. } = &err else {
            panic!("{err}");
        };
        assert!(cause.broken_rule().is_some_and(named), "{err}");
        return check_every_rank(calls, named);
    };
    assert!(named(e), "{err}");
    check_every_rank(calls, named);
}

/// Asserts that each rank that made its call got an error `named` accepts.
fn check_every_rank(calls: Calls, named: impl Fn(&SyncError) -> bool) {
    let recorded = calls.all();
    assert!(!recorded.is_empty());
    for (rank, result) in recorded {
        match result {
            Err(e) => assert!(named(&e), "rank {rank}: {e}"),
            Ok(()) => panic!("rank {rank}'s call returned"),
        }
    }
}

#[test]
fn a_timeout_from_the_first_arrival_names_the_ranks_that_did_not_arrive_and_the_epoch() {
    let calls = Calls::default();
    let seen = calls.clone();
    let err = barrier_job(4, 3, move |rank| {
        let seen = seen.clone();
        FnWorker {
            f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
                if ctx.iteration() == 2 && rank == 1 {
                    sleep(Duration::from_millis(1500));
                }
                let r = ctx.barrier();
                if ctx.iteration() == 2 {
                    seen.record(rank, &r);
                }
                r?;
                Ok(0)
            }),
        }
    })
    .sync_timeout(Duration::from_millis(300))
    .run()
    .unwrap_err();
    match &err {
        JobError::Sync(SyncError::TimedOut {
            at,
            kind,
            missing,
            waited,
            ..
        }) => {
            assert_eq!(
                (*at, *kind),
                (
                    CallAt {
                        iteration: 2,
                        call: 1,
                        group: superstep::GroupId::ALL,
                    },
                    SyncKind::Barrier
                ),
                "the first call of iteration 2 (the second of every rank)"
            );
            assert!(
                err.to_string()
                    .starts_with("barrier() (call 1 of iteration 2) timed out after"),
                "{err}"
            );
            assert_eq!(missing, &vec![1]);
            assert!(*waited >= Duration::from_millis(300));
        }
        other => panic!("unexpected {other:?}"),
    }
    let JobError::Sync(expected) = err else {
        unreachable!()
    };
    // Ranks 0, 2 and 3 waited and were released; rank 1 called after the failure and got
    // the same error at once — after `run` returned (its compute still slept, and was left
    // to end on its own thread after the failure grace).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while calls.all().len() < 4 && std::time::Instant::now() < deadline {
        sleep(Duration::from_millis(10));
    }
    let recorded = calls.all();
    assert_eq!(recorded.len(), 4);
    for (rank, result) in recorded {
        assert_eq!(result, Err(expected.clone()), "rank {rank}");
    }
}

#[test]
fn a_rank_that_returns_without_the_call_the_others_made_is_named_at_once() {
    let err = barrier_job(4, 5, move |rank| FnWorker {
        f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
            if !(rank == 3 && ctx.iteration() == 2) {
                ctx.barrier()?;
            }
            Ok(0)
        }),
    })
    .run()
    .unwrap_err();
    match err {
        JobError::Sync(SyncError::Unmatched {
            at, kind, returned, ..
        }) => {
            assert_eq!(
                (at, kind),
                (
                    CallAt {
                        iteration: 2,
                        call: 1,
                        group: superstep::GroupId::ALL,
                    },
                    SyncKind::Barrier
                )
            );
            assert_eq!(returned, vec![3]);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_rank_that_fails_releases_every_waiting_rank_at_once_with_its_cause() {
    for panic in [false, true] {
        let calls = Calls::default();
        let seen = calls.clone();
        let err = barrier_job(4, 5, move |rank| {
            let seen = seen.clone();
            FnWorker {
                f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
                    if rank == 0 && ctx.iteration() == 2 {
                        sleep(Duration::from_millis(50)); // the others are waiting by then
                        if panic {
                            panic!("GPU lost");
                        }
                        return Err("GPU lost".into());
                    }
                    let r = ctx.barrier();
                    if ctx.iteration() == 2 {
                        seen.record(rank, &r);
                    }
                    r?;
                    Ok(0)
                }),
            }
        })
        .run()
        .unwrap_err();
        match &err {
            JobError::Worker {
                rank: 0,
                iteration: 2,
                phase: Phase::Compute,
                cause,
            } => assert_eq!(cause.message(), "GPU lost"),
            other => panic!("unexpected {other:?}"),
        }
        let recorded = calls.all();
        assert_eq!(
            recorded.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        for (rank, result) in recorded {
            assert_eq!(
                result,
                Err(SyncError::JobFailed(Box::new(err.clone()))),
                "rank {rank}"
            );
        }
    }
}

#[test]
fn a_sync_call_outside_barrier_mode_fails_at_once_with_a_clear_error() {
    let err = Job::builder(summing_master(), |_| FnWorker {
        f: |ctx: &mut WorkerContext<u64, u64>| {
            ctx.barrier()?;
            Ok(0)
        },
    })
    .workers(3)
    .iteration_timeout(NEVER)
    .run()
    .unwrap_err();
    assert!(
        err.to_string()
            .ends_with("barrier() needs a job built with barrier_mode(true), which gives every worker a thread of its own so that ranks can wait for each other"),
        "{err}"
    );
}

#[test]
fn barrier_mode_cannot_run_workers_inline() {
    let err = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(0),
    })
    .barrier_mode(true)
    .placement(Placement::Inline)
    .build()
    .unwrap_err();
    assert_eq!(err.setting, "placement");
}

#[test]
fn sixty_four_ranks_gather_in_barrier_mode() {
    let workers = 64;
    let outcome = barrier_job(workers, 3, move |rank| FnWorker {
        f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
            let all = ctx.all_gather(&(rank as u64))?;
            Ok(all.iter().sum())
        }),
    })
    .run()
    .unwrap();
    let per_rank: u64 = (0..workers as u64).sum();
    assert_eq!(*outcome.result, 3 * workers as u64 * per_rank);
}

#[test]
fn with_the_default_sync_timeout_an_iteration_timeout_still_names_who_did_not_arrive() {
    // The iteration's own timeout passes first; the error is still the epoch's, naming the
    // rank that never arrived rather than every rank of the iteration.
    let err = Job::builder(summing_master(), move |rank| FnWorker {
        f: move |ctx: &mut WorkerContext<u64, u64>| {
            if rank == 2 && ctx.iteration() == 1 {
                sleep(Duration::from_millis(1000));
            }
            ctx.barrier()?;
            Ok(0)
        },
    })
    .workers(4)
    .barrier_mode(true)
    .iteration_timeout(Duration::from_millis(300))
    .run()
    .unwrap_err();
    match err {
        JobError::Sync(SyncError::TimedOut {
            at:
                CallAt {
                    iteration: 1,
                    call: 1,
                    group: superstep::GroupId::ALL,
                },
            missing,
            ..
        }) => assert_eq!(missing, vec![2]),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_sync_call_in_init_is_refused_with_a_clear_error() {
    struct SyncsInInit;
    impl WorkerComputable for SyncsInInit {
        type MasterResult = u64;
        type WorkerResult = u64;
        fn init(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
            ctx.barrier()?;
            Ok(())
        }
        fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
            Ok(0)
        }
    }
    let err = Job::builder(summing_master(), |_| SyncsInInit)
        .workers(2)
        .barrier_mode(true)
        .run()
        .unwrap_err();
    assert!(
        matches!(err, JobError::Worker { phase: Phase::Init, ref cause, .. }
            if cause.message() == SyncError::OutsideCompute(SyncKind::Barrier).to_string()),
        "{err:?}"
    );
}

#[test]
fn compute_that_uses_rayon_syncs_in_barrier_mode() {
    use rayon::prelude::*;
    let workers = 4;
    let outcome = barrier_job(workers, 5, move |rank| FnWorker {
        f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
            let local: u64 = (0..20_000u64)
                .into_par_iter()
                .map(|x| x % (rank as u64 + 2))
                .sum();
            ctx.barrier()?;
            let all = ctx.all_gather(&local)?;
            Ok(all.iter().sum())
        }),
    })
    .run()
    .unwrap();
    let per_iteration: u64 = (0..workers as u64)
        .map(|r| (0..20_000u64).map(|x| x % (r + 2)).sum::<u64>())
        .sum::<u64>()
        * workers as u64;
    assert_eq!(*outcome.result, 5 * per_iteration);
}

/// Barrier mode across processes (ranks as threads, each with its own TCP transport): rank
/// 1 fails while rank 0 waits in `barrier()` and rank 2 calls it only after the job has
/// failed. Every process returns the job's first failure — rank 1's, as the master saw
/// it — as fast as in memory: the waiting call and the late one are answered by the abort,
/// not by a timeout (sync 30 s, shutdown 60 s by default here).
#[cfg(feature = "tcp")]
#[test]
fn over_tcp_a_failure_ends_every_process_at_once_with_the_job_first_failure() {
    let started = std::time::Instant::now();
    let outcomes = common::over_tcp(3, "barrier-tcp", |_, t| {
        barrier_job(3, 5, |rank| FnWorker {
            f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
                if ctx.iteration() == 2 {
                    match rank {
                        1 => return Err("rank 1 fails".into()),
                        2 => sleep(Duration::from_millis(1500)),
                        _ => {}
                    }
                }
                ctx.barrier()?;
                Ok(1)
            }),
        })
        .shutdown_timeout(Duration::from_secs(60))
        .transport(t)
        .run()
    });
    // Rank 2's late call comes 1.5 s in; nothing else waits.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "took {took:?}");
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Err(JobError::Worker {
                rank: 1,
                iteration: 2,
                phase: Phase::Compute,
                cause,
            }) => assert_eq!(cause.message(), "rank 1 fails", "rank {rank}"),
            Err(other) => panic!("rank {rank} ended with {other}, not the job's first failure"),
            Ok(_) => panic!("rank {rank} completed"),
        }
    }
}
