//! Collectives started now and finished later (`start_all_reduce`, `start_barrier`,
//! `start_broadcast`, `finish`): several under way at once on a rank, finished in any order, while the rank
//! makes other calls — in memory and across processes over TCP — with every collective's
//! rules.

mod common;

use std::sync::{Arc, Mutex};

use common::{barrier_job as job, FnWorker, PATIENT};
use superstep::collective::ReduceOp;
use superstep::prelude::*;
use superstep::transport::MemoryTransport;

fn worker(
    f: impl FnMut(&mut WorkerContext<u64, u64>) -> Result<u64, BoxError> + Send + 'static,
) -> FnWorker<common::WorkerFn> {
    FnWorker { f: Box::new(f) }
}

/// Rank `rank`'s values of call `k` in iteration `i`: small integers, so that every
/// grouping of a float sum is exact.
fn values(rank: usize, k: usize, i: u64, len: usize) -> Vec<f64> {
    (0..len)
        .map(|e| ((rank * 31 + k * 13 + e * 7 + i as usize) % 97) as f64 - 40.0)
        .collect()
}

/// The sum of every rank's values of call `k`.
fn sum(workers: usize, k: usize, i: u64, len: usize) -> Vec<f64> {
    let all: Vec<Vec<f64>> = (0..workers).map(|r| values(r, k, i, len)).collect();
    (0..len).map(|e| all.iter().map(|v| v[e]).sum()).collect()
}

/// Whether the job failed of a mistake in the program: one no policy runs again.
fn mistake(err: &JobError) -> bool {
    match err {
        JobError::Worker { cause, .. } => cause.is_mistake(),
        JobError::Sync(e) => e.is_mistake(),
        _ => false,
    }
}

/// The lengths of the calls started together: a small one (recursive doubling), a large
/// one (around the ring, many pieces), a small one.
const LENGTHS: [usize; 3] = [5, 50_000, 3];

/// A worker that starts three `all_reduce`s, a barrier and a broadcast together, then — before it
/// finishes them, in an order of its rank's — makes a blocking `all_reduce` and an
/// `all_gather` (a call through the master's node): each wait of its drives the calls in
/// flight, or a rank waiting on another's part would wait for ever. Checks every sum
/// and returns how many elements it checked.
fn overlapping(
    workers: usize,
    asynchronous: bool,
) -> impl Fn(usize) -> FnWorker<common::WorkerFn> + Send + Sync + 'static {
    move |rank| {
        worker(move |ctx| {
            let i = ctx.iteration();
            let mut started = Vec::new();
            for (k, len) in LENGTHS.into_iter().enumerate() {
                let mine = Floats::from(values(rank, k, i, len));
                started.push(Some(ctx.start_all_reduce(mine, ReduceOp::Sum)?));
            }
            let barrier = ctx.start_barrier()?;
            // A large broadcast from a rank that moves each iteration.
            let root = i as usize % workers;
            let mine = (rank == root).then(|| vec![i; 70_000]);
            let told = ctx.start_broadcast(root, mine.as_ref())?;
            let mut done: Vec<Option<Floats>> = vec![None; LENGTHS.len()];
            if rank % 2 == 1 {
                // Odd ranks finish the large one before their other calls.
                done[1] = Some(ctx.finish(started[1].take().unwrap())?);
            }
            let mut between = Floats::from(values(rank, 9, i, 40));
            ctx.all_reduce(&mut between, ReduceOp::Sum)?;
            let ranks: Vec<u64> = ctx.all_gather(&(rank as u64))?;
            // Every rank finishes the rest last to first: the broadcast, the barrier, then
            // the sums.
            let told: Vec<u64> = if asynchronous {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let told = runtime.block_on(async {
                    let told = ctx.finish_async(told).await?;
                    ctx.finish_async(barrier).await?;
                    for k in (0..LENGTHS.len()).rev() {
                        if let Some(s) = started[k].take() {
                            done[k] = Some(ctx.finish_async(s).await?);
                        }
                    }
                    Ok::<_, SyncError>(told)
                })?;
                told
            } else {
                let told = ctx.finish(told)?;
                ctx.finish(barrier)?;
                for k in (0..LENGTHS.len()).rev() {
                    if let Some(s) = started[k].take() {
                        done[k] = Some(ctx.finish(s)?);
                    }
                }
                told
            };
            if told != vec![i; 70_000] {
                return Err(format!("rank {rank}: a wrong broadcast").into());
            }
            if *between != sum(workers, 9, i, 40) {
                return Err(format!("rank {rank}: a wrong sum of the call between").into());
            }
            if ranks != (0..workers as u64).collect::<Vec<_>>() {
                return Err(format!("rank {rank}: gathered {ranks:?}").into());
            }
            let mut checked = 0;
            for (k, len) in LENGTHS.into_iter().enumerate() {
                let got = done[k].take().expect("every call finished");
                if *got != sum(workers, k, i, len) {
                    return Err(format!("rank {rank}: a wrong sum of call {k}").into());
                }
                checked += len as u64;
            }
            Ok(checked)
        })
    }
}

