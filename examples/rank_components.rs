//! Connected components written on the rank-level messages (`examples/connected_components.rs`
//! is the vertex program):
//! a vertex whose label fell tells its neighbours on other ranks by a message, combined to
//! the least label per vertex (see `examples/support/components.rs`). Checked against a
//! sequential union-find; prints each superstep's messages and bytes.
//!
//! ```text
//! cargo run --release --example rank_components                  # 1M vertices, 10M edges
//! cargo run --release --example rank_components -- --vertices 200000 --edges 2000000 --workers 4
//! cargo run --release --example rank_components -- --workers 2 --rayon   # and by hand
//! cargo build --release --example rank_components && \
//!   cargo run --release --features launcher --bin superstep-launch -- --nproc 4 -- \
//!   target/release/examples/rank_components
//! ```
//!
//! The same binary runs both ways: `cluster_from_env` takes the cluster from the
//! launcher's environment when it is there, and runs every rank in memory otherwise.

#[path = "support/components.rs"]
mod components;
#[path = "support/graph.rs"]
mod graph;

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

/// Connected components with messages between supersteps.
#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    graph: graph::GraphArgs,
    /// Also time the same algorithm written by hand with rayon, on as many threads as
    /// workers.
    #[arg(long)]
    rayon: bool,
}

fn main() -> ExitCode {
    graph::log_to_stderr();
    let args = Args::parse();
    let ran = match graph::run(&args.graph, "connected-components", components::job) {
        Ok(ran) => ran,
        Err(code) => return code,
    };
    let got = *ran.outcome.result;
    println!(
        "{} components after {} supersteps in {:.2?}",
        got.roots, ran.outcome.iterations, ran.took
    );
    let sequential = Instant::now();
    let want = components::expected(&graph::components(&ran.graph));
    if (got.digest, got.roots) != (want.digest, want.roots) {
        eprintln!(
            "wrong: {} components (digest {:#x}), the sequential union-find finds {} ({:#x})",
            got.roots, got.digest, want.roots, want.digest
        );
        return ExitCode::FAILURE;
    }
    println!(
        "the same components as a sequential union-find ({:.2?})",
        sequential.elapsed()
    );
    if args.rayon && ran.runs_master {
        let started = Instant::now();
        let (labels, supersteps) = components::with_rayon(&ran.graph, ran.workers);
        let took = started.elapsed();
        let same = components::expected(&labels) == want;
        println!(
            "by hand with rayon on {} threads: {supersteps} supersteps in {took:.2?} (same components: {same})",
            ran.workers
        );
    }
    ExitCode::SUCCESS
}
