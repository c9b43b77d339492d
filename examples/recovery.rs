//! Worker state under recovery: connected components by label propagation, run fault-free,
//! with a worker that fails and is replaced, and with every worker restarted from a
//! checkpoint — three times the same answer, because each worker's state is its shard
//! (loaded again by `init`) and the master result (read again every iteration). See
//! `examples/support/labels.rs` for the rule, and the README's "Worker state under
//! recovery".
//!
//! ```text
//! cargo run --release --example recovery
//! cargo run --release --example recovery -- 2000000 8000000 4   # vertices, edges, workers
//! ```

#[path = "support/graph.rs"]
mod graph;
#[path = "support/labels.rs"]
mod labels;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use superstep::checkpoint::MemoryCheckpointStore;
use superstep::prelude::*;
use superstep::FailurePolicy;

/// A worker that fails once, in `iteration`, at rank 1: a lost disk, a killed process.
struct FailsOnce {
    inner: labels::Propagate,
    fail_in: Option<u64>,
}

impl WorkerComputable for FailsOnce {
    type MasterResult = labels::Labels;
    type WorkerResult = labels::Labels;

    fn init(
        &mut self,
        ctx: &mut WorkerContext<labels::Labels, labels::Labels>,
    ) -> Result<(), BoxError> {
        self.inner.init(ctx)
    }

    fn compute(
        &mut self,
        ctx: &mut WorkerContext<labels::Labels, labels::Labels>,
    ) -> Result<labels::Labels, BoxError> {
        if Some(ctx.iteration()) == self.fail_in {
            return Err(format!("worker {} lost its disk", ctx.rank()).into());
        }
        self.inner.compute(ctx)
    }
}

fn main() -> ExitCode {
    let arg = |i: usize, default: u64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (vertices, edges, workers) = (
        arg(1, 200_000) as u32,
        arg(2, 600_000) as usize,
        arg(3, 4) as usize,
    );
    let graph = labels::graph(vertices, edges, 7);
    let expected = labels::components(&graph);
    let count = |l: &labels::Labels| {
        l.iter()
            .enumerate()
            .filter(|&(v, &c)| v as u32 == c)
            .count()
    };
    println!(
        "{vertices} vertices, {edges} edges: {} components",
        count(&expected)
    );

    // A job whose rank 1 fails once in iteration 3, under `policy`.
    let failing = |policy: FailurePolicy| {
        let first = Arc::new(AtomicBool::new(true));
        let graph = Arc::clone(&graph);
        Job::builder(labels::Gather, move |rank| FailsOnce {
            inner: labels::Propagate::new(Arc::clone(&graph)),
            fail_in: (rank == 1 && first.swap(false, Ordering::SeqCst)).then_some(3),
        })
        .workers(workers)
        .iterations(10_000)
        .failure_policy(policy)
        .checkpoint(MemoryCheckpointStore::new(), 2)
    };
    let runs = [
        ("fault-free", labels::job(Arc::clone(&graph), workers).run()),
        (
            "a worker replaced",
            failing(FailurePolicy::RestartWorker { max_restarts: 1 }).run(),
        ),
        (
            "all restarted from a checkpoint",
            failing(FailurePolicy::RestartAll { max_attempts: 2 }).run(),
        ),
    ];
    let mut right = true;
    for (name, outcome) in runs {
        match outcome {
            Ok(o) => {
                let same = *o.result == expected;
                right &= same;
                println!(
                    "{name:>32}: {} iterations, {} recoveries, {} components — {}",
                    o.iterations,
                    o.report.recoveries.len(),
                    count(&o.result),
                    if same {
                        "the sequential answer"
                    } else {
                        "WRONG"
                    }
                );
            }
            Err(e) => {
                eprintln!("{name}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if right {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
