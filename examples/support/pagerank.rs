//! PageRank with Pregel's messages: each worker keeps the ranks of its vertex range; in
//! each superstep a vertex sends its rank, divided among its neighbours, to each of them —
//! those in the range directly, the others by a message `(vertex, share)` to the rank that
//! holds them, summed per vertex before it leaves a process and again as it arrives. The
//! rank that dangling vertices (no neighbours) hold goes to every vertex alike, through the
//! master.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use superstep::prelude::*;

use crate::graph::{owner, range, Adjacency, Graph};

/// A message: a vertex, and a share of a neighbour's rank.
pub type Share = (u32, f64);

/// The damping factor.
pub const DAMPING: f64 = 0.85;

/// A worker's sums of a superstep, and in the last one its range's ranks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// The rank its dangling vertices hold.
    pub dangling: f64,
    /// How much its ranks changed (the sum of the differences).
    pub change: f64,
    /// Its ranks, in the last superstep; empty before.
    pub ranks: Vec<f64>,
}

/// Every worker's sums of a superstep added up, and in the last one every rank.
pub type Ranks = Part;

/// The next rank of a vertex told `told` by its neighbours, when the dangling vertices
/// held `dangling` in all, among `vertices`.
fn next(told: f64, dangling: f64, vertices: u32) -> f64 {
    let n = f64::from(vertices);
    (1.0 - DAMPING) / n + DAMPING * (told + dangling / n)
}

/// A worker: its range's neighbours, ranks, and what its vertices were told.
pub struct PageRank {
    graph: Arc<Graph>,
    workers: usize,
    adjacency: Option<Adjacency>,
    ranks: Vec<f64>,
    told: Vec<f64>,
}

impl PageRank {
    pub fn new(graph: Arc<Graph>) -> Self {
        PageRank {
            graph,
            workers: 1,
            adjacency: None,
            ranks: Vec::new(),
            told: Vec::new(),
        }
    }
}

impl WorkerComputable for PageRank {
    type MasterResult = Ranks;
    type WorkerResult = Part;

    fn init(&mut self, ctx: &mut WorkerContext<Ranks, Part>) -> Result<(), BoxError> {
        self.workers = ctx.workers();
        let range = range(self.graph.vertices, ctx.rank(), ctx.workers());
        self.ranks = vec![1.0 / f64::from(self.graph.vertices); range.len()];
        self.told = vec![0.0; range.len()];
        self.adjacency = Some(Adjacency::of(&self.graph, range));
        Ok(())
    }

    fn compute(&mut self, ctx: &mut WorkerContext<Ranks, Part>) -> Result<Part, BoxError> {
        let adjacency = self.adjacency.as_ref().ok_or("compute before init")?;
        let (start, vertices) = (adjacency.range.start, self.graph.vertices);
        let mut part = Part::default();
        // From the second superstep: each vertex's rank from what it was told.
        if !ctx.is_first_iteration() {
            for &(v, share) in ctx.messages::<Share>()? {
                self.told[(v - start) as usize] += share;
            }
            let dangling = ctx.last_master_result().map_or(0.0, |r| r.dangling);
            for (rank, told) in self.ranks.iter_mut().zip(&mut self.told) {
                let new = next(std::mem::take(told), dangling, vertices);
                part.change += (new - *rank).abs();
                *rank = new;
            }
        }
        // Each vertex's rank, shared among its neighbours.
        for (i, &rank) in self.ranks.iter().enumerate() {
            let around = adjacency.around(i);
            if around.is_empty() {
                part.dangling += rank;
                continue;
            }
            let share = rank / around.len() as f64;
            for &w in around {
                if adjacency.range.contains(&w) {
                    self.told[(w - start) as usize] += share;
                } else {
                    ctx.send(owner(vertices, self.workers, w), (w, share))?;
                }
            }
        }
        if ctx.iteration() == ctx.iterations() {
            part.ranks = self.ranks.clone();
        }
        Ok(part)
    }
}

/// The master: the sums of every worker's, and in the last superstep every rank in
/// vertex order.
pub struct Gather;

impl MasterComputable for Gather {
    type MasterResult = Ranks;
    type WorkerResult = Part;

    fn compute(&mut self, ctx: &mut MasterContext<Ranks, Part>) -> Result<Step<Ranks>, BoxError> {
        let mut all = Ranks::default();
        for part in ctx.worker_results() {
            all.dangling += part.dangling;
            all.change += part.change;
            all.ranks.extend_from_slice(&part.ranks);
        }
        Ok(Step::Continue(all))
    }
}

/// The job on `graph`: `supersteps` supersteps, the first sharing the first ranks out.
pub fn job(graph: Arc<Graph>, supersteps: u64) -> JobBuilder<Ranks, Part> {
    Job::builder(Gather, move |_| PageRank::new(Arc::clone(&graph)))
        .iterations(supersteps)
        .combine_messages(|m: &Share| m.0, |into, m| into.1 += m.1)
}

/// The same ranks computed in one thread: `supersteps - 1` updates.
pub fn sequential(graph: &Graph, supersteps: u64) -> Vec<f64> {
    let all = Adjacency::of(graph, 0..graph.vertices);
    let n = graph.vertices as usize;
    let mut ranks = vec![1.0 / f64::from(graph.vertices); n];
    for _ in 1..supersteps {
        let mut told = vec![0.0; n];
        let mut dangling = 0.0;
        for (v, &rank) in ranks.iter().enumerate() {
            let around = all.around(v);
            if around.is_empty() {
                dangling += rank;
            }
            for &w in around {
                told[w as usize] += rank / around.len() as f64;
            }
        }
        for (rank, told) in ranks.iter_mut().zip(told) {
            *rank = next(told, dangling, graph.vertices);
        }
    }
    ranks
}

/// Checks `ranks` against [`sequential`]'s, printing what it found: shares are summed in
/// another order than one thread sums them, so the last bits may differ.
pub fn check(graph: &Graph, supersteps: u64, ranks: &[f64]) -> std::process::ExitCode {
    let started = std::time::Instant::now();
    let want = sequential(graph, supersteps);
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
        return std::process::ExitCode::FAILURE;
    }
    println!(
        "the ranks of the updates computed in one thread, within {worst:.1e} ({:.2?})",
        started.elapsed()
    );
    std::process::ExitCode::SUCCESS
}
