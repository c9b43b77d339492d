use super::*;
use crate::error::{Cause, Phase};
use crate::protocol::{FailurePolicy, JobConfig, NodeConfig};

type Process = WorkerProcess<u64>;

/// A process of a job of 2 ranks under `policy`.
fn process(policy: FailurePolicy) -> Process {
    let config = NodeConfig::of(JobConfig {
        workers: 2,
        failure_policy: policy,
        ..JobConfig::for_tests()
    });
    WorkerProcess::new(2, Arc::new(config.worker()))
}

fn gang() -> Process {
    process(FailurePolicy::RestartAll { max_attempts: 3 })
}

/// What the process asks, one line each.
fn actions(p: &mut Process) -> Vec<String> {
    std::iter::from_fn(|| p.poll_action())
        .map(|a| match a {
            ProcessAction::Deliver { rank, msg } => format!("deliver {rank} {}", name(&msg)),
            ProcessAction::Replace { rank, attempt, .. } => format!("replace {rank} in {attempt}"),
            ProcessAction::Offer { rank, replica } => {
                format!("offer {rank} iteration {}", replica.iteration)
            }
            ProcessAction::EndJob(_) => "end job".into(),
            ProcessAction::Record { rank } => format!("record {rank}"),
        })
        .collect()
}

fn name(msg: &ToWorker<u64>) -> String {
    match msg {
        ToWorker::Connected { attempt } => format!("connected {attempt}"),
        ToWorker::Restart { attempt, .. } => format!("restart {attempt}"),
        ToWorker::Abort { .. } => "abort".into(),
        ToWorker::Finish { .. } => "finish".into(),
        ToWorker::Iterate { iteration, .. } => format!("iterate {iteration}"),
        _ => "other".into(),
    }
}

fn connected(attempt: Attempt) -> ToWorker<u64> {
    ToWorker::Connected { attempt }
}

fn restart(attempt: Attempt) -> ToWorker<u64> {
    ToWorker::Restart {
        attempt,
        cause: JobError::Runtime {
            message: "a worker failed".into(),
        },
    }
}

fn finish(attempt: Attempt) -> ToWorker<u64> {
    ToWorker::Finish {
        attempt,
        iterations: 1,
        halted: false,
        last: Arc::new(0),
    }
}

fn replica(iteration: u64) -> ToWorker<u64> {
    ToWorker::Replica(Replica {
        iteration,
        bytes: Arc::new(vec![1, 2, 3]),
    })
}

#[test]
fn a_first_connection_is_the_start_and_a_second_restarts_a_gang() {
    let mut p = gang();
    let link = p.linked(1, 0);
    p.handle_message(1, link, connected(0));
    assert_eq!(actions(&mut p), ["deliver 1 connected 0"]);
    // A master's node reached again (one started again), in the same attempt: every
    // worker starts over; what follows waits for the new worker.
    p.handle_message(1, link, connected(0));
    assert_eq!(actions(&mut p), ["replace 1 in 0"]);
    p.handle_message(1, link, finish(0));
    assert_eq!(actions(&mut p), Vec::<String>::new());
    assert_eq!(p.pending(1), Some(0));
    assert!(p.handle_replaced(1, 0));
    assert_eq!(
        actions(&mut p),
        ["deliver 1 connected 0", "deliver 1 finish"],
        "what was held goes to the new worker, in its order"
    );
    assert_eq!(p.pending(1), None);
}

#[test]
fn a_request_for_the_flight_recorder_is_answered_by_the_process_even_while_its_worker_is_replaced()
{
    let mut p = gang();
    let link = p.linked(1, 0);
    p.handle_message(1, link, connected(0));
    p.handle_message(1, link, ToWorker::Record);
    assert_eq!(actions(&mut p), ["deliver 1 connected 0", "record 1"]);
    p.handle_message(1, link, restart(1));
    p.handle_message(1, link, ToWorker::Record);
    assert_eq!(
        actions(&mut p),
        ["replace 1 in 1", "record 1"],
        "not held for the new worker: the process answers"
    );
    // An older link's request is the old master's: none.
    let newer = p.linked(1, 1);
    p.handle_message(1, link, ToWorker::Record);
    assert_eq!(actions(&mut p), Vec::<String>::new());
    p.handle_message(1, newer, ToWorker::Record);
    assert_eq!(actions(&mut p), ["record 1"]);
}

