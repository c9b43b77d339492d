//! Pregel's messages between supersteps: sent in compute, read by their rank in the next
//! superstep in the senders' rank order, combined, counted in the report, and ending the
//! job when every worker voted to halt and none was sent.

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use common::{barrier_job as job, FnWorker};
use superstep::prelude::*;
use superstep::transport::MemoryTransport;
use superstep::MailCount;

fn worker(
    f: impl FnMut(&mut WorkerContext<u64, u64>) -> Result<u64, BoxError> + Send + 'static,
) -> FnWorker<common::WorkerFn> {
    FnWorker { f: Box::new(f) }
}

/// A message: who sent it, in which superstep, its number among the sender's to that rank.
type Note = (u64, u64, u64);

/// Rank `rank`, in each superstep, checks that it got from every rank, in rank order,
/// what they sent it in the superstep before — rank `s` sends each rank `s + 1` notes,
/// ranks in descending order so that the order of sends to one rank is not the order of
/// ranks — and returns how many it got.
fn noting(workers: usize) -> impl Fn(usize) -> FnWorker<common::WorkerFn> + Send + Sync {
    move |rank| {
        worker(move |ctx| {
            let i = ctx.iteration();
            let got = ctx.messages::<Note>()?.to_vec();
            let want: Vec<Note> = if i == 1 {
                Vec::new()
            } else {
                (0..workers as u64)
                    .flat_map(|s| (0..=s).map(move |k| (s, i - 1, k)))
                    .collect()
            };
            if got != want {
                return Err(format!("rank {rank} in {i}: got {got:?}, not {want:?}").into());
            }
            for k in 0..=rank as u64 {
                for to in (0..workers).rev() {
                    ctx.send(to, (rank as u64, i, k))?;
                }
            }
            Ok(got.len() as u64)
        })
    }
}

#[test]
fn messages_reach_their_rank_in_the_next_superstep_in_sender_then_send_order() {
    let workers = 4;
    // Each rank gets 1 + 2 + 3 + 4 notes a superstep from the second on.
    let want = 3 * workers as u64 * 10;
    for wire_check in [false, true] {
        let outcome = job(workers, 4, noting(workers))
            .messages::<Note>()
            .transport(MemoryTransport::new().wire_check(wire_check))
            .run()
            .unwrap();
        assert_eq!(*outcome.result, want, "wire check {wire_check}");
        let counts: Vec<_> = outcome
            .report
            .iterations
            .iter()
            .map(|r| r.messages)
            .collect();
        for count in &counts {
            assert_eq!(count.sent, 10 * workers as u64);
            assert_eq!(count.delivered, 10 * workers as u64);
            assert_eq!(count.received, 10 * workers as u64);
            // Across processes, or with the wire check, those to other ranks are encoded.
            assert_eq!(count.bytes > 0, wire_check, "{count:?}");
        }
        assert_eq!(outcome.report.totals.messages.sent, 40 * workers as u64);
    }
}

#[test]
fn each_ranks_counts_reach_the_master_and_add_up_to_the_iterations() {
    let workers = 3;
    let (subscriber, events) = superstep::events::channel();
    let outcome = job(workers, 3, noting(workers))
        .messages::<Note>()
        .transport(MemoryTransport::new().wire_check(true))
        .on_event(subscriber)
        .run()
        .unwrap();
    let mut by_rank = vec![vec![MailCount::default(); workers]; 3];
    for event in events.try_iter() {
        if let JobEvent::WorkerReported {
            rank,
            iteration,
            messages,
            ..
        } = event
        {
            by_rank[iteration as usize - 1][rank] = messages;
        }
    }
    for (i, ranks) in by_rank.iter().enumerate() {
        for (rank, count) in ranks.iter().enumerate() {
            // Rank `s` sends each rank `s + 1` notes; each rank gets 1 + 2 + 3, which the
            // exchange after its compute brought for the next superstep.
            assert_eq!(count.sent, (rank as u64 + 1) * workers as u64, "{i} {rank}");
            assert_eq!(count.received, 6, "{i} {rank}");
        }
        let mut sum = MailCount::default();
        for count in ranks {
            sum.sent += count.sent;
            sum.delivered += count.delivered;
            sum.bytes += count.bytes;
            sum.received += count.received;
            sum.rounds = sum.rounds.max(count.rounds);
        }
        assert_eq!(
            sum,
            outcome.report.iterations[i].messages,
            "iteration {}",
            i + 1
        );
    }
}

