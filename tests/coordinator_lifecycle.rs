//! The coordinator as an actor of the job: it hears the job's life as typed messages with
//! the job's context — started, each worker's report as that worker stops (with what the
//! worker attached), then finished or failed, exactly once — in memory and over TCP.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(feature = "tcp")]
use common::over_tcp;
use common::{summing_master, FnWorker};
use superstep::checkpoint::MemoryCheckpointStore;
use superstep::coordinator::{Coordinator, JobInfo, Lifecycle, WorkerReport};
use superstep::prelude::*;
use superstep::{FailurePolicy, Hook, JobBuilder, Placement};

/// What a coordinator heard, in order, as text: `started`, `done <rank>`, `finished`, or
/// `failed`, each with the job's context.
#[derive(Clone, Default)]
struct Heard {
    log: Arc<Mutex<Vec<(String, JobInfo)>>>,
    /// The files every worker attached, as `on_finish` read them.
    committed: Arc<Mutex<Vec<String>>>,
    /// The thread each hook ran on.
    threads: Arc<Mutex<Vec<Option<String>>>>,
    /// `on_worker_done` fails for this rank.
    refuse: Option<usize>,
    /// `on_finish` fails.
    refuse_finish: bool,
}

impl Heard {
    fn entries(&self) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().map(|(e, _)| e.clone()).collect()
    }

    fn contexts(&self) -> Vec<JobInfo> {
        let log = self.log.lock().unwrap();
        log.iter().map(|(_, j)| j.clone()).collect()
    }
}

impl Coordinator for Heard {
    fn handle(&mut self, job: &JobInfo, event: Lifecycle<'_>) -> Result<(), BoxError> {
        let thread = std::thread::current().name().map(str::to_string);
        self.threads.lock().unwrap().push(thread);
        let entry = match event {
            Lifecycle::Started => "started".to_string(),
            Lifecycle::WorkerDone(report) => {
                if self.refuse == Some(report.rank) {
                    return Err(format!("worker {}'s files are missing", report.rank).into());
                }
                format!("done {}", report.rank)
            }
            Lifecycle::Finished(_) if self.refuse_finish => {
                return Err("the catalog is down".into());
            }
            Lifecycle::Finished(reports) => {
                let mut files = Vec::new();
                for report in reports {
                    files.extend(report.attached::<String>()?);
                }
                *self.committed.lock().unwrap() = files;
                "finished".to_string()
            }
            Lifecycle::Failed(error) => format!("failed: {error}"),
            _ => "other".to_string(),
        };
        self.log.lock().unwrap().push((entry, job.clone()));
        Ok(())
    }
}

/// A worker that writes (pretends to write) one file per iteration and attaches its name.
fn writing_worker(
    rank: usize,
) -> FnWorker<impl FnMut(&mut WorkerContext<u64, u64>) -> Result<u64, BoxError>> {
    FnWorker {
        f: move |ctx: &mut WorkerContext<u64, u64>| {
            ctx.attach(&format!("part-{rank}-{}.csv", ctx.iteration()))?;
            Ok(1)
        },
    }
}

/// The order every successful job's coordinator hears: started, one report per worker,
/// finished.
fn assert_lifecycle(entries: &[String], workers: usize) {
    assert_eq!(
        entries.first().map(String::as_str),
        Some("started"),
        "{entries:?}"
    );
    assert_eq!(
        entries.last().map(String::as_str),
        Some("finished"),
        "{entries:?}"
    );
    let mut done: Vec<&str> = entries[1..entries.len() - 1]
        .iter()
        .map(String::as_str)
        .collect();
    done.sort_unstable();
    let expected: Vec<String> = (0..workers).map(|r| format!("done {r}")).collect();
    assert_eq!(done, expected, "one live report per worker: {entries:?}");
}

fn expected_files(workers: usize, iterations: u64) -> Vec<String> {
    (0..workers)
        .flat_map(|r| (1..=iterations).map(move |i| format!("part-{r}-{i}.csv")))
        .collect()
}

#[test]
fn the_coordinator_hears_each_worker_as_it_stops_and_commits_what_they_attached() {
    let heard = Heard::default();
    let outcome = Job::builder(summing_master(), writing_worker)
        .job_id("attaching")
        .workers(3)
        .iterations(2)
        .coordinator(heard.clone())
        .run()
        .unwrap();
    assert_eq!(*outcome.result, 6);
    assert_lifecycle(&heard.entries(), 3);
    assert_eq!(*heard.committed.lock().unwrap(), expected_files(3, 2));
    for job in heard.contexts() {
        assert_eq!(job, JobInfo::new("attaching", 3, 0));
    }
    // The job's report keeps what each worker attached too.
    let attached: Vec<Vec<String>> = outcome
        .report
        .workers
        .iter()
        .map(|w| w.attached::<String>().unwrap())
        .collect();
    assert_eq!(attached[1], ["part-1-1.csv", "part-1-2.csv"]);
}