#[test]
fn without_a_gang_a_connection_again_is_delivered_and_a_restart_still_replaces() {
    let mut p = process(FailurePolicy::RestartWorker { max_restarts: 3 });
    let link = p.linked(0, 0);
    p.handle_message(0, link, connected(0));
    p.handle_message(0, link, connected(0));
    assert_eq!(
        actions(&mut p),
        ["deliver 0 connected 0", "deliver 0 connected 0"]
    );
    p.handle_message(0, link, restart(1));
    assert_eq!(actions(&mut p), ["replace 0 in 1"]);
}

#[test]
fn a_newer_restart_overtakes_the_one_under_way() {
    let mut p = gang();
    let link = p.linked(0, 0);
    p.handle_message(0, link, connected(0));
    actions(&mut p);
    p.handle_message(0, link, restart(1));
    p.handle_message(0, link, finish(1));
    p.handle_message(0, link, restart(2));
    p.handle_message(0, link, finish(2));
    assert_eq!(actions(&mut p), ["replace 0 in 1", "replace 0 in 2"]);
    // The worker made for attempt 1 takes nothing: attempt 2's does.
    assert!(!p.handle_replaced(0, 1));
    assert_eq!(actions(&mut p), Vec::<String>::new());
    assert!(p.handle_replaced(0, 2));
    assert_eq!(actions(&mut p), ["deliver 0 restart 2", "deliver 0 finish"]);
    // A restart into the attempt the worker runs in is no restart.
    p.handle_message(0, link, restart(2));
    assert_eq!(actions(&mut p), ["deliver 0 restart 2"]);
}

#[test]
fn the_copy_kept_outlives_links_and_goes_first_on_each_connection() {
    let mut p = process(FailurePolicy::RestartWorker { max_restarts: 3 });
    let link = p.linked(1, 0);
    p.handle_message(1, link, connected(0));
    p.handle_message(1, link, replica(4));
    assert_eq!(
        actions(&mut p),
        ["deliver 1 connected 0"],
        "a copy is kept, not delivered"
    );
    assert_eq!(p.kept(1).map(|r| r.iteration), Some(4));
    p.handle_message(1, link, replica(6));
    // The worker is made again on a link of its own: the copy is the process's.
    let again = p.linked(1, 1);
    p.handle_message(1, again, connected(1));
    assert_eq!(
        actions(&mut p),
        ["offer 1 iteration 6", "deliver 1 connected 1"]
    );
    assert_eq!(p.kept(0), None, "each rank keeps its own");
}

#[test]
fn an_older_link_reaches_no_worker_but_its_abort_ends_the_job() {
    let mut p = process(FailurePolicy::Fail);
    let old = p.linked(0, 0);
    let new = p.linked(0, 0);
    p.handle_message(0, old, finish(0));
    assert_eq!(actions(&mut p), Vec::<String>::new());
    p.handle_message(
        0,
        old,
        ToWorker::Abort {
            attempt: 0,
            error: JobError::Runtime {
                message: "the job failed".into(),
            },
        },
    );
    assert_eq!(actions(&mut p), ["end job"]);
    p.handle_message(0, new, finish(0));
    assert_eq!(actions(&mut p), ["deliver 0 finish"]);
}

#[test]
fn an_abort_for_this_ranks_own_recoverable_failure_ends_only_the_worker() {
    let mut p = process(FailurePolicy::RestartWorker { max_restarts: 3 });
    let link = p.linked(1, 0);
    let own = |rank| ToWorker::Abort {
        attempt: 0,
        error: JobError::Worker {
            rank,
            iteration: 1,
            phase: Phase::Compute,
            cause: Cause::from_error("boom".into()),
        },
    };
    p.handle_message(1, link, own(1));
    assert_eq!(actions(&mut p), ["deliver 1 abort"]);
    p.handle_message(1, link, own(0));
    assert_eq!(actions(&mut p), ["end job", "deliver 1 abort"]);
}

#[test]
fn a_rank_without_a_link_here_gets_nothing() {
    let mut p = gang();
    p.handle_message(1, 1, connected(0));
    assert_eq!(actions(&mut p), Vec::<String>::new());
    assert!(!p.handle_replaced(1, 0));
    assert_eq!(p.pending(1), None);
}
