use super::*;
use crate::protocol::{FailurePolicy, JobConfig, NodeConfig, Share};

type Node = WorkerNode<u64, u64>;

/// A runtime error's message; another error as it displays.
fn short(e: &JobError) -> String {
    match e {
        JobError::Runtime { message } => message.clone(),
        other => other.to_string(),
    }
}

fn actions(node: &mut Node) -> Vec<String> {
    std::iter::from_fn(|| node.poll_action())
        .map(|a| match a {
            WorkerAction::Run(Work::Start) => "run start".to_string(),
            WorkerAction::Run(Work::Iterate(step)) => format!("run {}", step.iteration),
            WorkerAction::Run(Work::Stop(ending)) => match *ending {
                OwnedEnding::Completed { .. } => "run stop (completed)".into(),
                OwnedEnding::Failed(e) => format!("run stop ({})", short(&e)),
            },
            WorkerAction::Send(ToMaster::Registered { attempt }) => {
                format!("registered {attempt}")
            }
            WorkerAction::Send(ToMaster::Failed { error, .. }) => {
                format!("failed ({})", short(&error))
            }
            WorkerAction::Send(_) => "send".into(),
            WorkerAction::SendResult(r) => format!("result {}", r.iteration),
            WorkerAction::SendDone { awaits_word: false } => "done".into(),
            WorkerAction::SendDone { awaits_word: true } => "done, awaiting word".into(),
            WorkerAction::Answer((epoch, _), _) => format!("answer {epoch}"),
            WorkerAction::Verdict(e) => format!("verdict ({})", short(&e)),
            WorkerAction::EndSync(_) => "end sync".into(),
            WorkerAction::EndJob(_) => "end job".into(),
            WorkerAction::MarkStale => "stale".into(),
            WorkerAction::Report(OwnedEnding::Completed { .. }) => "report completed".into(),
            WorkerAction::Report(OwnedEnding::Failed(e)) => format!("report ({})", short(&e)),
            WorkerAction::Stop => "stop".into(),
        })
        .collect()
}

fn error(what: &str) -> JobError {
    JobError::Runtime {
        message: what.into(),
    }
}

/// The same error, as a unit of work ends with it.
fn failed(what: &str) -> Box<JobError> {
    Box::new(error(what))
}

fn report(iteration: Iteration) -> Worked<u64> {
    Worked::Iterated(Ok(Report {
        attempt: 0,
        iteration,
        result: Share::Own(1),
        halt_vote: false,
        mail: Default::default(),
        saved: None,
        calls: 0,
        group_calls: None,
        elapsed: Duration::ZERO,
    }))
}

/// The master's word that the job failed first elsewhere.
fn abort_first() -> ToWorker<u64> {
    ToWorker::Abort {
        attempt: 0,
        error: error("first"),
    }
}

fn iterate(iteration: Iteration) -> ToWorker<u64> {
    ToWorker::Iterate {
        attempt: 0,
        iteration,
        last: None,
        fold: crate::ids::FoldRoute::Star,
        save: false,
    }
}

/// A worker's settings: 1 s of failure grace, 10 s to stop, 2 s for the verdict.
fn config(policy: FailurePolicy, barrier_mode: bool) -> Arc<WorkerConfig> {
    let node = NodeConfig::of(JobConfig {
        failure_policy: policy,
        barrier_mode,
        failure_grace: secs(1),
        shutdown_timeout: secs(10),
        ..JobConfig::for_tests()
    });
    Arc::new(node.worker())
}

