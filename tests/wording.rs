//! What a user reads: thread names, and counts in messages that agree with their numbers.

mod common;

use std::sync::{Arc, Mutex};

use common::{summing_master, FnWorker};
use superstep::prelude::*;
use superstep::{FailurePolicy, Placement};

/// The names of the threads the workers' compute ran on, in a job of `job_id`.
fn compute_threads(job_id: Option<&str>) -> Vec<String> {
    let names = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&names);
    let job = Job::builder(summing_master(), move |_| {
        let seen = Arc::clone(&seen);
        FnWorker {
            f: move |_: &mut WorkerContext<u64, u64>| {
                let name = std::thread::current().name().unwrap_or("").to_string();
                seen.lock().unwrap().push(name);
                Ok(1)
            },
        }
    })
    .workers(2)
    .iterations(2)
    .placement(Placement::Pool);
    let job = match job_id {
        Some(id) => job.job_id(id),
        None => job,
    };
    job.run().unwrap();
    let names = names.lock().unwrap().clone();
    names
}

#[test]
fn compute_threads_are_named_once_for_superstep_and_once_for_the_job() {
    for name in compute_threads(None) {
        assert!(name.starts_with("superstep-compute-"), "{name}");
    }
    for name in compute_threads(Some("pagerank")) {
        assert!(name.starts_with("superstep-pagerank-compute-"), "{name}");
    }
}

#[test]
fn one_worker_is_one_worker_in_an_error() {
    let err = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .workers(1)
    .failure_policy(FailurePolicy::ContinueWithout)
    .build()
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("below the job's 1 worker "), "{text}");
}
