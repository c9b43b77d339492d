use super::*;
use crate::protocol::{JobConfig, Report, RowCounts, Share};

/// Every rank connected.
struct Connected;

impl Reach for Connected {
    fn is_connected(&self, _: Rank) -> bool {
        true
    }
    fn may_reach(&self, _: Rank) -> bool {
        true
    }
    fn refusals(&self, _: &[Rank]) -> Vec<String> {
        Vec::new()
    }
}

type Node = MasterNode<u32, u32>;

/// A driver that carries out nothing but the master's code, which returns the sum of
/// the workers' results and never halts.
struct Harness {
    node: Node,
    t: Instant,
    sent: Vec<ToWorker<u32>>,
    /// The job's failure, each time the node said it, and where in what was sent.
    ended: Vec<(JobError, usize)>,
    /// Each round handed to the master's code, and whether its checkpoint was due.
    rounds: Vec<(Iteration, Save)>,
    /// Each copy of a checkpoint sent: to which rank, of which iteration, and how many
    /// messages went before it.
    replicas: Vec<(Rank, Iteration, usize)>,
    /// Each copy the master's code was asked to resume from: who offered it, of which
    /// iteration.
    adopted: Vec<(Rank, Iteration)>,
    finished: Option<Result<JobOutcome<u32>, JobError>>,
}

impl Harness {
    fn new(workers: usize, iterations: Iteration, policy: FailurePolicy) -> Self {
        Harness::with(NodeConfig::of(JobConfig {
            workers,
            iterations,
            failure_policy: policy,
            ..JobConfig::for_tests()
        }))
    }

    fn with(config: NodeConfig) -> Self {
        let local = vec![true; config.job.workers];
        Harness::placed(config, local)
    }

    /// A job whose rank 0 runs in the master's process and every other rank in one of
    /// its own.
    fn across_processes(workers: usize, iterations: Iteration, policy: FailurePolicy) -> Self {
        let config = NodeConfig::of(JobConfig {
            workers,
            iterations,
            failure_policy: policy,
            ..JobConfig::for_tests()
        });
        Harness::placed(config, (0..workers).map(|r| r == 0).collect())
    }

    fn placed(config: NodeConfig, local: Vec<bool>) -> Self {
        Harness::resumed(config, local, None)
    }

    /// [`placed`](Harness::placed), the master's code having resumed from the checkpoint
    /// of `from` (its master result `from`).
    fn resumed(config: NodeConfig, local: Vec<bool>, from: Option<Iteration>) -> Self {
        let t = Instant::now();
        let node = MasterNode::new(
            Arc::new(config),
            NodeSettings {
                local,
                coordinated: false,
                listening: false,
                metrics: false,
            },
            0,
            None,
            Resumed {
                from: from.map(|i| (i, None)),
                point: from.map(|iteration| point(iteration, "the newest checkpoint")),
                last: from.map(|i| Arc::new(i as u32)),
                workers: Vec::new(),
            },
            t,
        );
        let mut h = Harness {
            node,
            t,
            sent: Vec::new(),
            ended: Vec::new(),
            rounds: Vec::new(),
            replicas: Vec::new(),
            adopted: Vec::new(),
            finished: None,
        };
        h.drive();
        h
    }

    fn drive(&mut self) {
        while let Some(action) = self.node.poll_action() {
            match action {
                Action::Send {
                    to,
                    msg: ToWorker::Replica(replica),
                } => self.replicas.push((to, replica.iteration, self.sent.len())),
                Action::Send { msg, .. } | Action::Broadcast(msg) => self.sent.push(msg),
                Action::EndJob(error) => self.ended.push((error, self.sent.len())),
                Action::RunMaster(work) => {
                    if let MasterWork::Iterate(round) = &work {
                        self.rounds.push((round.iteration, round.save));
                    }
                    let done = match work {
                        MasterWork::Start => MasterDone::Started(Ok(None)),
                        MasterWork::Restart(_) => MasterDone::Restarted(Ok(Resumed {
                            from: None,
                            point: None,
                            last: None,
                            workers: Vec::new(),
                        })),
                        MasterWork::Stop(_) => MasterDone::Stopped(Ok(())),
                        MasterWork::Adopt { from, replica } => {
                            let iteration = replica.iteration;
                            self.adopted.push((from, iteration));
                            // A copy whose bytes are `DAMAGED` fails its check.
                            let sound = replica.bytes[0] != DAMAGED;
                            MasterDone::Adopted(Ok(sound.then(|| Resumed {
                                from: Some((iteration, None)),
                                point: Some(point(iteration, "a worker's copy")),
                                last: Some(Arc::new(iteration as u32)),
                                workers: Vec::new(),
                            })))
                        }
                        MasterWork::Iterate(round) => {
                            // A checkpoint due is saved, and its bytes handed back when
                            // asked for.
                            let checkpointed = round.save == Save::Yes;
                            MasterDone::Iterated {
                                iteration: round.iteration,
                                tally: round.gathered.tally,
                                left_out: Vec::new(),
                                elapsed: Duration::ZERO,
                                spare: Default::default(),
                                result: Ok(Computed {
                                    result: Arc::new(round.gathered.results.iter().sum()),
                                    halt: false,
                                    checkpointed,
                                    replica: (checkpointed && round.replicate)
                                        .then(|| replica(round.iteration)),
                                }),
                            }
                        }
                    };
                    self.node.handle_master_done(self.t, done, &Connected);
                }
                Action::Finished(outcome) => self.finished = Some(*outcome),
                _ => {}
            }
        }
    }

