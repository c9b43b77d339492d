//! No thread is left behind: the job's coordination thread and its compute pool end with
//! the job, whether it completes or fails. (Alone in this file: it counts the process's
//! threads.)

mod common;

use std::time::{Duration, Instant};

use common::{summing_master, FnWorker};
use superstep::prelude::*;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Polls until the thread count is back to `baseline`, for at most a few seconds.
fn back_to(baseline: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = threads();
        if now <= baseline || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn threads_end_with_the_job_whether_it_completes_or_fails() {
    if threads() == 0 {
        eprintln!("no /proc/self/task here; nothing to count");
        return;
    }
    let baseline = threads();
    Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .workers(8)
    .compute_threads(4)
    .iterations(5)
    .run()
    .unwrap();
    assert_eq!(back_to(baseline), baseline, "after a completed job");

    Job::builder(summing_master(), |rank| FnWorker {
        f: move |ctx: &mut WorkerContext<u64, u64>| {
            if rank == 3 && ctx.iteration() == 2 {
                panic!("boom");
            }
            Ok(1)
        },
    })
    .workers(8)
    .compute_threads(4)
    .iterations(5)
    .run()
    .unwrap_err();
    assert_eq!(back_to(baseline), baseline, "after a failed job");
}
