//! The master's fold without the star: with `Aggregation::Tree` or `Ring` (or `Auto`
//! across processes, once results are large) the workers fold their results among
//! themselves and the master receives one folded result an iteration — the same result
//! as the star's, to the bit along the ring.

mod common;

use superstep::collective::{FoldRoute, ReduceOp};
use superstep::prelude::*;

/// Rank `rank`'s result in iteration `i` after the master result `last`: numbers of very
/// different magnitudes and signs, so that a float sum grouped otherwise, or in another
/// order, has other bits.
fn values(rank: usize, i: u64, len: usize, last: Option<&Floats>) -> Floats {
    Floats::from(
        (0..len)
            .map(|e| {
                let n = ((rank * 7919 + e * 104_729 + i as usize * 31) % 1000) as f64 + 0.1;
                let scale = 10f64.powi(((rank * 5 + e) % 17) as i32 - 8);
                let sign = if (rank + e) % 3 == 0 { -1.0 } else { 1.0 };
                sign * n * scale + last.map_or(0.0, |l| l[e] * 1e-3)
            })
            .collect::<Vec<_>>(),
    )
}

/// Passes the fold on as its result.
struct Fold;

impl MasterComputable for Fold {
    type MasterResult = Floats;
    type WorkerResult = Floats;
    fn compute(
        &mut self,
        ctx: &mut MasterContext<Floats, Floats>,
    ) -> Result<Step<Floats>, BoxError> {
        let fold = ctx
            .take_combined_result()
            .ok_or("the job combines: a fold was expected")?;
        Ok(Step::Continue(fold))
    }
}

/// Returns [`values`]; votes to halt from iteration `halt_at`.
struct Part {
    rank: usize,
    len: usize,
    halt_at: u64,
}

impl WorkerComputable for Part {
    type MasterResult = Floats;
    type WorkerResult = Floats;
    fn compute(&mut self, ctx: &mut WorkerContext<Floats, Floats>) -> Result<Floats, BoxError> {
        if ctx.iteration() >= self.halt_at {
            ctx.vote_halt();
        }
        Ok(values(
            self.rank,
            ctx.iteration(),
            self.len,
            ctx.last_master_result(),
        ))
    }
}

fn job(workers: usize, len: usize, aggregation: Aggregation) -> JobBuilder<Floats, Floats> {
    Job::builder(Fold, move |rank| Part {
        rank,
        len,
        halt_at: u64::MAX,
    })
    .workers(workers)
    .iterations(3)
    .barrier_mode(true)
    .sync_timeout(common::PATIENT)
    .aggregation(aggregation)
}

fn bits(v: &Floats) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The fold of [`combine`](JobBuilder::combine), by hand.
fn add(fold: &mut Floats, next: Floats) {
    fold.iter_mut().zip(next.0).for_each(|(a, b)| *a += b);
}

#[test]
fn the_ring_fold_among_workers_gives_the_stars_result_to_the_bit() {
    // 40,000 elements: five chunks, so the ring is a pipeline.
    let (workers, len) = (5, 40_000);
    let star = job(workers, len, Aggregation::Star)
        .combine_by(ReduceOp::Sum)
        .run()
        .unwrap();
    assert!(star
        .report
        .iterations
        .iter()
        .all(|i| i.aggregation == FoldRoute::Star));
    let ring = job(workers, len, Aggregation::Ring)
        .combine_by(ReduceOp::Sum)
        .run()
        .unwrap();
    assert_eq!(bits(&ring.result), bits(&star.result));
    for i in &ring.report.iterations {
        assert_eq!(i.aggregation, FoldRoute::Ring, "iteration {}", i.iteration);
        assert_eq!(
            i.results_held, 1,
            "one folded result, iteration {}",
            i.iteration
        );
    }
    // A fold of whole values goes along the ring too, and gives the same bits.
    let whole = job(workers, len, Aggregation::Ring)
        .combine(add)
        .run()
        .unwrap();
    assert_eq!(bits(&whole.result), bits(&star.result));
    // The tree groups the ranks otherwise: a float sum's bits may differ, never its sum
    // of exact numbers.
    let tree = job(workers, len, Aggregation::Tree)
        .combine_by(ReduceOp::Sum)
        .run()
        .unwrap();
    assert!(tree
        .report
        .iterations
        .iter()
        .all(|i| i.aggregation == FoldRoute::Tree));
    assert_ne!(
        bits(&tree.result),
        bits(&star.result),
        "the values are such that another grouping shows in the bits"
    );
    for (t, s) in tree.result.iter().zip(star.result.iter()) {
        assert!((t - s).abs() <= 1e-6 * s.abs().max(1.0), "{t} against {s}");
    }
}

