//! Collectives among the workers inside compute (barrier mode): `all_reduce`,
//! `reduce_scatter`, `broadcast` and a fold of any type, worker to worker; with the sync
//! calls' rules.

mod common;

use std::sync::{Arc, Mutex};

use common::{barrier_job as job, summing_master, FnWorker, PATIENT};
use superstep::collective::{Algorithm, CollectiveKind, ReduceOp};
use superstep::prelude::*;
use superstep::transport::MemoryTransport;
use superstep::{CallAt, SyncKind};

fn worker(
    f: impl FnMut(&mut WorkerContext<u64, u64>) -> Result<u64, BoxError> + Send + 'static,
) -> FnWorker<common::WorkerFn> {
    FnWorker { f: Box::new(f) }
}

/// Rank `rank`'s values in iteration `i`: small integers, so that every grouping of a
/// float sum is exact.
fn values(rank: usize, i: u64, len: usize) -> Vec<f64> {
    (0..len)
        .map(|e| ((rank * 31 + e * 7 + i as usize) % 97) as f64 - 40.0)
        .collect()
}

/// What each rank saw, checked on the test's thread (an assertion in a worker fails the
/// job with a less direct message).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Saw>>>);

/// A rank, a key (the iteration, or more) and the values it ended with.
type Saw = (usize, u64, Vec<f64>);

impl Seen {
    fn push(&self, rank: usize, i: u64, v: &[f64]) {
        self.0.lock().unwrap().push((rank, i, v.to_vec()));
    }
    fn all(&self) -> Vec<Saw> {
        self.0.lock().unwrap().clone()
    }
}

#[test]
fn all_reduce_gives_every_rank_the_sum_min_and_max_small_and_large_on_any_number_of_ranks() {
    // 100 elements go by recursive doubling (or a tree), 20,000 (160 KB) around the ring;
    // with the wire check (pieces encoded, as over TCP) and without (pieces as values).
    for (workers, wire_check) in [
        (1, true),
        (2, true),
        (3, false),
        (4, true),
        (5, true),
        (8, false),
    ] {
        for len in [100, 20_000] {
            let seen = Seen::default();
            let record = seen.clone();
            job(workers, 2, move |rank| {
                let record = record.clone();
                worker(move |ctx| {
                    let i = ctx.iteration();
                    for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
                        let mut v = Floats::from(values(rank, i, len));
                        ctx.all_reduce(&mut v, op)?;
                        record.push(rank, i * 10 + op as u64, &v);
                    }
                    Ok(0)
                })
            })
            .transport(MemoryTransport::new().wire_check(wire_check))
            .run()
            .unwrap();
            let seen = seen.all();
            assert_eq!(seen.len(), workers * 2 * 3);
            for (rank, key, got) in seen {
                let (i, op) = (key / 10, key % 10);
                let all: Vec<Vec<f64>> = (0..workers).map(|r| values(r, i, len)).collect();
                let want: Vec<f64> = (0..len)
                    .map(|e| {
                        let column = all.iter().map(|v| v[e]);
                        match op {
                            0 => column.sum(),
                            1 => column.fold(f64::INFINITY, f64::min),
                            _ => column.fold(f64::NEG_INFINITY, f64::max),
                        }
                    })
                    .collect();
                assert_eq!(
                    got, want,
                    "{workers} ranks, {len} elements, rank {rank}, op {op}"
                );
            }
        }
    }
}