    fn from(&mut self, rank: Rank, msg: ToMaster<u32>) {
        self.node
            .handle_message(self.t, Envelope { from: rank, msg }, &Connected);
        self.drive();
    }

    fn result(&mut self, rank: Rank, iteration: Iteration, result: u32) {
        let report = Report {
            attempt: 0,
            iteration,
            result: Share::Own(result),
            halt_vote: false,
            mail: Default::default(),
            saved: None,
            calls: 0,
            group_calls: None,
            elapsed: Duration::ZERO,
        };
        self.from(rank, ToMaster::Result(report));
    }

    fn done(&mut self, rank: Rank) {
        let done = ToMaster::Done {
            attempt: 0,
            awaits_word: false,
            rows: RowCounts::default(),
            attachments: Vec::new(),
        };
        self.from(rank, done);
    }
}

/// The bytes of a copy the master's code finds damaged.
const DAMAGED: u8 = 0xff;

/// A copy of the checkpoint of `iteration` (its bytes stand for it).
fn replica(iteration: Iteration) -> Replica {
    Replica {
        iteration,
        bytes: Arc::new(vec![iteration as u8; 3]),
    }
}

fn lost(rank: Rank) -> ToMaster<u32> {
    ToMaster::Failed {
        attempt: 0,
        error: JobError::WorkerLost {
            rank,
            reason: "its connection closed".into(),
        },
    }
}

#[test]
fn a_job_runs_from_registration_through_its_rounds_to_the_drain() {
    let mut h = Harness::new(2, 2, FailurePolicy::Fail);
    h.from(0, ToMaster::Registered { attempt: 0 });
    assert!(
        h.sent.is_empty(),
        "no iteration before every rank registered"
    );
    h.from(1, ToMaster::Registered { attempt: 0 });
    assert!(matches!(
        h.sent[..],
        [ToWorker::Iterate { iteration: 1, .. }]
    ));
    h.result(1, 1, 5);
    h.result(0, 1, 2);
    assert!(matches!(
        h.sent[1],
        ToWorker::Iterate { iteration: 2, last: Some(ref last), .. } if **last == 7
    ));
    h.result(0, 2, 1);
    h.result(1, 2, 1);
    assert!(matches!(h.sent[2], ToWorker::Finish { iterations: 2, .. }));
    assert!(
        h.finished.is_none(),
        "the job waits for every worker's Done"
    );
    h.done(0);
    h.done(1);
    let outcome = h.finished.take().expect("finished").expect("completed");
    assert_eq!(*outcome.result, 2);
    assert_eq!(outcome.report.iterations.len(), 2);
}

/// Regression: the gate answered one output per message, so a worker lost during the
/// drain — the last rank it waited for — ended the drain and its failure was dropped:
/// the job completed under `Fail` though a worker never finished.
#[test]
fn under_fail_a_worker_lost_during_the_drain_fails_the_job_instead_of_ending_the_drain() {
    let mut h = Harness::new(2, 1, FailurePolicy::Fail);
    h.from(0, ToMaster::Registered { attempt: 0 });
    h.from(1, ToMaster::Registered { attempt: 0 });
    h.result(0, 1, 1);
    h.result(1, 1, 1);
    assert!(matches!(h.sent.last(), Some(ToWorker::Finish { .. })));
    h.done(0);
    h.from(1, lost(1));
    match h.finished.take() {
        Some(Err(JobError::WorkerLost { rank: 1, .. })) => {}
        other => panic!("expected the job to fail with worker 1's loss, got {other:?}"),
    }
}

#[test]
fn under_continue_without_a_worker_lost_during_the_drain_is_not_waited_for() {
    let mut h = Harness::new(2, 1, FailurePolicy::ContinueWithout);
    h.from(0, ToMaster::Registered { attempt: 0 });
    h.from(1, ToMaster::Registered { attempt: 0 });
    h.result(0, 1, 1);
    h.result(1, 1, 1);
    h.done(0);
    h.from(1, lost(1));
    assert!(matches!(h.finished.take(), Some(Ok(_))));
}

