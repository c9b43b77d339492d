//! What a user reads when a sync call, a collective, a message or a result goes wrong:
//! the call they made by its own name, where it stands (`call N of iteration I`), both
//! sides of a mismatch, the type that did not encode and the ranks it went between. A
//! mismatch is the program's mistake: the job fails at once, whatever its policy.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{barrier_job as job, summing_master, FnWorker, PATIENT};
use superstep::collective::ReduceOp;
use superstep::prelude::*;
use superstep::transport::MemoryTransport;
use superstep::{CallAt, SyncKind};

fn worker(
    f: impl FnMut(&mut WorkerContext<u64, u64>) -> Result<u64, BoxError> + Send + 'static,
) -> FnWorker<common::WorkerFn> {
    FnWorker { f: Box::new(f) }
}

/// What each rank's call returned, to check on the test's thread.
type Results = Arc<Mutex<Vec<(usize, Result<(), SyncError>)>>>;

/// The ranks that made their call (a rank the job's failure reached before its compute
/// did makes none).
static CALLED: Mutex<Vec<(&'static str, usize)>> = Mutex::new(Vec::new());

/// Rank 0 broadcasts five bytes while the others sum one float: the others' call reads a
/// piece of another call, whose bytes are no float.
fn broadcast_against_all_reduce(
    name: &'static str,
    results: &Results,
) -> impl Fn(usize) -> FnWorker<common::WorkerFn> {
    let results = Arc::clone(results);
    move |rank| {
        let results = Arc::clone(&results);
        worker(move |ctx| {
            CALLED.lock().unwrap().push((name, rank));
            let result = if rank == 0 {
                ctx.broadcast(0, Some(&"hello".to_owned())).map(drop)
            } else {
                ctx.all_reduce(&mut Floats::from(vec![1.0]), ReduceOp::Sum)
            };
            results.lock().unwrap().push((rank, result.clone()));
            result?;
            Ok(0)
        })
    }
}

/// Every rank's call failed as a mismatch naming both calls, and nothing speaks of bytes
/// that do not decode.
fn assert_every_rank_names_both_calls(name: &str, results: &Results, job_error: &JobError) {
    // The job's failure returns at once; the other ranks' calls end just after.
    let called = || {
        let called = CALLED.lock().unwrap();
        called.iter().filter(|(n, _)| *n == name).count()
    };
    let deadline = Instant::now() + PATIENT;
    while results.lock().unwrap().len() < called() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let results = results.lock().unwrap();
    assert_eq!(results.len(), called(), "every call returned: {results:?}");
    assert!(results.len() >= 2, "{results:?}");
    for (rank, result) in results.iter() {
        let Err(error @ SyncError::CollectiveMismatch { .. }) = result else {
            panic!("rank {rank}: {result:?}");
        };
        let text = error.to_string();
        assert!(
            text.starts_with("different collectives at call 1 of iteration 1: rank "),
            "rank {rank}: {text}"
        );
        assert!(
            text.contains("called broadcast from rank 0"),
            "rank {rank}: {text}"
        );
        assert!(
            text.contains("called all_reduce(sum)"),
            "rank {rank}: {text}"
        );
        assert!(!text.contains("decode"), "rank {rank}: {text}");
    }
    let text = job_error.to_string();
    assert!(
        text.contains("broadcast from rank 0") && text.contains("all_reduce(sum)"),
        "{text}"
    );
    assert!(!text.contains("decode"), "{text}");
}

#[test]
fn another_collective_on_one_rank_is_a_mismatch_on_every_rank_before_any_piece_is_read() {
    let workers = 4;
    for (name, check) in [("in memory", false), ("wire check", true)] {
        // With the wire check, pieces travel encoded as over a network.
        let results = Results::default();
        let err = job(workers, 1, broadcast_against_all_reduce(name, &results))
            .transport(MemoryTransport::new().wire_check(check))
            .run()
            .unwrap_err();
        assert_every_rank_names_both_calls(name, &results, &err);
    }
}

#[cfg(feature = "tcp")]
#[test]
fn another_collective_across_processes_is_a_mismatch_on_every_rank_naming_both_calls() {
    let workers = 4;
    let results = Results::default();
    let each = Arc::clone(&results);
    let outcomes = common::over_tcp(workers, "mismatch", move |_, transport| {
        job(workers, 1, broadcast_against_all_reduce("tcp", &each))
            .transport(transport)
            .run()
    });
    let err = outcomes[0]
        .as_ref()
        .expect_err("the master's process fails");
    assert_every_rank_names_both_calls("tcp", &results, err);
}

#[test]
fn another_length_fails_the_job_at_once_under_every_policy() {
    let policies = [
        FailurePolicy::Fail,
        FailurePolicy::RestartWorker { max_restarts: 3 },
        FailurePolicy::RestartAll { max_attempts: 4 },
    ];
    for policy in policies {
        let computes = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&computes);
        let started = Instant::now();
        let err = job(3, 2, move |rank| {
            let counted = Arc::clone(&counted);
            worker(move |ctx| {
                counted.fetch_add(1, Ordering::SeqCst);
                ctx.barrier()?;
                let mut v = Floats::from(vec![1.0; 4 + rank / 2]);
                ctx.all_reduce(&mut v, ReduceOp::Sum)?;
                Ok(0)
            })
        })
        .failure_policy(policy)
        .run()
        .unwrap_err();
        assert!(
            started.elapsed() < PATIENT,
            "{policy:?}: waited out a timeout"
        );
        let text = err.to_string();
        assert!(
            text.contains("different collectives at call 2 of iteration 1: rank "),
            "{policy:?}: {text}"
        );
        assert!(
            text.contains(
                "with 4 element(s), rank 2 with 5; every rank must pass a value of the same length"
            ),
            "{policy:?}: {text}"
        );
        assert_eq!(
            computes.load(Ordering::SeqCst),
            3,
            "{policy:?}: the job ran again ({err})"
        );
    }
}