#[test]
fn all_reduce_many_gives_each_value_what_its_own_all_reduce_gives_in_one_call() {
    // Values of any lengths (an empty one too) go together: small ones by recursive
    // doubling, with a large one (20,000 elements) around the ring. Each ends as its own
    // `all_reduce` would leave it, on every rank, on any number of ranks.
    for workers in [1, 2, 3, 4, 8] {
        for lengths in [vec![3, 0, 100, 1], vec![5, 20_000, 7]] {
            let seen = Seen::default();
            let record = seen.clone();
            let sizes = lengths.clone();
            job(workers, 2, move |rank| {
                let (record, sizes) = (record.clone(), sizes.clone());
                worker(move |ctx| {
                    let i = ctx.iteration();
                    for op in [ReduceOp::Sum, ReduceOp::Max] {
                        let mut many: Vec<Floats> = sizes
                            .iter()
                            .enumerate()
                            .map(|(k, &len)| Floats::from(values(rank + k, i, len)))
                            .collect();
                        let mut each = many.clone();
                        let mut refs: Vec<&mut Floats> = many.iter_mut().collect();
                        ctx.all_reduce_many(&mut refs, op)?;
                        for one in &mut each {
                            ctx.all_reduce(one, op)?;
                        }
                        for (k, (got, want)) in many.iter().zip(&each).enumerate() {
                            record.push(rank, i * 100 + op as u64 * 10 + k as u64, got);
                            record.push(
                                rank,
                                1_000_000 + i * 100 + op as u64 * 10 + k as u64,
                                want,
                            );
                        }
                    }
                    Ok(0)
                })
            })
            .transport(MemoryTransport::new().wire_check(true))
            .run()
            .unwrap();
            let seen = seen.all();
            assert_eq!(seen.len(), workers * 2 * 2 * lengths.len() * 2);
            for (rank, key, got) in &seen {
                if *key >= 1_000_000 {
                    continue;
                }
                let want = seen
                    .iter()
                    .find(|(r, k, _)| r == rank && *k == key + 1_000_000)
                    .map(|(_, _, v)| v)
                    .unwrap();
                assert_eq!(
                    got, want,
                    "{workers} ranks, lengths {lengths:?}, rank {rank}, key {key}"
                );
                // And the sum is the sum: value k of ranks 0.. is values(rank + k, ..).
                let (i, op, k) = (key / 100, key / 10 % 10, (key % 10) as usize);
                if op == ReduceOp::Sum as u64 {
                    let all: Vec<Vec<f64>> =
                        (0..workers).map(|r| values(r + k, i, lengths[k])).collect();
                    let sum: Vec<f64> = (0..lengths[k])
                        .map(|e| all.iter().map(|v| v[e]).sum())
                        .collect();
                    assert_eq!(got, &sum, "{workers} ranks, value {k}");
                }
            }
        }
    }
}

#[test]
fn all_reduce_many_on_values_split_otherwise_fails_every_rank_naming_the_calls() {
    // As many elements in all, split otherwise on rank 1 (5 + 3 against 3 + 5), or in
    // fewer values (8): every rank's call fails, the job names both calls.
    for other in [vec![5, 3], vec![8]] {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        let other_split = other.clone();
        let err = job(3, 1, move |rank| {
            let (seen, other) = (Arc::clone(&seen), other_split.clone());
            worker(move |ctx| {
                let lengths = if rank == 1 { other.clone() } else { vec![3, 5] };
                let mut many: Vec<Floats> = lengths
                    .iter()
                    .map(|&len| Floats::from(vec![1.0; len]))
                    .collect();
                let mut refs: Vec<&mut Floats> = many.iter_mut().collect();
                let result = ctx.all_reduce_many(&mut refs, ReduceOp::Sum);
                seen.lock().unwrap().push((rank, result.clone()));
                result?;
                Ok(0)
            })
        })
        .run()
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("every rank must pass as many values, each as long as the other ranks' value in its place"),
            "{other:?}: {text}"
        );
        let n = other.len();
        assert!(
            text.contains(&format!(
                "rank 1 called all_reduce_many with {n} value(s) of 8"
            )) || text.contains(&format!("rank 1 with {n} of 8")),
            "{other:?}: {text}"
        );
        let calls = calls.lock().unwrap();
        assert!(
            calls.iter().any(|(rank, _)| *rank == 1)
                && calls.iter().all(|(_, result)| matches!(
                    result,
                    Err(SyncError::CollectiveMismatch { .. } | SyncError::Mismatch { .. })
                )),
            "every rank's call fails naming the calls: {calls:?}"
        );
    }
}

