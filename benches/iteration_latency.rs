//! Iteration latency with trivial compute: superstep in memory and over TCP, and beside it
//! the floor — the same master/worker round written by hand with no framework.
//!
//! One round = broadcast the master result, every worker replies, the master folds.
//!
//! ```text
//! cargo bench --bench iteration_latency
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/tcp.rs"]
mod tcp;
#[path = "support/timing.rs"]
mod timing;
#[path = "support/trivial.rs"]
mod trivial;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use superstep::prelude::*;
use superstep::JobOutcome;
use tcp::run_over_tcp;
use timing::{measured, WARMUP};
use trivial::{Echo, Fold};

/// The measured iterations' time: each from its broadcast to its master result.
fn iterating(outcome: &JobOutcome<u64>) -> Duration {
    assert_eq!(
        outcome.report.iterations.len() as u64,
        outcome.iterations,
        "the report keeps every iteration (report_iterations)"
    );
    measured(outcome)
}

fn superstep_memory(workers: usize, iters: u64) -> Duration {
    let outcome = Job::builder(Fold, |rank| Echo(rank as u64))
        .workers(workers)
        .iterations(iters + WARMUP)
        // Every iteration in the report: it keeps only the last 1,000 by default.
        .report_iterations((iters + WARMUP) as usize)
        .run()
        .expect("the job runs");
    iterating(&outcome)
}

/// The floor: a master task and `workers` worker tasks exchanging tokio channel messages.
fn tokio_round(runtime: &tokio::runtime::Runtime, workers: usize, iters: u64) -> Duration {
    runtime.block_on(async move {
        let (reply_tx, mut replies) = tokio::sync::mpsc::unbounded_channel::<(usize, u64)>();
        let mut to_workers = Vec::new();
        let mut tasks = Vec::new();
        for rank in 0..workers {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Arc<u64>>();
            let reply = reply_tx.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(m) = rx.recv().await {
                    let _ = reply.send((rank, *m + rank as u64));
                }
            }));
            to_workers.push(tx);
        }
        let mut results = vec![0u64; workers];
        let mut value = 0u64;
        let start = Instant::now();
        for _ in 0..iters {
            let m = Arc::new(value);
            for w in &to_workers {
                let _ = w.send(Arc::clone(&m));
            }
            for _ in 0..workers {
                let (rank, v) = replies.recv().await.expect("a reply");
                results[rank] = v;
            }
            value = results.iter().sum::<u64>() % 1_000_003;
        }
        let elapsed = start.elapsed();
        drop(to_workers);
        for t in tasks {
            let _ = t.await;
        }
        elapsed
    })
}

/// The peer a user would write instead: a rayon parallel map and reduce over `workers`
/// tasks per iteration (one task per worker, as each worker's compute is one unit of
/// work), on a pool of one thread per core.
fn rayon_round(pool: &rayon::ThreadPool, workers: usize, iters: u64) -> Duration {
    use rayon::prelude::*;
    let states: Vec<u64> = (0..workers as u64).collect();
    pool.install(|| {
        let mut value = 0u64;
        let start = Instant::now();
        for _ in 0..iters {
            let last = value;
            value = states
                .par_iter()
                .with_max_len(1)
                .map(|s| last + s)
                .sum::<u64>()
                % 1_000_003;
        }
        std::hint::black_box(value);
        start.elapsed()
    })
}

fn in_memory(c: &mut Criterion) {
    let one_thread = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let multi_thread = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a rayon pool");
    let mut group = c.benchmark_group("iteration/memory");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for workers in [1usize, 4, 16, 64, 256, 1024] {
        group.bench_with_input(BenchmarkId::new("superstep", workers), &workers, |b, &n| {
            b.iter_custom(|iters| superstep_memory(n, iters))
        });
        group.bench_with_input(
            BenchmarkId::new("floor_tokio_one_thread", workers),
            &workers,
            |b, &n| b.iter_custom(|iters| tokio_round(&one_thread, n, iters)),
        );
        group.bench_with_input(
            BenchmarkId::new("floor_tokio_two_threads", workers),
            &workers,
            |b, &n| b.iter_custom(|iters| tokio_round(&multi_thread, n, iters)),
        );
        group.bench_with_input(BenchmarkId::new("rayon", workers), &workers, |b, &n| {
            b.iter_custom(|iters| rayon_round(&pool, n, iters))
        });
    }
    group.finish();
}

/// superstep over TCP on loopback.
fn superstep_tcp(ranks: usize, iters: u64) -> Duration {
    iterating(&run_over_tcp(ranks, move || {
        Job::builder(Fold, |r| Echo(r as u64))
            .workers(ranks)
            .iterations(iters + WARMUP)
            .report_iterations((iters + WARMUP) as usize)
    }))
}

/// The floor: a master thread and `workers` worker threads, each pair on a TCP connection
/// over loopback, exchanging length-prefixed 8-byte frames with blocking sockets.
fn raw_tcp_round(workers: usize, iters: u64) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let threads: Vec<_> = (0..workers)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_nodelay(true).unwrap();
                let mut frame = [0u8; 12];
                while s.read_exact(&mut frame).is_ok() {
                    let v = u64::from_le_bytes(frame[4..].try_into().unwrap()) + rank as u64;
                    frame[4..].copy_from_slice(&v.to_le_bytes());
                    if s.write_all(&frame).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    let mut conns: Vec<TcpStream> = (0..workers)
        .map(|_| {
            let (s, _) = listener.accept().unwrap();
            s.set_nodelay(true).unwrap();
            s
        })
        .collect();
    let mut value = 0u64;
    let mut frame = [0u8; 12];
    frame[..4].copy_from_slice(&8u32.to_be_bytes());
    let start = Instant::now();
    for _ in 0..iters {
        frame[4..].copy_from_slice(&value.to_le_bytes());
        for c in &mut conns {
            c.write_all(&frame).unwrap();
        }
        let mut sum = 0u64;
        for c in &mut conns {
            let mut reply = [0u8; 12];
            c.read_exact(&mut reply).unwrap();
            sum += u64::from_le_bytes(reply[4..].try_into().unwrap());
        }
        value = sum % 1_000_003;
    }
    let elapsed = start.elapsed();
    drop(conns);
    for t in threads {
        let _ = t.join();
    }
    elapsed
}

fn over_tcp(c: &mut Criterion) {
    let mut group = c.benchmark_group("iteration/tcp");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    for ranks in [1usize, 4, 8] {
        group.bench_with_input(BenchmarkId::new("superstep", ranks), &ranks, |b, &n| {
            b.iter_custom(|iters| superstep_tcp(n, iters))
        });
        group.bench_with_input(BenchmarkId::new("floor_raw_tcp", ranks), &ranks, |b, &n| {
            b.iter_custom(|iters| raw_tcp_round(n, iters))
        });
    }
    group.finish();
}

criterion_group!(benches, in_memory, over_tcp);
criterion_main!(benches);
