//! Logistic regression by batch gradient descent, as a superstep job and as a plain
//! sequential loop, on a generated, seeded data set.
//!
//! Shared by `examples/logistic_regression.rs` and the tests.

#![allow(dead_code)]

use std::ops::Range;
use std::sync::Arc;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use superstep::coordinator::Shard;
use superstep::prelude::*;

/// Rows of features and 0/1 labels, row-major.
pub struct Dataset {
    pub rows: usize,
    pub features: usize,
    pub x: Vec<f64>,
    pub y: Vec<f64>,
}

impl Dataset {
    /// `rows` rows of `features` features uniform in [-1, 1], labelled by a logistic model
    /// with hidden weights; the same seed gives the same data.
    pub fn generate(rows: usize, features: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let truth: Vec<f64> = (0..features).map(|_| rng.random_range(-2.0..2.0)).collect();
        let mut x = Vec::with_capacity(rows * features);
        let mut y = Vec::with_capacity(rows);
        for _ in 0..rows {
            let row: Vec<f64> = (0..features).map(|_| rng.random_range(-1.0..1.0)).collect();
            let p = sigmoid(dot(&row, &truth));
            y.push(if rng.random::<f64>() < p { 1.0 } else { 0.0 });
            x.extend_from_slice(&row);
        }
        Dataset {
            rows,
            features,
            x,
            y,
        }
    }

    fn row(&self, i: usize) -> &[f64] {
        &self.x[i * self.features..(i + 1) * self.features]
    }
}

/// `rows` split into `workers` contiguous ranges of nearly equal size.
pub fn split(rows: usize, workers: usize) -> Vec<Range<usize>> {
    (0..workers)
        .map(|r| (r * rows / workers)..((r + 1) * rows / workers))
        .collect()
}

pub fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// The log-loss of one row, computed stably.
fn log_loss(z: f64, y: f64) -> f64 {
    // -(y ln p + (1-y) ln(1-p)) with p = sigmoid(z), written as softplus(z) - y z.
    let softplus = if z > 0.0 {
        z + (-z).exp().ln_1p()
    } else {
        z.exp().ln_1p()
    };
    softplus - y * z
}

/// One worker's contribution: the gradient and loss summed over its rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Gradient {
    pub grad: Vec<f64>,
    pub loss: f64,
    pub rows: u64,
}

impl Gradient {
    /// Adds `other` into `self`: the combiner of a job that sums gradients as they arrive
    /// (`JobBuilder::combine`).
    pub fn add(&mut self, other: Gradient) {
        self.add_from(&other);
    }

    fn add_from(&mut self, other: &Gradient) {
        for (t, x) in self.grad.iter_mut().zip(&other.grad) {
            *t += x;
        }
        self.loss += other.loss;
        self.rows += other.rows;
    }
}

/// The model after an iteration, and the mean loss of the weights it was computed from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Model {
    pub weights: Vec<f64>,
    pub loss: f64,
}

