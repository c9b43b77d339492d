//! Results with the serde attributes users put on their types cross the wire as they are,
//! and a type whose serde form does not survive it fails the same way in memory (the
//! in-memory transport's wire check, on in debug builds), in the simulator and over TCP:
//! with a `JobError::Decode` naming the direction, the type and the peer — never a lost
//! worker.

mod common;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use superstep::prelude::*;
use superstep::sim::Simulation;
use superstep::transport::{MemoryTransport, TcpTransport};
use superstep::JobOutcome;

/// A worker's result with an optional field left out when empty, a flattened map, an
/// untagged and an internally tagged enum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Partial {
    sum: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    note: Option<String>,
    #[serde(flatten)]
    counts: BTreeMap<String, u64>,
    shape: Shape,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Shape {
    Point { x: u64, y: u64 },
    Label(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
enum Kind {
    Even { half: u64 },
    Odd,
}

/// The master's result, with a field left out when empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Total {
    total: u64,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    notes: Vec<String>,
    labels: u64,
}

struct PartialWorker;

impl WorkerComputable for PartialWorker {
    type MasterResult = Total;
    type WorkerResult = Partial;

    fn compute(&mut self, ctx: &mut WorkerContext<Total, Partial>) -> Result<Partial, BoxError> {
        let (rank, i) = (ctx.rank() as u64, ctx.iteration());
        let last = ctx
            .last_master_result()
            .map_or(0, |t| t.total + t.notes.len() as u64);
        let sum = rank * 10 + i + last % 7;
        Ok(Partial {
            sum,
            note: (rank % 2 == 1).then(|| format!("r{rank}i{i}")),
            counts: BTreeMap::from([(format!("rank{rank}"), i)]),
            shape: if i % 2 == 0 {
                Shape::Point { x: rank, y: i }
            } else {
                Shape::Label(format!("l{rank}"))
            },
            kind: if sum % 2 == 0 {
                Kind::Even { half: sum / 2 }
            } else {
                Kind::Odd
            },
        })
    }
}

struct TotalMaster;

impl MasterComputable for TotalMaster {
    type MasterResult = Total;
    type WorkerResult = Partial;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<Total, Partial>,
    ) -> Result<Step<Total>, BoxError> {
        let mut total = Total {
            total: 0,
            notes: Vec::new(),
            labels: 0,
        };
        for p in ctx.worker_results() {
            total.total += p.sum + p.counts.values().sum::<u64>();
            total.total += match (&p.shape, &p.kind) {
                (Shape::Point { x, y }, _) => x + y,
                (Shape::Label(_), Kind::Even { half }) => *half,
                (Shape::Label(_), Kind::Odd) => 1,
            };
            total.labels += matches!(p.shape, Shape::Label(_)) as u64;
            // Notes only in even iterations: the field is left out of every other result.
            if ctx.iteration() % 2 == 0 {
                total.notes.extend(p.note.clone());
            }
        }
        Ok(Step::Continue(total))
    }
}

fn partial_job() -> superstep::JobBuilder<Total, Partial> {
    Job::builder(TotalMaster, |_| PartialWorker)
        .workers(3)
        .iterations(6)
}

#[test]
fn serde_attributes_survive_tcp_and_give_the_in_memory_result() {
    let unchecked = partial_job()
        .transport(MemoryTransport::new().wire_check(false))
        .run()
        .unwrap();
    let checked = partial_job()
        .transport(MemoryTransport::new().wire_check(true))
        .run()
        .unwrap();
    assert_eq!(checked.result, unchecked.result);
    let outcomes = common::over_tcp(3, "serde-attributes", |_, t: TcpTransport<_, _>| {
        partial_job().transport(t).run()
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome.result, unchecked.result, "rank {rank}");
    }
    assert!(!unchecked.result.notes.is_empty());
}

/// A result type that leaves a field out of its encoding but needs it back: the commonest
/// way a type works in memory and not across processes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Cached {
    value: u64,
    #[serde(skip_serializing)]
    cache: Vec<u64>,
}

struct CachedWorker;

impl WorkerComputable for CachedWorker {
    type MasterResult = u64;
    type WorkerResult = Cached;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, Cached>) -> Result<Cached, BoxError> {
        Ok(Cached {
            value: ctx.rank() as u64,
            cache: vec![1],
        })
    }
}

struct CachedSum;