/// Passes the fold on, as a string.
struct Words;

impl MasterComputable for Words {
    type MasterResult = String;
    type WorkerResult = String;
    fn compute(
        &mut self,
        ctx: &mut MasterContext<String, String>,
    ) -> Result<Step<String>, BoxError> {
        Ok(Step::Continue(
            ctx.take_combined_result().unwrap_or_default(),
        ))
    }
}

struct Word(usize);

impl WorkerComputable for Word {
    type MasterResult = String;
    type WorkerResult = String;
    fn compute(&mut self, ctx: &mut WorkerContext<String, String>) -> Result<String, BoxError> {
        Ok(format!("{}.{};", ctx.iteration(), self.0))
    }
}

#[test]
fn a_fold_of_any_type_by_the_tree_or_the_ring_keeps_the_rank_order() {
    for workers in [1, 2, 3, 6, 8] {
        let want: String = (0..workers).map(|r| format!("2.{r};")).collect();
        for aggregation in [Aggregation::Star, Aggregation::Tree, Aggregation::Ring] {
            let outcome = Job::builder(Words, Word)
                .workers(workers)
                .iterations(2)
                .barrier_mode(true)
                .sync_timeout(common::PATIENT)
                .aggregation(aggregation)
                .combine(|a: &mut String, b: String| a.push_str(&b))
                .run()
                .unwrap();
            assert_eq!(*outcome.result, want, "{workers} workers, {aggregation}");
        }
    }
}

#[test]
fn the_workers_votes_halt_the_job_when_results_fold_among_them() {
    let outcome = Job::builder(Fold, |rank| Part {
        rank,
        len: 10,
        halt_at: 2,
    })
    .workers(4)
    .iterations(10)
    .barrier_mode(true)
    .worker_halt(true)
    .aggregation(Aggregation::Ring)
    .combine_by(ReduceOp::Sum)
    .run()
    .unwrap();
    assert_eq!((outcome.iterations, outcome.halted), (2, true));
}

#[test]
fn a_fold_that_panics_among_the_workers_fails_the_job_naming_the_worker_and_the_combine() {
    let error = Job::builder(Words, Word)
        .workers(4)
        .iterations(2)
        .barrier_mode(true)
        .sync_timeout(common::PATIENT)
        .aggregation(Aggregation::Tree)
        .combine(|_: &mut String, b: String| {
            if b.ends_with(".3;") {
                panic!("no rank 3");
            }
        })
        .run()
        .unwrap_err();
    match &error {
        JobError::Worker { phase, .. } => assert_eq!(*phase, Phase::Combine, "{error}"),
        other => panic!("not the worker's combine: {other}"),
    }
    assert!(error.to_string().contains("no rank 3"), "{error}");
}

#[test]
fn settings_that_cannot_fold_among_the_workers_fail_naming_the_setting() {
    let error = job(3, 10, Aggregation::Ring)
        .barrier_mode(false)
        .combine_by(ReduceOp::Sum)
        .run()
        .unwrap_err();
    assert!(
        error.to_string().contains("`aggregation` = Ring")
            && error.to_string().contains("barrier mode"),
        "{error}"
    );
    let error = job(3, 10, Aggregation::Tree).run().unwrap_err();
    assert!(
        error.to_string().contains("`aggregation` = Tree")
            && error.to_string().contains("combines its results"),
        "{error}"
    );
    // In one process `Auto` is the star: results are handed over, not copied.
    let outcome = job(3, 100_000, Aggregation::Auto)
        .combine_by(ReduceOp::Sum)
        .run()
        .unwrap();
    assert!(outcome
        .report
        .iterations
        .iter()
        .all(|i| i.aggregation == FoldRoute::Star));
}

