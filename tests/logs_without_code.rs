//! What a job says in its log without a line of the user's code: its progress, once per
//! interval, and the setting a worker's call needs but the job lacks.

mod common;

use std::time::Duration;

use common::{lines_with, logs, summing_master, FnWorker};
use superstep::prelude::*;

fn voting(job: &str, worker_halt: bool) -> Result<JobOutcome<u64>, JobError> {
    Job::builder(summing_master(), |_| FnWorker {
        f: |ctx: &mut WorkerContext<u64, u64>| {
            ctx.vote_halt();
            Ok(1)
        },
    })
    .job_id(job)
    .workers(2)
    .iterations(3)
    .worker_halt(worker_halt)
    .run()
}

#[test]
fn a_vote_to_halt_in_a_job_without_worker_halt_is_warned_of_once() {
    logs();
    let outcome = voting("votes-ignored", false).unwrap();
    assert_eq!(outcome.iterations, 3, "the votes did not halt it");
    let warned = lines_with(&["votes-ignored", "WARN", "without worker_halt(true)"]);
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(
        warned[0].contains("2 worker(s) voted to halt in iteration 1"),
        "{}",
        warned[0]
    );

    let outcome = voting("votes-counted", true).unwrap();
    assert_eq!(outcome.iterations, 1, "a unanimous vote halts it");
    assert!(lines_with(&["votes-counted", "worker_halt(true)"]).is_empty());
}

#[test]
fn each_completed_iteration_is_said_at_info_at_most_once_per_interval() {
    logs();
    let every = |job: &str, interval: Duration, iterations: u64| {
        Job::builder(summing_master(), |rank| FnWorker {
            f: move |_: &mut WorkerContext<u64, u64>| {
                if rank == 1 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Ok(1)
            },
        })
        .job_id(job)
        .workers(3)
        .iterations(iterations)
        .progress_interval(interval)
        .run()
        .unwrap();
        lines_with(&[job, " INFO ", "completed in"])
    };
    let all = every("progress-every", Duration::ZERO, 4);
    assert_eq!(all.len(), 4, "{all:#?}");
    for (i, line) in all.iter().enumerate() {
        assert!(
            line.contains(&format!("iteration {} completed in", i + 1)),
            "{line}"
        );
        assert!(line.contains("slowest worker 1 ("), "{line}");
    }
    // A long interval: the first iteration only (the job's own last line says the rest).
    let first = every("progress-hourly", Duration::from_secs(3600), 20);
    assert_eq!(first.len(), 1, "{first:#?}");
    assert!(
        first[0].contains("iteration 1 completed in"),
        "{}",
        first[0]
    );
    let done = lines_with(&["progress-hourly", "job completed"]);
    assert_eq!(done.len(), 1, "{done:#?}");
}
