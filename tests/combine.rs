//! Combining worker results as they arrive (`JobBuilder::combine`): the same result as
//! folding them all at the end, fewer results held, and a failing combiner fails the job.

#[path = "../examples/support/lr.rs"]
mod lr;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use superstep::prelude::*;
use superstep::{JobBuilder, Phase, Placement};

fn lr_job(data: &Arc<lr::Dataset>, workers: usize) -> JobBuilder<lr::Model, lr::Gradient> {
    lr::job(data, workers, 0.5).iterations(6)
}

fn bits(m: &lr::Model) -> Vec<u64> {
    m.weights.iter().map(|w| w.to_bits()).collect()
}

#[test]
fn combining_as_results_arrive_gives_the_same_model_bit_for_bit() {
    let data = Arc::new(lr::Dataset::generate(6_000, 7, 5));
    for workers in [1, 2, 5, 8] {
        let folded = lr_job(&data, workers).run().unwrap();
        let combined = lr_job(&data, workers)
            .combine(lr::Gradient::add)
            .run()
            .unwrap();
        assert_eq!(
            bits(&combined.result),
            bits(&folded.result),
            "{workers} workers"
        );
        assert_eq!(combined.iterations, 6);
        for it in &folded.report.iterations {
            assert_eq!(
                it.results_held, workers,
                "without combining: one per worker"
            );
        }
        for it in &combined.report.iterations {
            assert!((1..=workers).contains(&it.results_held), "{it:?}");
        }
    }
}

/// Vectors whose values say who made them, so a fold that skipped, repeated or reordered
/// a rank would show.
struct Tagged;

impl WorkerComputable for Tagged {
    type MasterResult = Vec<f64>;
    type WorkerResult = Vec<f64>;

    fn compute(
        &mut self,
        ctx: &mut WorkerContext<Vec<f64>, Vec<f64>>,
    ) -> Result<Vec<f64>, BoxError> {
        // Deliver in rank order, well apart, so the fold never waits for a lower rank.
        thread::sleep(Duration::from_millis(40 * ctx.rank() as u64));
        Ok(vec![ctx.rank() as f64 + 1.0; 1_000])
    }
}

struct Decimal;

impl MasterComputable for Decimal {
    type MasterResult = Vec<f64>;
    type WorkerResult = Vec<f64>;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<Vec<f64>, Vec<f64>>,
    ) -> Result<Step<Vec<f64>>, BoxError> {
        let folded = ctx
            .take_combined_result()
            .ok_or("the job combines: the fold must be there")?;
        assert!(ctx.worker_results().is_empty());
        Ok(Step::Continue(folded))
    }
}

#[test]
fn results_in_rank_order_are_folded_as_they_arrive_so_the_master_holds_two_not_n() {
    let workers = 6;
    let run = |combine: bool| {
        let mut job = Job::builder(Decimal, |_| Tagged)
            .workers(workers)
            .iterations(2)
            .compute_threads(workers)
            .placement(Placement::Pool);
        if combine {
            // Shifts the fold one decimal digit left per rank: the order shows in the value.
            job = job.combine(|fold: &mut Vec<f64>, next: Vec<f64>| {
                fold.iter_mut()
                    .zip(next)
                    .for_each(|(a, b)| *a = *a * 10.0 + b)
            });
        }
        job.run()
    };
    let outcome = run(true).unwrap();
    assert!(
        outcome.result.iter().all(|&v| v == 123_456.0),
        "{:?}",
        &outcome.result[..3]
    );
    for it in &outcome.report.iterations {
        // The fold and the result that just arrived: never one per worker.
        assert!(it.results_held <= 3, "{it:?}");
    }
    let err = run(false).unwrap_err();
    assert!(err.to_string().contains("the fold must be there"), "{err}");
}

#[test]
fn a_panicking_combiner_fails_the_job_as_the_masters_combine_phase() {
    let err = lr_job(&Arc::new(lr::Dataset::generate(400, 3, 1)), 3)
        .combine(|_: &mut lr::Gradient, next: lr::Gradient| {
            assert!(next.rows == 0, "cannot combine {} rows", next.rows)
        })
        .run()
        .unwrap_err();
    match err {
        JobError::Master {
            iteration, phase, ..
        } => {
            assert_eq!(iteration, 1);
            assert_eq!(phase, Phase::Combine);
        }
        other => panic!("unexpected {other}"),
    }
    assert!(JobError::to_string(
        &lr_job(&Arc::new(lr::Dataset::generate(400, 3, 1)), 2)
            .combine(|_: &mut lr::Gradient, _: lr::Gradient| panic!("no"))
            .run()
            .unwrap_err()
    )
    .contains("combine"),);
}