#[cfg(feature = "tcp")]
#[test]
fn messages_across_processes_over_tcp_are_those_in_memory() {
    let workers = 3;
    let in_memory = job(workers, 4, noting(workers))
        .messages::<Note>()
        .run()
        .unwrap();
    let outcomes = common::over_tcp(workers, "messages", move |_, transport| {
        job(workers, 4, noting(workers))
            .messages::<Note>()
            .transport(transport)
            .run()
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome.result, in_memory.result, "rank {rank}");
        if rank == 0 {
            let bytes: Vec<u64> = outcome
                .report
                .iterations
                .iter()
                .map(|r| r.messages.bytes)
                .collect();
            assert!(bytes.iter().all(|&b| b > 0), "{bytes:?}");
        }
    }
}

/// Rank `rank`, in each superstep, checks that it got from every rank, in rank order,
/// the `big` notes each sent it in the superstep before — thousands, so that a batch
/// takes more than one 64 KiB frame — and returns how many it got.
#[cfg(any(feature = "tcp", feature = "sim"))]
fn noting_many(workers: usize, big: u64) -> impl Fn(usize) -> FnWorker<common::WorkerFn> {
    move |rank| {
        worker(move |ctx| {
            let i = ctx.iteration();
            let got = ctx.messages::<Note>()?;
            let sent = |s: u64| (0..big + s).map(move |k| (s, i - 1, k << 20));
            let want = (0..workers as u64).flat_map(sent);
            if i > 1 && !got.iter().copied().eq(want) {
                return Err(format!("rank {rank} in {i}: not what was sent, in order").into());
            }
            let count = got.len() as u64;
            for to in (0..workers).rev() {
                ctx.send_all((0..big + rank as u64).map(|k| (to, (rank as u64, i, k << 20))))?;
            }
            Ok(count)
        })
    }
}

/// Across processes one rank's batch for another larger than a frame travels in several:
/// each round of the exchange carries one frame from each rank to each, as many rounds
/// as the largest batch needs, and the messages arrive whole, in the order they were
/// sent, as in memory.
#[cfg(feature = "tcp")]
#[test]
fn a_batch_over_the_frame_limit_travels_in_several_frames_and_arrives_in_order() {
    let (workers, big) = (3, 20_000);
    let in_memory = job(workers, 3, noting_many(workers, big))
        .messages::<Note>()
        .run()
        .unwrap();
    let outcomes = common::over_tcp_with(
        workers,
        "messages-in-frames",
        |s| s.max_frame = 64 << 10,
        move |_, transport| {
            job(workers, 3, noting_many(workers, big))
                .messages::<Note>()
                .transport(transport)
                .run()
        },
    );
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome.result, in_memory.result, "rank {rank}");
        if rank == 0 {
            for r in &outcome.report.iterations {
                // 8 to 12 bytes a note: 20,002 notes are about 225 KB, four frames of
                // 64 KiB.
                assert_eq!(r.messages.rounds, 4, "{:?}", r.messages);
                assert_eq!(r.messages.received, (3 * big + 3) * workers as u64);
            }
        }
    }
    for r in &in_memory.report.iterations {
        assert_eq!(r.messages.rounds, 1, "{:?}", r.messages);
    }
}

