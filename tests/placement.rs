//! The default placement never lines workers up: a compute that was cheap runs inline on
//! the node's thread, but when it turns slow, the rest of its round moves to the pool —
//! no worker's compute waits for another's, and a failure elsewhere ends the job while the
//! slow compute still runs.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{summing_master, FnWorker};
use superstep::prelude::*;

/// The scenario of a user's report: two workers, cheap for two iterations; in the third,
/// rank 0 sleeps and rank 1 fails. Rank 1's compute does not wait for rank 0's, and `run`
/// returns within a second of its failure — not when the sleep ends.
#[test]
fn a_failure_beside_a_compute_that_turned_slow_ends_the_job_within_a_second() {
    let failed_at = Arc::new(Mutex::new(None));
    let slow_at = Arc::new(Mutex::new(None));
    let (at, slow) = (Arc::clone(&failed_at), Arc::clone(&slow_at));
    let err = Job::builder(summing_master(), move |rank| {
        let (at, slow) = (Arc::clone(&at), Arc::clone(&slow));
        FnWorker {
            f: move |ctx: &mut WorkerContext<u64, u64>| {
                if ctx.iteration() == 3 {
                    if rank == 0 {
                        *slow.lock().unwrap() = Some(Instant::now());
                        std::thread::sleep(Duration::from_secs(6));
                    } else {
                        // Fails once rank 0's sleep began (so the failure is beside it):
                        // a second at most, if rank 0's compute never waits for this one.
                        let waiting = Instant::now();
                        while slow.lock().unwrap().is_none()
                            && waiting.elapsed() < Duration::from_secs(1)
                        {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        *at.lock().unwrap() = Some(Instant::now());
                        return Err("disk full".into());
                    }
                }
                Ok(1)
            },
        }
    })
    .workers(2)
    .iterations(5)
    .run()
    .unwrap_err();
    let returned = Instant::now();
    assert!(err.to_string().contains("worker 1 failed"), "{err}");
    let failed = failed_at
        .lock()
        .unwrap()
        .expect("rank 1 computed iteration 3");
    let slow = slow_at
        .lock()
        .unwrap()
        .expect("rank 0 computed iteration 3");
    // Whichever began first, neither waited for the other.
    let apart = failed.max(slow).saturating_duration_since(failed.min(slow));
    assert!(
        apart < Duration::from_millis(500),
        "rank 1 failed {apart:?} from rank 0's start"
    );
    let after = returned.saturating_duration_since(failed);
    assert!(
        after < Duration::from_secs(1),
        "returned {after:?} after the failure"
    );
}

/// Ranks 1..4 start iteration 3 while rank 0's compute, cheap until then, sleeps.
#[test]
fn no_workers_compute_waits_for_a_compute_that_turned_slow() {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&starts);
    let broadcast = Arc::new(Mutex::new(None));
    let b = Arc::clone(&broadcast);
    let outcome = Job::builder(summing_master(), move |rank| {
        let (seen, b) = (Arc::clone(&seen), Arc::clone(&b));
        FnWorker {
            f: move |ctx: &mut WorkerContext<u64, u64>| {
                if ctx.iteration() == 3 {
                    let now = Instant::now();
                    if rank == 0 {
                        *b.lock().unwrap() = Some(now);
                        std::thread::sleep(Duration::from_millis(1500));
                    } else {
                        seen.lock().unwrap().push((rank, now));
                    }
                }
                Ok(1)
            },
        }
    })
    .workers(4)
    .iterations(4)
    .run()
    .unwrap();
    assert_eq!(outcome.iterations, 4);
    let slow_began = broadcast.lock().unwrap().expect("rank 0 ran iteration 3");
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 3, "{starts:?}");
    for (rank, at) in starts {
        let waited = at.saturating_duration_since(slow_began);
        assert!(
            waited < Duration::from_millis(500),
            "rank {rank} began {waited:?} after rank 0's slow compute"
        );
    }
}

/// Computes that turn slow now and then, at random ranks and iterations: rounds are
/// rescued again and again, mid-round, and the job's answer is the one it always is.
#[test]
fn rounds_rescued_again_and_again_give_the_same_answer() {
    let slow = |rank: usize, iteration: u64| (rank as u64 * 7919 + iteration * 104_729) % 23 == 0;
    let outcome = Job::builder(summing_master(), move |rank| FnWorker {
        f: move |ctx: &mut WorkerContext<u64, u64>| {
            if slow(rank, ctx.iteration()) {
                std::thread::sleep(Duration::from_micros(400));
            }
            Ok(ctx.iteration() * (rank as u64 + 1))
        },
    })
    .workers(8)
    .iterations(400)
    .run()
    .unwrap();
    assert_eq!(outcome.iterations, 400);
    // The summing master adds each round's sum to the last: Σ_i i × (1 + … + 8).
    assert_eq!(*outcome.result, (1..=400u64).sum::<u64>() * 36);
}
