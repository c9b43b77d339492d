//! Barrier mode: ranks that talk to each other. Every rank opens a listener on 127.0.0.1,
//! the ranks exchange their addresses with `all_gather`, each greets the next rank in a
//! ring over its own connection, and they meet at a `barrier()` before any listener
//! closes — Spark's `BarrierTaskContext.allGather()` and `barrier()`.
//!
//! ```text
//! cargo run --example barrier                        # every rank in this process
//! cargo run --example barrier -- --workers 8
//! cargo build --example barrier && \
//!   cargo run --features launcher --bin superstep-launch -- --nproc 4 -- target/debug/examples/barrier
//! ```
//!
//! The same binary runs both ways: `cluster_from_env` takes the cluster from the
//! launcher's environment when it is there, and runs every rank in memory otherwise.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use superstep::prelude::*;

/// What a rank heard from the rank before it in the ring: its rank and its iteration.
type Heard = (u64, u64);

struct RingRank;

impl WorkerComputable for RingRank {
    type MasterResult = ();
    type WorkerResult = Heard;

    fn compute(&mut self, ctx: &mut WorkerContext<(), Heard>) -> Result<Heard, BoxError> {
        let (rank, n, iteration) = (ctx.rank(), ctx.workers(), ctx.iteration());
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let mine = listener.local_addr()?.to_string();
        // Every rank's address, in rank order.
        let addresses: Vec<String> = ctx.all_gather(mine.as_str())?;

        let next = &addresses[(rank + 1) % n];
        let mut out = TcpStream::connect(next)?;
        out.write_all(format!("{rank} {iteration}\n").as_bytes())?;
        drop(out);

        // The rank before greets within a bound: a rank that failed after the gather
        // must not hold this one forever.
        let mut from = accept_within(&listener, Duration::from_secs(30))
            .map_err(|e| format!("rank {rank}: no greeting from the rank before it: {e}"))?;
        from.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut greeting = String::new();
        from.read_to_string(&mut greeting)?;
        let mut words = greeting.split_whitespace().map(str::parse::<u64>);
        let heard = match (words.next(), words.next()) {
            (Some(Ok(r)), Some(Ok(i))) => (r, i),
            _ => return Err(format!("rank {rank}: unreadable greeting {greeting:?}").into()),
        };
        // No rank leaves (and closes its listener) before every rank was greeted.
        ctx.barrier()?;
        Ok(heard)
    }
}

/// The next connection to `listener`, or an error once `within` passed without one.
fn accept_within(listener: &TcpListener, within: Duration) -> std::io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + within;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("none within {within:?}"),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Checks that every rank heard from the one before it, in this iteration.
struct Check;

impl MasterComputable for Check {
    type MasterResult = ();
    type WorkerResult = Heard;

    fn compute(&mut self, ctx: &mut MasterContext<(), Heard>) -> Result<Step<()>, BoxError> {
        let n = ctx.worker_results().len() as u64;
        for (rank, &(from, iteration)) in ctx.worker_results().iter().enumerate() {
            let expected = (rank as u64 + n - 1) % n;
            if from != expected || iteration != ctx.iteration() {
                return Err(format!(
                    "rank {rank} heard rank {from} in iteration {iteration}, not rank {expected} in {}",
                    ctx.iteration()
                )
                .into());
            }
        }
        println!(
            "iteration {}: {n} ranks exchanged addresses and greeted the next one",
            ctx.iteration()
        );
        Ok(Step::Continue(()))
    }
}

fn main() -> ExitCode {
    let workers = match std::env::args().skip_while(|a| a != "--workers").nth(1) {
        None => 4,
        Some(n) => match n.parse::<usize>() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("--workers {n:?} is not a number of workers: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let job = Job::builder(Check, |_| RingRank)
        .job_id("barrier-example")
        .workers(workers)
        .cluster_from_env();
    let job = match job {
        Ok(job) => job,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let rank = job.process_rank();
    match job.barrier_mode(true).iterations(3).run() {
        Ok(outcome) => {
            println!(
                "rank {}: done after {} iterations",
                rank.unwrap_or(0),
                outcome.iterations
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("job failed: {error}");
            ExitCode::FAILURE
        }
    }
}
