//! PageRank of a generated graph with Pregel's messages between supersteps: a vertex
//! sends its rank, divided among its neighbours, to those on other ranks by a message,
//! summed per vertex (see `examples/support/pagerank.rs`). Checked against the same
//! updates computed in one thread; prints each superstep's messages and bytes.
//!
//! ```text
//! cargo run --release --example pagerank                  # 1M vertices, 10M edges, 20 supersteps
//! cargo run --release --example pagerank -- --vertices 200000 --edges 2000000 --workers 4
//! cargo build --release --example pagerank && \
//!   cargo run --release --features launcher --bin superstep-launch -- --nproc 4 -- \
//!   target/release/examples/pagerank
//! ```
//!
//! The same binary runs both ways: `cluster_from_env` takes the cluster from the
//! launcher's environment when it is there, and runs every rank in memory otherwise.

#[path = "support/graph.rs"]
mod graph;
#[path = "support/pagerank.rs"]
mod pagerank;

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

/// PageRank with messages between supersteps.
#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    graph: graph::GraphArgs,
    /// Supersteps (the first shares the first ranks out).
    #[arg(long, default_value_t = 20)]
    supersteps: u64,
    /// Skip the check against the updates computed in one thread.
    #[arg(long)]
    no_check: bool,
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
    let supersteps = args.supersteps;
    let ran = match graph::run(&args.graph, "pagerank", |g| pagerank::job(g, supersteps)) {
        Ok(ran) => ran,
        Err(code) => return code,
    };
    if !ran.runs_master {
        return ExitCode::SUCCESS;
    }
    let (outcome, took, graph) = (&ran.outcome, ran.took, &ran.graph);
    let ranks = &outcome.result.ranks;
    println!(
        "{} supersteps in {took:.2?}; the ranks sum to {:.9}",
        outcome.iterations,
        ranks.iter().sum::<f64>()
    );
    if args.no_check {
        return ExitCode::SUCCESS;
    }
    let sequential = Instant::now();
    let want = pagerank::sequential(graph, args.supersteps);
    // Shares are summed in another order than one thread sums them: the last bits differ.
    let worst = ranks
        .iter()
        .zip(&want)
        .map(|(got, want)| ((got - want) / want).abs())
        .fold(0.0, f64::max);
    if ranks.len() != want.len() || worst > 1e-9 {
        eprintln!(
            "wrong: {} ranks, {} expected; the largest relative difference {worst:e}",
            ranks.len(),
            want.len()
        );
        return ExitCode::FAILURE;
    }
    println!(
        "the ranks of the updates computed in one thread, within {worst:.1e} ({:.2?})",
        sequential.elapsed()
    );
    ExitCode::SUCCESS
}
