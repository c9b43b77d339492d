//! Every rank contributes `--mb` MB of `f64` and every rank gets the sum, `--iterations`
//! times: the collective a training loop runs on its gradients. Rank 0 prints one line,
//! `allreduce mode=<mode> n=<ranks> mb=<MB> median_ms=<ms>` (with `values=<V>` before
//! `median_ms` when a call sums more than one value), the median over the
//! iterations after the first (which opens the connections).
//!
//! - `--mode all-reduce` (the default): `ctx.all_reduce` inside compute, worker to worker
//!   around the ring (barrier mode); the time is the slowest rank's call. With `--values
//!   V`, each call sums V values of `--mb` together (`ctx.all_reduce_many`).
//! - `--mode started`: as `all-reduce`, but the `--values` values each go in a call of
//!   their own, all started together (`ctx.start_all_reduce`) and then finished
//!   (`ctx.finish`): several calls in flight at once. The time is still a call's of all.
//! - `--mode all-gather`: `ctx.all_gather()` of `--mb` of bytes from each rank inside
//!   compute, `--calls` times. The time is the slowest rank's call.
//! - `--mode barrier`: `ctx.barrier()` inside compute, `--calls` times; no values travel
//!   (`--mb` is ignored). The time is the slowest rank's call.
//! - `--mode halves`: as `all-reduce`, each rank among its half of the ranks alone (the
//!   even ranks, the odd ones: a `collective::Group` each, `ctx.among`), `--calls` times.
//! - `--mode star`: each worker returns its values, the master sums them and sends the
//!   sum to every worker with the next iteration — everything through rank 0; the time
//!   is the master's round, from one sum to the next.
//! - `--mode fold`: each worker returns its values and the job combines them
//!   (`combine_by(ReduceOp::Sum)`) with the default aggregation: across processes the workers
//!   fold them along the ring of ranks, chunk by chunk, and the last rank sends the sum on
//!   to rank 0, whose process runs the master; the master checks it and sends a small
//!   result back. In one process, the master folds. The time is the master's round, from one fold to the next.
//!
//! ```text
//! cargo run --release --example allreduce -- --workers 4 --mb 8         # in one process
//! cargo build --release --features launcher --example allreduce --bin superstep-launch
//! target/release/superstep-launch --nproc 4 -- target/release/examples/allreduce --mb 8
//! ```
//!
//! Across hosts, start rank `r` of `n` with `SUPERSTEP_RANK=r SUPERSTEP_WORLD_SIZE=n
//! SUPERSTEP_MASTER_ADDR=host0:port SUPERSTEP_SECRET=… SUPERSTEP_BIND=0.0.0.0` (or a
//! launcher's variables); `benches/cluster/allreduce.sh` runs it on an emulated cluster.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use superstep::collective::{Group, ReduceOp};
use superstep::prelude::*;

#[derive(Parser, Debug)]
struct Args {
    /// How many MB (10⁶ bytes) of f64 each rank contributes.
    #[arg(long, default_value_t = 8.0)]
    mb: f64,
    /// How many times.
    #[arg(long, default_value_t = 10)]
    iterations: u64,
    /// How the values travel.
    #[arg(long, value_enum, default_value_t = Mode::AllReduce)]
    mode: Mode,
    /// How many ranks, in one process (a cluster's environment gives its own).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// How many `all_reduce` (or `barrier`) calls each compute makes back to back;
    /// the time is a call's, their total over their number — the way latency benchmarks
    /// (OSU's, say) time a small collective.
    #[arg(long, default_value_t = 1)]
    calls: u32,
    /// How many values of `--mb` each call sums (`--mode all-reduce`): more than one go
    /// together in one `all_reduce_many`, the time still a call's. In `--mode started`,
    /// how many calls are in flight together.
    #[arg(long, default_value_t = 1)]
    values: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    AllReduce,
    Started,
    AllGather,
    Barrier,
    Halves,
    Star,
    Fold,
}

/// Rank `rank`'s values: small integers, so that every order of summing is exact and
/// the sum can be checked.
fn contribution(rank: usize, len: usize) -> Floats {
    Floats::from(vec![rank as f64 + 1.0; len])
}