#[cfg(feature = "tcp")]
#[test]
fn across_processes_auto_folds_along_the_ring_once_results_are_large() {
    let workers = 4;
    for (len, large) in [(100, false), (20_000, true)] {
        let star = job(workers, len, Aggregation::Star)
            .combine_by(ReduceOp::Sum)
            .run()
            .unwrap();
        let outcomes = common::over_tcp(workers, "aggregation", move |_, transport| {
            job(workers, len, Aggregation::Auto)
                .iteration_timeout(std::time::Duration::from_secs(60))
                .combine_by(ReduceOp::Sum)
                .transport(transport)
                .run()
        });
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            assert_eq!(
                bits(&outcome.result),
                bits(&star.result),
                "rank {rank}, {len}"
            );
            if rank == 0 {
                let routes: Vec<FoldRoute> = outcome
                    .report
                    .iterations
                    .iter()
                    .map(|i| i.aggregation)
                    .collect();
                // The first iteration's fold is measured; from then on the ring, if large.
                let later = if large {
                    FoldRoute::Ring
                } else {
                    FoldRoute::Star
                };
                assert_eq!(routes, [FoldRoute::Star, later, later], "{len} elements");
            }
        }
    }
}

#[cfg(feature = "sim")]
#[test]
fn the_simulator_folds_among_workers_as_the_runtime_does_and_recovers_under_faults() {
    use superstep::sim::{Faults, Simulation};
    let (workers, len) = (4, 3_000);
    let star = job(workers, len, Aggregation::Star)
        .combine_by(ReduceOp::Sum)
        .run()
        .unwrap();
    for aggregation in [Aggregation::Ring, Aggregation::Tree] {
        let fault_free =
            Simulation::from_job(move || job(workers, len, aggregation).combine_by(ReduceOp::Sum))
                .run(0);
        assert!(
            fault_free.violations.is_empty(),
            "{:?}",
            fault_free.violations
        );
        let expected = fault_free.outcome.unwrap().result;
        if aggregation == Aggregation::Ring {
            // The ring's fold is the star's, to the bit, in the simulator too.
            assert_eq!(bits(&expected), bits(&star.result));
        }
        // Workers and the master crash (a worker also while its peers wait for it in the
        // fold), pieces are delayed and retransmitted: restarting every worker, the job
        // ends with the fault-free result.
        let faulty = Simulation::from_job(move || {
            job(workers, len, aggregation)
                .combine_by(ReduceOp::Sum)
                .failure_policy(FailurePolicy::RestartAll { max_attempts: 100 })
        })
        .faults(Faults::all(0.05));
        faulty.check(0..40, |run| match &run.outcome {
            Ok(outcome) if bits(&outcome.result) == bits(&expected) => Ok(()),
            Ok(_) => Err(format!("{aggregation:?}: another result")),
            Err(error) => Err(format!("{aggregation:?}: {error}")),
        });
    }
}

#[cfg(feature = "tcp")]
#[test]
fn a_process_whose_element_wise_fold_has_another_op_is_refused_naming_both() {
    let outcomes = common::over_tcp(3, "aggregation-op", move |rank, transport| {
        let op = if rank == 2 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        job(3, 10, Aggregation::Auto)
            .combine_by(op)
            .transport(transport)
            .run()
    });
    match &outcomes[2] {
        Err(JobError::Mismatch {
            field,
            master,
            worker,
            ..
        }) => {
            assert_eq!(field, "combine");
            assert!(
                master.contains("sum") && worker.contains("max"),
                "{master} / {worker}"
            );
        }
        other => panic!("rank 2 was not refused: {other:?}"),
    }
    assert!(outcomes[0].is_err(), "the job fails");
}