/// A combiner folds what comes round by round: the sums over every sender's messages with
/// one key are those of one frame, whatever the frames.
#[cfg(feature = "tcp")]
#[test]
fn messages_combined_across_frames_sum_to_what_they_sum_in_memory() {
    let workers = 3;
    // Rank r sends rank `to` 30,000 keys, each twice, spread over the keys of every rank.
    let summing = move |rank: usize| {
        worker(move |ctx| {
            let got = ctx.messages::<(u32, u64)>()?;
            let mut sums = std::collections::BTreeMap::<u32, u64>::new();
            for &(key, x) in got {
                *sums.entry(key).or_default() += x;
            }
            let digest = sums.iter().fold(0u64, |h, (&k, &x)| {
                h.rotate_left(5) ^ (u64::from(k) * 31 + x)
            });
            let i = ctx.iteration();
            for to in 0..workers {
                for key in 0..30_000u32 {
                    for twice in 0..2 {
                        let x = (i * 1_000 + rank as u64 * 10 + twice) << 24;
                        ctx.send(to, (key * 7 + to as u32, x))?;
                    }
                }
            }
            // The master sums the ranks' results.
            Ok((digest ^ sums.len() as u64) >> 8)
        })
    };
    let in_memory = job(workers, 3, summing)
        .combine_messages(|m: &(u32, u64)| m.0, |into, m| into.1 += m.1)
        .run()
        .unwrap();
    let outcomes = common::over_tcp_with(
        workers,
        "combined-in-frames",
        |s| s.max_frame = 64 << 10,
        move |_, transport| {
            job(workers, 3, summing)
                .combine_messages(|m: &(u32, u64)| m.0, |into, m| into.1 += m.1)
                .transport(transport)
                .run()
        },
    );
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome.result, in_memory.result, "rank {rank}");
        if rank == 0 {
            for r in &outcome.report.iterations {
                assert!(r.messages.rounds > 1, "{:?}", r.messages);
                // Folded where they were sent: one message a key from each sender.
                assert_eq!(r.messages.delivered, 30_000 * 3 * workers as u64);
            }
        }
    }
}

/// A single message larger than a frame cannot be split: it fails its sender's superstep
/// naming both ranks, the size and the limit — not as a connection lost.
#[cfg(feature = "tcp")]
#[test]
fn a_message_over_the_frame_limit_fails_its_sender_naming_both_ranks_and_the_limit() {
    let workers = 2;
    let outcomes = common::over_tcp_with(
        workers,
        "message-too-large",
        |s| s.max_frame = 64 << 10,
        move |_, transport| {
            job(workers, 2, |rank| {
                worker(move |ctx| {
                    if rank == 1 {
                        ctx.send(0, vec![1u64 << 40; 10])?;
                        // 10,000 numbers of 9 bytes: about 90 KB in one message.
                        ctx.send(0, vec![1u64 << 40; 10_000])?;
                    }
                    Ok(0)
                })
            })
            .messages::<Vec<u64>>()
            .transport(transport)
            .run()
        },
    );
    let message = match &outcomes[0] {
        Err(e @ JobError::Worker { rank: 1, .. }) => e.to_string(),
        other => panic!("not rank 1's failure: {other:?}"),
    };
    assert!(message.contains("rank 1's piece"), "{message}");
    assert!(message.contains("for rank 0"), "{message}");
    assert!(message.contains("frame limit of 65536 bytes"), "{message}");
    assert!(!message.contains("lost"), "{message}");
}

/// A message for a vertex: its key and a value to sum.
type Part = (u32, u64);

#[test]
fn a_combiner_folds_messages_with_one_key_before_they_leave_and_again_as_they_arrive() {
    let workers = 3;
    let seen: Arc<Mutex<Vec<Vec<Part>>>> = Arc::default();
    let keep = Arc::clone(&seen);
    let outcome = job(workers, 3, move |rank| {
        let keep = Arc::clone(&keep);
        worker(move |ctx| {
            if rank == 0 {
                keep.lock().unwrap().push(ctx.messages::<Part>()?.to_vec());
            }
            // Six sends to rank 0, three keys: 3, 1, 3, 2, 1, 3.
            let sends = [3u32, 1, 3, 2, 1, 3].iter().enumerate();
            ctx.send_all(sends.map(|(j, &key)| (0, (key, (rank * 10 + j) as u64))))?;
            Ok(0)
        })
    })
    .combine_messages(|m: &Part| m.0, |into, m| into.1 += m.1)
    .transport(MemoryTransport::new().wire_check(true))
    .run()
    .unwrap();
    // Key 3 first (each rank's first send), then 1, then 2; summed over every rank's sends.
    let sum = |js: &[usize]| -> u64 {
        (0..workers)
            .flat_map(|r| js.iter().map(move |&j| (r * 10 + j) as u64))
            .sum()
    };
    let want = vec![(3, sum(&[0, 2, 5])), (1, sum(&[1, 4])), (2, sum(&[3]))];
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![Vec::new(), want.clone(), want]);
    for r in &outcome.report.iterations {
        assert_eq!(r.messages.sent, 6 * workers as u64);
        // Three left each sender; rank 0 received them all.
        assert_eq!(r.messages.delivered, 3 * workers as u64);
        assert_eq!(r.messages.received, 3 * workers as u64);
    }
}

