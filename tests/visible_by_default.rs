//! A job run by a program that installed no `tracing` subscriber still tells a person what
//! it does — its progress, a recovery, a resume, its failure — on standard error; one run
//! under a subscriber of its own logs there, from every thread of the job, and
//! `SUPERSTEP_LOG=off` silences the fallback.
//!
//! Each case runs in a process of its own (this test binary again, one test of it), since
//! a process's subscriber is set once for its life.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use superstep::checkpoint::MemoryCheckpointStore;
use superstep::prelude::*;
use superstep::FailurePolicy;

/// Set in the child process: which case it runs.
const CASE: &str = "SUPERSTEP_TEST_VISIBLE_CASE";

struct Sum;
impl MasterComputable for Sum {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(ctx.worker_results().iter().sum()))
    }
}

/// Fails once in iteration 2 if `fail` is still set.
struct Once(Arc<AtomicBool>);
impl WorkerComputable for Once {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        if ctx.rank() == 1 && ctx.iteration() == 2 && self.0.swap(false, Ordering::SeqCst) {
            return Err("its disk is gone".into());
        }
        Ok(ctx.iteration())
    }
}

/// Three jobs: one that recovers a worker, one that resumes its finished checkpoint, one
/// that fails.
fn three_jobs() {
    let store = MemoryCheckpointStore::new();
    let fail = Arc::new(AtomicBool::new(true));
    let job = |fail: Arc<AtomicBool>| {
        Job::builder(Sum, move |_| Once(Arc::clone(&fail)))
            .workers(2)
            .iterations(4)
            .checkpoint(store.clone(), 2)
    };
    job(Arc::clone(&fail))
        .failure_policy(FailurePolicy::RestartWorker { max_restarts: 1 })
        .run()
        .unwrap();
    job(Arc::new(AtomicBool::new(false))).run().unwrap();
    let err = Job::builder(Sum, |_| Once(Arc::new(AtomicBool::new(true))))
        .workers(2)
        .iterations(4)
        .run()
        .unwrap_err();
    println!("FAILED AS {err}");
}

/// Runs this binary's test `name` alone, with `case` and `env`; its standard error.
fn child(name: &str, case: &str, env: &[(&str, &str)]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CASE, case)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the child failed: {}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

#[test]
fn a_job_without_a_subscriber_says_its_progress_recovery_resume_and_failure() {
    if std::env::var(CASE).as_deref() == Ok("none") {
        return three_jobs();
    }
    let said = child(
        "a_job_without_a_subscriber_says_its_progress_recovery_resume_and_failure",
        "none",
        &[],
    );
    for line in [
        " INFO superstep::protocol::master::progress: iteration 1 completed in ",
        " WARN superstep::protocol::master::workers: recovering from a worker's failure cause=worker 1 failed in compute at iteration 2: its disk is gone",
        " INFO superstep::checkpoint::resume: the job finished at iteration 4 (the newest checkpoint in memory (a MemoryCheckpointStore)); returning its result",
        "ERROR superstep::protocol::master::rounds: job failed error=worker 1 failed in compute at iteration 2: its disk is gone",
    ] {
        assert!(said.contains(line), "no line with {line:?} in:\n{said}");
    }
    // Nothing below INFO, and nothing of other crates.
    assert!(!said.contains("DEBUG") && !said.contains("TRACE"), "{said}");
}

#[test]
fn superstep_log_off_silences_the_fallback() {
    if std::env::var(CASE).as_deref() == Ok("off") {
        return three_jobs();
    }
    let said = child(
        "superstep_log_off_silences_the_fallback",
        "off",
        &[("SUPERSTEP_LOG", "off")],
    );
    assert!(!said.contains("superstep::"), "{said}");
}

/// Counts the events of superstep's it hears, whatever thread they come from.
#[derive(Default)]
struct Counting(std::sync::atomic::AtomicUsize);

impl tracing::Subscriber for Counting {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target().starts_with("superstep") {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_job_run_under_a_subscriber_of_its_callers_thread_logs_there_and_not_to_stderr() {
    if std::env::var(CASE).as_deref() == Ok("scoped") {
        let dispatch = tracing::Dispatch::new(Counting::default());
        tracing::dispatcher::with_default(&dispatch, three_jobs);
        let heard = dispatch
            .downcast_ref::<Counting>()
            .unwrap()
            .0
            .load(Ordering::SeqCst);
        // The master's node, on the job's thread, logs the progress, the recovery and the
        // failure: each was heard by the caller's subscriber.
        assert!(heard >= 4, "heard {heard} events");
        return;
    }
    let said = child(
        "a_job_run_under_a_subscriber_of_its_callers_thread_logs_there_and_not_to_stderr",
        "scoped",
        &[],
    );
    assert!(!said.contains("superstep::"), "{said}");
}

#[test]
fn a_variable_that_nothing_read_is_warned_of_once_naming_the_call_that_reads_it() {
    match std::env::var(CASE).as_deref() {
        Ok("unread") => return three_jobs(),
        Ok("read") => {
            let job = Job::builder(Sum, |_| Once(Arc::new(AtomicBool::new(false))))
                .workers(2)
                .iterations(2)
                .settings_from_env()
                .unwrap()
                .build()
                .unwrap();
            assert_eq!(job.config().checkpoint_replicas, Some(2));
            job.run().unwrap();
            return;
        }
        _ => {}
    }
    let name = "a_variable_that_nothing_read_is_warned_of_once_naming_the_call_that_reads_it";
    let replicas = [("SUPERSTEP_CHECKPOINT_REPLICAS", "2")];
    let said = child(name, "unread", &replicas);
    let warning = " WARN superstep::runtime: SUPERSTEP_CHECKPOINT_REPLICAS is set, but this program never called JobBuilder::settings_from_env (or JobConfig::with_env), which reads it: it has no effect";
    assert_eq!(said.matches(warning).count(), 1, "{said}");
    // Read, it is no warning.
    let said = child(name, "read", &replicas);
    assert!(!said.contains("SUPERSTEP_CHECKPOINT_REPLICAS"), "{said}");
}
