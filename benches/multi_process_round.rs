//! Iteration latency over TCP with every rank a process of its own: superstep's ranks
//! started by `superstep-launch`, and beside them the floor — the same master/worker round
//! over raw length-delimited TCP, its master and workers started as processes too. Trivial
//! compute: what is measured is the round itself.
//!
//! This bench runs its own binary again as each rank (`SUPERSTEP_BENCH_ROLE`); rank 0 (or
//! the floor's master) prints the time its measured iterations took.
//!
//! ```text
//! cargo bench --bench multi_process_round
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/timing.rs"]
mod timing;
#[path = "support/trivial.rs"]
mod trivial;

use criterion::{BenchmarkId, Criterion};
use superstep::prelude::*;
use superstep::transport::TcpTransport;
use timing::{measured, WARMUP};
use trivial::{Echo, Fold};

const ROLE: &str = "SUPERSTEP_BENCH_ROLE";
const ITERS: &str = "SUPERSTEP_BENCH_ITERS";
const PORT: &str = "SUPERSTEP_BENCH_PORT";
const RANK: &str = "SUPERSTEP_BENCH_RANK";
const WORKERS: &str = "SUPERSTEP_BENCH_WORKERS";

fn var(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} is set by the bench"))
}

/// A rank of superstep's job, under `superstep-launch`: rank 0 prints the measured time.
fn superstep_rank() {
    let iters = var(ITERS);
    let transport = TcpTransport::from_env()
        .expect("the launcher's environment")
        .expect("started by superstep-launch");
    let outcome = Job::builder(Fold, |rank| Echo(rank as u64))
        .iterations(iters + WARMUP)
        // Every iteration in the report: it keeps only the last 1,000 by default.
        .report_iterations((iters + WARMUP) as usize)
        .transport(transport)
        .run()
        .expect("the job runs");
    let measured = measured(&outcome);
    if !outcome.report.iterations.is_empty() {
        println!("ELAPSED_NS {}", measured.as_nanos());
    }
}

/// The floor's master: accepts its workers, then runs the rounds, and prints their time.
fn floor_master() {
    let (workers, iters) = (var(WORKERS) as usize, var(ITERS));
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    println!("PORT {}", listener.local_addr().expect("bound").port());
    std::io::stdout().flush().expect("stdout");
    let mut conns: Vec<TcpStream> = (0..workers)
        .map(|_| {
            let (s, _) = listener.accept().expect("a worker");
            s.set_nodelay(true).expect("nodelay");
            s
        })
        .collect();
    let mut value = 0u64;
    let mut frame = [0u8; 12];
    frame[..4].copy_from_slice(&8u32.to_be_bytes());
    let mut round = |value: &mut u64| {
        frame[4..].copy_from_slice(&value.to_le_bytes());
        for c in &mut conns {
            c.write_all(&frame).expect("a write");
        }
        let mut sum = 0u64;
        for c in &mut conns {
            let mut reply = [0u8; 12];
            c.read_exact(&mut reply).expect("a reply");
            sum += u64::from_le_bytes(reply[4..].try_into().expect("8 bytes"));
        }
        *value = sum % 1_000_003;
    };
    for _ in 0..WARMUP {
        round(&mut value);
    }
    let start = Instant::now();
    for _ in 0..iters {
        round(&mut value);
    }
    println!("ELAPSED_NS {}", start.elapsed().as_nanos());
}

/// A floor worker: answers every frame with its value plus its rank, until the master
/// closes the connection.
fn floor_worker() {
    let (port, rank) = (var(PORT), var(RANK));
    let mut s = TcpStream::connect(("127.0.0.1", port as u16)).expect("the master");
    s.set_nodelay(true).expect("nodelay");
    let mut frame = [0u8; 12];
    while s.read_exact(&mut frame).is_ok() {
        let v = u64::from_le_bytes(frame[4..].try_into().expect("8 bytes")) + rank;
        frame[4..].copy_from_slice(&v.to_le_bytes());
        if s.write_all(&frame).is_err() {
            break;
        }
    }
}

/// Reads lines of `child`'s output until one starts with `key` (after the launcher's rank
/// prefix, if any); returns the rest of that line.
fn read_value(lines: &mut impl Iterator<Item = std::io::Result<String>>, key: &str) -> u64 {
    for line in lines {
        let line = line.expect("a line of output");
        if let Some(at) = line.find(key) {
            return line[at + key.len()..].trim().parse().expect("a number");
        }
    }
    panic!("the process ended without printing {key}")
}

fn wait(mut child: Child) {
    let status = child.wait().expect("the process ends");
    assert!(status.success(), "a rank failed: {status}");
}

fn superstep_processes(ranks: usize, iters: u64) -> Duration {
    let me = std::env::current_exe().expect("this bench's binary");
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_superstep-launch"))
        .args(["--nproc", &ranks.to_string(), "--"])
        .arg(me)
        .env(ROLE, "superstep")
        .env(ITERS, iters.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("superstep-launch starts");
    let out = launcher.stdout.take().expect("piped");
    let ns = read_value(&mut BufReader::new(out).lines(), "ELAPSED_NS ");
    wait(launcher);
    Duration::from_nanos(ns)
}

fn floor_processes(workers: usize, iters: u64) -> Duration {
    let me = std::env::current_exe().expect("this bench's binary");
    let mut master = Command::new(&me)
        .env(ROLE, "floor_master")
        .env(WORKERS, workers.to_string())
        .env(ITERS, iters.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the floor's master starts");
    let mut lines = BufReader::new(master.stdout.take().expect("piped")).lines();
    let port = read_value(&mut lines, "PORT ");
    let children: Vec<Child> = (0..workers)
        .map(|rank| {
            Command::new(&me)
                .env(ROLE, "floor_worker")
                .env(PORT, port.to_string())
                .env(RANK, rank.to_string())
                .spawn()
                .expect("a floor worker starts")
        })
        .collect();
    let ns = read_value(&mut lines, "ELAPSED_NS ");
    wait(master);
    children.into_iter().for_each(wait);
    Duration::from_nanos(ns)
}

fn over_processes(c: &mut Criterion) {
    let mut group = c.benchmark_group("iteration/tcp_processes");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_millis(500));
    for ranks in [1usize, 4, 8] {
        group.bench_with_input(BenchmarkId::new("superstep", ranks), &ranks, |b, &n| {
            b.iter_custom(|iters| superstep_processes(n, iters))
        });
        group.bench_with_input(BenchmarkId::new("floor_raw_tcp", ranks), &ranks, |b, &n| {
            b.iter_custom(|iters| floor_processes(n, iters))
        });
    }
    group.finish();
}

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("superstep") => return superstep_rank(),
        Ok("floor_master") => return floor_master(),
        Ok("floor_worker") => return floor_worker(),
        _ => {}
    }
    let mut c = Criterion::default().configure_from_args();
    over_processes(&mut c);
    c.final_summary();
}
