//! Logistic regression by batch gradient descent on a generated, seeded data set, sharded
//! across workers. Prints the loss of every iteration under a progress bar, then checks
//! the final weights against a sequential single-threaded implementation.
//!
//! ```text
//! cargo run --release --example logistic_regression
//! cargo run --release --example logistic_regression -- --rows 200000 --workers 4 --iterations 50
//! ```
//!
//! The same binary runs as one process of a cluster job when its environment says so
//! (`SUPERSTEP_RANK` and friends, or Slurm's, or a Kubernetes Indexed Job's): each process
//! runs the worker of its rank over TCP, and rank 0 also the master. For 4 processes on
//! this host:
//!
//! ```text
//! cargo build --release --example logistic_regression
//! cargo run --release --features launcher --bin superstep-launch -- --nproc 4 -- target/release/examples/logistic_regression
//! ```
//!
//! With checkpoints, a process that dies is started again (the master resumes from its
//! newest checkpoint; the workers reach it again and carry on; a worker's is replaced):
//!
//! ```text
//! cargo run --release --features launcher --bin superstep-launch -- --nproc 4 --restarts 2 -- \
//!     target/release/examples/logistic_regression --checkpoint-dir /tmp/lr-checkpoints \
//!     --replace-workers 2
//! ```

#[path = "support/lr.rs"]
mod lr;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use superstep::checkpoint::FsCheckpointStore;
use superstep::coordinator::Input;
use superstep::prelude::*;

use lr::{Dataset, Gradient, LrMaster, LrWorker, Model};

/// Logistic regression on superstep.
#[derive(Parser, Debug)]
struct Args {
    /// Rows of the generated data set.
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
    /// Features per row.
    #[arg(long, default_value_t = 20)]
    features: usize,
    /// Workers (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Iterations of gradient descent.
    #[arg(long, default_value_t = 30)]
    iterations: u64,
    /// Learning rate.
    #[arg(long, default_value_t = 0.5)]
    rate: f64,
    /// Seed of the generated data set.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Skip the check against the sequential implementation.
    #[arg(long)]
    no_check: bool,
    /// Save the master's checkpoints here (the last 3), every `--checkpoint-every`
    /// iterations; a run on a directory with a checkpoint of this job resumes from it.
    #[arg(long)]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Save them as objects at this URL instead (`s3://bucket/prefix`, `gs://…`, `az://…`,
    /// `file:///dir`), credentials from the `AWS_*` / `GOOGLE_*` / `AZURE_*` variables
    /// (built with the `object-store` feature).
    #[cfg(feature = "object-store")]
    #[arg(long, conflicts_with = "checkpoint_dir")]
    checkpoint_url: Option<String>,
    /// Every how many iterations a checkpoint is saved.
    #[arg(long, default_value_t = 5)]
    checkpoint_every: u64,
    /// Replace a worker that fails or is lost (a process killed, say) by a new one of its
    /// rank, at most this many times over the job, instead of failing the job (in a
    /// cluster job, the launcher or scheduler starts the new process).
    #[arg(long, default_value_t = 0)]
    replace_workers: u32,
    /// Restart every worker from the newest checkpoint when one fails or is lost, at most
    /// this many attempts in all (in a cluster job each live process replaces its own
    /// worker, and the launcher or scheduler starts a dead one again).
    #[arg(long, default_value_t = 0, conflicts_with = "replace_workers")]
    restart_all: u32,
}

/// What this run's job is beyond its settings: the data set and the learning rate. A
/// checkpoint of other values is another job's, and no process of other values joins.
#[derive(serde::Serialize)]
struct Params {
    rows: usize,
    features: usize,
    rate: f64,
    seed: u64,
}

/// Prints the loss of each iteration above the progress bar.
struct LossPrinter {
    bar: ProgressBar,
}

