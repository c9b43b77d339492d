//! Stragglers (Guagua's min-workers ratio and timeout): after the timeout an iteration
//! goes on with its quorum, the master is told which ranks reported, the straggler's late
//! result is dropped as stale, and the straggler skips ahead instead of replaying.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use superstep::prelude::*;
use superstep::Rank;

/// Each rank returns its rank plus one; rank `slow` sleeps in iteration 2.
struct Ranked {
    slow: Rank,
    computed: Arc<Mutex<Vec<(Rank, u64)>>>,
}

impl WorkerComputable for Ranked {
    type MasterResult = Vec<Rank>;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<Vec<Rank>, u64>) -> Result<u64, BoxError> {
        if ctx.rank() == self.slow && ctx.iteration() == 2 {
            thread::sleep(Duration::from_millis(400));
        }
        self.computed
            .lock()
            .unwrap()
            .push((ctx.rank(), ctx.iteration()));
        Ok(ctx.rank() as u64 + 1)
    }
}

/// Returns the ranks that reported, after checking they match the results.
struct Reported;

impl MasterComputable for Reported {
    type MasterResult = Vec<Rank>;
    type WorkerResult = u64;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<Vec<Rank>, u64>,
    ) -> Result<Step<Vec<Rank>>, BoxError> {
        let ranks = ctx.reported_ranks().to_vec();
        let expected: Vec<u64> = ranks.iter().map(|&r| r as u64 + 1).collect();
        if ctx.worker_results() != expected.as_slice() {
            return Err(format!(
                "results {:?} are not those of ranks {ranks:?}",
                ctx.worker_results()
            )
            .into());
        }
        let mut all = ranks.clone();
        all.extend_from_slice(ctx.left_out_ranks());
        all.sort_unstable();
        if all != (0..ctx.workers()).collect::<Vec<_>>() {
            return Err(
                format!("reported {ranks:?} and left out {:?}", ctx.left_out_ranks()).into(),
            );
        }
        Ok(Step::Continue(ranks))
    }
}

#[test]
fn an_iteration_goes_on_without_a_straggler_which_then_skips_ahead() {
    let computed = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&computed);
    let outcome = Job::builder(Reported, move |_| Ranked {
        slow: 3,
        computed: Arc::clone(&log),
    })
    .workers(4)
    .iterations(12)
    .min_workers(0.75, Duration::from_millis(40))
    .iteration_timeout(Duration::from_secs(20))
    .run()
    .unwrap();
    let report = &outcome.report;
    let second = &report.iterations[1];
    assert_eq!(second.iteration, 2);
    assert_eq!(second.left_out, vec![3], "{report:#?}");
    assert!(
        report.drops.stale >= 1,
        "the late result is dropped: {report:?}"
    );
    let last = report.iterations.last().unwrap();
    assert_eq!(outcome.iterations, 12);
    assert!(
        last.left_out.is_empty(),
        "the straggler caught up: {last:?}"
    );
    assert_eq!(*outcome.result, vec![0, 1, 2, 3]);
    let slow: Vec<u64> = computed
        .lock()
        .unwrap()
        .iter()
        .filter(|(r, _)| *r == 3)
        .map(|(_, i)| *i)
        .collect();
    assert!(slow.windows(2).all(|w| w[0] < w[1]), "never back: {slow:?}");
    assert!(
        slow.windows(2).any(|w| w[1] > w[0] + 1),
        "the straggler skipped the iterations it missed: {slow:?}"
    );
}

#[test]
fn without_its_quorum_an_iteration_times_out_naming_the_missing() {
    let computed = Arc::new(Mutex::new(Vec::new()));
    let outcome = Job::builder(Reported, move |_| Ranked {
        slow: 3,
        computed: Arc::clone(&computed),
    })
    .workers(4)
    .iterations(3)
    .min_workers(1.0, Duration::from_millis(40))
    .iteration_timeout(Duration::from_millis(150))
    .run();
    match outcome {
        Err(JobError::WorkersTimedOut { missing, .. }) => assert_eq!(missing, vec![3]),
        other => panic!("expected a timeout naming rank 3, got {other:?}"),
    }
}
