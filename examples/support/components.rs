//! Connected components with Pregel's messages: each worker keeps the labels of its
//! vertex range, and a vertex whose label fell tells its neighbours — those in the range
//! directly, the others by a message `(vertex, label)` to the rank that holds them,
//! combined to the least label per vertex before it leaves and again as it arrives.
//! A worker with nothing left to tell votes to halt; the job ends when every worker did
//! and no message is on its way.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use superstep::prelude::*;

use crate::graph::{owner, range, Adjacency, Graph, Labels};

/// A message: a vertex, and a label its neighbour has.
pub type Label = (u32, u32);

/// What the labels of some vertices come to: how many changed in a superstep, a digest of
/// every label, and how many vertices are their component's root (its smallest vertex):
/// the components.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sum {
    pub changed: u64,
    pub digest: u64,
    pub roots: u64,
}

impl Sum {
    /// The sum of `labels` of the vertices `range` (what a worker reports, and what the
    /// sequential answer gives for the whole graph).
    pub fn of(range: Range<u32>, labels: &[u32], changed: u64) -> Sum {
        let mut sum = Sum {
            changed,
            ..Sum::default()
        };
        for (v, &l) in range.zip(labels) {
            sum.digest = sum.digest.wrapping_add(mix(v, l));
            sum.roots += u64::from(v == l);
        }
        sum
    }

    fn add(&mut self, other: &Sum) {
        self.changed += other.changed;
        self.digest = self.digest.wrapping_add(other.digest);
        self.roots += other.roots;
    }
}

/// A vertex and its label, mixed into 64 bits.
fn mix(v: u32, l: u32) -> u64 {
    let x = (u64::from(v) << 32 | u64::from(l)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

/// The sum of the sequential answer.
pub fn expected(labels: &Labels) -> Sum {
    Sum::of(0..labels.len() as u32, labels, 0)
}

const NONE: u32 = u32::MAX;

/// A worker: its range's neighbours and labels, and the least label each vertex of the
/// range was told this superstep by a vertex of the range.
pub struct Components {
    graph: Arc<Graph>,
    workers: usize,
    adjacency: Adjacency,
    labels: Vec<u32>,
    told: Vec<u32>,
    /// The vertices (as indexes into the range) in `told`.
    touched: Vec<u32>,
}

impl Components {
    pub fn new(graph: Arc<Graph>) -> Self {
        Components {
            graph,
            workers: 1,
            adjacency: Adjacency {
                range: 0..0,
                offsets: vec![0],
                targets: Vec::new(),
            },
            labels: Vec::new(),
            told: Vec::new(),
            touched: Vec::new(),
        }
    }

    /// Vertex index `i` of the range is told `label`.
    fn tell(&mut self, i: usize, label: u32) {
        if label < self.told[i] {
            if self.told[i] == NONE {
                self.touched.push(i as u32);
            }
            self.told[i] = label;
        }
    }
}

impl WorkerComputable for Components {
    type MasterResult = Sum;
    type WorkerResult = Sum;

    fn init(&mut self, ctx: &mut WorkerContext<Sum, Sum>) -> Result<(), BoxError> {
        self.workers = ctx.workers();
        let range = range(self.graph.vertices, ctx.rank(), ctx.workers());
        self.labels = range.clone().collect();
        self.told = vec![NONE; range.len()];
        self.adjacency = Adjacency::of(&self.graph, range);
        Ok(())
    }

    fn compute(&mut self, ctx: &mut WorkerContext<Sum, Sum>) -> Result<Sum, BoxError> {
        let range = self.adjacency.range.clone();
        let start = range.start;
        // Which labels fell: every vertex in the first superstep, then those told less
        // than their label, by their range or by a message.
        let changed: Vec<u32> = if ctx.is_first_iteration() {
            (0..range.len() as u32).collect()
        } else {
            for &(v, label) in ctx.messages::<Label>()? {
                self.tell((v - start) as usize, label);
            }
            let mut changed = Vec::new();
            for i in std::mem::take(&mut self.touched) {
                let told = std::mem::replace(&mut self.told[i as usize], NONE);
                if told < self.labels[i as usize] {
                    self.labels[i as usize] = told;
                    changed.push(i);
                }
            }
            changed
        };
        for &i in &changed {
            let label = self.labels[i as usize];
            for k in self.adjacency.offsets[i as usize]..self.adjacency.offsets[i as usize + 1] {
                let w = self.adjacency.targets[k];
                if range.contains(&w) {
                    if label < self.labels[(w - start) as usize] {
                        self.tell((w - start) as usize, label);
                    }
                } else {
                    ctx.send(owner(self.graph.vertices, self.workers, w), (w, label))?;
                }
            }
        }
        // Nothing left to tell its own vertices: what it told others is on its way, and
        // wakes them.
        if self.touched.is_empty() {
            ctx.vote_halt();
        }
        Ok(Sum::of(range, &self.labels, changed.len() as u64))
    }
}

/// The master: the sum of every range's.
pub struct Total;

impl MasterComputable for Total {
    type MasterResult = Sum;
    type WorkerResult = Sum;

    fn compute(&mut self, ctx: &mut MasterContext<Sum, Sum>) -> Result<Step<Sum>, BoxError> {
        let mut total = Sum::default();
        for sum in ctx.worker_results() {
            total.add(sum);
        }
        Ok(Step::Continue(total))
    }
}

/// The job on `graph`: it ends when no label falls any more.
pub fn job(graph: Arc<Graph>) -> JobBuilder<Sum, Sum> {
    Job::builder(Total, move |_| Components::new(Arc::clone(&graph)))
        .iterations(10_000)
        .worker_halt(true)
        .combine_messages(|m: &Label| m.0, |into, m| into.1 = into.1.min(m.1))
}

/// The same algorithm written by hand with rayon on `threads` threads, for comparison:
/// every vertex's labels in one array; in each superstep the vertices whose label fell
/// tell their neighbours (the least label each is told, an atomic minimum), then those
/// told less than their label take it. Returns the labels and the supersteps.
pub fn with_rayon(graph: &Graph, threads: usize) -> (Labels, u64) {
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    pool.install(|| {
        let all = Adjacency::of(graph, 0..graph.vertices);
        let labels: Vec<AtomicU32> = (0..graph.vertices).map(AtomicU32::new).collect();
        let told: Vec<AtomicU32> = (0..graph.vertices).map(|_| AtomicU32::new(NONE)).collect();
        let mut changed: Vec<u32> = (0..graph.vertices).collect();
        let mut supersteps = 0;
        while !changed.is_empty() {
            supersteps += 1;
            let touched: Vec<u32> = changed
                .par_chunks(4096)
                .flat_map_iter(|chunk| {
                    let mut touched = Vec::new();
                    for &v in chunk {
                        let label = labels[v as usize].load(Relaxed);
                        for &w in all.around(v as usize) {
                            if label < labels[w as usize].load(Relaxed)
                                && told[w as usize].fetch_min(label, Relaxed) == NONE
                            {
                                touched.push(w);
                            }
                        }
                    }
                    touched
                })
                .collect();
            changed = touched
                .par_iter()
                .filter_map(|&w| {
                    let got = told[w as usize].swap(NONE, Relaxed);
                    (got < labels[w as usize].load(Relaxed)).then(|| {
                        labels[w as usize].store(got, Relaxed);
                        w
                    })
                })
                .collect();
        }
        (
            labels.into_iter().map(AtomicU32::into_inner).collect(),
            supersteps,
        )
    })
}