/// A node of `rank` under `Fail` (`ends`) or `RestartWorker`, started and registered
/// at `t`.
fn started(rank: Rank, ends: bool, barrier_mode: bool, t: Instant) -> Node {
    let policy = if ends {
        FailurePolicy::Fail
    } else {
        FailurePolicy::RestartWorker { max_restarts: 1 }
    };
    let mut node = Node::new(rank, 0, config(policy, barrier_mode));
    node.start();
    assert_eq!(actions(&mut node), ["run start"]);
    node.handle_worked(t, Worked::Started(Ok(())));
    assert_eq!(actions(&mut node), ["registered 0"]);
    node
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn a_straggler_skips_to_the_newest_iteration_once_its_code_is_back() {
    let t = Instant::now();
    let mut node = started(1, false, false, t);
    node.handle_message(t, iterate(1));
    assert_eq!(actions(&mut node), ["run 1"]);
    node.handle_message(t, iterate(2));
    node.handle_message(t, iterate(3));
    assert!(actions(&mut node).is_empty(), "the code is away");
    node.handle_worked(t, report(1));
    assert_eq!(actions(&mut node), ["result 1"]);
    node.handle_sent(t, 1, Ok(()));
    assert_eq!(actions(&mut node), ["run 3"]);
    assert_eq!(node.poll_timeout(), None, "no timer while the job runs");
}

#[test]
fn a_worker_that_failed_first_reports_the_jobs_first_failure_once_the_master_says_it() {
    let t = Instant::now();
    let mut node = started(2, true, false, t);
    node.handle_message(t, iterate(1));
    assert_eq!(actions(&mut node), ["run 1"]);
    node.handle_worked(t, Worked::Iterated(Err(failed("mine"))));
    assert_eq!(
        actions(&mut node),
        ["end job", "failed (mine)", "run stop (mine)"]
    );
    assert_eq!(
        node.poll_timeout(),
        Some(t + secs(10)),
        "the stop's deadline"
    );
    node.handle_worked(t + secs(1), Worked::Stopped(Ok(())));
    assert_eq!(actions(&mut node), ["done"]);
    assert_eq!(
        node.poll_timeout(),
        Some(t + secs(3)),
        "the wait for the master's word comes first"
    );
    // Another rank's failure came first: that is this worker's ending too.
    node.handle_message(t + secs(2), abort_first());
    assert_eq!(
        actions(&mut node),
        ["verdict (first)", "report (first)", "stop"]
    );
    assert_eq!(node.poll_timeout(), None, "an ended worker has no timer");
}

#[test]
fn without_the_masters_word_a_worker_ends_with_its_own_failure_when_its_wait_passes() {
    let t = Instant::now();
    let mut node = started(0, false, false, t);
    node.handle_message(t, iterate(1));
    node.handle_worked(t, Worked::Iterated(Err(failed("mine"))));
    node.handle_worked(t, Worked::Stopped(Ok(())));
    let _ = actions(&mut node);
    node.handle_timeout(t + secs(1));
    assert!(actions(&mut node).is_empty(), "early: nothing is due");
    node.handle_timeout(t + secs(2));
    assert_eq!(actions(&mut node), ["report (mine)", "stop"]);
}

/// The transport's word that the link reaches for a master again.
fn reconnecting() -> ToWorker<u64> {
    ToWorker::Reconnecting {
        reason: "closed".into(),
    }
}

/// A worker of a job whose failures restart every worker, failed on its own and stopped
/// at `t`, awaiting the master's word.
fn failed_in_a_gang(t: Instant) -> Node {
    let policy = FailurePolicy::RestartAll { max_attempts: 2 };
    let mut node = Node::new(1, 0, config(policy, true));
    node.start();
    node.handle_worked(t, Worked::Started(Ok(())));
    node.handle_message(t, iterate(1));
    let _ = actions(&mut node);
    node.handle_worked(t, Worked::Iterated(Err(failed("peer lost"))));
    assert_eq!(
        actions(&mut node),
        ["failed (peer lost)", "run stop (peer lost)"]
    );
    node.handle_worked(t, Worked::Stopped(Ok(())));
    // Not its last word: a restart may follow, from this master or one started again.
    assert_eq!(actions(&mut node), ["done, awaiting word"]);
    node
}

#[test]
fn in_a_gang_a_worker_whose_master_is_lost_before_its_word_keeps_its_failure_for_the_next() {
    let t = Instant::now();
    let mut node = failed_in_a_gang(t);
    node.handle_message(t + secs(1), reconnecting());
    // Its grace passes: it does not end (its process would end with it) while its link
    // reaches a master again.
    assert_eq!(node.poll_timeout(), None);
    node.handle_timeout(t + secs(60));
    assert!(actions(&mut node).is_empty());
    assert!(matches!(node.stage, Stage::AwaitingVerdict(_)));
    // Reached again: the grace runs anew from then (its process replaces it first).
    node.handle_message(t + secs(61), ToWorker::Connected { attempt: 1 });
    assert_eq!(node.poll_timeout(), Some(t + secs(63)));
    node.handle_timeout(t + secs(63));
    assert_eq!(actions(&mut node), ["report (peer lost)", "stop"]);
}

#[test]
fn in_a_gang_a_worker_that_fails_after_its_master_was_lost_keeps_its_failure_too() {
    let t = Instant::now();
    let policy = FailurePolicy::RestartAll { max_attempts: 2 };
    let mut node = Node::new(1, 0, config(policy, true));
    node.start();
    node.handle_worked(t, Worked::Started(Ok(())));
    node.handle_message(t, iterate(1));
    // The master's loss is heard while the compute runs; the compute then fails (a peer
    // in the master's process lost).
    node.handle_message(t, reconnecting());
    node.handle_worked(t, Worked::Iterated(Err(failed("peer lost"))));
    node.handle_worked(t, Worked::Stopped(Ok(())));
    let _ = actions(&mut node);
    assert_eq!(node.poll_timeout(), None);
    assert!(matches!(node.stage, Stage::AwaitingVerdict(_)));
}

#[test]
fn in_a_gang_a_worker_whose_link_gives_up_on_the_master_ends_with_the_masters_loss() {
    let t = Instant::now();
    let mut node = failed_in_a_gang(t);
    node.handle_message(t, reconnecting());
    let lost = JobError::MasterLost {
        reason: "not reached again".into(),
    };
    node.handle_message(
        t + secs(30),
        ToWorker::Abort {
            attempt: 0,
            error: lost,
        },
    );
    assert_eq!(
        actions(&mut node),
        [
            "verdict (the master was lost: not reached again)",
            "report (the master was lost: not reached again)",
            "stop"
        ]
    );
}

#[test]
fn outside_a_gang_a_failed_workers_done_is_its_last_word_and_a_lost_master_changes_nothing() {
    let t = Instant::now();
    let mut node = started(0, false, false, t);
    node.handle_message(t, iterate(1));
    let _ = actions(&mut node);
    node.handle_worked(t, Worked::Iterated(Err(failed("mine"))));
    node.handle_worked(t, Worked::Stopped(Ok(())));
    assert_eq!(
        actions(&mut node),
        ["failed (mine)", "run stop (mine)", "done"]
    );
    node.handle_message(t, reconnecting());
    node.handle_timeout(t + secs(2));
    assert_eq!(actions(&mut node), ["report (mine)", "stop"]);
}

#[test]
fn the_jobs_failure_gives_code_away_the_grace_then_the_worker_ends_without_it() {
    let t = Instant::now();
    let mut node = started(0, false, false, t);
    node.handle_message(t, iterate(1));
    let _ = actions(&mut node);
    node.handle_message(t, abort_first());
    assert_eq!(actions(&mut node), ["verdict (first)"]);
    assert_eq!(node.poll_timeout(), Some(t + secs(1)), "the failure grace");
    node.handle_timeout(t + secs(1));
    assert_eq!(actions(&mut node), ["report (first)", "stop"]);
    assert_eq!(node.poll_timeout(), None);
}

#[test]
fn the_grace_covers_the_stop_too_and_fires_once() {
    let t = Instant::now();
    let mut node = started(0, false, false, t);
    node.handle_message(t, iterate(1));
    let _ = actions(&mut node);
    node.handle_message(t, abort_first());
    let _ = actions(&mut node);
    // Its compute came back within the grace: its stop runs, within the same grace.
    node.handle_worked(t + Duration::from_millis(10), report(1));
    node.handle_sent(t + Duration::from_millis(10), 1, Ok(()));
    assert_eq!(actions(&mut node), ["result 1", "run stop (first)"]);
    assert_eq!(node.poll_timeout(), Some(t + secs(1)));
    node.handle_timeout(t + secs(1));
    assert_eq!(actions(&mut node), ["report (first)", "stop"]);
    node.handle_timeout(t + secs(11));
    assert!(actions(&mut node).is_empty(), "nothing fires twice");
}

#[test]
fn code_home_when_the_grace_passes_is_not_given_up_on() {
    let t = Instant::now();
    let mut node = started(0, false, false, t);
    node.handle_message(t, iterate(1));
    let _ = actions(&mut node);
    node.handle_message(t, abort_first());
    node.handle_worked(t, report(1));
    node.handle_sent(t, 1, Ok(()));
    node.handle_worked(t, Worked::Stopped(Ok(())));
    assert_eq!(
        actions(&mut node),
        [
            "verdict (first)",
            "result 1",
            "run stop (first)",
            "done",
            "report (first)",
            "stop"
        ]
    );
    assert_eq!(node.poll_timeout(), None, "an ended worker has no timer");
}

#[test]
fn a_stop_whose_code_outlives_the_shutdown_timeout_reports_its_ending_without_it() {
    let t = Instant::now();
    let mut node = started(0, false, false, t);
    let last = Arc::new(9);
    node.handle_message(
        t,
        ToWorker::Finish {
            attempt: 0,
            iterations: 3,
            halted: false,
            last,
        },
    );
    assert_eq!(actions(&mut node), ["run stop (completed)"]);
    assert_eq!(node.poll_timeout(), Some(t + secs(10)));
    node.handle_timeout(t + secs(10));
    assert_eq!(actions(&mut node), ["report completed", "stop"]);
    // Its code, back at last, finds the worker ended.
    node.handle_worked(t + secs(12), Worked::Stopped(Ok(())));
    assert_eq!(actions(&mut node), ["done"]);
}

#[test]
fn a_timer_of_no_end_never_fires() {
    let t = Instant::now();
    let forever = Arc::new(
        NodeConfig::of(JobConfig {
            shutdown_timeout: Duration::MAX,
            ..JobConfig::for_tests()
        })
        .worker(),
    );
    let mut node = Node::new(0, 0, forever);
    node.start();
    node.handle_worked(t, Worked::Started(Ok(())));
    node.handle_message(
        t,
        ToWorker::Finish {
            attempt: 0,
            iterations: 1,
            halted: false,
            last: Arc::new(1),
        },
    );
    let _ = actions(&mut node);
    assert_eq!(node.poll_timeout(), None);
}

#[test]
fn a_result_that_cannot_be_sent_fails_the_worker_with_the_transports_error_as_source() {
    let t = Instant::now();
    let mut node = started(3, false, false, t);
    node.handle_message(t, iterate(1));
    node.handle_worked(t, report(1));
    let _ = actions(&mut node);
    let too_large = std::io::Error::other("too large");
    node.handle_sent(
        t,
        1,
        Err(Unsent::Failed(crate::ErrorSource::new(too_large))),
    );
    let failed = match node.poll_action() {
        Some(WorkerAction::Send(ToMaster::Failed { error, .. })) => error,
        _ => panic!("the worker fails first"),
    };
    assert!(failed
        .to_string()
        .contains("worker 3 could not send its result of iteration 1: too large"));
    let source = std::error::Error::source(&failed).expect("a source");
    assert!(source.downcast_ref::<std::io::Error>().is_some());
    let got = actions(&mut node);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with("run stop (transport"), "{got:?}");
}

#[test]
fn reaching_a_master_started_again_drops_the_work_of_the_old_one() {
    let t = Instant::now();
    let mut node = started(0, false, false, t);
    node.handle_message(t, ToWorker::Connected { attempt: 0 });
    node.handle_message(t, iterate(1));
    let _ = actions(&mut node);
    node.handle_message(t, ToWorker::Connected { attempt: 1 });
    assert_eq!(actions(&mut node), ["stale", "registered 1"]);
    node.handle_worked(t, report(1));
    assert!(actions(&mut node).is_empty(), "its result is not sent");
    assert_eq!(node.attempt(), 1);
    // In barrier mode the worker fails instead, and its sync calls with it.
    let mut node = started(0, false, true, t);
    node.handle_message(t, ToWorker::Connected { attempt: 0 });
    node.handle_message(t, ToWorker::Connected { attempt: 1 });
    let got = actions(&mut node);
    assert_eq!(got[0], "end sync");
    assert!(got[1].starts_with("failed (the master"), "{got:?}");
    assert!(got[2].starts_with("run stop"), "{got:?}");
    assert_eq!(got.len(), 3);
}
