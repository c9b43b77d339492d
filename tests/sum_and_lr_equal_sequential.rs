//! Sum and logistic regression equal their sequential computation for 1, 2, 3, 7 and 16
//! workers, with shards of unequal size and one empty shard.

mod common;
#[path = "../examples/support/lr.rs"]
mod lr;

use std::sync::Arc;

use common::{summing_master, unequal_shards, SumWorker};
use superstep::{Job, Placement};

const WORKER_COUNTS: [usize; 5] = [1, 2, 3, 7, 16];

#[test]
fn the_shards_used_here_are_unequal_cover_every_row_and_include_an_empty_one() {
    for workers in WORKER_COUNTS {
        let shards = unequal_shards(1000, workers);
        assert_eq!(shards.len(), workers);
        assert_eq!(shards.iter().map(|r| r.len()).sum::<usize>(), 1000);
        assert!(shards.windows(2).all(|w| w[0].end == w[1].start));
        if workers > 1 {
            assert!(shards.iter().any(|r| r.is_empty()));
            assert!(
                shards
                    .iter()
                    .map(|r| r.len())
                    .collect::<std::collections::HashSet<_>>()
                    .len()
                    > 1
            );
        }
    }
}

#[test]
fn sum_equals_the_sequential_sum_for_every_worker_count_and_placement() {
    let numbers: Arc<Vec<u64>> = Arc::new((0..10_007u64).map(|i| i * i % 1_009).collect());
    let iterations = 4;
    let expected = iterations * numbers.iter().sum::<u64>();
    for placement in [Placement::Auto, Placement::Inline, Placement::Pool] {
        for workers in WORKER_COUNTS {
            let shards = unequal_shards(numbers.len(), workers);
            let data = Arc::clone(&numbers);
            let outcome = Job::builder(summing_master(), move |rank| SumWorker {
                numbers: Arc::clone(&data),
                range: shards[rank].clone(),
                shard: Vec::new(),
            })
            .workers(workers)
            .iterations(iterations)
            .placement(placement)
            .run()
            .unwrap();
            assert_eq!(
                *outcome.result, expected,
                "{workers} workers, {placement:?}"
            );
            assert_eq!(outcome.iterations, iterations);
            assert!(!outcome.halted);
        }
    }
}

#[test]
fn logistic_regression_equals_the_sequential_descent_within_1e_9() {
    let data = Arc::new(lr::Dataset::generate(3_000, 6, 7));
    let (iterations, rate) = (12, 0.8);
    let expected = lr::sequential(&data, iterations, rate);
    for workers in WORKER_COUNTS {
        let shards = unequal_shards(data.rows, workers);
        let shared = Arc::clone(&data);
        let outcome = Job::builder(
            lr::LrMaster {
                features: data.features,
                rate,
            },
            move |rank| lr::LrWorker::new(Arc::clone(&shared), shards[rank].clone()),
        )
        .workers(workers)
        .iterations(iterations)
        .run()
        .unwrap();
        let diff = lr::max_abs_diff(&outcome.result.weights, &expected.weights);
        assert!(
            diff <= 1e-9,
            "{workers} workers: weights differ by {diff:e}"
        );
        assert!((outcome.result.loss - expected.loss).abs() <= 1e-9);
    }
}