#[test]
fn the_first_failure_is_the_job_s_and_every_worker_is_told_at_once() {
    let mut h = Harness::new(3, 5, FailurePolicy::Fail);
    for rank in 0..3 {
        h.from(rank, ToMaster::Registered { attempt: 0 });
    }
    h.result(0, 1, 1);
    h.from(2, lost(2));
    h.from(1, lost(1));
    assert!(
        matches!(
            h.sent.last(),
            Some(ToWorker::Abort {
                error: JobError::WorkerLost { rank: 2, .. },
                ..
            })
        ),
        "{:?}",
        h.sent.last()
    );
    h.done(0);
    match h.finished.take() {
        Some(Err(JobError::WorkerLost { rank: 2, .. })) => {}
        other => panic!("expected worker 2's loss, got {other:?}"),
    }
}

#[test]
fn a_round_completed_after_the_job_failed_is_never_computed() {
    let mut h = Harness::new(2, 5, FailurePolicy::Fail);
    h.from(0, ToMaster::Registered { attempt: 0 });
    h.from(1, ToMaster::Registered { attempt: 0 });
    let error = JobError::Cancelled;
    h.node.cancel(h.t, &Connected);
    h.drive();
    assert!(matches!(h.sent.last(), Some(ToWorker::Abort { .. })));
    h.result(0, 1, 1);
    h.result(1, 1, 1);
    h.done(0);
    h.done(1);
    assert_eq!(h.finished.take().map(|r| r.err()), Some(Some(error)));
}

fn registered(h: &mut Harness) {
    for rank in 0..h.node.config.job.workers {
        h.from(rank, ToMaster::Registered { attempt: 0 });
    }
}

#[test]
fn the_job_s_end_is_said_once_before_any_worker_is_told_of_it() {
    let mut h = Harness::new(3, 5, FailurePolicy::Fail);
    registered(&mut h);
    h.from(2, lost(2));
    h.from(1, lost(1));
    assert_eq!(h.ended.len(), 1, "once: {:?}", h.ended);
    let (error, at) = &h.ended[0];
    assert_eq!(error.rank(), Some(2));
    assert!(
        matches!(h.sent[*at], ToWorker::Abort { .. }),
        "the abort is the next message: {:?}",
        &h.sent[*at..]
    );
}

#[test]
fn a_message_a_worker_cannot_read_fails_the_job_and_a_worker_out_of_reach_does_not() {
    let mut h = Harness::new(2, 5, FailurePolicy::Fail);
    registered(&mut h);
    let gone = Unsent::Failed(crate::ErrorSource::new(std::io::Error::other("reset")));
    h.node.handle_unsent(h.t, Some(1), gone, &Connected);
    h.node
        .handle_unsent(h.t, Some(1), Unsent::Replaced, &Connected);
    h.drive();
    assert!(h.ended.is_empty(), "its loss is the transport's to report");
    let unreadable = JobError::Decode {
        direction: "master → worker 1".into(),
        type_name: "u32".into(),
        peer: "10.0.0.2:7000".into(),
        message: "invalid type".into(),
    };
    h.node.handle_unsent(
        h.t,
        Some(1),
        Unsent::Undecodable(unreadable.clone()),
        &Connected,
    );
    h.drive();
    assert_eq!(h.ended.first().map(|(e, _)| e), Some(&unreadable));
}

#[test]
fn a_broadcast_that_does_not_go_fails_the_job_keeping_the_transports_error() {
    let mut h = Harness::new(2, 5, FailurePolicy::Fail);
    registered(&mut h);
    let closed = Unsent::Failed(crate::ErrorSource::new(std::io::Error::other("closed")));
    h.node.handle_unsent(h.t, None, closed, &Connected);
    h.drive();
    let (error, _) = h.ended.first().expect("the job failed");
    assert!(matches!(error, JobError::Transport { .. }), "{error}");
    let source = std::error::Error::source(error).expect("its source");
    assert!(source.downcast_ref::<std::io::Error>().is_some());
}

#[test]
fn each_round_goes_to_the_master_with_whether_its_checkpoint_is_due() {
    let mut h = Harness::with(NodeConfig {
        checkpoint_every: Some(2),
        ..NodeConfig::of(JobConfig {
            workers: 1,
            iterations: 5,
            ..JobConfig::for_tests()
        })
    });
    registered(&mut h);
    for iteration in 1..=5 {
        h.result(0, iteration, 1);
    }
    use Save::{IfMasterHalts as Halts, Yes};
    assert_eq!(
        h.rounds,
        [(1, Halts), (2, Yes), (3, Halts), (4, Yes), (5, Yes)]
    );
}

