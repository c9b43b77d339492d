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

/// What `fn main() -> Result<(), Box<dyn Error>>` prints of an error is its `Debug`: a
/// sentence, as `Display` gives it, never a struct dump.
#[test]
fn errors_print_as_sentences_under_debug() {
    let setting = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .workers(0)
    .build()
    .unwrap_err();
    assert_eq!(format!("{setting:?}"), setting.to_string());
    assert!(
        setting.to_string().starts_with("invalid setting `workers`"),
        "{setting}"
    );
    let boxed: Box<dyn std::error::Error> = Box::new(setting.clone());
    assert_eq!(format!("{boxed:?}"), setting.to_string());

    let failed = Job::builder(summing_master(), |_| FnWorker {
        f: |ctx: &mut WorkerContext<u64, u64>| {
            if ctx.rank() == 1 {
                Err("disk full".into())
            } else {
                Ok(1)
            }
        },
    })
    .workers(2)
    .iterations(2)
    .run()
    .unwrap_err();
    let debug = format!("{failed:?}");
    assert_eq!(debug, failed.to_string());
    assert!(debug.starts_with("worker 1 failed"), "{debug}");
    assert!(debug.contains("disk full"), "{debug}");
    assert!(!debug.contains("Worker {"), "{debug}");

    let sync = Job::builder(summing_master(), |_| FnWorker {
        f: |ctx: &mut WorkerContext<u64, u64>| {
            let err = ctx.barrier().unwrap_err();
            Err(format!("{err:?}").into())
        },
    })
    .workers(1)
    .iterations(1)
    .run()
    .unwrap_err();
    let text = sync.to_string();
    assert!(
        text.starts_with("barrier() needs a job built with barrier_mode(true)")
            || text.contains(": barrier() needs a job built with barrier_mode(true)"),
        "{text}"
    );
    assert!(!text.contains("NotEnabled"), "{text}");
}