/// What every element sums to over `n` ranks.
fn expected(n: usize) -> f64 {
    (n * (n + 1) / 2) as f64
}

/// Checks a few elements of a sum (a wrong collective shows in every element).
fn check(sum: &[f64], n: usize) -> Result<(), BoxError> {
    let want = expected(n);
    for &i in &[0, sum.len() / 2, sum.len().saturating_sub(1)] {
        if sum.get(i).is_some_and(|&x| x != want) {
            return Err(format!("element {i} sums to {}, not {want}", sum[i]).into());
        }
    }
    Ok(())
}

/// A rank: in `--mode all-reduce` it sums with every other inside compute and reports how
/// long its call took (ms); in `--mode star` it sends its values to the master and checks
/// the sum the master sent back.
struct Rank {
    mode: Mode,
    len: usize,
    calls: u32,
    values: u32,
}

impl WorkerComputable for Rank {
    type MasterResult = Floats;
    type WorkerResult = Floats;

    fn compute(&mut self, ctx: &mut WorkerContext<Floats, Floats>) -> Result<Floats, BoxError> {
        let mut values = contribution(ctx.rank(), self.len);
        match self.mode {
            Mode::AllReduce => {
                let mut took = 0.0;
                for call in 0..self.calls.max(1) {
                    if call > 0 {
                        values = contribution(ctx.rank(), self.len);
                    }
                    let mut more: Vec<Floats> = (1..self.values)
                        .map(|_| contribution(ctx.rank(), self.len))
                        .collect();
                    let started = Instant::now();
                    if more.is_empty() {
                        ctx.all_reduce(&mut values, ReduceOp::Sum)?;
                    } else {
                        let mut all: Vec<&mut Floats> = more.iter_mut().collect();
                        all.push(&mut values);
                        ctx.all_reduce_many(&mut all, ReduceOp::Sum)?;
                    }
                    took += started.elapsed().as_secs_f64() * 1e3;
                    check(&values, ctx.workers())?;
                    for value in &more {
                        check(value, ctx.workers())?;
                    }
                }
                let took = took / f64::from(self.calls.max(1));
                Ok(Floats::from(vec![took]))
            }
            Mode::Started => {
                let started = Instant::now();
                for _ in 0..self.calls.max(1) {
                    let mut flying = Vec::new();
                    for _ in 0..self.values.max(1) {
                        let mine = contribution(ctx.rank(), self.len);
                        flying.push(ctx.start_all_reduce(mine, ReduceOp::Sum)?);
                    }
                    for call in flying {
                        check(&ctx.finish(call)?, ctx.workers())?;
                    }
                }
                let took = started.elapsed().as_secs_f64() * 1e3 / f64::from(self.calls.max(1));
                Ok(Floats::from(vec![took]))
            }
            Mode::AllGather => {
                let mine = vec![ctx.rank() as u8; (self.len * 8).max(1)];
                let started = Instant::now();
                for _ in 0..self.calls.max(1) {
                    let all: Vec<Vec<u8>> = ctx.all_gather(&mine)?;
                    if all.iter().enumerate().any(|(r, m)| m[0] != r as u8) {
                        return Err("a wrong all_gather".into());
                    }
                }
                let took = started.elapsed().as_secs_f64() * 1e3 / f64::from(self.calls.max(1));
                Ok(Floats::from(vec![took]))
            }
            Mode::Barrier => {
                let started = Instant::now();
                for _ in 0..self.calls.max(1) {
                    ctx.barrier()?;
                }
                let took = started.elapsed().as_secs_f64() * 1e3 / f64::from(self.calls.max(1));
                Ok(Floats::from(vec![took]))
            }
            Mode::Halves => {
                let (rank, workers) = (ctx.rank(), ctx.workers());
                let half = Group::new((rank % 2..workers).step_by(2))?;
                let want: f64 = half.ranks().iter().map(|&r| r as f64 + 1.0).sum();
                let started = Instant::now();
                for _ in 0..self.calls.max(1) {
                    let mut values = contribution(rank, self.len);
                    ctx.among(&half)?.all_reduce(&mut values, ReduceOp::Sum)?;
                    if values.first().is_some_and(|&x| x != want) {
                        return Err(format!("{} summed among {half}, not {want}", values[0]).into());
                    }
                }
                let took = started.elapsed().as_secs_f64() * 1e3 / f64::from(self.calls.max(1));
                Ok(Floats::from(vec![took]))
            }
            Mode::Star => {
                if let Some(sum) = ctx.last_master_result() {
                    check(sum, ctx.workers())?;
                }
                Ok(values)
            }
            Mode::Fold => Ok(values),
        }
    }
}

