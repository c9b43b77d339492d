//! PageRank as a vertex program: each vertex shares its rank among its neighbours, and
//! takes what it was told, summed by a combiner; the rank that vertices without
//! neighbours hold is aggregated and shared by every vertex alike. Checked against the
//! same updates computed in one thread.
//!
//! ```text
//! cargo run --release --example pagerank                  # 1M vertices, 10M edges, 20 supersteps
//! cargo run --release --example pagerank -- --vertices 200000 --edges 2000000 --workers 4
//! cargo build --release --example pagerank && \
//!   cargo run --release --features launcher --bin superstep-launch -- --nproc 3 -- \
//!   target/release/examples/pagerank
//! ```

#[path = "support/graph.rs"]
mod graph;
// Its sequential check; the rest is the rank-level example's.
#[allow(dead_code)]
#[path = "support/pagerank.rs"]
mod pagerank;

use std::process::ExitCode;

use clap::Parser;
use superstep::graph::{Context, GraphInfo, GraphJob, Messages, Vertex, VertexProgram};
use superstep::BoxError;

const DAMPING: f64 = 0.85;

/// PageRank over `supersteps` supersteps: the first shares the first ranks out.
struct PageRank {
    supersteps: u64,
}

impl VertexProgram for PageRank {
    type Id = u32;
    type Value = f64;
    type Edge = ();
    type Message = f64;
    /// The rank the vertices without neighbours hold.
    type Aggregate = f64;

    fn initial(&self, _: u32, graph: &GraphInfo) -> f64 {
        1.0 / graph.vertices as f64
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        told: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        if ctx.superstep() > 0 {
            let n = ctx.graph().vertices as f64;
            let told: f64 = told.sum();
            vertex.set_value((1.0 - DAMPING) / n + DAMPING * (told + ctx.aggregated() / n));
        }
        if ctx.superstep() + 1 == self.supersteps {
            vertex.vote_to_halt();
        } else if vertex.degree() == 0 {
            ctx.aggregate(*vertex.value())?;
        } else {
            ctx.send_to_neighbours(vertex, vertex.value() / vertex.degree() as f64)?;
        }
        Ok(())
    }
}

/// PageRank as a vertex program.
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
    let ran = graph::run(&args.graph, "pagerank", |g| {
        GraphJob::builder(PageRank { supersteps })
            .edges(graph::undirected(&g))
            .vertices(u64::from(g.vertices))
            .combine(|sum, share| *sum += share)
            .aggregate(|sum, rank| *sum += rank)
            .job()
    });
    let ran = match ran {
        Ok(ran) if ran.runs_master => ran,
        Ok(_) => return ExitCode::SUCCESS,
        Err(code) => return code,
    };
    let values = ran.outcome.result.values();
    println!(
        "{} supersteps in {:.2?}; the ranks sum to {:.9}",
        ran.outcome.result.supersteps,
        ran.took,
        values.iter().map(|&(_, r)| r).sum::<f64>()
    );
    if args.no_check {
        return ExitCode::SUCCESS;
    }
    let ranks: Vec<f64> = values.iter().map(|&(_, r)| r).collect();
    pagerank::check(&ran.graph, supersteps, &ranks)
}