impl MasterComputable for CachedSum {
    type MasterResult = u64;
    type WorkerResult = Cached;

    fn compute(&mut self, ctx: &mut MasterContext<u64, Cached>) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(
            ctx.worker_results().iter().map(|c| c.value).sum(),
        ))
    }
}

fn cached_job() -> superstep::JobBuilder<u64, Cached> {
    Job::builder(CachedSum, |_| CachedWorker)
        .workers(2)
        .iterations(3)
}

fn assert_decode_error(error: &JobError, direction: &str, type_part: &str, peer: &str) {
    match error {
        JobError::Decode {
            direction: d,
            type_name,
            peer: p,
            message,
        } => {
            assert!(d.contains(direction), "{error}");
            assert!(type_name.contains(type_part), "{error}");
            assert!(p.contains(peer), "{error}");
            assert!(
                message.contains("cache"),
                "names the missing field: {error}"
            );
        }
        other => panic!("expected a decode error, got {other}"),
    }
}

#[test]
fn a_worker_result_that_does_not_survive_the_wire_fails_in_memory_in_the_simulator_and_over_tcp_alike(
) {
    // In memory, with the wire check (on by default where debug assertions are).
    let error = cached_job()
        .transport(MemoryTransport::new().wire_check(true))
        .run()
        .unwrap_err();
    assert_decode_error(&error, "→ master", "Cached", "this process");
    assert!(error.to_string().contains("worker"), "{error}");
    if cfg!(debug_assertions) {
        let default = cached_job().run().unwrap_err();
        assert!(matches!(default, JobError::Decode { .. }), "{default}");
    }
    // Without it the job passes in memory: the check is what finds it.
    assert_eq!(
        *cached_job()
            .transport(MemoryTransport::new().wire_check(false))
            .run()
            .unwrap()
            .result,
        1
    );
    // In the simulator.
    let run = Simulation::from_job(cached_job).run(1);
    let error = run.outcome.unwrap_err();
    // The worker's own failure, as its transport's check reports it in memory.
    assert_decode_error(&error, "→ master", "Cached", "this process");
    assert!(run.violations.is_empty(), "{:?}", run.violations);
    // Over TCP: every process ends with the same typed error, and no worker is "lost".
    let outcomes = common::over_tcp(2, "cached-worker", |_, t: TcpTransport<_, _>| {
        cached_job()
            .shutdown_timeout(std::time::Duration::from_secs(5))
            .transport(t)
            .run()
    });
    for (rank, outcome) in outcomes.iter().enumerate() {
        let error = outcome.as_ref().map(|_| ()).unwrap_err();
        assert_decode_error(error, "→ master", "Cached", "127.0.0.1:");
        assert!(!error.to_string().contains("lost"), "rank {rank}: {error}");
    }
}

struct CachedMaster;

impl MasterComputable for CachedMaster {
    type MasterResult = Cached;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<Cached, u64>) -> Result<Step<Cached>, BoxError> {
        Ok(Step::Continue(Cached {
            value: ctx.worker_results().iter().sum(),
            cache: vec![2],
        }))
    }
}

struct Plain;

impl WorkerComputable for Plain {
    type MasterResult = Cached;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<Cached, u64>) -> Result<u64, BoxError> {
        Ok(ctx.last_master_result().map_or(1, |c| c.value + 1))
    }
}

fn cached_master_job() -> superstep::JobBuilder<Cached, u64> {
    Job::builder(CachedMaster, |_| Plain)
        .workers(2)
        .iterations(3)
}

#[test]
fn a_master_result_that_does_not_survive_the_wire_fails_in_memory_and_over_tcp_alike() {
    let error = cached_master_job()
        .transport(MemoryTransport::new().wire_check(true))
        .run()
        .unwrap_err();
    assert_decode_error(&error, "master →", "Cached", "this process");
    let outcomes = common::over_tcp(2, "cached-master", |_, t: TcpTransport<_, _>| {
        cached_master_job()
            .shutdown_timeout(std::time::Duration::from_secs(5))
            .transport(t)
            .run()
    });
    let outcomes: Vec<Result<JobOutcome<Cached>, JobError>> = outcomes;
    for outcome in &outcomes {
        let error = outcome.as_ref().map(|_| ()).unwrap_err();
        assert_decode_error(error, "master → worker", "Cached", "127.0.0.1:");
    }
}
