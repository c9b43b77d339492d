//! PageRank written on the rank-level messages (`examples/pagerank.rs` is the vertex
//! program; this is what it runs on, by hand). A vertex
//! sends its rank, divided among its neighbours, to those on other ranks by a message,
//! summed per vertex (see `examples/support/pagerank.rs`). Checked against the same
//! updates computed in one thread; prints each superstep's messages and bytes.
//!
//! ```text
//! cargo run --release --example rank_pagerank                  # 1M vertices, 10M edges, 20 supersteps
//! cargo run --release --example rank_pagerank -- --vertices 200000 --edges 2000000 --workers 4
//! cargo build --release --example rank_pagerank && \
//!   cargo run --release --features launcher --bin superstep-launch -- --nproc 4 -- \
//!   target/release/examples/rank_pagerank
//! ```
//!
//! The same binary runs both ways: `cluster_from_env` takes the cluster from the
//! launcher's environment when it is there, and runs every rank in memory otherwise.

#[path = "support/graph.rs"]
mod graph;
#[path = "support/pagerank.rs"]
mod pagerank;

use std::process::ExitCode;

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
    graph::log_to_stderr();
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
    pagerank::check(graph, args.supersteps, ranks)
}
