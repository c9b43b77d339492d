//! A job can be watched: events in order, a report of every iteration, results in rank
//! order whatever order they arrived in.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::{summing_master, FnMaster, FnWorker};
use superstep::prelude::*;
use superstep::{HaltedBy, Placement};

#[test]
fn events_follow_the_job_from_start_to_completion() {
    let (subscriber, events) = superstep::events::channel();
    let workers = 3;
    let outcome = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .workers(workers)
    .iterations(3)
    .on_event(subscriber)
    .run()
    .unwrap();
    let events: Vec<JobEvent> = events.try_iter().collect();
    assert!(matches!(
        events.first(),
        Some(JobEvent::Started {
            workers: 3,
            iterations: 3,
            ..
        })
    ));
    assert!(matches!(events[1], JobEvent::Registered { .. }));
    let mut i = 2;
    for iteration in 1..=3 {
        assert!(
            matches!(events[i], JobEvent::IterationStarted { iteration: it } if it == iteration),
            "{:?}",
            events[i]
        );
        // Each rank's result as the master's node takes it, in the order they came.
        let mut reported: Vec<usize> = events[i + 1..i + 1 + workers]
            .iter()
            .map(|e| match e {
                JobEvent::WorkerReported {
                    rank,
                    iteration: it,
                    ..
                } if *it == iteration => *rank,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        reported.sort();
        assert_eq!(reported, vec![0, 1, 2]);
        match &events[i + 1 + workers] {
            JobEvent::IterationCompleted(report) => {
                assert_eq!(report.iteration, iteration);
                assert_eq!(report, &outcome.report.iterations[iteration as usize - 1]);
            }
            other => panic!("unexpected {other:?}"),
        }
        i += 2 + workers;
    }
    let mut done: Vec<usize> = events[i..i + workers]
        .iter()
        .map(|e| match e {
            JobEvent::WorkerDone { rank } => *rank,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    done.sort();
    assert_eq!(done, vec![0, 1, 2]);
    assert!(matches!(
        events[i + workers],
        JobEvent::Completed {
            iterations: 3,
            halted: false,
            ..
        }
    ));
    assert_eq!(events.len(), i + workers + 1);
}

#[test]
fn a_halt_and_a_failure_are_events_too() {
    let (subscriber, events) = superstep::events::channel();
    let master = FnMaster {
        f: |ctx: &mut MasterContext<u64, u64>| Ok(Step::Halt(ctx.iteration())),
    };
    Job::builder(master, |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .on_event(subscriber)
    .run()
    .unwrap();
    let events: Vec<JobEvent> = events.try_iter().collect();
    assert!(events.iter().any(|e| matches!(
        e,
        JobEvent::Halted {
            iteration: 1,
            by: HaltedBy::Master
        }
    )));

    let (subscriber, events) = superstep::events::channel();
    let err = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Err("broken".into()),
    })
    .workers(2)
    .on_event(subscriber)
    .run()
    .unwrap_err();
    let events: Vec<JobEvent> = events.try_iter().collect();
    let failed: Vec<&JobError> = events
        .iter()
        .filter_map(|e| match e {
            JobEvent::Failed { error } => Some(error),
            _ => None,
        })
        .collect();
    assert_eq!(failed, vec![&err], "the first failure, once");
    assert!(!events
        .iter()
        .any(|e| matches!(e, JobEvent::Completed { .. })));
}

#[test]
fn the_master_gets_results_in_rank_order_whatever_order_they_arrive_in() {
    let workers = 6;
    let master = FnMaster {
        f: move |ctx: &mut MasterContext<u64, u64>| {
            let ranks: Vec<u64> = ctx.worker_results().to_vec();
            assert_eq!(ranks, (0..workers as u64).collect::<Vec<_>>());
            Ok(Step::Continue(0))
        },
    };
    // Higher ranks finish first; rank 0 returns only once every other rank of the
    // iteration has, and 30 ms later — so it is the slowest however a busy machine
    // delays the others' threads.
    let returned = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let outcome = Job::builder(master, move |rank| {
        let returned = std::sync::Arc::clone(&returned);
        FnWorker {
            f: move |ctx: &mut WorkerContext<u64, u64>| {
                use std::sync::atomic::Ordering;
                sleep(Duration::from_millis(5 * (workers - rank) as u64));
                if rank == 0 {
                    let others = (workers as u64 - 1) * ctx.iteration();
                    // Bounded: a rank that failed fails the job, which must not hang here.
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    while returned.load(Ordering::SeqCst) < others {
                        if std::time::Instant::now() > deadline {
                            return Err("the other ranks did not return within 10 s".into());
                        }
                        sleep(Duration::from_millis(1));
                    }
                    sleep(Duration::from_millis(30));
                } else {
                    returned.fetch_add(1, Ordering::SeqCst);
                }
                Ok(rank as u64)
            },
        }
    })
    .workers(workers)
    .iterations(3)
    .placement(Placement::Pool)
    .compute_threads(workers)
    .run()
    .unwrap();
    for report in &outcome.report.iterations {
        let (slowest, elapsed) = report.slowest.unwrap();
        assert_eq!(slowest, 0, "rank 0 sleeps longest");
        assert!(elapsed >= Duration::from_millis(30));
        assert!(report.elapsed >= elapsed);
    }
}

#[test]
fn a_thousand_in_process_workers_finish_a_ten_iteration_sum() {
    let workers = 1_000;
    let outcome = Job::builder(summing_master(), |rank| FnWorker {
        f: move |_: &mut WorkerContext<u64, u64>| Ok(rank as u64),
    })
    .workers(workers)
    .iterations(10)
    .run()
    .unwrap();
    let per_iteration: u64 = (0..workers as u64).sum();
    assert_eq!(*outcome.result, 10 * per_iteration);
    assert_eq!(outcome.iterations, 10);
}

#[test]
fn a_job_runs_from_inside_an_async_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let outcome = rt.block_on(async {
        Job::builder(summing_master(), |_| FnWorker {
            f: |_: &mut WorkerContext<u64, u64>| Ok(2),
        })
        .workers(4)
        .iterations(2)
        .build()
        .unwrap()
        .run_async()
        .await
        .unwrap()
    });
    assert_eq!(*outcome.result, 16);
}

#[test]
fn the_report_keeps_the_last_iterations_in_detail_and_totals_every_one() {
    let (subscriber, events) = superstep::events::channel();
    let outcome = Job::builder(summing_master(), |rank| FnWorker {
        f: move |ctx: &mut WorkerContext<u64, u64>| {
            if rank == 1 && ctx.iteration() % 10 == 0 {
                sleep(Duration::from_millis(2));
            }
            Ok(1)
        },
    })
    .workers(2)
    .iterations(40)
    .report_iterations(5)
    .on_event(subscriber)
    .run()
    .unwrap();
    let report = &outcome.report;
    let kept: Vec<u64> = report.iterations.iter().map(|i| i.iteration).collect();
    assert_eq!(kept, [36, 37, 38, 39, 40]);
    // Every iteration, kept or not, is in the totals: those the events reported.
    let all: Vec<_> = events
        .try_iter()
        .filter_map(|e| match e {
            JobEvent::IterationCompleted(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(all.len(), 40);
    let totals = &report.totals;
    assert_eq!(totals.count, 40);
    let sum: Duration = all.iter().map(|r| r.elapsed).sum();
    let max = all.iter().map(|r| r.elapsed).max().unwrap();
    assert_eq!((totals.elapsed.sum, totals.elapsed.max), (sum, max));
    assert_eq!(report.iterating(), sum);
    assert_eq!(totals.elapsed.mean(40), sum / 40);
    let master: Duration = all.iter().map(|r| r.master_elapsed).sum();
    assert_eq!(totals.master_elapsed.sum, master);
    let slowest = all.iter().filter_map(|r| r.slowest).map(|(_, d)| d).max();
    assert_eq!(Some(totals.slowest_worker.max), slowest);
    assert!(totals.slowest_worker.max >= Duration::from_millis(2));
    assert_eq!(totals.most_results_held, 2);
    assert_eq!(totals.left_out, 0);

    let none = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .iterations(3)
    .report_iterations(0)
    .run()
    .unwrap();
    assert!(none.report.iterations.is_empty());
    assert_eq!(none.report.totals.count, 3);
}