#[test]
fn a_unanimous_halt_waits_for_the_messages_on_their_way_and_a_message_wakes_its_rank() {
    let got: Arc<Mutex<Vec<(u64, usize)>>> = Arc::default();
    let keep = Arc::clone(&got);
    let outcome = job(3, 10, move |rank| {
        let keep = Arc::clone(&keep);
        worker(move |ctx| {
            let i = ctx.iteration();
            let messages = ctx.messages::<u64>()?.len();
            if messages > 0 {
                keep.lock().unwrap().push((i, rank));
            }
            // Rank 0 sends rank 2 one message in superstep 3, and rank 2 answers it.
            if rank == 0 && i == 3 {
                ctx.send(2, 7u64)?;
            }
            if rank == 2 && messages > 0 {
                ctx.send(1, 8u64)?;
            }
            if i >= 3 {
                ctx.vote_halt();
            }
            Ok(0)
        })
    })
    .worker_halt(true)
    .messages::<u64>()
    .run()
    .unwrap();
    // Every rank votes to halt from superstep 3 on; the messages of 3 and 4 keep it going.
    assert_eq!(outcome.iterations, 5);
    assert!(outcome.halted);
    assert_eq!(*got.lock().unwrap(), vec![(4, 2), (5, 1)]);
}

fn failure(builder: superstep::JobBuilder<u64, u64>) -> String {
    match builder.run() {
        Err(e @ JobError::Worker { .. }) => e.to_string(),
        other => panic!("not a worker's failure: {other:?}"),
    }
}

#[test]
fn a_message_to_a_rank_outside_the_world_fails_the_sender_naming_the_rank() {
    let message = failure(
        job(3, 2, |rank| {
            worker(move |ctx| {
                if rank == 1 {
                    ctx.send(7, 1u64)?;
                }
                Ok(0)
            })
        })
        .messages::<u64>(),
    );
    assert!(message.contains("worker 1"), "{message}");
    assert!(message.contains("rank 7"), "{message}");
    assert!(message.contains("3 worker(s)"), "{message}");
}

#[test]
fn messages_of_another_type_or_in_a_job_without_them_say_so() {
    let message = failure(
        job(2, 2, |_| {
            worker(|ctx| ctx.send(0, 1u32).map(|_| 0).map_err(Into::into))
        })
        .messages::<u64>(),
    );
    assert!(
        message.contains("u32") && message.contains("u64"),
        "{message}"
    );
    let message = failure(job(2, 2, |_| {
        worker(|ctx| Ok(ctx.messages::<u64>()?.len() as u64))
    }));
    assert!(
        message.contains("JobBuilder::messages::<u64>()"),
        "{message}"
    );
}

/// A message that encodes but never decodes.
#[derive(Debug, serde::Serialize)]
struct OneWay(u64);

impl<'de> serde::Deserialize<'de> for OneWay {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(serde::de::Error::custom("OneWay never decodes"))
    }
}

#[test]
fn a_message_type_that_does_not_survive_the_wire_fails_the_receiver_naming_the_sender() {
    let job = || {
        job(2, 2, |rank| {
            worker(move |ctx| {
                ctx.send(1 - rank, OneWay(rank as u64))?;
                Ok(0)
            })
        })
        .messages::<OneWay>()
    };
    let message = failure(job().transport(MemoryTransport::new().wire_check(true)));
    assert!(message.contains("OneWay never decodes"), "{message}");
    assert!(message.contains("from rank"), "{message}");
}

#[test]
fn turning_barrier_mode_off_after_declaring_messages_is_refused() {
    let err = job(2, 2, |_| worker(|_| Ok(0)))
        .messages::<u64>()
        .barrier_mode(false)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("barrier_mode"), "{err}");
}

