use super::*;

fn config(workers: usize) -> GateConfig {
    GateConfig::new(
        workers,
        0,
        [
            Duration::from_secs(10),
            Duration::from_secs(5),
            Duration::from_secs(1),
        ],
    )
}

fn env<W>(from: Rank, msg: ToMaster<W>) -> Envelope<ToMaster<W>> {
    Envelope { from, msg }
}

fn done(from: Rank) -> Envelope<ToMaster<u32>> {
    env(
        from,
        ToMaster::Done {
            attempt: 0,
            awaits_word: false,
            rows: Default::default(),
            attachments: Vec::new(),
        },
    )
}

fn report(iteration: Iteration, result: u32) -> ToMaster<u32> {
    ToMaster::Result(Report {
        attempt: 0,
        iteration,
        result: Share::Own(result),
        halt_vote: false,
        mail: Default::default(),
        saved: None,
        calls: 0,
        group_calls: None,
        elapsed: Duration::ZERO,
    })
}

#[test]
fn a_failure_is_the_rank_s_it_came_from_whatever_rank_it_names() {
    let t0 = Instant::now();
    let mut gate = Gate::<u32>::new(config(3), t0);
    let blame = |rank| JobError::Worker {
        rank,
        iteration: 0,
        phase: Phase::Init,
        cause: Cause::message_only(crate::error::CauseKind::Error, "x"),
    };
    let failed = ToMaster::Failed {
        attempt: 0,
        error: blame(2),
    };
    match gate.on_message(t0, env(1, failed)) {
        Some(GateOutput::Failed(error)) => assert_eq!(error, blame(1)),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn registration_then_a_round_then_a_drain() {
    let t0 = Instant::now();
    let mut gate = Gate::new(config(2), t0);
    assert_eq!(
        gate.on_message(t0, env(1, ToMaster::Registered { attempt: 0 })),
        None
    );
    assert_eq!(
        gate.on_message(t0, env(0, ToMaster::Registered { attempt: 0 })),
        Some(GateOutput::AllRegistered)
    );
    gate.open(t0, 1);
    assert_eq!(gate.on_message(t0, env(1, report(1, 11))), None);
    let out = gate.on_message(t0, env(0, report(1, 10))).unwrap();
    match out {
        GateOutput::RoundComplete {
            iteration,
            gathered,
        } => {
            assert_eq!(iteration, 1);
            assert_eq!(gathered.results, vec![10, 11]);
            assert_eq!(gathered.combined, None);
            assert_eq!(gathered.tally.results_held, 2);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(gate.drain(t0), None);
    gate.on_message(t0, done(0));
    assert!(matches!(
        gate.on_message(t0, done(1)),
        Some(GateOutput::Drained { ref missing, .. }) if missing.is_empty()
    ));
}

#[test]
fn a_rounds_buffers_handed_back_hold_the_next_rounds_results_and_one_not_emptied_is_not_kept() {
    let t0 = Instant::now();
    let mut gate = Gate::new(config(2), t0);
    gate.on_message(t0, env(0, ToMaster::Registered { attempt: 0 }));
    gate.on_message(t0, env(1, ToMaster::Registered { attempt: 0 }));
    let round = |gate: &mut Gate<u32>, iteration, base: u32| {
        assert!(gate.open(t0, iteration));
        gate.on_message(t0, env(1, report(iteration, base + 1)));
        match gate.on_message(t0, env(0, report(iteration, base))) {
            Some(GateOutput::RoundComplete { gathered, .. }) => gathered,
            other => panic!("unexpected {other:?}"),
        }
    };
    let Gathered {
        mut results,
        mut reported,
        ..
    } = round(&mut gate, 1, 10);
    assert_eq!((&results[..], &reported[..]), (&[10, 11][..], &[0, 1][..]));
    let (at, ranks_at) = (results.as_ptr(), reported.as_ptr());
    results.clear();
    reported.clear();
    gate.recycle(Spare { results, reported });
    // The next round's go where the last round's were: no allocation.
    let gathered = round(&mut gate, 2, 20);
    assert_eq!(gathered.results, [20, 21]);
    assert_eq!(gathered.reported, [0, 1]);
    assert_eq!(gathered.results.as_ptr(), at);
    assert_eq!(gathered.reported.as_ptr(), ranks_at);
    // Buffers that still hold something are not kept (what they hold is dropped by the
    // caller, where its code may run): the next round holds its own results alone.
    gate.recycle(Spare {
        results: gathered.results,
        reported: gathered.reported,
    });
    let gathered = round(&mut gate, 3, 30);
    assert_eq!(gathered.results, [30, 31]);
    assert_eq!(gathered.reported, [0, 1]);
}

fn registered(workers: usize, t0: Instant) -> Gate<String> {
    let mut gate =
        Gate::new(config(workers), t0).combining(Box::new(|fold: &mut String, next: String| {
            if next == "boom" {
                return Err(Cause::from_error("cannot combine boom".into()));
            }
            fold.push_str(&next);
            Ok(())
        }));
    for r in 0..workers {
        gate.on_message(t0, env(r, ToMaster::Registered { attempt: 0 }));
    }
    gate
}

fn text(iteration: Iteration, s: &str) -> ToMaster<String> {
    ToMaster::Result(Report {
        attempt: 0,
        iteration,
        result: Share::Own(s.to_string()),
        halt_vote: s.ends_with('!'),
        mail: Default::default(),
        saved: None,
        calls: 0,
        group_calls: None,
        elapsed: Duration::from_millis(s.len() as u64),
    })
}

#[test]
fn a_combining_gate_folds_in_rank_order_as_the_prefix_arrives_holding_only_what_is_ahead() {
    let t0 = Instant::now();
    let mut gate = registered(4, t0);
    gate.open(t0, 1);
    assert_eq!(gate.on_message(t0, env(2, text(1, "c!"))), None);
    assert_eq!(gate.on_message(t0, env(0, text(1, "a"))), None);
    assert_eq!(gate.on_message(t0, env(1, text(1, "bbb"))), None);
    match gate.on_message(t0, env(3, text(1, "d!"))) {
        Some(GateOutput::RoundComplete {
            iteration,
            gathered,
        }) => {
            assert_eq!(iteration, 1);
            assert_eq!(gathered.combined.as_deref(), Some("abbbc!d!"));
            assert!(gathered.results.is_empty());
            assert_eq!(gathered.tally.halt_votes, 2);
            assert_eq!(gathered.tally.slowest, Some((1, Duration::from_millis(3))));
            // When rank 1 arrived: the fold of rank 0, rank 1's and rank 2's (ahead).
            assert_eq!(gathered.tally.results_held, 3);
        }
        other => panic!("unexpected {other:?}"),
    }
    // In rank order the fold and the one arrival are all it ever holds.
    gate.open(t0, 2);
    for r in 0..3 {
        assert_eq!(gate.on_message(t0, env(r, text(2, "x"))), None);
    }
    match gate.on_message(t0, env(3, text(2, "y"))) {
        Some(GateOutput::RoundComplete { gathered, .. }) => {
            assert_eq!(gathered.combined.as_deref(), Some("xxxy"), "a fresh fold");
            assert_eq!(gathered.tally.results_held, 2);
            assert_eq!(gathered.tally.halt_votes, 0, "votes are counted per round");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_failing_combiner_fails_the_round_as_the_masters_combine_phase() {
    let t0 = Instant::now();
    let mut gate = registered(2, t0);
    gate.open(t0, 1);
    gate.on_message(t0, env(0, text(1, "a")));
    match gate.on_message(t0, env(1, text(1, "boom"))) {
        Some(GateOutput::Failed(JobError::Master {
            iteration, phase, ..
        })) => {
            assert_eq!(iteration, 1);
            assert_eq!(phase, Phase::Combine);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(gate.poll_timeout(), None, "the round is over");
}

#[test]
fn a_registration_timeout_names_the_ranks_that_did_not_register() {
    let t0 = Instant::now();
    let mut gate: Gate<u32> = Gate::new(config(3), t0);
    gate.on_message(t0, env(1, ToMaster::Registered { attempt: 0 }));
    assert_eq!(gate.handle_timeout(t0 + Duration::from_secs(9)), None);
    match gate.handle_timeout(t0 + Duration::from_secs(10)) {
        Some(GateOutput::Failed(JobError::WorkersTimedOut {
            during, missing, ..
        })) => {
            assert_eq!(during, Waiting::Registration);
            assert_eq!(missing, vec![0, 2]);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(gate.poll_timeout(), None, "a timeout fires once");
}

#[test]
fn an_iteration_timeout_names_the_ranks_whose_results_are_missing() {
    let t0 = Instant::now();
    let mut gate = Gate::new(config(3), t0);
    for r in 0..3 {
        gate.on_message(t0, env(r, ToMaster::Registered { attempt: 0 }));
    }
    let t1 = t0 + Duration::from_secs(3);
    gate.open(t1, 4);
    gate.on_message(t1, env(2, report(4, 0)));
    assert_eq!(gate.poll_timeout(), Some(t1 + Duration::from_secs(5)));
    match gate.handle_timeout(t1 + Duration::from_secs(6)) {
        Some(GateOutput::Failed(err @ JobError::WorkersTimedOut { .. })) => {
            assert_eq!(err.iteration(), Some(4));
            assert!(err.to_string().contains("[0, 1]"), "{err}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_result_that_arrives_after_the_deadline_fails_the_round_instead_of_completing_it() {
    let t0 = Instant::now();
    let mut gate = Gate::new(config(2), t0);
    for r in 0..2 {
        gate.on_message(t0, env(r, ToMaster::Registered { attempt: 0 }));
    }
    gate.open(t0, 1);
    gate.on_message(t0, env(0, report(1, 0)));
    let late = t0 + Duration::from_secs(5);
    match gate.on_message(late, env(1, report(1, 0))) {
        Some(GateOutput::Failed(JobError::WorkersTimedOut { missing, .. })) => {
            assert_eq!(missing, vec![1])
        }
        other => panic!("unexpected {other:?}"),
    }
    let late_registration = Gate::<u32>::new(config(1), t0).on_message(
        t0 + Duration::from_secs(10),
        env(0, ToMaster::Registered { attempt: 0 }),
    );
    assert!(matches!(late_registration, Some(GateOutput::Failed(_))));
}

#[test]
fn an_endless_timeout_never_fires_and_a_round_opens_only_between_rounds() {
    let t0 = Instant::now();
    let mut gate: Gate<u32> = Gate::new(
        GateConfig {
            startup_timeout: Duration::MAX,
            ..config(1)
        },
        t0,
    );
    assert_eq!(gate.poll_timeout(), None);
    assert_eq!(gate.handle_timeout(t0 + Duration::from_secs(1 << 40)), None);
    assert!(!gate.open(t0, 1), "not before registration");
    gate.on_message(t0, env(0, ToMaster::Registered { attempt: 0 }));
    assert!(gate.open(t0, 1));
    assert!(!gate.open(t0, 2), "not while a round is open");
}

#[test]
fn a_lost_worker_is_not_waited_for_at_the_end() {
    let t0 = Instant::now();
    let mut gate: Gate<u32> = Gate::new(config(2), t0);
    let lost = JobError::WorkerLost {
        rank: 1,
        reason: "its connection closed".into(),
    };
    assert!(matches!(
        gate.on_message(
            t0,
            env(
                1,
                ToMaster::Failed {
                    attempt: 0,
                    error: lost
                }
            )
        ),
        Some(GateOutput::Failed(_))
    ));
    assert_eq!(gate.drain(t0), None);
    assert!(matches!(
        gate.on_message(t0, done(0)),
        Some(GateOutput::Drained { ref missing, .. }) if missing.is_empty()
    ));
}

#[test]
fn a_worker_lost_during_the_drain_is_reported_as_a_failure_not_hidden_by_the_drain_s_end() {
    let t0 = Instant::now();
    let mut gate: Gate<u32> = Gate::new(config(2), t0);
    gate.on_message(t0, done(0));
    assert_eq!(gate.drain(t0), None);
    let lost = JobError::WorkerLost {
        rank: 1,
        reason: "its connection closed".into(),
    };
    let failed = ToMaster::Failed {
        attempt: 0,
        error: lost.clone(),
    };
    assert_eq!(
        gate.on_message(t0, env(1, failed)),
        Some(GateOutput::Failed(lost))
    );
    // The driver goes on without the rank: the drain ends.
    assert!(matches!(
        gate.lose(t0, 1),
        Some(GateOutput::Drained { ref missing, .. }) if missing.is_empty()
    ));
}

#[test]
fn a_drain_timeout_names_the_ranks_not_done() {
    let t0 = Instant::now();
    let mut gate: Gate<u32> = Gate::new(config(2), t0);
    gate.on_message(t0, done(0));
    gate.drain(t0);
    match gate.handle_timeout(t0 + Duration::from_secs(1)) {
        Some(GateOutput::Drained { missing, .. }) => assert_eq!(missing, vec![1]),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_failure_is_reported_at_once_and_stale_messages_are_counted() {
    let t0 = Instant::now();
    let mut gate: Gate<u32> = Gate::new(config(2), t0);
    let error = JobError::Runtime {
        message: "x".into(),
    };
    assert!(matches!(
        gate.on_message(t0, env(1, ToMaster::Failed { attempt: 0, error })),
        Some(GateOutput::Failed(_))
    ));
    gate.on_message(t0, env(0, ToMaster::Registered { attempt: 7 }));
    gate.on_message(t0, env(5, ToMaster::Registered { attempt: 0 }));
    gate.on_message(t0, env(0, report(1, 1)));
    let drops = gate.drops();
    assert_eq!((drops.stale, drops.unknown_rank), (2, 1));
}

fn quorum_gate(workers: usize, quorum: usize, t0: Instant) -> Gate<u32> {
    let config = config(workers).with_quorum(quorum, Duration::from_secs(1));
    let mut gate = Gate::new(config, t0);
    for r in 0..workers {
        gate.on_message(t0, env(r, ToMaster::Registered { attempt: 0 }));
    }
    gate
}

#[test]
fn after_the_min_workers_timeout_a_round_goes_on_with_its_quorum_and_drops_the_stragglers() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut gate = quorum_gate(4, 3, t0);
    assert!(gate.open(t0, 1));
    assert_eq!(
        gate.poll_timeout(),
        Some(t0 + s(1)),
        "the soft deadline first"
    );
    for r in [2, 0, 1] {
        assert_eq!(gate.on_message(t0, env(r, report(1, r as u32))), None);
    }
    assert_eq!(
        gate.handle_timeout(t0 + s(1) / 2),
        None,
        "waits for all before it"
    );
    let Some(GateOutput::RoundComplete { gathered, .. }) = gate.handle_timeout(t0 + s(1)) else {
        panic!("the quorum is in once the min-workers timeout passed")
    };
    assert_eq!(gathered.results, vec![0, 1, 2]);
    assert_eq!(gathered.reported, vec![0, 1, 2]);
    assert_eq!(gathered.left_out, vec![3]);
    let late = gate.on_message(t0 + s(2), env(3, report(1, 3)));
    assert_eq!(late, None);
    assert_eq!(
        gate.drops().stale,
        1,
        "the straggler's late result is stale"
    );
    assert!(gate.open(t0 + s(2), 2));
    assert_eq!(
        gate.poll_timeout(),
        Some(t0 + s(3)),
        "each round waits anew"
    );
}

#[test]
fn a_round_short_of_its_quorum_at_the_min_workers_timeout_completes_when_the_quorum_arrives() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut gate = quorum_gate(4, 3, t0);
    gate.open(t0, 1);
    gate.on_message(t0, env(1, report(1, 1)));
    assert_eq!(
        gate.handle_timeout(t0 + s(1)),
        None,
        "one result is short of three"
    );
    assert_eq!(
        gate.poll_timeout(),
        Some(t0 + s(5)),
        "then the iteration deadline"
    );
    gate.on_message(t0 + s(2), env(3, report(1, 3)));
    let Some(GateOutput::RoundComplete { gathered, .. }) =
        gate.on_message(t0 + s(2), env(0, report(1, 0)))
    else {
        panic!("the third result completes the round")
    };
    assert_eq!(gathered.reported, vec![0, 1, 3]);
    assert_eq!(
        gathered.results,
        vec![0, 1, 3],
        "rank order, without rank 2"
    );
    assert_eq!(gathered.left_out, vec![2]);
    gate.open(t0 + s(3), 2);
    gate.on_message(t0 + s(3), env(1, report(2, 1)));
    assert!(
        matches!(
            gate.handle_timeout(t0 + s(8)),
            Some(GateOutput::Failed(JobError::WorkersTimedOut { ref missing, .. }))
                if *missing == vec![0, 2, 3]
        ),
        "no iteration completes without its quorum"
    );
}

#[test]
fn a_combined_round_with_its_quorum_folds_the_reported_ranks_in_rank_order() {
    let t0 = Instant::now();
    let config = config(4).with_quorum(2, Duration::from_secs(1));
    let mut gate = Gate::new(config, t0).combining(Box::new(|fold: &mut String, next| {
        fold.push_str(&next);
        Ok(())
    }));
    for r in 0..4 {
        gate.on_message(t0, env(r, ToMaster::Registered { attempt: 0 }));
    }
    gate.open(t0, 1);
    gate.on_message(t0, env(3, text(1, "d")));
    gate.on_message(t0, env(1, text(1, "b")));
    let Some(GateOutput::RoundComplete { gathered, .. }) =
        gate.handle_timeout(t0 + Duration::from_secs(1))
    else {
        panic!("two of four is the quorum")
    };
    assert_eq!(gathered.combined.as_deref(), Some("bd"));
    assert_eq!(gathered.left_out, vec![0, 2]);
}

#[test]
fn a_replaced_rank_registers_again_mid_round_and_a_lost_rank_is_not_waited_for() {
    let t0 = Instant::now();
    let mut gate = quorum_gate(3, 2, t0);
    gate.open(t0, 4);
    gate.on_message(t0, env(0, report(4, 0)));
    gate.rejoin(1);
    assert_eq!(
        gate.on_message(t0, env(1, ToMaster::Registered { attempt: 0 })),
        Some(GateOutput::Rejoined {
            rank: 1,
            iteration: Some(4)
        })
    );
    assert_eq!(
        gate.on_message(t0, env(1, ToMaster::Registered { attempt: 0 })),
        None,
        "once"
    );
    gate.on_message(t0, env(1, report(4, 1)));
    let Some(GateOutput::RoundComplete { gathered, .. }) = gate.lose(t0, 2) else {
        panic!("the round waited only for the lost rank")
    };
    assert_eq!(gathered.reported, vec![0, 1]);
    assert_eq!(gathered.left_out, vec![2]);
    assert_eq!(gate.lost(), vec![2]);
    gate.open(t0, 5);
    gate.on_message(t0, env(0, report(5, 0)));
    assert!(
        matches!(
            gate.on_message(t0, env(1, report(5, 1))),
            Some(GateOutput::RoundComplete { .. })
        ),
        "later rounds do not wait for it either"
    );
}

#[test]
fn the_failed_workers_done_is_forgotten_when_its_replacement_registers() {
    let t0 = Instant::now();
    let mut gate = quorum_gate(2, 2, t0);
    gate.open(t0, 1);
    gate.on_message(t0, env(0, report(1, 0)));
    gate.rejoin(1);
    // The failed worker ran its post_application and said done after the rejoin.
    assert_eq!(gate.on_message(t0, done(1)), None);
    assert!(gate.is_done(1));
    gate.on_message(t0, env(1, ToMaster::Registered { attempt: 0 }));
    assert!(!gate.is_done(1), "the replacement is not done");
    assert!(matches!(
        gate.on_message(t0, env(1, report(1, 1))),
        Some(GateOutput::RoundComplete { .. })
    ));
    gate.on_message(t0, done(0));
    assert_eq!(gate.drain(t0), None, "the drain waits for the replacement");
    assert!(matches!(
        gate.on_message(t0, done(1)),
        Some(GateOutput::Drained { ref missing, .. }) if missing.is_empty()
    ));
}

#[test]
fn a_restart_is_a_new_attempt_from_registration_and_fences_off_the_old_one() {
    let t0 = Instant::now();
    let mut gate = quorum_gate(2, 2, t0);
    gate.open(t0, 3);
    gate.on_message(t0, env(0, report(3, 0)));
    gate.restart(t0, 1);
    assert_eq!(gate.attempt(), 1);
    assert_eq!(
        gate.on_message(t0, env(1, ToMaster::Registered { attempt: 0 })),
        None
    );
    gate.on_message(t0, env(0, ToMaster::Registered { attempt: 1 }));
    assert_eq!(
        gate.on_message(t0, env(1, ToMaster::Registered { attempt: 1 })),
        Some(GateOutput::AllRegistered)
    );
    gate.open(t0, 3);
    assert_eq!(
        gate.on_message(t0, env(1, report(3, 1))),
        None,
        "attempt 0's result"
    );
    assert_eq!(gate.drops().stale, 2);
}

fn share(iteration: Iteration, share: Share<String>, vote: bool) -> ToMaster<String> {
    ToMaster::Result(Report {
        attempt: 0,
        iteration,
        result: share,
        halt_vote: vote,
        mail: Default::default(),
        saved: None,
        calls: 0,
        group_calls: None,
        elapsed: Duration::ZERO,
    })
}

#[test]
fn a_round_folded_among_the_workers_takes_the_fold_from_the_rank_it_ends_at() {
    let t0 = Instant::now();
    // By either route the fold ends at rank 0, beside the master; its report may come
    // first or last.
    for (route, order) in [
        (FoldRoute::Ring, [2, 0, 3, 1]),
        (FoldRoute::Tree, [2, 3, 1, 0]),
    ] {
        let root = 0;
        let mut gate = registered(4, t0);
        assert!(gate.open_folding(t0, 1, route));
        let mut out = None;
        for r in order {
            let msg = if r == root {
                share(1, Share::Fold("abcd".into()), true)
            } else {
                share(1, Share::Passed, r == 1)
            };
            out = gate.on_message(t0, env(r, msg));
        }
        match out {
            Some(GateOutput::RoundComplete { gathered, .. }) => {
                assert_eq!(gathered.combined.as_deref(), Some("abcd"), "{route:?}");
                assert_eq!(gathered.reported, [0, 1, 2, 3]);
                assert_eq!(gathered.tally.halt_votes, 2, "every rank's vote counts");
                assert_eq!(gathered.tally.results_held, 1, "one folded result");
            }
            other => panic!("{route:?}: unexpected {other:?}"),
        }
    }
}

#[test]
fn a_share_that_does_not_fit_the_rounds_route_fails_the_round_naming_the_rank() {
    let t0 = Instant::now();
    // A rank's own result where the ring folds: the fold would count it twice.
    let mut gate = registered(3, t0);
    gate.open_folding(t0, 1, FoldRoute::Ring);
    match gate.on_message(t0, env(0, share(1, Share::Own("a".into()), false))) {
        Some(GateOutput::Failed(JobError::Runtime { message })) => {
            assert!(
                message.starts_with("worker 0 sent its own result in iteration 1"),
                "{message}"
            );
            assert!(message.contains("Ring"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    // Nothing from a rank where the star expects every rank's own result.
    let mut gate = Gate::<u32>::new(config(2), t0);
    for r in 0..2 {
        gate.on_message(t0, env(r, ToMaster::Registered { attempt: 0 }));
    }
    gate.open(t0, 1);
    let passed = ToMaster::Result(Report {
        attempt: 0,
        iteration: 1,
        result: Share::Passed,
        halt_vote: false,
        mail: Default::default(),
        saved: None,
        calls: 0,
        group_calls: None,
        elapsed: Duration::ZERO,
    });
    gate.on_message(t0, env(1, passed));
    match gate.on_message(t0, env(0, report(1, 5))) {
        Some(GateOutput::Failed(JobError::Runtime { message })) => {
            assert!(message.starts_with("worker 1 sent nothing"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// One arrival of a generated batch: a result (of some rank, attempt and iteration, with a
/// vote and a time), or a worker's `Done`.
#[derive(Debug, Clone)]
enum Arrival {
    Result {
        from: Rank,
        attempt: Attempt,
        iteration: Iteration,
        result: u32,
        halt: bool,
        ms: u64,
    },
    Done(Rank),
}

impl Arrival {
    fn env(&self) -> Envelope<ToMaster<u32>> {
        match *self {
            Arrival::Result {
                from,
                attempt,
                iteration,
                result,
                halt,
                ms,
            } => env(
                from,
                ToMaster::Result(Report {
                    attempt,
                    iteration,
                    result: Share::Own(result),
                    halt_vote: halt,
                    mail: None,
                    saved: None,
                    calls: 0,
                    group_calls: None,
                    elapsed: Duration::from_millis(ms),
                }),
            ),
            Arrival::Done(from) => done(from),
        }
    }
}

fn arrival(workers: usize) -> impl proptest::strategy::Strategy<Value = Arrival> {
    use proptest::prelude::*;
    prop_oneof![
        8 => (0..workers + 1, 0u32..2, 1u64..4, any::<u32>(), any::<bool>(), 0u64..4).prop_map(
            |(from, attempt, iteration, result, halt, ms)| Arrival::Result {
                // Mostly this attempt; now and then another, or a rank past the last.
                from,
                attempt: if attempt == 1 && result % 4 != 0 { 0 } else { attempt },
                iteration,
                result,
                halt,
                ms,
            }
        ),
        1 => (0..workers).prop_map(Arrival::Done),
    ]
}

/// A gate of `workers` ranks, registered, its first round open at `t0`: with a quorum
/// below every rank after `quorum_after` if given, combining by wrapping sums if asked.
fn gathering(
    workers: usize,
    quorum: Option<(usize, Duration)>,
    combine: bool,
    t0: Instant,
) -> Gate<u32> {
    let mut c = config(workers);
    if let Some((quorum, after)) = quorum {
        c = c.with_quorum(quorum, after);
    }
    let mut gate = Gate::new(c, t0);
    if combine {
        gate = gate.combining(Box::new(|acc: &mut u32, w| {
            *acc = acc.wrapping_add(w);
            Ok(())
        }));
    }
    for rank in 0..workers {
        gate.on_message(t0, env(rank, ToMaster::Registered { attempt: 0 }));
    }
    assert!(gate.open(t0, 1));
    gate
}

/// What a driver does after an output: opens the next iteration after a round.
fn after(gate: &mut Gate<u32>, now: Instant, output: &GateOutput<u32>) {
    if let GateOutput::RoundComplete { iteration, .. } = output {
        gate.open(now, iteration + 1);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// A batch of arrivals fed with `on_results` (the other messages one at a time, as the
    /// master's node does) gives the same outputs, at the same arrivals, and leaves the
    /// gate as feeding each with `on_message` does: drops, what it waits for, its next
    /// timeout.
    #[test]
    fn results_fed_as_a_batch_do_what_they_do_one_at_a_time(
        workers in 1usize..6,
        batch in proptest::collection::vec(arrival(5), 0..24),
        quorum in proptest::option::of((1usize..6, 0u64..3)),
        combine in proptest::bool::ANY,
        late_ms in 0u64..7_000,
    ) {
        let batch: Vec<Arrival> = batch
            .into_iter()
            .map(|a| match a {
                Arrival::Result { from, attempt, iteration, result, halt, ms } => Arrival::Result {
                    from: from.min(workers), attempt, iteration, result, halt, ms,
                },
                Arrival::Done(r) => Arrival::Done(r.min(workers - 1)),
            })
            .collect();
        let quorum = quorum.map(|(q, s)| (q.min(workers), Duration::from_secs(s)));
        let t0 = Instant::now();
        // Past the iteration timeout (5 s) for some: the wait's end meets the batch.
        let now = t0 + Duration::from_millis(late_ms);

        let mut one = gathering(workers, quorum, combine, t0);
        let mut one_outputs = Vec::new();
        for (i, a) in batch.iter().enumerate() {
            if let Some(output) = one.on_message(now, a.env()) {
                after(&mut one, now, &output);
                one_outputs.push((i, output));
            }
        }

        let mut bulk = gathering(workers, quorum, combine, t0);
        let mut bulk_outputs = Vec::new();
        let mut arrivals: Vec<_> = batch.iter().map(Arrival::env).collect();
        let mut at = 0;
        while at < arrivals.len() {
            if !matches!(arrivals[at].msg, ToMaster::Result(_)) {
                if let Some(output) = bulk.on_message(now, arrivals[at].clone()) {
                    after(&mut bulk, now, &output);
                    bulk_outputs.push((at, output));
                }
                at += 1;
                continue;
            }
            let (taken, output) = bulk.on_results(now, &mut arrivals[at..]);
            proptest::prop_assert!(taken > 0 || output.is_none());
            at += taken;
            if let Some(output) = output {
                after(&mut bulk, now, &output);
                bulk_outputs.push((at - 1, output));
            }
        }

        proptest::prop_assert_eq!(one_outputs, bulk_outputs);
        proptest::prop_assert_eq!(one.drops(), bulk.drops());
        proptest::prop_assert_eq!(one.waiting(), bulk.waiting());
        proptest::prop_assert_eq!(one.poll_timeout(), bulk.poll_timeout());
    }
}

#[test]
fn the_slowest_rank_is_the_lowest_of_the_equally_slow_in_any_order_of_arrival() {
    let t0 = Instant::now();
    let mut gate = gathering(4, None, false, t0);
    let at = |from, ms| {
        Arrival::Result {
            from,
            attempt: 0,
            iteration: 1,
            result: 0,
            halt: false,
            ms,
        }
        .env()
    };
    for (from, ms) in [(3, 5), (2, 5), (0, 1)] {
        assert_eq!(gate.on_message(t0, at(from, ms)), None);
    }
    match gate.on_message(t0, at(1, 2)) {
        Some(GateOutput::RoundComplete { gathered, .. }) => {
            assert_eq!(gathered.tally.slowest, Some((2, Duration::from_millis(5))))
        }
        other => panic!("unexpected {other:?}"),
    }
}