#[test]
fn all_reduce_by_the_chain_sums_floats_bit_for_bit_as_the_master_folds_results() {
    let workers = 6;
    let len = 5_000;
    let value = |rank: usize, e: usize| ((rank + 1) as f64).sqrt() * (e as f64 + 0.1).ln();
    let seen = Seen::default();
    let record = seen.clone();
    job(workers, 1, move |rank| {
        let record = record.clone();
        worker(move |ctx| {
            let mut v: Floats = (0..len).map(|e| value(rank, e)).collect();
            ctx.all_reduce_by(&mut v, ReduceOp::Sum, Algorithm::Chain)?;
            record.push(rank, 0, &v);
            Ok(0)
        })
    })
    .run()
    .unwrap();
    let left_fold: Vec<u64> = (0..len)
        .map(|e| {
            (1..workers)
                .fold(value(0, e), |acc, r| acc + value(r, e))
                .to_bits()
        })
        .collect();
    for (rank, _, got) in seen.all() {
        let bits: Vec<u64> = got.iter().map(|x| x.to_bits()).collect();
        assert!(
            bits == left_fold,
            "rank {rank}: not the rank order's fold, bit for bit"
        );
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_segment_of_the_sum() {
    let workers = 4;
    let len = 10_003;
    let seen = Seen::default();
    let record = seen.clone();
    job(workers, 1, move |rank| {
        let record = record.clone();
        worker(move |ctx| {
            let mine = ctx.reduce_scatter(Floats::from(values(rank, 1, len)), ReduceOp::Sum)?;
            assert_eq!(mine.len(), ctx.segment(len).len());
            record.push(rank, 0, &mine);
            Ok(0)
        })
    })
    .run()
    .unwrap();
    let sum: Vec<f64> = (0..len)
        .map(|e| (0..workers).map(|r| values(r, 1, len)[e]).sum())
        .collect();
    let mut covered = 0;
    for (rank, _, got) in seen.all() {
        let base = len / workers;
        let start = rank * base + rank.min(len % workers);
        assert_eq!(got, sum[start..start + got.len()], "rank {rank}");
        covered += got.len();
    }
    assert_eq!(covered, len, "the segments cover the value");
}

#[test]
fn broadcast_gives_every_rank_the_root_value_small_and_large() {
    let workers = 5;
    let got = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&got);
    job(workers, 2, move |rank| {
        let record = Arc::clone(&record);
        worker(move |ctx| {
            let i = ctx.iteration();
            // A few bytes in the first iteration, a megabyte in the second.
            let len = if i == 1 { 3 } else { 1 << 17 };
            let root = (i as usize * 2) % 5;
            let mine = (rank == root).then(|| vec![i * 1000 + rank as u64; len]);
            let value: Vec<u64> = ctx.broadcast(root, mine.as_ref())?;
            record.lock().unwrap().push((rank, i, value));
            Ok(0)
        })
    })
    .run()
    .unwrap();
    let got = got.lock().unwrap();
    assert_eq!(got.len(), workers * 2);
    for (rank, i, value) in got.iter() {
        let len = if *i == 1 { 3 } else { 1 << 17 };
        let root = (*i as usize * 2) % 5;
        assert!(
            *value == vec![i * 1000 + root as u64; len],
            "rank {rank}, iteration {i}: not rank {root}'s value"
        );
    }
}

#[test]
fn all_reduce_with_folds_any_type_in_rank_order_on_every_rank() {
    let workers = 7;
    let got = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&got);
    job(workers, 1, move |rank| {
        let record = Arc::clone(&record);
        worker(move |ctx| {
            let all = ctx.all_reduce_with(format!("{rank};"), |a, b| a.push_str(&b))?;
            record.lock().unwrap().push(all);
            Ok(0)
        })
    })
    .run()
    .unwrap();
    let got = got.lock().unwrap();
    assert_eq!(got.len(), workers);
    assert!(got.iter().all(|s| s == "0;1;2;3;4;5;6;"), "{got:?}");
}

