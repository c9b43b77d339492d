//! Connected components as a vertex program: each vertex takes the least label it hears
//! of, tells its neighbours when its label fell, and votes to halt; the job ends when no
//! label falls. Checked against a sequential union-find.
//!
//! ```text
//! cargo run --release --example connected_components                  # 1M vertices, 10M edges
//! cargo run --release --example connected_components -- --vertices 200000 --edges 2000000 --workers 4
//! cargo build --release --example connected_components && \
//!   cargo run --release --features launcher --bin superstep-launch -- --nproc 3 -- \
//!   target/release/examples/connected_components
//! ```

#[path = "support/graph.rs"]
mod graph;

use std::process::ExitCode;

use clap::Parser;
use superstep::graph::{Context, GraphInfo, GraphJob, Messages, Vertex, VertexProgram};
use superstep::BoxError;

/// Label propagation: a vertex's label is the least id it heard of.
struct Components;

impl VertexProgram for Components {
    type Id = u32;
    type Value = u32;
    type Edge = ();
    type Message = u32;
    type Aggregate = ();

    fn initial(&self, id: u32, _: &GraphInfo) -> u32 {
        id
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        heard: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        let least = heard.copied().min().unwrap_or(u32::MAX);
        if ctx.superstep() == 0 || least < *vertex.value() {
            vertex.set_value(least.min(*vertex.value()));
            ctx.send_to_neighbours(vertex, *vertex.value())?;
        }
        vertex.vote_to_halt();
        Ok(())
    }
}

/// Connected components as a vertex program.
#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    graph: graph::GraphArgs,
}

fn main() -> ExitCode {
    graph::log_to_stderr();
    let args = Args::parse();
    let ran = graph::run(&args.graph, "connected-components", |g| {
        GraphJob::builder(Components)
            .edges(graph::undirected(&g))
            .vertices(u64::from(g.vertices))
            .combine(|least, label| *least = (*least).min(label))
            .job()
    });
    let ran = match ran {
        Ok(ran) if ran.runs_master => ran,
        Ok(_) => return ExitCode::SUCCESS,
        Err(code) => return code,
    };
    let result = &ran.outcome.result;
    let labels: Vec<u32> = result.values().iter().map(|&(_, label)| label).collect();
    let roots = labels
        .iter()
        .enumerate()
        .filter(|&(v, &l)| v as u32 == l)
        .count();
    println!(
        "{roots} components after {} supersteps in {:.2?}",
        result.supersteps, ran.took
    );
    if labels != graph::components(&ran.graph) {
        eprintln!("wrong: not the components of a sequential union-find");
        return ExitCode::FAILURE;
    }
    println!("the same components as a sequential union-find");
    ExitCode::SUCCESS
}