impl Model {
    /// The weights' bits, in hex: two runs agree on these only when they agree bit for
    /// bit.
    pub fn bits(&self) -> String {
        self.weights
            .iter()
            .map(|w| format!("{:016x}", w.to_bits()))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Adds the gradient and loss of rows `range` at `weights` into `acc`.
fn accumulate(data: &Dataset, range: Range<usize>, weights: &[f64], acc: &mut Gradient) {
    for i in range {
        let row = data.row(i);
        let z = dot(row, weights);
        let err = sigmoid(z) - data.y[i];
        for (g, x) in acc.grad.iter_mut().zip(row) {
            *g += err * x;
        }
        acc.loss += log_loss(z, data.y[i]);
        acc.rows += 1;
    }
}

fn step(weights: &[f64], total: &Gradient, rate: f64) -> Model {
    let n = total.rows.max(1) as f64;
    Model {
        weights: weights
            .iter()
            .zip(&total.grad)
            .map(|(w, g)| w - rate * g / n)
            .collect(),
        loss: total.loss / n,
    }
}

/// A worker: the gradient over its rows of the shared data set.
pub struct LrWorker {
    data: Arc<Dataset>,
    range: Range<usize>,
    /// Whether `init` takes the range from the worker's shard of the input.
    sharded: bool,
}

impl LrWorker {
    pub fn new(data: Arc<Dataset>, range: Range<usize>) -> Self {
        LrWorker {
            data,
            range,
            sharded: false,
        }
    }

    /// A worker that reads the rows of its shard of `Input::Rows` (`ctx.shard()`).
    #[allow(dead_code)]
    pub fn sharded(data: Arc<Dataset>) -> Self {
        LrWorker {
            data,
            range: 0..0,
            sharded: true,
        }
    }
}

impl WorkerComputable for LrWorker {
    type MasterResult = Model;
    type WorkerResult = Gradient;

    fn init(&mut self, ctx: &mut WorkerContext<Model, Gradient>) -> Result<(), BoxError> {
        if self.sharded {
            self.range = match ctx.shard() {
                Some(Shard::Rows(rows)) => rows.start as usize..rows.end as usize,
                other => return Err(format!("expected a shard of rows, got {other:?}").into()),
            };
        }
        if self.range.end > self.data.rows {
            return Err(format!(
                "worker {}: rows {:?} are outside the data set of {} rows",
                ctx.rank(),
                self.range,
                self.data.rows
            )
            .into());
        }
        Ok(())
    }

    fn compute(&mut self, ctx: &mut WorkerContext<Model, Gradient>) -> Result<Gradient, BoxError> {
        let zeros = vec![0.0; self.data.features];
        let weights = ctx.last_master_result().map_or(&zeros, |m| &m.weights);
        let mut acc = Gradient {
            grad: vec![0.0; self.data.features],
            loss: 0.0,
            rows: 0,
        };
        accumulate(&self.data, self.range.clone(), weights, &mut acc);
        Ok(acc)
    }
}

/// The master: sums the workers' gradients in rank order and takes one step.
pub struct LrMaster {
    pub features: usize,
    pub rate: f64,
}

impl MasterComputable for LrMaster {
    type MasterResult = Model;
    type WorkerResult = Gradient;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<Model, Gradient>,
    ) -> Result<Step<Model>, BoxError> {
        // With `combine(Gradient::add)` the gradients arrive summed already, in rank order.
        let total = match ctx.take_combined_result() {
            Some(total) => total,
            None => {
                let mut total = Gradient {
                    grad: vec![0.0; self.features],
                    loss: 0.0,
                    rows: 0,
                };
                for g in ctx.worker_results() {
                    total.add_from(g);
                }
                total
            }
        };
        let zeros = vec![0.0; self.features];
        let weights = ctx.last_master_result().map_or(&zeros, |m| &m.weights);
        Ok(Step::Continue(step(weights, &total, self.rate)))
    }
}

/// The job: rows split evenly over `workers`, one descent step of `rate` per iteration.
pub fn job(data: &Arc<Dataset>, workers: usize, rate: f64) -> JobBuilder<Model, Gradient> {
    let ranges = split(data.rows, workers);
    let shared = Arc::clone(data);
    Job::builder(
        LrMaster {
            features: data.features,
            rate,
        },
        move |rank| LrWorker::new(Arc::clone(&shared), ranges[rank].clone()),
    )
    .workers(workers)
}

/// The same descent, single-threaded, with no framework.
pub fn sequential(data: &Dataset, iterations: u64, rate: f64) -> Model {
    let mut model = Model {
        weights: vec![0.0; data.features],
        loss: f64::NAN,
    };
    for _ in 0..iterations {
        let mut acc = Gradient {
            grad: vec![0.0; data.features],
            loss: 0.0,
            rows: 0,
        };
        accumulate(data, 0..data.rows, &model.weights, &mut acc);
        model = step(&model.weights, &acc, rate);
    }
    model
}

/// The same descent written with rayon, as a user would without this library: each
/// iteration a parallel fold of the rows' gradients and a reduce, on the rayon pool this is
/// called in.
pub fn rayon(data: &Dataset, iterations: u64, rate: f64) -> Model {
    use rayon::prelude::*;
    let zero = || Gradient {
        grad: vec![0.0; data.features],
        loss: 0.0,
        rows: 0,
    };
    let mut model = Model {
        weights: vec![0.0; data.features],
        loss: f64::NAN,
    };
    for _ in 0..iterations {
        let weights = &model.weights;
        let total = (0..data.rows)
            .into_par_iter()
            .with_min_len(4096)
            .fold(zero, |mut acc, i| {
                accumulate(data, i..i + 1, weights, &mut acc);
                acc
            })
            .reduce(zero, |mut a, b| {
                a.add_from(&b);
                a
            });
        model = step(&model.weights, &total, rate);
    }
    model
}

/// The largest absolute difference between two weight vectors.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "weight vectors differ in length");
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}