#[test]
fn a_gang_restart_waits_for_a_rank_lost_before_it_registered_in_the_new_attempt() {
    let mut h = Harness::across_processes(3, 5, FailurePolicy::RestartAll { max_attempts: 3 });
    registered(&mut h);
    let restarts = |h: &Harness| {
        h.sent
            .iter()
            .filter_map(|m| match m {
                ToWorker::Restart { attempt, .. } => Some(*attempt),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // Rank 1's process is lost in iteration 1: every worker restarts, as attempt 1.
    h.from(1, lost(1));
    assert_eq!(restarts(&h), [1]);
    // Rank 2's process, killed with it, is found lost only now — in attempt 1, before it
    // registered in it: no second restart; a new process of the rank is waited for.
    h.from(
        2,
        ToMaster::Failed {
            attempt: 1,
            error: JobError::WorkerLost {
                rank: 2,
                reason: "its connection closed".into(),
            },
        },
    );
    assert_eq!(restarts(&h), [1]);
    assert!(h.ended.is_empty(), "{:?}", h.ended);
    assert_eq!(h.node.report.recovered, 1);
    // The new processes register in attempt 1: the job goes on from iteration 1.
    for rank in 0..3 {
        h.from(rank, ToMaster::Registered { attempt: 1 });
    }
    assert!(
        h.sent.iter().any(|m| matches!(
            m,
            ToWorker::Iterate {
                attempt: 1,
                iteration: 1,
                ..
            }
        )),
        "{:?}",
        h.sent
    );
}

/// Three ranks, rank 0 in the master's process; six iterations, a checkpoint every second.
fn checkpointing() -> NodeConfig {
    NodeConfig {
        checkpoint_every: Some(2),
        ..NodeConfig::of(JobConfig {
            workers: 3,
            iterations: 6,
            ..JobConfig::for_tests()
        })
    }
}

#[test]
fn each_checkpoint_is_copied_to_a_worker_of_another_process_after_the_next_broadcast() {
    let mut h = Harness::placed(checkpointing(), vec![true, false, false]);
    registered(&mut h);
    for iteration in 1..=3 {
        for rank in 0..3 {
            h.result(rank, iteration, 1);
        }
    }
    // The copy of 2 goes to rank 1 (rank 0's would go with the master's host), once the
    // workers have iteration 3: it holds none of them back.
    assert_eq!(h.replicas.len(), 1, "{:?}", h.replicas);
    let (to, iteration, after) = h.replicas[0];
    assert_eq!((to, iteration), (1, 2));
    assert!(
        matches!(h.sent[after - 1], ToWorker::Iterate { iteration: 3, .. }),
        "{:?}",
        h.sent
    );
    // A job whose every worker is in the master's process makes no copy.
    let mut alone = Harness::placed(checkpointing(), vec![true; 3]);
    registered(&mut alone);
    for iteration in 1..=2 {
        for rank in 0..3 {
            alone.result(rank, iteration, 1);
        }
    }
    assert_eq!(alone.rounds.len(), 2);
    assert!(alone.replicas.is_empty());
}

#[test]
fn a_master_with_an_older_store_resumes_from_the_newest_copy_offered_before_its_first_iteration() {
    // The master's store had only the checkpoint of 2; workers offer copies of 4 and 2.
    let mut h = Harness::resumed(checkpointing(), vec![true, false, false], Some(2));
    h.from(2, ToMaster::Replica(replica(2)));
    h.from(1, ToMaster::Replica(replica(4)));
    h.from(2, ToMaster::Replica(replica(3)));
    assert!(h.adopted.is_empty(), "not before every worker registered");
    registered(&mut h);
    assert_eq!(h.adopted, [(1, 4)], "the newest copy");
    assert!(
        matches!(
            h.sent[..],
            [ToWorker::Iterate { iteration: 5, last: Some(ref last), .. }] if **last == 4
        ),
        "the job goes on after the copy's iteration, from its result: {:?}",
        h.sent
    );
    assert_eq!(h.node.report.resumed_from(), Some(4));
}

#[test]
fn a_copy_no_newer_than_the_masters_or_offered_once_the_job_began_is_not_taken() {
    let mut h = Harness::resumed(checkpointing(), vec![true, false, false], Some(4));
    h.from(1, ToMaster::Replica(replica(4)));
    h.from(2, ToMaster::Replica(replica(2)));
    registered(&mut h);
    assert!(h.adopted.is_empty());
    assert!(matches!(
        h.sent[..],
        [ToWorker::Iterate { iteration: 5, .. }]
    ));
    // A worker that reconnects mid-job offers its copy again: the master's own
    // checkpoints are the newest now.
    let mut h = Harness::placed(checkpointing(), vec![true, false, false]);
    registered(&mut h);
    h.from(1, ToMaster::Replica(replica(6)));
    for rank in 0..3 {
        h.result(rank, 1, 1);
    }
    assert!(h.adopted.is_empty());
    assert!(matches!(
        h.sent.last(),
        Some(ToWorker::Iterate { iteration: 2, .. })
    ));
}

#[test]
fn a_damaged_copy_gives_way_to_the_next_newest_and_an_older_one_is_never_taken() {
    let mut config = checkpointing();
    Arc::make_mut(&mut config.job).workers = 4;
    let mut h = Harness::placed(config, vec![true, false, false, false]);
    let mut damaged = replica(6);
    damaged.bytes = Arc::new(vec![DAMAGED; 3]);
    h.from(1, ToMaster::Replica(damaged));
    h.from(2, ToMaster::Replica(replica(4)));
    h.from(3, ToMaster::Replica(replica(2)));
    // Rank 3 reached the master again and offers what it holds once more: one per rank.
    h.from(3, ToMaster::Replica(replica(2)));
    registered(&mut h);
    assert_eq!(
        h.adopted,
        [(1, 6), (2, 4)],
        "the damaged 6, then 4; never 2"
    );
    assert!(
        matches!(h.sent[..], [ToWorker::Iterate { iteration: 5, .. }]),
        "{:?}",
        h.sent
    );
    assert_eq!(h.node.report.resumed_from(), Some(4));
}

/// What a report says of a checkpoint resumed from in these tests.
fn point(iteration: Iteration, source: &str) -> crate::protocol::ResumedFrom {
    crate::protocol::ResumedFrom {
        iteration,
        source: source.into(),
        finished: false,
    }
}

/// What the hosted workers send after one broadcast, fed as one batch: the node's batch
/// path (`handle_messages`) does what feeding each message in turn does — the same
/// messages sent, rounds computed, failures said and outcome — with a round completing
/// mid-batch, results of a round already complete, duplicates, a failure and the
/// workers' `Done` after their last results.
#[test]
fn a_batch_of_messages_does_what_each_in_turn_does() {
    let report = |iteration, result| {
        ToMaster::Result(Report {
            attempt: 0,
            iteration,
            result: Share::Own(result),
            halt_vote: false,
            mail: None,
            saved: None,
            calls: 0,
            group_calls: None,
            elapsed: Duration::from_millis(result as u64),
        })
    };
    let done = || ToMaster::Done {
        attempt: 0,
        awaits_word: false,
        rows: RowCounts::default(),
        attachments: Vec::new(),
    };
    let registered = || ToMaster::Registered { attempt: 0 };
    let batches: Vec<Vec<(Rank, ToMaster<u32>)>> = vec![
        vec![(0, registered()), (1, registered()), (2, registered())],
        // Rank 1's twice: the second dropped.
        vec![
            (2, report(1, 3)),
            (1, report(1, 1)),
            (1, report(1, 9)),
            (0, report(1, 2)),
        ],
        // The round completes at rank 0's; rank 3 is no rank; rank 2's is then stale.
        vec![
            (1, report(2, 4)),
            (3, report(2, 8)),
            (0, report(2, 5)),
            (2, report(2, 6)),
            (2, report(2, 7)),
        ],
        vec![(0, report(3, 1)), (2, lost(2)), (1, report(3, 2))],
        vec![
            (0, report(4, 1)),
            (1, report(4, 1)),
            (0, done()),
            (1, done()),
        ],
    ];
    let run = |bulk: bool| {
        let mut h = Harness::with(NodeConfig::of(JobConfig {
            workers: 3,
            iterations: 4,
            failure_policy: FailurePolicy::ContinueWithout,
            min_workers_ratio: 0.6,
            ..JobConfig::for_tests()
        }));
        for batch in &batches {
            let mut envs: Vec<_> = batch
                .iter()
                .map(|(from, msg)| Envelope {
                    from: *from,
                    msg: msg.clone(),
                })
                .collect();
            if bulk {
                h.node.handle_messages(h.t, &mut envs, &Connected);
                assert!(envs.is_empty(), "every message is taken");
            } else {
                for env in envs {
                    h.node.handle_message(h.t, env, &Connected);
                }
            }
            h.drive();
        }
        (
            format!("{:?}", h.sent),
            h.rounds.clone(),
            format!("{:?}", h.ended),
            format!("{:?}", h.finished),
            h.node.drops(),
        )
    };
    let (one, bulk) = (run(false), run(true));
    assert_eq!(one, bulk);
    assert!(one.3.contains("Ok"), "the job completes: {}", one.3);
    assert_eq!(one.4.duplicate, 1);
    assert_eq!(one.4.unknown_rank, 1);
}

/// A node of `workers` ranks and `iterations`, with a checkpoint every 3 iterations.
fn preemptible(workers: usize, iterations: Iteration) -> Harness {
    Harness::with(NodeConfig {
        checkpoint_every: Some(3),
        ..NodeConfig::of(JobConfig {
            workers,
            iterations,
            preempt_grace: Duration::from_secs(20),
            ..JobConfig::for_tests()
        })
    })
}

/// Every iteration broadcast so far, with whether its workers save for a checkpoint.
fn broadcast(h: &Harness) -> Vec<(Iteration, bool)> {
    h.sent
        .iter()
        .filter_map(|m| match m {
            ToWorker::Iterate {
                iteration, save, ..
            } => Some((*iteration, *save)),
            _ => None,
        })
        .collect()
}

fn preempted(h: &Harness) -> Option<&JobError> {
    h.sent.iter().find_map(|m| match m {
        ToWorker::Abort { error, .. } if error.is_preempted() => Some(error),
        _ => None,
    })
}

#[test]
fn a_preemption_in_an_iteration_without_a_checkpoint_stops_after_the_next_whose_workers_save() {
    let mut h = preemptible(2, 10);
    registered(&mut h);
    h.result(0, 1, 1);
    h.result(1, 1, 1);
    // Asked by a worker's process while iteration 2 is gathered (its workers save nothing).
    h.from(
        1,
        ToMaster::Preempt {
            by: "SIGTERM in rank 1's process".into(),
        },
    );
    assert!(
        preempted(&h).is_none(),
        "no checkpoint yet: the job goes on"
    );
    h.result(0, 2, 1);
    h.result(1, 2, 1);
    assert_eq!(
        broadcast(&h),
        [(1, false), (2, false), (3, true)],
        "the next iteration's workers save"
    );
    assert!(preempted(&h).is_none());
    h.result(0, 3, 1);
    h.result(1, 3, 1);
    assert_eq!(h.rounds.last(), Some(&(3, Save::Yes)));
    assert_eq!(
        preempted(&h),
        Some(&JobError::Preempted {
            iteration: 3,
            checkpoint: Some(3),
            by: "SIGTERM in rank 1's process".into(),
        })
    );
    assert_eq!(broadcast(&h).len(), 3, "no iteration after the checkpoint");
    h.done(0);
    h.done(1);
    assert!(matches!(
        h.finished.take(),
        Some(Err(JobError::Preempted { iteration: 3, .. }))
    ));
}

#[test]
fn a_preemption_stops_at_the_jobs_own_checkpoint_when_that_comes_first_and_is_said_once() {
    let mut h = preemptible(1, 10);
    registered(&mut h);
    h.result(0, 1, 1);
    // Asked while iteration 2 is gathered: 3 is the job's own checkpoint, taken as due.
    h.node
        .preempt(h.t, "Preempt::request in this process".into(), &Connected);
    h.drive();
    h.result(0, 2, 1);
    h.result(0, 3, 1);
    assert!(matches!(
        preempted(&h),
        Some(JobError::Preempted {
            iteration: 3,
            checkpoint: Some(3),
            ..
        })
    ));
    // Asked again, or by another rank, it is said once.
    h.node.preempt(h.t, "SIGTERM".into(), &Connected);
    h.drive();
    assert_eq!(
        h.sent
            .iter()
            .filter(|m| matches!(m, ToWorker::Abort { .. }))
            .count(),
        1
    );
}

#[test]
fn a_preemption_whose_grace_runs_out_stops_the_job_naming_the_checkpoint_before() {
    let mut h = preemptible(2, 10);
    registered(&mut h);
    for i in 1..=4 {
        h.result(0, i, 1);
        h.result(1, i, 1);
    }
    h.node
        .preempt(h.t, "SIGUSR1 in rank 0's process".into(), &Connected);
    h.drive();
    // Rank 1 never reports iteration 5; the grace (20 s) passes.
    h.result(0, 5, 1);
    let until = h.node.poll_timeout().expect("the grace is a deadline");
    assert!(until <= h.t + Duration::from_secs(20));
    h.t += Duration::from_secs(21);
    h.node.handle_timeout(h.t, &Connected);
    h.drive();
    assert_eq!(
        preempted(&h),
        Some(&JobError::Preempted {
            iteration: 4,
            checkpoint: Some(3),
            by: "SIGUSR1 in rank 0's process".into(),
        })
    );
}

#[test]
fn a_preemption_before_the_first_iteration_stops_at_once_and_without_a_store_at_the_next_boundary()
{
    let mut h = preemptible(2, 10);
    h.node.preempt(h.t, "SIGTERM".into(), &Connected);
    h.drive();
    assert!(broadcast(&h).is_empty());
    assert!(matches!(
        preempted(&h),
        Some(JobError::Preempted {
            iteration: 0,
            checkpoint: None,
            ..
        })
    ));

    let mut h = Harness::new(1, 10, FailurePolicy::Fail);
    registered(&mut h);
    h.node.preempt(h.t, "SIGTERM".into(), &Connected);
    h.drive();
    h.result(0, 1, 1);
    assert_eq!(broadcast(&h), [(1, false)]);
    assert!(matches!(
        preempted(&h),
        Some(JobError::Preempted {
            iteration: 1,
            checkpoint: None,
            ..
        })
    ));
}

proptest::proptest! {
    /// Wherever a preemption comes — before which result of which iteration, in whatever
    /// order the ranks report, at whatever checkpoint interval, asked by a rank or by the
    /// master's process — the job stops at the first checkpoint whose workers saved: the
    /// iteration under way when its broadcast asked them to, else the next one, whose
    /// broadcast does; nothing is broadcast after it; and a job whose last iteration that
    /// is completes instead.
    #[test]
    fn a_preemption_anywhere_stops_at_the_first_checkpoint_whose_workers_saved(
        workers in 1usize..4,
        iterations in 2u64..10,
        every in 1u64..5,
        asked_after in 0usize..40,
        by_rank in proptest::option::of(0usize..4),
        order in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 40),
    ) {
        let mut h = Harness::with(NodeConfig {
            checkpoint_every: Some(every),
            ..NodeConfig::of(JobConfig {
                workers,
                iterations,
                ..JobConfig::for_tests()
            })
        });
        registered(&mut h);
        let mut sent = 0;
        let mut asked_in = None;
        'job: for i in 1..=iterations {
            let mut ranks: Vec<Rank> = (0..workers).collect();
            for (at, pick) in order.iter().take(workers).enumerate() {
                let j = at + pick.index(workers - at);
                ranks.swap(at, j);
            }
            for rank in ranks {
                if sent == asked_after && asked_in.is_none() {
                    asked_in = Some(i);
                    match by_rank {
                        Some(r) => {
                            let msg = ToMaster::Preempt { by: "a rank".into() };
                            h.from(r % workers, msg)
                        }
                        None => {
                            h.node.preempt(h.t, "the master's process".into(), &Connected);
                            h.drive();
                        }
                    }
                }
                if preempted(&h).is_some() {
                    break 'job;
                }
                h.result(rank, i, 1);
                sent += 1;
            }
        }
        for rank in 0..workers {
            h.done(rank);
        }
        let finished = h.finished.take().expect("the job ended");
        let Some(asked) = asked_in else {
            proptest::prop_assert!(finished.is_ok(), "never asked: {finished:?}");
            return Ok(());
        };
        let saved_for = |i: Iteration| i % every == 0 || i >= iterations;
        let stop = if saved_for(asked) { asked } else { asked + 1 };
        let sent_iterations = broadcast(&h);
        proptest::prop_assert_eq!(sent_iterations.last().map(|&(i, _)| i), Some(stop));
        proptest::prop_assert!(
            sent_iterations.iter().all(|&(i, save)| save == (saved_for(i) || i > asked)),
            "the broadcasts after the request ask the workers to save: {:?}",
            sent_iterations
        );
        proptest::prop_assert_eq!(h.rounds.last(), Some(&(stop, Save::Yes)));
        match finished {
            Ok(outcome) => {
                // Only a stop at the job's last iteration completes it.
                proptest::prop_assert_eq!(outcome.iterations, iterations);
                proptest::prop_assert_eq!(stop, iterations);
            }
            Err(JobError::Preempted { iteration, checkpoint, .. }) => {
                proptest::prop_assert!(stop < iterations);
                proptest::prop_assert_eq!((iteration, checkpoint), (stop, Some(stop)));
            }
            Err(other) => proptest::prop_assert!(false, "{other}"),
        }
    }
}

#[test]
fn a_replacement_in_the_round_a_preemption_checkpoints_saves_as_the_others_were_told() {
    let mut h = Harness::with(NodeConfig {
        checkpoint_every: Some(10),
        ..NodeConfig::of(JobConfig {
            workers: 2,
            iterations: 20,
            failure_policy: FailurePolicy::RestartWorker { max_restarts: 1 },
            ..JobConfig::for_tests()
        })
    });
    registered(&mut h);
    h.result(0, 1, 1);
    h.node.preempt(h.t, "SIGTERM".into(), &Connected);
    h.drive();
    h.result(1, 1, 1);
    assert_eq!(broadcast(&h).last(), Some(&(2, true)));
    // Rank 1 is lost in iteration 2; its replacement joins the round, saving too.
    h.result(0, 2, 1);
    h.from(1, lost(1));
    h.from(1, ToMaster::Registered { attempt: 0 });
    assert_eq!(broadcast(&h).last(), Some(&(2, true)), "{:?}", h.sent);
    h.result(1, 2, 1);
    assert!(matches!(
        preempted(&h),
        Some(JobError::Preempted {
            iteration: 2,
            checkpoint: Some(2),
            ..
        })
    ));
}

/// A job of `workers` ranks in barrier mode, every rank registered.
fn calling(workers: usize) -> Harness {
    let mut h = Harness::with(NodeConfig::of(JobConfig {
        workers,
        iterations: 2,
        barrier_mode: true,
        ..JobConfig::for_tests()
    }));
    registered(&mut h);
    h
}

/// Rank `rank`'s word of `calls` 8-byte `all_reduce`s from `epoch`, none awaited.
fn all_reduces(epoch: Epoch, calls: u32) -> ToMaster<u32> {
    ToMaster::Sync {
        attempt: 0,
        epoch,
        calls,
        kind: SyncKind::Collective(crate::ids::CollectiveKind::AllReduce(Some(
            crate::ids::ReduceOp::Sum,
        ))),
        message: Vec::new(),
        awaits: false,
        group: GroupId::ALL,
        ranks: Vec::new(),
    }
}

/// Rank `rank`'s result of iteration 1, its compute having made `calls` calls.
fn returned(h: &mut Harness, rank: Rank, calls: Epoch) {
    let report = Report {
        attempt: 0,
        iteration: 1,
        result: Share::Own(1),
        halt_vote: false,
        mail: Default::default(),
        saved: None,
        calls,
        group_calls: None,
        elapsed: Duration::ZERO,
    };
    h.from(rank, ToMaster::Result(report));
}

#[test]
fn a_word_of_several_calls_counts_as_each_of_them() {
    let mut h = calling(2);
    h.from(0, all_reduces(0, 3));
    h.from(1, all_reduces(0, 1));
    h.from(1, all_reduces(1, 2));
    returned(&mut h, 0, 3);
    returned(&mut h, 1, 3);
    assert!(h.ended.is_empty(), "{:?}", h.ended);
    assert!(
        matches!(h.sent.last(), Some(ToWorker::Iterate { iteration: 2, .. })),
        "{:?}",
        h.sent
    );
}

#[test]
fn a_call_inside_a_word_of_several_meets_the_other_ranks_call_of_its_own_epoch() {
    let mut h = calling(2);
    h.from(0, all_reduces(0, 3));
    h.from(1, all_reduces(0, 1));
    let barrier = ToMaster::Sync {
        attempt: 0,
        epoch: 1,
        calls: 1,
        kind: SyncKind::Barrier,
        message: Vec::new(),
        awaits: true,
        group: GroupId::ALL,
        ranks: Vec::new(),
    };
    h.from(1, barrier);
    let (error, _) = h.ended.first().expect("the job failed");
    let JobError::Sync(crate::SyncError::Mismatch { at, calls }) = error else {
        panic!("a mismatch: {error:?}");
    };
    assert_eq!(at.call, 2, "{error}");
    assert_eq!(calls[1], (1, SyncKind::Barrier), "{error}");
}

#[test]
fn a_word_of_no_calls_or_of_more_than_a_worker_says_fails_the_job_naming_the_rank() {
    for calls in [0, crate::protocol::MAX_CALLS + 1] {
        let mut h = calling(2);
        h.from(1, all_reduces(0, calls));
        let (error, _) = h.ended.first().expect("the job failed");
        assert!(
            matches!(error, JobError::Decode { peer, .. } if peer == "rank 1"),
            "{error:?}"
        );
        assert!(
            error.to_string().contains(&format!("{calls} calls")),
            "{error}"
        );
    }
}

#[test]
fn a_word_of_several_calls_that_awaits_the_masters_word_fails_the_job_naming_the_rank() {
    let awaited = |calls| {
        let mut word = all_reduces(0, calls);
        if let ToMaster::Sync { awaits, .. } = &mut word {
            *awaits = true;
        }
        word
    };
    let mut h = calling(2);
    h.from(1, awaited(2));
    let (error, _) = h.ended.first().expect("the job failed");
    assert!(
        matches!(error, JobError::Decode { peer, .. } if peer == "rank 1"),
        "{error:?}"
    );
    assert!(error.to_string().contains("2 calls that awaits"), "{error}");
    // One call that awaits the word is any blocking call's.
    let mut h = calling(2);
    h.from(1, awaited(1));
    assert!(h.ended.is_empty(), "{:?}", h.ended);
}
