//! Connected components by label propagation, written so that recovery gives the
//! fault-free answer: a worker's state is either loaded again by `init` (its shard: the
//! edges of its vertices) or derived, every iteration, from the master result (the labels
//! of every vertex) — never carried from one iteration to the next in the worker alone.
//!
//! A replaced worker (`FailurePolicy::RestartWorker`) is a new instance: `init` loads its
//! shard again, and its first compute reads the current master result, as the worker it
//! replaces would have. A job resumed from a checkpoint (`RestartAll`, a master's process
//! started again) resumes from the master result the checkpoint holds, which is again
//! all a worker needs. A worker that kept its labels in itself and only sent changes
//! would restart with the labels of iteration 0: its answer would depend on whether it
//! failed.

use std::ops::Range;
use std::sync::Arc;

use superstep::prelude::*;

/// Every vertex's label: the smallest vertex id known to be in its component.
pub type Labels = Vec<u32>;

/// An undirected graph of `vertices` vertices.
pub struct Graph {
    pub vertices: u32,
    pub edges: Vec<(u32, u32)>,
}

/// A graph of `vertices` vertices and `edges` edges drawn uniformly from `seed` (a 64-bit
/// LCG): a large component of short diameter, and small ones beside it.
pub fn graph(vertices: u32, edges: usize, seed: u64) -> Arc<Graph> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    let edges = (0..edges)
        .map(|_| (next() % vertices, next() % vertices))
        .collect();
    Arc::new(Graph { vertices, edges })
}

/// The components of `graph` computed in one thread (union-find): what the job must give.
pub fn components(graph: &Graph) -> Labels {
    let mut parent: Vec<u32> = (0..graph.vertices).collect();
    fn root(parent: &mut [u32], mut v: u32) -> u32 {
        while parent[v as usize] != v {
            parent[v as usize] = parent[parent[v as usize] as usize];
            v = parent[v as usize];
        }
        v
    }
    for &(u, v) in &graph.edges {
        let (a, b) = (root(&mut parent, u), root(&mut parent, v));
        // The smaller id is the root, so a component's root is its smallest vertex.
        if a < b {
            parent[b as usize] = a;
        } else if b < a {
            parent[a as usize] = b;
        }
    }
    (0..graph.vertices).map(|v| root(&mut parent, v)).collect()
}

/// The vertices of rank `rank` of `workers`: an even range of ids.
pub fn range(vertices: u32, rank: usize, workers: usize) -> Range<u32> {
    let share = |r: usize| (vertices as u64 * r as u64 / workers as u64) as u32;
    share(rank)..share(rank + 1)
}

/// A worker: the neighbours of its vertices (its shard, loaded by `init`), and nothing
/// else that lasts from one iteration to the next.
pub struct Propagate {
    graph: Arc<Graph>,
    range: Range<u32>,
    /// Each of its vertices' neighbours, from `init`.
    neighbours: Vec<Vec<u32>>,
}

impl Propagate {
    pub fn new(graph: Arc<Graph>) -> Self {
        Propagate {
            graph,
            range: 0..0,
            neighbours: Vec::new(),
        }
    }
}

impl WorkerComputable for Propagate {
    type MasterResult = Labels;
    type WorkerResult = Labels;

    /// Loads the shard: run again by a worker that replaces this one.
    fn init(&mut self, ctx: &mut WorkerContext<Labels, Labels>) -> Result<(), BoxError> {
        self.range = range(self.graph.vertices, ctx.rank(), ctx.workers());
        let start = self.range.start;
        self.neighbours = vec![Vec::new(); self.range.len()];
        for &(u, v) in &self.graph.edges {
            if self.range.contains(&u) {
                self.neighbours[(u - start) as usize].push(v);
            }
            if self.range.contains(&v) {
                self.neighbours[(v - start) as usize].push(u);
            }
        }
        Ok(())
    }

    /// This range's labels of the next iteration, from every vertex's labels of this one
    /// — the master result, the same for the worker that ran the last iteration and for a
    /// new one that replaces it.
    fn compute(&mut self, ctx: &mut WorkerContext<Labels, Labels>) -> Result<Labels, BoxError> {
        let labels = ctx.last_master_result();
        let label = |v: u32| labels.map_or(v, |l| l[v as usize]);
        Ok(self
            .range
            .clone()
            .zip(&self.neighbours)
            .map(|(v, around)| around.iter().fold(label(v), |low, &n| low.min(label(n))))
            .collect())
    }
}

/// The master: every range's labels, in rank order, are the next labels; it halts when
/// none changed. Its result is all the job's state, so a checkpoint holds all of it.
pub struct Gather;

impl MasterComputable for Gather {
    type MasterResult = Labels;
    type WorkerResult = Labels;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<Labels, Labels>,
    ) -> Result<Step<Labels>, BoxError> {
        let next: Labels = ctx.worker_results().iter().flatten().copied().collect();
        if ctx.last_master_result() == Some(&next) {
            Ok(Step::Halt(next))
        } else {
            Ok(Step::Continue(next))
        }
    }
}

/// The job on `graph` with `workers` workers.
pub fn job(graph: Arc<Graph>, workers: usize) -> JobBuilder<Labels, Labels> {
    Job::builder(Gather, move |_| Propagate::new(Arc::clone(&graph)))
        .workers(workers)
        .iterations(10_000)
}
