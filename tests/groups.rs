//! Collectives among a group of the job's ranks (`collective::Group`,
//! `WorkerContext::among`): every kind among the group's ranks alone, counted apart from
//! the job's other calls, with the rules of every collective inside the group — in one
//! process and across processes.

mod common;

use std::time::{Duration, Instant};

use common::{barrier_job as job, FnWorker, PATIENT};
use superstep::collective::CollectiveKind;
use superstep::collective::{Group, ReduceOp};
use superstep::prelude::*;
use superstep::transport::MemoryTransport;
use superstep::{GroupId, SyncKind};

fn worker(
    f: impl FnMut(&mut WorkerContext<u64, u64>) -> Result<u64, BoxError> + Send + 'static,
) -> FnWorker<common::WorkerFn> {
    FnWorker { f: Box::new(f) }
}

/// Rank `rank`'s values in iteration `i`: small integers, so every grouping of a sum is
/// exact.
fn values(rank: usize, i: u64, len: usize) -> Vec<f64> {
    (0..len)
        .map(|e| ((rank * 31 + e * 7 + i as usize) % 97) as f64 - 40.0)
        .collect()
}

/// The half of `workers` ranks that `rank` is in: the even ranks or the odd ones.
fn half(rank: usize, workers: usize) -> Group {
    Group::new((rank % 2..workers).step_by(2)).unwrap()
}

/// Checks, every iteration, what each kind of collective among the rank's half gives it
/// against what it computes alone — with a call among every rank between them, and the
/// even half making one call more than the odd — and returns how many checks passed.
fn checking(workers: usize) -> impl Fn(usize) -> FnWorker<common::WorkerFn> + Send + Sync {
    move |rank| {
        let group = half(rank, workers);
        worker(move |ctx| {
            let i = ctx.iteration();
            let ranks = group.ranks().to_vec();
            let mut checks = 0;
            let fail = |what: &str| -> BoxError { format!("rank {rank}: {what}").into() };
            for len in [100, 20_000] {
                let mut v = Floats::from(values(rank, i, len));
                ctx.among(&group)?.all_reduce(&mut v, ReduceOp::Sum)?;
                let theirs: Vec<Vec<f64>> = ranks.iter().map(|&r| values(r, i, len)).collect();
                let want: Vec<f64> = (0..len)
                    .map(|e| theirs.iter().map(|v| v[e]).sum())
                    .collect();
                if *v != want {
                    return Err(fail(&format!("a wrong sum of {len} among {ranks:?}")));
                }
                checks += 1;
            }
            // Among every rank, between two calls among the group.
            let mut all = Floats::from(vec![1.0]);
            ctx.all_reduce(&mut all, ReduceOp::Sum)?;
            if all[0] != workers as f64 {
                return Err(fail("a wrong sum among every rank"));
            }
            let mut among = ctx.among(&group)?;
            among.barrier()?;
            // From the group's last rank: a rank of the job, named as the job names it.
            let root = *ranks.last().unwrap();
            for len in [10, 70_000] {
                let mine = (rank == root).then(|| vec![i + root as u64; len]);
                let got: Vec<u64> = among.broadcast(root, mine.as_ref())?;
                if got != vec![i + root as u64; len] {
                    return Err(fail(&format!("a wrong broadcast of {len}")));
                }
                checks += 1;
            }
            let gathered: Vec<usize> = among.all_gather(&rank)?;
            if gathered != ranks {
                return Err(fail(&format!("gathered {gathered:?}, not {ranks:?}")));
            }
            let folded = among.all_reduce_with(format!("{rank};"), |a, b| a.push_str(&b))?;
            let want: String = ranks.iter().map(|r| format!("{r};")).collect();
            if folded != want {
                return Err(fail(&format!("folded {folded}, not {want}")));
            }
            let len = 1_000;
            let segment = among.segment(len);
            let mine = among.reduce_scatter(Floats::from(values(rank, i, len)), ReduceOp::Max)?;
            let theirs: Vec<Vec<f64>> = ranks.iter().map(|&r| values(r, i, len)).collect();
            let want: Vec<f64> = segment
                .clone()
                .map(|e| {
                    theirs
                        .iter()
                        .map(|v| v[e])
                        .fold(f64::NEG_INFINITY, f64::max)
                })
                .collect();
            if *mine != want || segment.len() < len / ranks.len() {
                return Err(fail(&format!("a wrong segment {segment:?}")));
            }
            if rank % 2 == 0 {
                // One call more among the even ranks: the odd ones' calls do not count it.
                among.barrier()?;
            }
            drop(among);
            // Started among the group, with one among every rank, and finished after.
            let started = ctx
                .among(&group)?
                .start_all_reduce(Floats::from(vec![rank as f64; 3]), ReduceOp::Sum)?;
            let everyone = ctx.start_all_reduce(Floats::from(vec![1.0]), ReduceOp::Sum)?;
            let everyone = ctx.finish(everyone)?;
            let started = ctx.finish(started)?;
            let sum: f64 = ranks.iter().map(|&r| r as f64).sum();
            if *started != vec![sum; 3] || everyone[0] != workers as f64 {
                return Err(fail("a wrong sum of calls in flight"));
            }
            Ok(checks + 1)
        })
    }
}

