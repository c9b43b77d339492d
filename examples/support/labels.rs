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

pub use crate::graph::{components, graph, range, Graph, Labels};

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