/// Keeps each iteration's time — the slowest rank's call (all-reduce), or the round since
/// the last sum (star, where the master sums) — and prints their median after the last.
struct Timing {
    mode: Mode,
    mb: f64,
    /// How many values a call sums, when more than one.
    values: u32,
    last: Option<Instant>,
    times: Vec<f64>,
}

impl MasterComputable for Timing {
    type MasterResult = Floats;
    type WorkerResult = Floats;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<Floats, Floats>,
    ) -> Result<Step<Floats>, BoxError> {
        let first = ctx.is_first_iteration();
        let next = match self.mode {
            Mode::AllReduce | Mode::Started | Mode::AllGather | Mode::Barrier | Mode::Halves => {
                let slowest = ctx
                    .worker_results()
                    .iter()
                    .map(|t| t[0])
                    .fold(0.0, f64::max);
                if !first {
                    self.times.push(slowest);
                }
                Floats::default()
            }
            Mode::Star => {
                let mut results = ctx.worker_results().iter();
                let mut sum = results.next().cloned().unwrap_or_default();
                for other in results {
                    for (s, x) in sum.iter_mut().zip(other.iter()) {
                        *s += x;
                    }
                }
                self.lap();
                sum
            }
            Mode::Fold => {
                let sum = ctx
                    .take_combined_result()
                    .ok_or("the job combines: a fold was expected")?;
                check(&sum, ctx.workers())?;
                self.lap();
                // The master's result is small: the round measures the fold.
                Floats::from(vec![sum.first().copied().unwrap_or_default()])
            }
        };
        if ctx.iteration() == ctx.iterations() {
            let mode = match self.mode {
                Mode::AllReduce => "all-reduce",
                Mode::Started => "started",
                Mode::AllGather => "all-gather",
                Mode::Barrier => "barrier",
                Mode::Halves => "halves",
                Mode::Star => "star",
                Mode::Fold => "fold",
            };
            let values = if self.values > 1 {
                format!(" values={}", self.values)
            } else {
                String::new()
            };
            println!(
                "allreduce mode={mode} n={} mb={}{values} median_ms={:.4}",
                ctx.workers(),
                self.mb,
                median(&self.times)
            );
        }
        Ok(Step::Continue(next))
    }
}

impl Timing {
    /// Counts the round since the last lap, if any.
    fn lap(&mut self) {
        let now = Instant::now();
        if let Some(last) = self.last.replace(now) {
            self.times.push((now - last).as_secs_f64() * 1e3);
        }
    }
}

fn median(times: &[f64]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // MB of 10⁶ bytes, as the bounds and Open MPI's test count them.
    let len = (args.mb * 1e6 / 8.0).round().max(1.0) as usize;
    let master = Timing {
        mode: args.mode,
        mb: args.mb,
        values: args.values,
        last: None,
        times: Vec::new(),
    };
    let (mode, calls, values) = (args.mode, args.calls, args.values);
    let mut job = Job::builder(master, move |_| Rank {
        mode,
        len,
        calls,
        values,
    })
    .job_id("allreduce")
    .workers(args.workers);
    if mode == Mode::Fold {
        job = job.combine_by(ReduceOp::Sum);
    }
    let job = job.cluster_from_env();
    let job = match job {
        Ok(job) => job,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    // One more iteration than asked: the first opens the connections and is not timed.
    let outcome = job
        .iterations(args.iterations + 1)
        .barrier_mode(mode != Mode::Star)
        .run();
    match outcome {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}
