//! Single-source shortest paths as a vertex program (Pregel's own example): a vertex
//! that hears of a shorter way from the source takes it and offers its neighbours the
//! way through it, each edge's weight on top; the job ends when no way shortens. Checked
//! against Dijkstra's algorithm in one thread.
//!
//! ```text
//! cargo run --release --example shortest_paths                  # 1M vertices, 10M edges
//! cargo run --release --example shortest_paths -- --vertices 200000 --edges 2000000 --workers 4
//! cargo build --release --example shortest_paths && \
//!   cargo run --release --features launcher --bin superstep-launch -- --nproc 3 -- \
//!   target/release/examples/shortest_paths
//! ```

#[path = "support/graph.rs"]
mod graph;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::process::ExitCode;

use clap::Parser;
use superstep::graph::{Context, GraphInfo, GraphJob, Messages, Vertex, VertexProgram};
use superstep::BoxError;

/// Distances from one source; `u64::MAX` for a vertex it does not reach.
struct ShortestPaths {
    source: u32,
}

impl VertexProgram for ShortestPaths {
    type Id = u32;
    type Value = u64;
    /// The edge's length.
    type Edge = u32;
    type Message = u64;
    type Aggregate = ();

    fn initial(&self, id: u32, _: &GraphInfo) -> u64 {
        if id == self.source {
            0
        } else {
            u64::MAX
        }
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        offered: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        let shortest = offered.copied().min().unwrap_or(u64::MAX);
        let reached = ctx.superstep() == 0 && vertex.id() == self.source;
        if reached || shortest < *vertex.value() {
            vertex.set_value(shortest.min(*vertex.value()));
            let here = *vertex.value();
            for i in 0..vertex.degree() {
                let (to, length) = (vertex.targets()[i], vertex.edge_values()[i]);
                ctx.send(to, here + u64::from(length))?;
            }
        }
        vertex.vote_to_halt();
        Ok(())
    }
}

/// The length of edge `u - v`: from 1 to 16, the same both ways.
fn length(u: u32, v: u32) -> u32 {
    let (a, b) = (u.min(v) as u64, u.max(v) as u64);
    ((a.wrapping_mul(0x9e37_79b9) ^ b.wrapping_mul(0x85eb_ca6b)) % 16) as u32 + 1
}

/// Dijkstra's algorithm from `source`, in one thread: what the job must give.
fn dijkstra(graph: &graph::Graph, source: u32) -> Vec<u64> {
    let all = graph::Adjacency::of(graph, 0..graph.vertices);
    let mut distance = vec![u64::MAX; graph.vertices as usize];
    let mut heap = BinaryHeap::from([Reverse((0u64, source))]);
    while let Some(Reverse((d, u))) = heap.pop() {
        if d >= distance[u as usize] {
            continue;
        }
        distance[u as usize] = d;
        for &v in all.around(u as usize) {
            heap.push(Reverse((d + u64::from(length(u, v)), v)));
        }
    }
    distance
}

/// Single-source shortest paths as a vertex program.
#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    graph: graph::GraphArgs,
    /// The source vertex.
    #[arg(long, default_value_t = 0)]
    source: u32,
}

fn main() -> ExitCode {
    graph::log_to_stderr();
    let args = Args::parse();
    let source = args.source;
    let ran = graph::run(&args.graph, "shortest-paths", |g| {
        let edges = std::sync::Arc::clone(&g);
        GraphJob::builder(ShortestPaths { source })
            .edges(move |add| {
                for &(u, v) in &edges.edges {
                    add(u, v, length(u, v));
                    add(v, u, length(u, v));
                }
            })
            .vertices(u64::from(g.vertices))
            .combine(|shortest, way| *shortest = (*shortest).min(way))
            .job()
    });
    let ran = match ran {
        Ok(ran) if ran.runs_master => ran,
        Ok(_) => return ExitCode::SUCCESS,
        Err(code) => return code,
    };
    let result = &ran.outcome.result;
    let got: Vec<u64> = result.values().iter().map(|&(_, d)| d).collect();
    let reached = got.iter().filter(|&&d| d != u64::MAX).count();
    let far = got
        .iter()
        .filter(|&&d| d != u64::MAX)
        .max()
        .copied()
        .unwrap_or(0);
    println!("{reached} vertices reached from {source}, the farthest {far} away, after {} supersteps in {:.2?}", result.supersteps, ran.took);
    if got != dijkstra(&ran.graph, source) {
        eprintln!("wrong: not the distances of Dijkstra's algorithm");
        return ExitCode::FAILURE;
    }
    println!("the same distances as Dijkstra's algorithm in one thread");
    ExitCode::SUCCESS
}