impl MasterInterceptor<Model, Gradient> for LossPrinter {
    fn post_iteration(&mut self, ctx: &MasterContext<Model, Gradient>) -> Result<(), BoxError> {
        if let Some(model) = ctx.master_result() {
            let line = format!("iteration {:>3}: loss {:.6}", ctx.iteration(), model.loss);
            // A bar that is not drawn (output is not a terminal) also drops its lines.
            if self.bar.is_hidden() {
                println!("{line}");
            } else {
                self.bar.println(line);
            }
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,superstep=info".into()),
        )
        // Log lines on standard error, the results on standard output.
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let generated = Instant::now();
    let data = Arc::new(Dataset::generate(args.rows, args.features, args.seed));
    let shared = Arc::clone(&data);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // In a cluster job the environment decides the workers (one per process) and this
    // process's rank; otherwise every worker runs here, in memory. Each worker takes its
    // rows from its shard of the input.
    let builder = Job::builder(
        LrMaster {
            features: args.features,
            rate: args.rate,
        },
        move |_| LrWorker::sharded(Arc::clone(&shared)),
    )
    .workers(cores)
    .cluster_from_env();
    let builder = match builder {
        Ok(builder) => builder,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let builder = match args.workers {
        Some(workers) => builder.workers(workers),
        None => builder,
    };
    let (rank, runs_master, workers) = (
        builder.process_rank(),
        builder.runs_master(),
        builder.worker_count(),
    );
    println!(
        "generated {} rows x {} features (seed {}) in {:.2?}; {} workers, {} iterations",
        args.rows,
        args.features,
        args.seed,
        generated.elapsed(),
        workers,
        args.iterations
    );

    let bar = if runs_master {
        ProgressBar::new(args.iterations)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} iterations, {elapsed} {msg}")
            .expect("a valid template"),
    );
    let progress = bar.clone();
    let builder = builder.input(Input::Rows(args.rows as u64));
    let builder = match (args.replace_workers, args.restart_all) {
        (0, 0) => builder,
        (0, max_attempts) => builder.failure_policy(FailurePolicy::RestartAll { max_attempts }),
        (max_restarts, _) => builder.failure_policy(FailurePolicy::RestartWorker { max_restarts }),
    };
    // Only the master's process saves and reads checkpoints.
    #[cfg(feature = "object-store")]
    let builder = match (&args.checkpoint_url, runs_master) {
        (Some(url), true) => match superstep::checkpoint::ObjectCheckpointStore::from_url(url, 3) {
            Ok(store) => builder.checkpoint(store, args.checkpoint_every),
            Err(error) => {
                eprintln!("cannot use the checkpoint store: {error}");
                return ExitCode::FAILURE;
            }
        },
        _ => builder,
    };
    let builder = match (&args.checkpoint_dir, runs_master) {
        (Some(dir), true) => match FsCheckpointStore::new(dir, 3) {
            Ok(store) => builder.checkpoint(store, args.checkpoint_every),
            Err(error) => {
                eprintln!("cannot use the checkpoint directory: {error}");
                return ExitCode::FAILURE;
            }
        },
        _ => builder,
    };
    let builder = builder
        .job_id("logistic-regression")
        .params(&Params {
            rows: args.rows,
            features: args.features,
            rate: args.rate,
            seed: args.seed,
        })
        .iterations(args.iterations)
        // Sum the gradients as they arrive, in rank order: the master never holds one per
        // worker, and the sum is the same, bit for bit, as summing them all at the end.
        .combine(Gradient::add)
        .master_interceptor(LossPrinter { bar: bar.clone() })
        .on_event(move |event| {
            if let JobEvent::IterationCompleted(report) = event {
                progress.set_position(report.iteration);
                progress.set_message(format!("{:.1?}/iteration", report.elapsed));
            }
        })
        // The environment has the last word: SUPERSTEP_ITERATIONS, SUPERSTEP_PREEMPT_SIGNAL, …
        .settings_from_env();
    let outcome = match builder {
        Ok(builder) => builder.run(),
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    bar.finish_and_clear();

    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => {
            // 75 when it was preempted (SIGTERM, or the preempt signal): run again, it
            // resumes from its checkpoint.
            let how = if error.is_preempted() {
                "stopped"
            } else {
                "failed"
            };
            eprintln!("job {how}: {error}");
            return ExitCode::from(error.exit_code());
        }
    };
    if !runs_master {
        println!(
            "worker {} done: {} iterations, final loss {:.6}",
            rank.unwrap_or(0),
            outcome.iterations,
            outcome.result.loss
        );
        return ExitCode::SUCCESS;
    }
    let per_iteration = outcome.report.iterating() / outcome.iterations.max(1) as u32;
    println!(
        "done: {} iterations in {:.2?} ({:.2?} per iteration), final loss {:.6}",
        outcome.iterations, outcome.report.elapsed, per_iteration, outcome.result.loss
    );
    println!("weights: {:.4?}", outcome.result.weights);
    println!("weights' bits: {}", outcome.result.bits());

    if args.no_check {
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    let expected = lr::sequential(&data, outcome.iterations, args.rate);
    let seq_elapsed = started.elapsed();
    let diff = lr::max_abs_diff(&outcome.result.weights, &expected.weights);
    println!(
        "sequential: {:.2?} ({:.2?} per iteration); max |difference| of weights {diff:.3e}",
        seq_elapsed,
        seq_elapsed / outcome.iterations.max(1) as u32
    );
    if diff <= 1e-9 {
        println!("OK: equal to the sequential implementation within 1e-9");
        ExitCode::SUCCESS
    } else {
        eprintln!("MISMATCH: the weights differ from the sequential implementation by {diff:e}");
        ExitCode::FAILURE
    }
}