#[test]
fn the_coordinators_hooks_run_on_a_thread_of_their_own_not_the_jobs() {
    let heard = Heard::default();
    let job_thread = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&job_thread);
    Job::builder(summing_master(), move |_| {
        let seen = Arc::clone(&seen);
        FnWorker {
            f: move |_: &mut WorkerContext<u64, u64>| {
                // Inline compute runs on the job's coordination thread.
                *seen.lock().unwrap() = std::thread::current().name().map(str::to_string);
                Ok(1)
            },
        }
    })
    .job_id("own-thread")
    .workers(2)
    .iterations(1)
    .placement(Placement::Inline)
    .coordinator(heard.clone())
    .run()
    .unwrap();
    let job_thread = job_thread.lock().unwrap().clone();
    assert!(job_thread.is_some());
    let threads = heard.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), 4, "started, two reports, finished");
    for thread in threads {
        assert_ne!(
            thread, job_thread,
            "a hook ran on the job's coordination thread"
        );
    }
}

#[test]
fn a_failed_worker_report_fails_the_job_naming_the_hook_and_nothing_is_committed() {
    let heard = Heard {
        refuse: Some(1),
        ..Heard::default()
    };
    let error = Job::builder(summing_master(), writing_worker)
        .job_id("refused-report")
        .workers(3)
        .iterations(2)
        .coordinator(heard.clone())
        .run()
        .unwrap_err();
    match &error {
        JobError::Coordinator { hook, cause } => {
            assert_eq!(*hook, Hook::OnWorkerDone);
            assert!(
                cause.to_string().contains("worker 1's files are missing"),
                "{cause}"
            );
        }
        other => panic!("expected the coordinator's failure, got {other}"),
    }
    let entries = heard.entries();
    assert!(!entries.iter().any(|e| e == "finished"), "{entries:?}");
    assert!(heard.committed.lock().unwrap().is_empty());
    let failed: Vec<&String> = entries.iter().filter(|e| e.starts_with("failed")).collect();
    assert_eq!(failed.len(), 1, "on_error exactly once: {entries:?}");
    assert_eq!(
        entries.last(),
        failed.last().copied(),
        "on_error is the last: {entries:?}"
    );
}

#[test]
fn after_every_worker_restarts_the_context_names_the_new_attempt_and_only_its_attachments_count() {
    let heard = Heard::default();
    let failed_once = Arc::new(AtomicBool::new(false));
    let outcome = Job::builder(summing_master(), move |rank| {
        let failed_once = Arc::clone(&failed_once);
        FnWorker {
            f: move |ctx: &mut WorkerContext<u64, u64>| {
                ctx.attach(&format!("part-{rank}-{}.csv", ctx.iteration()))?;
                if rank == 2 && ctx.iteration() == 2 && !failed_once.swap(true, Ordering::SeqCst) {
                    return Err("disk full".into());
                }
                Ok(1)
            },
        }
    })
    .job_id("restarted")
    .workers(3)
    .iterations(2)
    .failure_policy(FailurePolicy::RestartAll { max_attempts: 2 })
    .coordinator(heard.clone())
    .run()
    .unwrap();
    assert_eq!(outcome.report.attempt, 1);
    // One live report per rank: those of the second attempt's workers.
    assert_lifecycle(&heard.entries(), 3);
    let log = heard.log.lock().unwrap().clone();
    assert_eq!(log[0].1.attempt, 0, "started in the first attempt");
    let (last, job) = log.last().unwrap();
    assert_eq!(last, "finished");
    assert_eq!(job.attempt, 1, "finished in the second attempt");
    // Each worker of the second attempt started afresh: its attachments are its own.
    assert_eq!(*heard.committed.lock().unwrap(), expected_files(3, 2));
}

/// A job that checkpoints every iteration, with `heard` as its coordinator.
fn committing(store: &MemoryCheckpointStore, heard: &Heard) -> JobBuilder<u64, u64> {
    Job::builder(summing_master(), writing_worker)
        .job_id("committing")
        .workers(3)
        .iterations(2)
        .checkpoint(store.clone(), 1)
        .coordinator(heard.clone())
}