#[test]
fn every_collective_among_a_group_runs_among_its_ranks_alone_counted_apart() {
    for (workers, wire_check) in [(2, true), (5, false), (6, true)] {
        let outcome = job(workers, 3, checking(workers))
            .transport(MemoryTransport::new().wire_check(wire_check))
            .run()
            .unwrap_or_else(|e| panic!("{workers} ranks: {e}"));
        // Every rank's checks, every iteration (the master sums them).
        assert_eq!(*outcome.result, (workers * 5 * 3) as u64, "{workers} ranks");
    }
}

#[cfg(feature = "tcp")]
#[test]
fn collectives_among_groups_across_processes_give_what_they_give_in_memory() {
    let workers = 4;
    common::same_over_tcp(workers, "groups", move || {
        job(workers, 2, checking(workers))
    });
}

#[test]
fn a_rank_of_the_group_that_returns_without_its_call_is_named_by_its_rank_in_the_job() {
    let started = Instant::now();
    let group = Group::new([1, 2, 3]).unwrap();
    let id = group.id();
    let err = job(4, 1, move |rank| {
        let group = group.clone();
        worker(move |ctx| {
            if rank == 1 || rank == 3 {
                ctx.among(&group)?
                    .all_reduce(&mut Floats::from(vec![1.0; 10]), ReduceOp::Sum)?;
            }
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    assert!(started.elapsed() < PATIENT, "waited out the sync timeout");
    let JobError::Sync(SyncError::Unmatched {
        at,
        returned,
        waiting,
        ..
    }) = &err
    else {
        panic!("{err}");
    };
    assert_eq!(
        (returned.as_slice(), at.group, at.call),
        (&[2][..], id, 1),
        "{err}"
    );
    assert!(waiting.iter().all(|r| [1, 3].contains(r)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("call 1 of {id} in iteration 1")),
        "{text}"
    );
}

#[test]
fn ranks_of_a_group_that_make_different_calls_among_it_fail_naming_both() {
    let group = Group::new([0, 2]).unwrap();
    let err = job(3, 1, move |rank| {
        let group = group.clone();
        worker(move |ctx| {
            let mut among = match rank {
                1 => return Ok(0),
                _ => ctx.among(&group)?,
            };
            if rank == 0 {
                among.all_reduce(&mut Floats::from(vec![1.0; 8]), ReduceOp::Sum)?;
            } else {
                among.all_reduce(&mut Floats::from(vec![1.0; 9]), ReduceOp::Sum)?;
            }
            Ok(0)
        })
    })
    .run()
    .unwrap_err();
    let JobError::Sync(SyncError::CollectiveMismatch {
        rank,
        call,
        peer,
        peer_call,
    }) = &err
    else {
        panic!("{err}");
    };
    assert_eq!((*rank, *peer), (0, 2), "{err}");
    assert_eq!((call.len, peer_call.len), (8, 9), "{err}");
    assert_eq!(call.at.group, GroupId::of(&[0, 2]), "{err}");
    assert_eq!(
        call.kind,
        CollectiveKind::AllReduce(Some(ReduceOp::Sum)),
        "{err}"
    );
}

#[test]
fn a_rank_of_the_group_that_does_not_call_in_time_is_named_by_the_timeout() {
    let group = Group::new([0, 1, 3]).unwrap();
    let id = group.id();
    let err = job(4, 1, move |rank| {
        let group = group.clone();
        worker(move |ctx| {
            if rank == 3 {
                // Neither calls nor returns within the sync timeout.
                std::thread::sleep(Duration::from_millis(1_500));
                return Ok(0);
            }
            if rank != 2 {
                ctx.among(&group)?.barrier()?;
            }
            Ok(0)
        })
    })
    .sync_timeout(Duration::from_millis(300))
    .run()
    .unwrap_err();
    let JobError::Sync(SyncError::TimedOut {
        at, kind, missing, ..
    }) = &err
    else {
        panic!("{err}");
    };
    assert_eq!(
        (missing.as_slice(), at.group, *kind),
        (&[3][..], id, SyncKind::Barrier),
        "{err}"
    );
}

#[test]
fn a_group_the_job_cannot_have_or_a_rank_outside_it_fails_at_once_naming_it() {
    assert!(matches!(
        Group::new([2, 0, 2]),
        Err(SyncError::BadGroup(why)) if why.contains("rank 2 is in it twice")
    ));
    assert!(matches!(Group::new([]), Err(SyncError::BadGroup(_))));
    for (case, expected) in [
        (
            0,
            "not a group of ranks: it has rank 7, and the job 3 worker(s)",
        ),
        (1, "rank 1 is not in group"),
        (2, "rank 1 is not in group"),
    ] {
        let err = job(3, 1, move |rank| {
            worker(move |ctx| {
                match case {
                    0 => drop(ctx.among(&Group::new([0, 7]).unwrap())?),
                    1 if rank == 1 => drop(ctx.among(&Group::new([0, 2]).unwrap())?),
                    // A broadcast's root outside the group.
                    2 if rank != 1 => {
                        let group = Group::new([0, 2]).unwrap();
                        let _: u64 = ctx.among(&group)?.broadcast(1, Some(&5))?;
                    }
                    _ => {}
                }
                Ok(0)
            })
        })
        .run()
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains(expected), "case {case}: {text}");
        assert!(
            matches!(&err, JobError::Worker { cause, .. } if cause.is_mistake()),
            "case {case}: {text}"
        );
    }
}