#[test]
fn a_job_with_messages_resumes_from_a_checkpoint_with_the_messages_on_their_way() {
    let workers = 3;
    let want = *job(workers, 6, noting(workers))
        .messages::<Note>()
        .run()
        .unwrap()
        .result;
    // Rank 2 fails once in superstep 5: every worker starts again from the checkpoint of
    // 4, and each reads in 5 the notes sent to it in 4, which only the checkpoint holds.
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let note = noting(workers);
    let outcome = job(workers, 6, move |rank| {
        let mut noted = note(rank);
        let failed = Arc::clone(&failed);
        worker(move |ctx| {
            if rank == 2 && ctx.iteration() == 5 && !failed.swap(true, Ordering::SeqCst) {
                return Err("rank 2 fails once".into());
            }
            (noted.f)(ctx)
        })
    })
    .messages::<Note>()
    .checkpoint(superstep::checkpoint::MemoryCheckpointStore::new(), 2)
    .failure_policy(FailurePolicy::RestartAll { max_attempts: 2 })
    .run()
    .unwrap();
    assert_eq!(*outcome.result, want);
    assert_eq!(outcome.report.recoveries.len(), 1);
}

#[cfg(feature = "sim")]
mod simulated {
    use super::*;
    use proptest::prelude::{Just, Strategy};
    use std::time::Duration;
    use superstep::sim::{Faults, Simulation};

    fn noted(policy: FailurePolicy) -> superstep::JobBuilder<u64, u64> {
        job(4, 4, noting(4))
            .messages::<Note>()
            .sync_timeout(Duration::from_secs(1))
            .failure_policy(policy)
    }

    #[test]
    fn messages_run_in_the_simulator_as_in_the_runtime_and_start_over_under_restart_all() {
        let real = noted(FailurePolicy::Fail).run().unwrap();
        let run = Simulation::from_job(|| noted(FailurePolicy::Fail)).run(0);
        assert!(run.violations.is_empty(), "{:?}", run.violations);
        assert_eq!(run.outcome.unwrap().result, real.result);
        // Workers and the master crash, also while their peers wait for their messages;
        // pieces are delayed and retransmitted; every worker restarts from iteration 1.
        let faulty =
            Simulation::from_job(|| noted(FailurePolicy::RestartAll { max_attempts: 100 }))
                .faults(Faults::all(0.05));
        let want = *real.result;
        faulty.check(0..150, move |run| match &run.outcome {
            Ok(o) if *o.result == want => Ok(()),
            other => Err(format!("{other:?}")),
        });
    }