#[test]
fn calls_started_together_give_their_sums_finished_in_any_order_around_other_calls() {
    for workers in [1, 2, 3, 4, 8] {
        for asynchronous in [false, true] {
            let outcome = job(workers, 3, overlapping(workers, asynchronous))
                .transport(MemoryTransport::new().wire_check(true))
                .run()
                .unwrap_or_else(|e| panic!("{workers} ranks, async {asynchronous}: {e}"));
            let per_rank: usize = LENGTHS.iter().sum();
            // The master sums the ranks' counts, over three iterations.
            assert_eq!(
                *outcome.result,
                3 * (workers * per_rank) as u64,
                "{workers} ranks"
            );
        }
    }
}

#[cfg(feature = "tcp")]
#[test]
fn calls_started_together_across_processes_give_what_they_give_in_memory() {
    let workers = 4;
    common::same_over_tcp(workers, "in-flight", move || {
        job(workers, 3, overlapping(workers, false))
    });
}

#[test]
fn a_compute_that_returns_with_a_call_not_finished_fails_the_job_at_once_naming_it() {
    let started = std::time::Instant::now();
    let err = job(4, 1, |rank| {
        worker(move |ctx| {
            let call = ctx.start_all_reduce(Floats::from(vec![1.0; 1000]), ReduceOp::Sum)?;
            if rank != 2 {
                ctx.finish(call)?;
            } else {
                // Dropped: the compute returns with the call under way.
                let _ = call;
            }
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    assert!(
        started.elapsed() < PATIENT,
        "the others waited out the sync timeout: {err}"
    );
    assert!(mistake(&err), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("rank 2 returned from compute with all_reduce(sum) of 1000 element(s)")
            && text.contains("started and not finished"),
        "{text}"
    );
}

#[test]
fn calls_started_in_another_order_fail_every_rank_naming_both() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&calls);
    let err = job(3, 1, move |rank| {
        let seen = Arc::clone(&seen);
        worker(move |ctx| {
            // Rank 1 starts the long one first.
            let lengths = if rank == 1 { [8, 3] } else { [3, 8] };
            let first = ctx.start_all_reduce(Floats::from(vec![1.0; lengths[0]]), ReduceOp::Sum)?;
            let second =
                ctx.start_all_reduce(Floats::from(vec![1.0; lengths[1]]), ReduceOp::Sum)?;
            let result = ctx.finish(second).map(drop);
            let other = ctx.finish(first).map(drop);
            seen.lock().unwrap().push((rank, result.clone()));
            result?;
            other?;
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    assert!(mistake(&err), "{err}");
    let text = err.to_string();
    assert!(text.contains("rank 1"), "{text}");
    let calls = calls.lock().unwrap();
    assert!(
        calls.iter().all(|(_, result)| matches!(
            result,
            Err(SyncError::CollectiveMismatch { .. } | SyncError::Mismatch { .. })
        )),
        "every rank's call fails naming the calls: {calls:?}"
    );
}

#[test]
fn a_call_finished_on_a_rank_that_did_not_start_it_fails_saying_so() {
    // Rank 0 hands its started call to rank 1 (one process): rank 1 cannot finish it.
    let (give, take) = std::sync::mpsc::channel();
    let (said, tried) = std::sync::mpsc::channel();
    let give = Mutex::new(Some((give, tried)));
    let take = Mutex::new(Some((take, said)));
    let finished = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&finished);
    let err = job(2, 1, move |rank| {
        let give = (rank == 0).then(|| give.lock().unwrap().take().unwrap());
        let take = (rank == 1).then(|| take.lock().unwrap().take().unwrap());
        let seen = Arc::clone(&seen);
        worker(move |ctx| {
            if let Some((give, tried)) = &give {
                let mine = ctx.start_all_reduce(Floats::from(vec![1.0; 4]), ReduceOp::Sum)?;
                give.send(mine).unwrap();
                // Returns (and fails the job) once rank 1 tried.
                let _ = tried.recv();
                return Ok(0);
            }
            let (take, tried) = take.as_ref().unwrap();
            let theirs = take.recv().unwrap();
            let result = ctx.finish(theirs).map(drop);
            *seen.lock().unwrap() = Some(result.clone());
            tried.send(()).unwrap();
            result?;
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    assert!(mistake(&err), "{err}");
    let finished = finished.lock().unwrap().clone().expect("rank 1 tried");
    assert_eq!(
        finished,
        Err(SyncError::NotStarted { rank: 1, epoch: 0 }),
        "{err}"
    );
    let text = finished.unwrap_err().to_string();
    assert!(
        text.contains("rank 1 has no call #0 under way to finish"),
        "{text}"
    );
}

#[test]
fn a_call_left_unattended_while_its_rank_computes_waits_its_full_patience_once_attended() {
    // A broadcast along the ranks (large: 0 → 1 → 2), each rank computing between
    // starting and finishing it: rank 2 for 5.6 s, rank 1 — which passes the pieces on
    // only when it waits — for 6.2 s, both past the silence limit a call counts from its
    // start (a sync timeout of 100 ms, and five seconds more). Rank 2's wait, begun
    // before rank 1 sends, counts its silence from its start: the call ends with the
    // value on every rank.
    let err = job(3, 1, |rank| {
        worker(move |ctx| {
            let mine = (rank == 0).then(|| vec![7u8; 100_000]);
            let call = ctx.start_broadcast(0, mine.as_ref())?;
            let computing = [0, 6200, 5600][rank];
            std::thread::sleep(std::time::Duration::from_millis(computing));
            let got = ctx.finish(call)?;
            if got != vec![7u8; 100_000] {
                return Err(format!("rank {rank}: a wrong broadcast").into());
            }
            Ok(0)
        })
    })
    .sync_timeout(std::time::Duration::from_millis(100))
    .run()
    .err();
    assert!(err.is_none(), "{err:?}");
}

#[test]
fn a_finish_given_up_half_way_leaves_its_call_in_flight_to_be_named() {
    // Rank 1 awaits its call's end for a moment only (rank 0 starts its part later): the
    // call stays in flight, and the compute that returns without it fails naming it —
    // rather than the job going on with rank 1's part never taken.
    let err = job(2, 1, |rank| {
        worker(move |ctx| {
            if rank == 0 {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            let call = ctx.start_all_reduce(Floats::from(vec![1.0; 4]), ReduceOp::Sum)?;
            if rank == 0 {
                ctx.finish(call)?;
                return Ok(0);
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let waited = runtime.block_on(async {
                tokio::time::timeout(std::time::Duration::from_millis(20), ctx.finish_async(call))
                    .await
            });
            assert!(waited.is_err(), "the call ended before rank 0 started");
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    assert!(mistake(&err), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("rank 1 returned from compute with all_reduce(sum) of 4 element(s)"),
        "{text}"
    );
}