#[test]
fn a_rank_that_makes_another_call_fails_the_job_naming_the_calls_that_differ() {
    let err = job(3, 1, |rank| {
        worker(move |ctx| {
            if rank == 1 {
                ctx.barrier()?;
            } else {
                ctx.all_reduce(&mut Floats::from(vec![1.0; 8]), ReduceOp::Sum)?;
            }
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    // The calls the master's node had met when two differed: two, or all three when they
    // came together.
    let all_reduce = SyncKind::Collective(CollectiveKind::AllReduce(Some(ReduceOp::Sum)));
    let JobError::Sync(SyncError::Mismatch {
        at:
            CallAt {
                iteration: 1,
                call: 1,
                group: superstep::GroupId::ALL,
            },
        calls,
    }) = &err
    else {
        panic!("{err}");
    };
    assert!(calls.len() >= 2, "{err}");
    assert!(calls.contains(&(1, SyncKind::Barrier)), "{err}");
    assert!(
        calls.contains(&(0, all_reduce)) || calls.contains(&(2, all_reduce)),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("rank 1 called barrier()"), "{text}");
    assert!(text.contains("called all_reduce(sum)"), "{text}");
}

#[test]
fn a_rank_that_passes_another_length_fails_the_job_naming_both_ranks_and_lengths() {
    let err = job(2, 1, |rank| {
        worker(move |ctx| {
            let mut v = Floats::from(vec![1.0; 10 + rank]);
            ctx.all_reduce(&mut v, ReduceOp::Sum)?;
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("rank 0 called all_reduce(sum) with 10 element(s), rank 1 with 11")
            || text.contains("rank 1 called all_reduce(sum) with 11 element(s), rank 0 with 10"),
        "{text}"
    );
}

#[test]
fn a_rank_whose_part_is_done_at_once_still_fails_with_the_others_on_another_length() {
    // Rank 2's empty value needs nothing from anyone: without every rank's length
    // compared, it would return an empty "sum" while the others waited for it.
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&calls);
    let started = std::time::Instant::now();
    let err = job(3, 1, move |rank| {
        let seen = Arc::clone(&seen);
        worker(move |ctx| {
            let len = if rank == 2 { 0 } else { 4 };
            let result = ctx.all_reduce(&mut Floats::from(vec![1.0; len]), ReduceOp::Sum);
            seen.lock().unwrap().push((rank, result.clone()));
            result?;
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    assert!(
        started.elapsed() < PATIENT,
        "ranks waited out the sync timeout"
    );
    assert!(
        err.to_string()
            .contains("called all_reduce(sum) with 4 element(s), rank 2 with 0"),
        "{err}"
    );
    let calls = calls.lock().unwrap();
    assert!(
        calls
            .iter()
            .all(|(_, result)| matches!(result, Err(SyncError::CollectiveMismatch { .. }))),
        "every rank's call fails alike: {calls:?}"
    );
}

#[test]
fn a_broadcast_from_a_rank_the_job_does_not_have_fails_at_once() {
    let err = job(2, 1, |_| {
        worker(|ctx| {
            let value: u64 = ctx.broadcast(5, Some(&7u64))?;
            Ok(value)
        })
    })
    .run()
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("there is no rank 5: the job has 2 worker(s)"),
        "{err}"
    );
}

#[test]
fn a_rank_that_returns_without_the_call_fails_the_others_at_once_naming_it() {
    let started = std::time::Instant::now();
    let err = job(4, 1, |rank| {
        worker(move |ctx| {
            if rank != 2 {
                ctx.all_reduce(&mut Floats::from(vec![1.0; 1000]), ReduceOp::Sum)?;
            }
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    assert!(
        started.elapsed() < PATIENT,
        "the others waited out the sync timeout"
    );
    assert!(
        matches!(&err, JobError::Sync(SyncError::Unmatched { returned, .. }) if returned == &[2]),
        "{err}"
    );
}

#[test]
fn a_collective_outside_barrier_mode_or_in_init_says_what_it_needs() {
    let err = Job::builder(summing_master(), |_| {
        worker(|ctx| {
            ctx.all_reduce(&mut Floats::from(vec![1.0]), ReduceOp::Sum)?;
            Ok(0)
        })
    })
    .workers(2)
    .iterations(1)
    .run()
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("all_reduce(sum) needs a job built with barrier_mode(true)"),
        "{err}"
    );
}

/// A worker that checks, in every iteration, what four kinds of collective give it —
/// the ring's and recursive doubling's sums, a broadcast, a fold of strings — against what
/// it computes alone, and returns how many values it checked.
#[cfg(feature = "tcp")]
fn checking(
    workers: usize,
) -> impl Fn(usize) -> FnWorker<common::WorkerFn> + Send + Sync + 'static {
    move |rank| {
        worker(move |ctx| {
            let i = ctx.iteration();
            let mut checked = 0;
            for len in [100, 50_000] {
                let mut v = Floats::from(values(rank, i, len));
                ctx.all_reduce(&mut v, ReduceOp::Sum)?;
                let all: Vec<Vec<f64>> = (0..workers).map(|r| values(r, i, len)).collect();
                let want: Vec<f64> = (0..len).map(|e| all.iter().map(|v| v[e]).sum()).collect();
                if *v != want {
                    return Err(format!("rank {rank}: a wrong sum of {len} elements").into());
                }
                checked += len as u64;
            }
            let root = i as usize % workers;
            let mine = (rank == root).then(|| vec![i; 70_000]);
            let got: Vec<u64> = ctx.broadcast(root, mine.as_ref())?;
            if got != vec![i; 70_000] {
                return Err(format!("rank {rank}: a wrong broadcast").into());
            }
            let (mut few, mut many) = (
                Floats::from(values(rank, i, 3)),
                Floats::from(values(rank + 1, i, 30_000)),
            );
            ctx.all_reduce_many(&mut [&mut few, &mut many], ReduceOp::Max)?;
            let max = |k: usize, len: usize, e: usize| {
                (0..workers)
                    .map(|r| values(r + k, i, len)[e])
                    .fold(f64::NEG_INFINITY, f64::max)
            };
            if few[2] != max(0, 3, 2) || many[29_999] != max(1, 30_000, 29_999) {
                return Err(format!("rank {rank}: a wrong all_reduce_many").into());
            }
            let all = ctx.all_reduce_with(format!("{rank};"), |a, b| a.push_str(&b))?;
            let want: String = (0..workers).map(|r| format!("{r};")).collect();
            if all != want {
                return Err(format!("rank {rank}: {all} folded, not {want}").into());
            }
            Ok(checked + 1)
        })
    }
}

#[cfg(feature = "tcp")]
#[test]
fn collectives_across_processes_over_tcp_give_what_they_give_in_memory() {
    let workers = 4;
    common::same_over_tcp(workers, "collectives", move || {
        job(workers, 3, checking(workers))
    });
}

#[cfg(feature = "tcp")]
#[test]
fn calls_held_back_on_the_way_to_the_master_reach_it_within_a_short_sync_timeout() {
    // An all_reduce's call to the master's node goes with the next frame, or after a few
    // milliseconds: never a heartbeat (here four seconds) later. Each rank computes a while
    // after its calls — rank 2 for 600 ms — so a call held back until the rank's result
    // would reach the master long after rank 0's, past the 300 ms sync timeout.
    let workers = 3;
    let outcomes = common::over_tcp_with(
        workers,
        "held-calls",
        |s| s.heartbeat_interval = std::time::Duration::from_secs(4),
        move |_, transport| {
            job(workers, 2, move |rank| {
                worker(move |ctx| {
                    for _ in 0..3 {
                        let mut one = Floats::from(vec![1.0f64]);
                        ctx.all_reduce(&mut one, ReduceOp::Sum)?;
                        if one[0] != workers as f64 {
                            return Err(format!("rank {rank}: a wrong sum {}", one[0]).into());
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(300 * rank as u64));
                    Ok(1)
                })
            })
            .sync_timeout(std::time::Duration::from_millis(300))
            .transport(transport)
            .run()
        },
    );
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome.iterations, 2, "rank {rank}");
    }
}

/// Rank `rank`'s `all_gather` message in iteration `i`: large (about 120 KB encoded) but
/// on rank 1, whose message is small.
#[cfg(feature = "tcp")]
fn gathered(rank: usize, i: u64) -> Vec<u32> {
    let len = if rank == 1 { 10 } else { 40_000 };
    vec![rank as u32 * 1000 + i as u32; len]
}

#[cfg(feature = "tcp")]
#[test]
fn a_large_all_gather_across_processes_goes_around_the_ring_in_frames_of_one_message() {
    // Through the master, every rank's answer would be one frame holding every message
    // (about 360 KB); around the ring each frame holds one.
    let workers = 4;
    let outcomes = common::over_tcp_with(
        workers,
        "gather-ring",
        |s| s.max_frame = 256 << 10,
        move |_, transport| {
            job(workers, 2, move |rank| {
                worker(move |ctx| {
                    let i = ctx.iteration();
                    let all: Vec<Vec<u32>> = ctx.all_gather(&gathered(rank, i))?;
                    let want: Vec<Vec<u32>> = (0..workers).map(|r| gathered(r, i)).collect();
                    if all != want {
                        return Err(format!("rank {rank}: a wrong all_gather").into());
                    }
                    let small: Vec<u64> = ctx.all_gather(&(rank as u64 + i))?;
                    if small != (0..workers as u64).map(|r| r + i).collect::<Vec<_>>() {
                        return Err(format!("rank {rank}: a wrong small all_gather").into());
                    }
                    Ok(1)
                })
            })
            .transport(transport)
            .run()
        },
    );
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome.iterations, 2, "rank {rank}");
    }
}

/// Rank 0's first call is awaited beside a task that lets rank 1 make its calls: were the
/// call to block rank 0's thread, that task would never run and rank 1 would give up.
/// Then every `_async` form, checked against what each rank computes alone.
fn awaiting(
    rank: usize,
    workers: usize,
    go: Option<std::sync::mpsc::Sender<()>>,
    gone: Option<std::sync::mpsc::Receiver<()>>,
) -> FnWorker<common::WorkerFn> {
    worker(move |ctx| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        runtime.block_on(async {
            let i = ctx.iteration();
            let name = format!("r{rank}");
            let names: Vec<String> = match (&go, &gone) {
                (Some(go), _) => {
                    let signal = async {
                        let _ = go.send(());
                    };
                    let (names, ()) = tokio::join!(ctx.all_gather_async(name.as_str()), signal);
                    names?
                }
                (_, Some(gone)) => {
                    gone.recv_timeout(std::time::Duration::from_secs(30))
                        .map_err(|_| "rank 0's other task never ran while its call waited")?;
                    ctx.all_gather_async(name.as_str()).await?
                }
                _ => ctx.all_gather_async(name.as_str()).await?,
            };
            let want: Vec<String> = (0..workers).map(|r| format!("r{r}")).collect();
            if names != want {
                return Err(format!("rank {rank}: gathered {names:?}").into());
            }
            ctx.barrier_async().await?;
            let all = |len| -> Vec<f64> {
                let each: Vec<Vec<f64>> = (0..workers).map(|r| values(r, i, len)).collect();
                (0..len).map(|e| each.iter().map(|v| v[e]).sum()).collect()
            };
            for len in [100, 50_000] {
                let mut v = Floats::from(values(rank, i, len));
                ctx.all_reduce_async(&mut v, ReduceOp::Sum).await?;
                let mut chained = Floats::from(values(rank, i, len));
                ctx.all_reduce_by_async(&mut chained, ReduceOp::Sum, Algorithm::Chain)
                    .await?;
                if *v != all(len) || *chained != all(len) {
                    return Err(format!("rank {rank}: a wrong sum of {len} elements").into());
                }
            }
            let mine = ctx
                .reduce_scatter_async(Floats::from(values(rank, i, 1_000)), ReduceOp::Sum)
                .await?;
            if *mine != all(1_000)[ctx.segment(1_000)] {
                return Err(format!("rank {rank}: a wrong segment").into());
            }
            let told: String = ctx
                .broadcast_async(1, (rank == 1).then(|| "from 1".to_owned()).as_ref())
                .await?;
            let folded = ctx
                .all_reduce_with_async(format!("{rank};"), |a, b| a.push_str(&b))
                .await?;
            let want: String = (0..workers).map(|r| format!("{r};")).collect();
            if told != "from 1" || folded != want {
                return Err(format!("rank {rank}: {told:?}, {folded:?}").into());
            }
            Ok(1)
        })
    })
}

#[test]
fn async_forms_leave_the_thread_to_other_tasks_while_they_wait_and_give_what_blocking_ones_give() {
    let workers = 3;
    let (go, gone) = std::sync::mpsc::channel();
    let ends = Arc::new(Mutex::new((Some(go), Some(gone))));
    let outcome = job(workers, 2, move |rank| {
        let mut ends = ends.lock().unwrap();
        let go = if rank == 0 { ends.0.take() } else { None };
        let gone = if rank == 1 { ends.1.take() } else { None };
        awaiting(rank, workers, go, gone)
    })
    .run()
    .unwrap();
    assert_eq!(*outcome.result, 2 * workers as u64);
}

#[test]
fn an_async_call_awaited_outside_a_tokio_runtime_fails_saying_so() {
    let outcome = job(2, 1, |_| {
        worker(|ctx| {
            use std::future::Future;
            let mut call = std::pin::pin!(ctx.barrier_async());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            match call.as_mut().poll(&mut cx) {
                std::task::Poll::Ready(Err(superstep::SyncError::NoTimer)) => Ok(1),
                other => Err(format!("{other:?}").into()),
            }
        })
    })
    .run()
    .unwrap();
    assert_eq!(*outcome.result, 2);
}