#[test]
fn a_job_that_committed_and_is_started_again_ends_at_once_and_runs_no_hook_again() {
    let store = MemoryCheckpointStore::new();
    let first = Heard::default();
    let outcome = committing(&store, &first).run().unwrap();
    assert_lifecycle(&first.entries(), 3);
    let newest = store.checkpoints().pop().unwrap();
    assert_eq!((newest.iteration, newest.committed), (2, true));
    // Started again (its process restarted after the commit): its result at once; no
    // second commit, no `on_error`, not even `on_start`.
    let again = Heard::default();
    let resumed = committing(&store, &again).run().unwrap();
    assert_eq!(resumed.result, outcome.result);
    assert_eq!(resumed.report.resumed_from(), Some(2));
    assert!(resumed.report.iterations.is_empty());
    assert_eq!(again.entries(), Vec::<String>::new());
    // Its input since moved or changed (by its commit, say), it still ends with its result.
    let moved = committing(&store, &again)
        .input(superstep::coordinator::Input::Rows(7))
        .run()
        .unwrap();
    assert_eq!(moved.result, outcome.result);
    assert_eq!(again.entries(), Vec::<String>::new());
    // Run again with more iterations, it is another end: it goes on and commits it.
    let more = Heard::default();
    let longer = committing(&store, &more).iterations(3).run().unwrap();
    assert_eq!(longer.report.resumed_from(), Some(2));
    assert_lifecycle(&more.entries(), 3);
    assert!(store.checkpoints().pop().unwrap().committed);
}

#[test]
fn a_commit_that_failed_is_not_recorded_and_a_job_started_again_commits() {
    let store = MemoryCheckpointStore::new();
    let refusing = Heard {
        refuse_finish: true,
        ..Heard::default()
    };
    let error = committing(&store, &refusing).run().unwrap_err();
    assert!(
        matches!(
            error,
            JobError::Coordinator {
                hook: Hook::OnFinish,
                ..
            }
        ),
        "{error}"
    );
    assert!(store.checkpoints().iter().all(|c| !c.committed));
    let again = Heard::default();
    let outcome = committing(&store, &again).run().unwrap();
    assert_eq!(*outcome.result, 6);
    assert_lifecycle(&again.entries(), 3);
    assert!(store.checkpoints().pop().unwrap().committed);
}

/// The master's process of a job over TCP started again after its job committed, with
/// no worker left: it returns the result at once instead of waiting for workers that are
/// gone and failing (and cleaning up what it committed).
#[cfg(feature = "tcp")]
#[test]
fn over_tcp_a_master_started_again_after_its_commit_returns_at_once_without_workers() {
    let store = MemoryCheckpointStore::new();
    let heard = Heard::default();
    let (master_store, master_heard) = (store.clone(), heard.clone());
    let outcomes = over_tcp::<u64, u64, _>(3, "committed-tcp", move |rank, transport| {
        let builder = Job::builder(summing_master(), writing_worker)
            .job_id("committed-tcp")
            .workers(3)
            .iterations(2)
            .transport(transport);
        if rank == 0 {
            builder
                .checkpoint(master_store.clone(), 1)
                .coordinator(master_heard.clone())
                .run()
        } else {
            builder.run()
        }
    });
    for outcome in outcomes {
        assert_eq!(*outcome.unwrap().result, 6);
    }
    assert_lifecycle(&heard.entries(), 3);
    let again = Heard::default();
    let (transport, _) = common::tcp_master::<u64, u64>(3, "committed-tcp", |_| {});
    let outcome = Job::builder(summing_master(), writing_worker)
        .job_id("committed-tcp")
        .workers(3)
        .iterations(2)
        // Without the record it would wait this long for its workers, then fail.
        .startup_timeout(std::time::Duration::from_secs(30))
        .transport(transport)
        .checkpoint(store.clone(), 1)
        .coordinator(again.clone())
        .run()
        .unwrap();
    assert_eq!(*outcome.result, 6);
    assert_eq!(outcome.report.resumed_from(), Some(2));
    assert_eq!(again.entries(), Vec::<String>::new());
}

#[cfg(feature = "tcp")]
#[test]
fn over_tcp_what_each_worker_attached_crosses_to_the_coordinator() {
    let heard = Heard::default();
    let master_heard = heard.clone();
    let outcomes = over_tcp::<u64, u64, _>(3, "attach-tcp", move |rank, transport| {
        let builder = Job::builder(summing_master(), writing_worker)
            .job_id("attach-tcp")
            .workers(3)
            .iterations(2)
            .transport(transport);
        if rank == 0 {
            builder.coordinator(master_heard.clone()).run()
        } else {
            builder.run()
        }
    });
    for outcome in outcomes {
        assert_eq!(*outcome.unwrap().result, 6);
    }
    assert_lifecycle(&heard.entries(), 3);
    assert_eq!(*heard.committed.lock().unwrap(), expected_files(3, 2));
    for job in heard.contexts() {
        assert_eq!(job, JobInfo::new("attach-tcp", 3, 0));
    }
}

#[test]
fn an_attachment_read_as_the_wrong_type_names_the_worker_and_its_place() {
    let report = WorkerReport {
        rank: 4,
        attachments: vec![
            superstep::coordinator::Attachment::new(&"a.csv").unwrap(),
            superstep::coordinator::Attachment::new(&17u64).unwrap(),
        ],
        ..WorkerReport::default()
    };
    let error = report.attached::<String>().unwrap_err();
    assert_eq!((error.rank, error.index), (Some(4), Some(1)));
    assert!(
        error.to_string().starts_with("worker 4's attachment 1:"),
        "{error}"
    );
}