#[test]
fn calls_are_named_by_their_number_in_the_iteration() {
    let err = job(3, 3, |rank| {
        worker(move |ctx| {
            ctx.barrier()?;
            if ctx.iteration() == 2 && rank == 1 {
                ctx.all_gather(&1u64)?;
            } else {
                ctx.barrier()?;
            }
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    let JobError::Sync(SyncError::Mismatch { at, .. }) = &err else {
        panic!("{err}");
    };
    assert_eq!(
        *at,
        CallAt {
            iteration: 2,
            call: 2,
            group: superstep::GroupId::ALL,
        }
    );
    let text = err.to_string();
    assert!(
        text.starts_with("different calls at call 2 of iteration 2: rank"),
        "{text}"
    );
    assert!(text.contains("rank 1 called all_gather()"), "{text}");
}

#[test]
fn a_call_without_barrier_mode_or_in_init_names_the_call_made() {
    type Call = fn(&mut WorkerContext<u64, u64>) -> Result<(), SyncError>;
    let calls: [(Call, &str); 5] = [
        (|ctx| ctx.barrier(), "barrier()"),
        (|ctx| ctx.all_gather(&1u64).map(drop), "all_gather()"),
        (
            |ctx| ctx.all_reduce(&mut Floats::from(vec![1.0]), ReduceOp::Sum),
            "all_reduce(sum)",
        ),
        (
            |ctx| ctx.all_reduce_with(1u64, |a, b| *a += b).map(drop),
            "all_reduce_with",
        ),
        (
            |ctx| ctx.broadcast(0, Some(&1u64)).map(drop),
            "broadcast from rank 0",
        ),
    ];
    for (call, name) in calls {
        let err = Job::builder(summing_master(), move |_| {
            worker(move |ctx| {
                call(ctx)?;
                Ok(0)
            })
        })
        .workers(2)
        .iterations(1)
        .run()
        .unwrap_err();
        let JobError::Worker { cause, .. } = &err else {
            panic!("{name}: {err}");
        };
        assert_eq!(
            cause.message(),
            format!(
                "{name} needs a job built with barrier_mode(true), which gives every worker a \
                 thread of its own so that ranks can wait for each other"
            ),
            "{name}"
        );
        assert!(!cause.message().contains("barrier()") || name == "barrier()");
    }
}

/// A collective called in `init`, where no iteration runs.
struct CallsInInit;

impl WorkerComputable for CallsInInit {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn init(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
        ctx.all_reduce(&mut Floats::from(vec![1.0]), ReduceOp::Max)?;
        Ok(())
    }

    fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(0)
    }
}

#[test]
fn a_collective_in_init_names_itself() {
    let err = Job::builder(summing_master(), |_| CallsInInit)
        .workers(2)
        .barrier_mode(true)
        .failure_policy(FailurePolicy::RestartAll { max_attempts: 3 })
        .run()
        .unwrap_err();
    let JobError::Worker { cause, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(
        cause.message(),
        "all_reduce(max) was called in init: sync calls and collectives meet per iteration, \
         so only compute can make them"
    );
    assert!(cause.is_mistake(), "a mistake is not retried: {err}");
    assert_eq!(
        SyncError::OutsideCompute(SyncKind::Barrier).to_string(),
        "barrier() was called in init: sync calls and collectives meet per iteration, so only \
         compute can make them"
    );
}

/// A message that encodes unless it is 13, and decodes unless it is 7.
#[derive(Debug, Clone, PartialEq)]
struct Picky(u64);

impl serde::Serialize for Picky {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0 == 13 {
            return Err(serde::ser::Error::custom("13 does not encode"));
        }
        s.serialize_u64(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Picky {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match <u64 as serde::Deserialize>::deserialize(d)? {
            7 => Err(serde::de::Error::custom("7 does not decode")),
            n => Ok(Picky(n)),
        }
    }
}

/// Rank 0 sends rank 1 `value` in iteration 1; the job's error.
fn sending(value: u64) -> JobError {
    job(2, 2, move |rank| {
        worker(move |ctx| {
            if rank == 0 && ctx.iteration() == 1 {
                ctx.send(1, Picky(value))?;
            }
            Ok(0)
        })
    })
    .messages::<Picky>()
    .transport(MemoryTransport::new().wire_check(true))
    .run()
    .unwrap_err()
}

#[test]
fn a_message_that_does_not_encode_or_decode_names_its_type_its_sender_and_receiver() {
    let picky = std::any::type_name::<Picky>();
    let err = sending(13);
    assert!(
        matches!(
            err,
            JobError::Worker {
                rank: 0,
                iteration: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().ends_with(&format!(
            "rank 0's messages of type {picky} to rank 1 do not encode: 13 does not encode"
        )),
        "{err}"
    );
    let err = sending(7);
    assert!(
        matches!(
            err,
            JobError::Worker {
                rank: 1,
                iteration: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(
            "rank 1 got a piece of the superstep's messages (call 1 of iteration 1) from rank 0"
        ),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "its messages of type {picky} do not decode: 7 does not decode"
        )),
        "{text}"
    );
    assert!(!text.contains("all_gather"), "{text}");
}

#[test]
fn an_all_gather_message_that_does_not_encode_or_decode_names_the_call_its_type_and_rank() {
    let picky = std::any::type_name::<Picky>();
    let run = |value: u64| {
        job(2, 1, move |rank| {
            worker(move |ctx| {
                let mine = Picky(if rank == 1 { value } else { 1 });
                ctx.all_gather(&mine)?;
                Ok(0)
            })
        })
        .run()
        .unwrap_err()
        .to_string()
    };
    let text = run(13);
    assert!(
        text.ends_with(&format!(
            "rank 1's all_gather message, a {picky}, does not encode: 13 does not encode"
        )),
        "{text}"
    );
    let text = run(7);
    assert!(
        text.ends_with(&format!(
            "rank 1's all_gather message does not decode as {picky} on rank 0: 7 does not decode"
        )) || text.ends_with(&format!(
            "rank 1's all_gather message does not decode as {picky} on rank 1: 7 does not decode"
        )),
        "{text}"
    );
}

/// A master whose result stops encoding in iteration 2.
struct PickyMaster;

impl MasterComputable for PickyMaster {
    type MasterResult = Picky;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<Picky, u64>) -> Result<Step<Picky>, BoxError> {
        Ok(Step::Continue(Picky(if ctx.iteration() == 2 {
            13
        } else {
            1
        })))
    }
}

struct Idle;

impl WorkerComputable for Idle {
    type MasterResult = Picky;
    type WorkerResult = u64;

    fn compute(&mut self, _: &mut WorkerContext<Picky, u64>) -> Result<u64, BoxError> {
        Ok(0)
    }
}

#[test]
fn a_master_result_that_does_not_encode_names_its_type_and_iteration() {
    let picky = std::any::type_name::<Picky>();
    let err = Job::builder(PickyMaster, |_| Idle)
        .workers(2)
        .iterations(3)
        .transport(MemoryTransport::new().wire_check(true))
        .run()
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains(picky), "{text}");
    assert!(text.contains("iteration 2"), "{text}");
    assert!(text.contains("13 does not encode"), "{text}");
}

/// A job of 4 ranks summing by recursive doubling, whose rank 3 calls long after the
/// sync timeout: rank 0 waits for rank 1, which waits for rank 3.
fn one_rank_late(results: &Results) -> JobBuilder<u64, u64> {
    let each = Arc::clone(results);
    job(4, 1, move |rank| {
        let each = Arc::clone(&each);
        worker(move |ctx| {
            if rank == 3 {
                std::thread::sleep(Duration::from_millis(1500));
            }
            let r = ctx.all_reduce(&mut Floats::from(vec![1.0; 4]), ReduceOp::Sum);
            each.lock().unwrap().push((rank, r.clone()));
            r?;
            Ok(0)
        })
    })
    .sync_timeout(Duration::from_millis(300))
}

#[test]
fn a_rank_that_never_calls_is_named_by_every_waiting_rank() {
    let results = Results::default();
    let err = one_rank_late(&results).run().unwrap_err();
    assert!(
        matches!(&err, JobError::Sync(SyncError::TimedOut { missing, .. }) if missing == &[3]),
        "{err}"
    );
    for (rank, result) in results.lock().unwrap().iter().filter(|(r, _)| *r != 3) {
        let text = result.as_ref().unwrap_err().to_string();
        assert!(
            text.starts_with("all_reduce(sum) (call 1 of iteration 1) timed out after"),
            "rank {rank}: {text}"
        );
        // And what rank 3 last did, as the master's node heard it: it registered, and
        // said nothing since.
        assert!(
            text.contains(
                "rank(s) [3] did not make it; last heard by the master's node: rank 3: registered "
            ),
            "rank {rank}: {text}"
        );
    }
}

#[cfg(feature = "tcp")]
#[test]
fn a_rank_that_never_calls_is_named_by_every_waiting_rank_across_processes() {
    let results = Results::default();
    let each = Arc::clone(&results);
    let outcomes = common::over_tcp(4, "never-calls", move |_, transport| {
        one_rank_late(&each).transport(transport).run()
    });
    let err = outcomes[0]
        .as_ref()
        .expect_err("the master's process fails");
    assert!(
        matches!(err, JobError::Sync(SyncError::TimedOut { missing, .. }) if missing == &[3]),
        "{err}"
    );
    let results = results.lock().unwrap();
    for (rank, result) in results.iter().filter(|(r, _)| *r != 3) {
        let text = result.as_ref().unwrap_err().to_string();
        // And what rank 3 last did, as the master's node heard it: it registered, and
        // said nothing since.
        assert!(
            text.contains(
                "rank(s) [3] did not make it; last heard by the master's node: rank 3: registered "
            ),
            "rank {rank}: {text}"
        );
    }
    assert!(results.len() >= 3, "{results:?}");
}

#[test]
fn a_mistake_wrapped_as_text_still_fails_at_once() {
    // The compute words the error itself: no `SyncError` is left in its chain.
    let computes = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&computes);
    let err = Job::builder(summing_master(), move |_| {
        let counted = Arc::clone(&counted);
        worker(move |ctx| {
            counted.fetch_add(1, Ordering::SeqCst);
            ctx.all_reduce(&mut Floats::from(vec![1.0]), ReduceOp::Sum)
                .map_err(|e| format!("my step: {e}"))?;
            Ok(0)
        })
    })
    .workers(2)
    .iterations(2)
    .failure_policy(FailurePolicy::RestartWorker { max_restarts: 5 })
    .run()
    .unwrap_err();
    let JobError::Worker { cause, .. } = &err else {
        panic!("{err}");
    };
    assert!(cause.is_mistake(), "{err}");
    assert!(
        cause
            .message()
            .starts_with("my step: all_reduce(sum) needs"),
        "{err}"
    );
    assert!(computes.load(Ordering::SeqCst) <= 2, "{err}: ran again");
}

#[test]
fn a_call_against_the_runtimes_own_says_the_other_rank_returned_from_compute() {
    let err = job(2, 1, |rank| {
        worker(move |ctx| {
            if rank == 1 {
                ctx.barrier()?;
            }
            Ok(0)
        })
    })
    .messages::<u64>()
    .run()
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("rank 0 returned from compute (the superstep's messages were to go next)"),
        "{text}"
    );
    assert!(text.contains("rank 1 called barrier()"), "{text}");
}

#[test]
fn values_of_another_element_type_are_named_as_such() {
    let err = job(2, 1, |rank| {
        worker(move |ctx| {
            if rank == 0 {
                ctx.all_reduce(&mut Floats::from(vec![1.0f32; 4]), ReduceOp::Sum)?;
            } else {
                ctx.all_reduce(&mut Floats::from(vec![1.0f64; 4]), ReduceOp::Sum)?;
            }
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "values of another element type; every rank must pass values of the same type"
        ),
        "{text}"
    );
}