    /// A batch larger than a piece goes in rounds, and a crash or a lost piece between
    /// two rounds of one exchange is recovered from like any other: the messages arrive
    /// whole and in order, and the result is the fault-free one.
    #[test]
    fn batches_in_several_rounds_end_with_the_fault_free_result_whatever_the_faults() {
        let make = || {
            job(3, 3, noting_many(3, 300))
                .messages::<Note>()
                .sync_timeout(Duration::from_secs(1))
                .failure_policy(FailurePolicy::RestartAll { max_attempts: 100 })
        };
        let real = make().run().unwrap();
        // 300 notes of 8 bytes, 2.4 KB: they pass only in pieces of at most 1 KiB; in 4
        // bytes, not even one note does.
        let simulated = Simulation::from_job(make).max_piece(1024);
        let run = simulated.clone().run(0);
        assert!(run.violations.is_empty(), "{:?}", run.violations);
        assert_eq!(run.outcome.unwrap().result, real.result);
        let run = Simulation::from_job(make).max_piece(4).run(0);
        let error = run.outcome.unwrap_err().to_string();
        assert!(
            error.contains("over the transport's frame limit of 4 bytes"),
            "{error}"
        );
        let want = *real.result;
        simulated
            .faults(Faults::all(0.05))
            .check(0..100, move |run| match &run.outcome {
                Ok(o) if *o.result == want => Ok(()),
                other => Err(format!("{other:?}")),
            });
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// Any shape of the job (1–4 workers, 1–5 supersteps, a checkpoint every k
        /// supersteps or none), its workers in the master's process or launched each in a
        /// process of its own, and any schedule of up to 4
        /// faults — crashes of workers and of the master at any point, stragglers, results
        /// dropped, duplicated or delayed, partitions — ends under `RestartAll`, and under
        /// `RestartWorker` (which in barrier mode restarts every worker too), with the
        /// messages and the result of the fault-free run.
        #[test]
        fn a_job_with_messages_ends_with_the_fault_free_result_whatever_the_faults(
            (workers, supersteps, schedule, every) in (1usize..=4, 1u64..=5).prop_flat_map(
                |(w, i)| (
                    Just(w),
                    Just(i),
                    superstep::sim::strategies::schedule(w, i, 4),
                    proptest::option::of(1..=i),
                )
            ),
            policy in proptest::prop_oneof![
                Just(FailurePolicy::RestartAll { max_attempts: 30 }),
                Just(FailurePolicy::RestartWorker { max_restarts: 30 }),
            ],
            launched in proptest::prelude::any::<bool>(),
        ) {
            let noted = move || {
                job(workers, supersteps, noting(workers))
                    .messages::<Note>()
                    .sync_timeout(Duration::from_secs(1))
            };
            let want = *Simulation::from_job(noted).run(0).outcome.unwrap().result;
            let sim = Simulation::from_job(move || {
                let job = noted().failure_policy(policy);
                match every {
                    Some(every) => {
                        job.checkpoint(superstep::checkpoint::MemoryCheckpointStore::new(), every)
                    }
                    None => job,
                }
            });
            // In the master's process, or each rank in a process of its own. (Launched, a
            // master that dies in the drain, once its workers' processes ended, waits for
            // processes no launcher starts again: it starts over unless its newest
            // checkpoint holds the job's end.)
            let drain = schedule.contains(&superstep::sim::Fault::MasterCrashInDrain);
            proptest::prop_assume!(!(launched && drain));
            let sim = if launched { sim.launched(30) } else { sim };
            sim.schedule(schedule)
            .try_check(0..2, move |run| match &run.outcome {
                Ok(o) if *o.result == want => Ok(()),
                other => Err(format!("{other:?}")),
            })
            .map_err(|failure| proptest::test_runner::TestCaseError::fail(failure.to_string()))?;
        }
    }

    #[test]
    fn a_launched_master_killed_amid_a_message_exchange_is_recovered_from_with_one_restart() {
        use superstep::sim::{CrashPoint, Fault};
        let want = *noted(FailurePolicy::Fail).run().unwrap().result;
        // Every rank a process of its own, rank 0's worker in the master's: the master's
        // process dies while the workers exchange their messages, and a worker may fail on
        // its lost peer, rank 0, before its link finds the master lost. The launcher has
        // one restart, the master's: every other process must wait for the master started
        // again, which starts it over.
        for iteration in 1..=4 {
            let crash = Fault::MasterCrash {
                iteration,
                point: CrashPoint::Gathering,
            };
            Simulation::from_job(|| {
                noted(FailurePolicy::RestartAll { max_attempts: 2 })
                    .checkpoint(superstep::checkpoint::MemoryCheckpointStore::new(), 1)
            })
            .launched(1)
            .schedule(vec![crash])
            .check(0..30, move |run| match &run.outcome {
                Ok(o) if *o.result == want => Ok(()),
                other => Err(format!("{other:?}")),
            });
        }
    }

    #[test]
    fn messages_and_checkpoints_in_the_simulator_end_with_the_fault_free_result() {
        let want = *noted(FailurePolicy::Fail).run().unwrap().result;
        // Workers and the master crash at any point, checkpoints torn included; every
        // worker starts again from the newest checkpoint with the notes on their way —
        // under `RestartWorker` too, whose replacement takes every rank back with it.
        for policy in [
            FailurePolicy::RestartAll { max_attempts: 100 },
            FailurePolicy::RestartWorker { max_restarts: 100 },
        ] {
            let faulty = Simulation::from_job(move || {
                noted(policy).checkpoint(superstep::checkpoint::MemoryCheckpointStore::new(), 1)
            })
            .faults(Faults::all(0.05));
            faulty.check(0..150, move |run| match &run.outcome {
                Ok(o) if *o.result == want => Ok(()),
                other => Err(format!("{policy:?}: {other:?}")),
            });
        }
    }
}
