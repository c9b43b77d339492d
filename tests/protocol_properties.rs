//! Property tests of the sans-IO protocol: for arbitrary worker counts and arbitrary
//! arrival orders with duplicates and stale messages, the master gets exactly one result
//! per rank, in rank order.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use superstep::dev::{
    Envelope, Gate, GateConfig, GateOutput, Offer, Report, Round, Share, SyncState, ToMaster,
};
use superstep::SyncKind;

/// One arrival at the barrier: (rank, attempt, iteration, value).
type Arrival = (usize, u32, u64, u64);

fn genuine(rank: usize) -> u64 {
    rank as u64 * 1_000 + 7
}

/// A fold whose value depends on the order of its inputs.
fn order_sensitive(fold: u64, next: u64) -> u64 {
    fold.wrapping_mul(1_000_003).wrapping_add(next)
}

/// The genuine arrivals of one round, plus duplicates of some, plus stale ones (another
/// attempt, an earlier or a later iteration), plus some from ranks that do not exist,
/// shuffled.
fn arrivals() -> impl Strategy<Value = (usize, u32, u64, Vec<Arrival>)> {
    (1usize..40, 0u32..3, 2u64..20).prop_flat_map(|(workers, attempt, iteration)| {
        let dups = prop::collection::vec(0..workers, 0..workers * 2);
        // (rank, which way it is stale, how far)
        let stale = prop::collection::vec((0..workers, 0u8..3, 1u64..3), 0..workers * 2);
        let unknown = prop::collection::vec(workers..workers + 5, 0..3);
        (dups, stale, unknown)
            .prop_flat_map(move |(dups, stale, unknown)| {
                let mut all: Vec<Arrival> = (0..workers)
                    .map(|r| (r, attempt, iteration, genuine(r)))
                    .collect();
                all.extend(dups.iter().map(|&r| (r, attempt, iteration, genuine(r))));
                all.extend(stale.iter().map(|&(r, way, by)| match way {
                    0 => (r, attempt + 1, iteration, u64::MAX),
                    1 => (r, attempt, iteration - by, u64::MAX),
                    _ => (r, attempt, iteration + by, u64::MAX),
                }));
                all.extend(unknown.iter().map(|&r| (r, attempt, iteration, u64::MAX)));
                Just(all).prop_shuffle()
            })
            .prop_map(move |all| (workers, attempt, iteration, all))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_round_hands_over_exactly_one_result_per_rank_in_rank_order(
        (workers, attempt, iteration, arrivals) in arrivals()
    ) {
        let mut round = Round::new(workers);
        round.open(attempt, iteration);
        let mut completions = 0;
        for &(rank, a, i, value) in &arrivals {
            if round.offer(rank, a, i, value) == Offer::Completed {
                completions += 1;
            }
        }
        prop_assert_eq!(completions, 1, "the round completes exactly once");
        let taken = round.close();
        let ranks: Vec<usize> = taken.iter().map(|(r, _)| *r).collect();
        prop_assert_eq!(ranks, (0..workers).collect::<Vec<_>>());
        for (rank, value) in &taken {
            prop_assert_eq!(*value, genuine(*rank), "never a stale value");
        }
        let drops = round.drops();
        let genuine_count = workers as u64;
        prop_assert_eq!(
            drops.total() + genuine_count,
            arrivals.len() as u64,
            "every arrival is either kept or counted as dropped"
        );
        let unknown = arrivals.iter().filter(|a| a.0 >= workers).count() as u64;
        prop_assert_eq!(drops.unknown_rank, unknown);
        let stale = arrivals.iter().filter(|a| a.0 < workers && (a.1 != attempt || a.2 != iteration)).count() as u64;
        prop_assert_eq!(drops.stale, stale);
    }

    #[test]
    fn the_gate_completes_each_iteration_once_in_rank_order_whatever_the_arrival_order(
        workers in 1usize..12,
        iterations in 1u64..6,
        seed in any::<u64>(),
        combining in any::<bool>(),
    ) {
        let t0 = Instant::now();
        let mut gate = Gate::new(GateConfig::new(workers, 0, [Duration::from_secs(1); 3]), t0);
        if combining {
            gate = gate.combining(Box::new(|fold, next| {
                *fold = order_sensitive(*fold, next);
                Ok(())
            }));
        }
        let mut registered = 0;
        for r in (0..workers).rev() {
            if gate.on_message(t0, Envelope { from: r, msg: ToMaster::<u64>::Registered { attempt: 0 } })
                == Some(GateOutput::AllRegistered) {
                registered += 1;
            }
        }
        prop_assert_eq!(registered, 1);
        let mut state = seed;
        let mut next = move || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state };
        for iteration in 1..=iterations {
            gate.open(t0, iteration);
            // Every rank's result, some twice, plus late results of the iteration before.
            let mut msgs: Vec<(usize, u64, u64)> = (0..workers).map(|r| (r, iteration, genuine(r) + iteration)).collect();
            for r in 0..workers {
                if next() % 3 == 0 { msgs.push((r, iteration, genuine(r) + iteration)); }
                if iteration > 1 && next() % 3 == 0 { msgs.push((r, iteration - 1, u64::MAX)); }
            }
            for i in (1..msgs.len()).rev() {
                let j = (next() % (i as u64 + 1)) as usize;
                msgs.swap(i, j);
            }
            let mut completed = Vec::new();
            for (r, it, value) in msgs {
                let msg = ToMaster::Result(Report { attempt: 0, iteration: it, result: Share::Own(value), halt_vote: false, mail: Default::default(), elapsed: Duration::ZERO, saved: None, calls: 0, group_calls: None });
                if let Some(out) = gate.on_message(t0, Envelope { from: r, msg }) {
                    completed.push(out);
                }
            }
            prop_assert_eq!(completed.len(), 1);
            match completed.pop().unwrap() {
                GateOutput::RoundComplete { iteration: done, gathered } => {
                    prop_assert_eq!(done, iteration);
                    let expected: Vec<u64> = (0..workers).map(|r| genuine(r) + iteration).collect();
                    if combining {
                        prop_assert!(gathered.results.is_empty());
                        let folded = expected.iter().copied().reduce(order_sensitive);
                        prop_assert_eq!(gathered.combined, folded, "folded once each, in rank order");
                        prop_assert!((1..=workers).contains(&gathered.tally.results_held));
                    } else {
                        prop_assert_eq!(gathered.results, expected);
                        prop_assert_eq!(gathered.combined, None);
                        prop_assert_eq!(gathered.tally.results_held, workers);
                    }
                }
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }

    #[test]
    fn every_epoch_answers_every_rank_once_with_all_messages_in_rank_order(
        workers in 1usize..16,
        epochs in 1u64..5,
        order in prop::collection::vec(any::<prop::sample::Index>(), 64),
    ) {
        let t0 = Instant::now();
        let mut sync = SyncState::new(workers, Duration::from_secs(1));
        for epoch in 0..epochs {
            // Ranks call in an arbitrary order.
            let mut pending: Vec<usize> = (0..workers).collect();
            let mut answered = Vec::new();
            let mut k = 0;
            while !pending.is_empty() {
                let rank = pending.remove(order[k % order.len()].index(pending.len()));
                k += 1;
                let message = vec![rank as u8, epoch as u8];
                let step = sync.on_call(t0, rank, epoch, SyncKind::AllGather, message, true);
                prop_assert_eq!(step.failed, None);
                answered.extend(step.replies);
            }
            prop_assert_eq!(answered.len(), workers, "one answer per rank, all at the last arrival");
            let expected: Vec<Vec<u8>> = (0..workers).map(|r| vec![r as u8, epoch as u8]).collect();
            for (r, (rank, answered_epoch, result)) in answered.into_iter().enumerate() {
                prop_assert_eq!(rank, r);
                prop_assert_eq!(answered_epoch, epoch);
                prop_assert_eq!(result.unwrap().to_vec(), expected.clone());
            }
        }
    }
}
