use std::collections::VecDeque;
use std::ops::Range;

use proptest::prelude::*;

use super::plan::{all_vouch, segment};
use super::*;
use crate::ids::{Algorithm, CollectiveKind, ReduceOp};

/// Elements folded by `fold(earlier, later)`.
#[derive(Debug, Clone)]
struct Cells<T> {
    values: Vec<T>,
    fold: fn(T, T) -> T,
}

impl<T: Clone> Buffer for Cells<T> {
    type Part = Vec<T>;

    fn len(&self) -> usize {
        self.values.len()
    }

    fn part(&self, range: Range<usize>) -> Vec<T> {
        self.values[range].to_vec()
    }

    fn part_len(part: &Vec<T>) -> usize {
        part.len()
    }

    fn put(&mut self, range: Range<usize>, part: Vec<T>) {
        self.values[range].clone_from_slice(&part);
    }

    fn fold(&mut self, range: Range<usize>, part: Vec<T>, part_first: bool) {
        for (own, got) in self.values[range].iter_mut().zip(part) {
            *own = if part_first {
                (self.fold)(got, own.clone())
            } else {
                (self.fold)(own.clone(), got)
            };
        }
    }
}

/// Words, joined by a fold: a result tells which ranks' values it holds and in which
/// order.
type Words = Cells<String>;

fn words(values: Vec<String>) -> Words {
    Cells {
        values,
        fold: |a, b| a + &b,
    }
}

/// Floats, summed.
fn sums(values: Vec<f64>) -> Cells<f64> {
    Cells {
        values,
        fold: |a, b| a + b,
    }
}

fn word(rank: Rank, element: usize) -> String {
    format!("<{rank}.{element}>")
}

/// Rank `rank`'s input: for `all_gather` its own segment only (the rest empty), else a
/// word per element.
fn input(kind: CollectiveKind, ranks: usize, rank: Rank, len: usize) -> Words {
    let mine = segment(len, ranks, rank);
    words(
        (0..len)
            .map(|e| match kind {
                CollectiveKind::AllGather if !mine.contains(&e) => String::new(),
                _ => word(rank, e),
            })
            .collect(),
    )
}

fn call(kind: CollectiveKind, algorithm: Algorithm, len: usize, chunk: u32) -> CollectiveCall {
    CollectiveCall {
        seq: 7,
        at: crate::ids::CallAt {
            iteration: 3,
            call: 2,
            group: crate::ids::GroupId::ALL,
        },
        kind,
        len: len as u64,
        algorithm,
        chunk,
    }
}

/// A small random number generator for the delivery order.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Runs one call on every rank, each link delivering in order (as a TCP connection does)
/// and the links taken in an order the dice choose. Returns each rank's value.
fn run<B: Buffer>(call: CollectiveCall, inputs: Vec<B>, seed: u64) -> Vec<B>
where
    B::Part: std::fmt::Debug,
{
    let ranks = inputs.len();
    let mut exchanges: Vec<Exchange<B>> = inputs
        .into_iter()
        .enumerate()
        .map(|(rank, buffer)| Exchange::new(call, ranks, rank, buffer))
        .collect();
    let mut links: Vec<VecDeque<Piece<B::Part>>> =
        (0..ranks * ranks).map(|_| VecDeque::new()).collect();
    let mut dice = Dice(seed | 1);
    loop {
        for (from, exchange) in exchanges.iter_mut().enumerate() {
            while let Some((to, piece)) = exchange.poll_send() {
                assert_ne!(to, from, "a rank sends to itself");
                links[from * ranks + to].push_back(piece);
            }
        }
        let busy: Vec<usize> = (0..links.len()).filter(|&l| !links[l].is_empty()).collect();
        if busy.is_empty() {
            break;
        }
        let link = busy[dice.below(busy.len())];
        let piece = links[link].pop_front().unwrap();
        let (from, to) = (link / ranks, link % ranks);
        exchanges[to]
            .handle_piece(from, piece)
            .expect("a piece of the same call fits");
    }
    for (rank, exchange) in exchanges.iter().enumerate() {
        assert!(
            exchange.is_done(),
            "rank {rank} of {ranks} is not done: waits on {:?}",
            exchange.waiting_on()
        );
    }
    exchanges.into_iter().map(Exchange::into_buffer).collect()
}

/// The rank order's fold of element `e` over `ranks`.
fn in_order(ranks: Range<usize>, e: usize) -> String {
    ranks.map(|r| word(r, e)).collect()
}

/// The words of `value`, sorted: which ranks' values it holds, in whatever order.
fn sorted(value: &str) -> Vec<&str> {
    let mut words: Vec<&str> = value.split_inclusive('>').collect();
    words.sort_unstable();
    words
}

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Ring,
    Algorithm::Chain,
    Algorithm::Tree,
    Algorithm::Doubling,
];

fn kinds(ranks: usize, root: usize) -> Vec<CollectiveKind> {
    let root = root % ranks;
    vec![
        CollectiveKind::AllReduce(None),
        CollectiveKind::AllReduceMany {
            op: crate::ids::ReduceOp::Sum,
            values: 3,
            lengths: 7,
        },
        CollectiveKind::ReduceScatter(None),
        CollectiveKind::Reduce { root, op: None },
        CollectiveKind::Broadcast { root },
        CollectiveKind::AllGather,
        CollectiveKind::Barrier,
    ]
}

/// Whether the algorithm keeps the rank order for `kind`: every one but the ring's
/// segments (which start anywhere on the ring) and a tree's reduce to another root than
/// rank 0. A reduce along the chain keeps it to every root.
fn keeps_order(kind: CollectiveKind, algorithm: Algorithm, ranks: usize) -> bool {
    match (kind, effective(kind, algorithm, ranks)) {
        (CollectiveKind::AllReduce(_) | CollectiveKind::AllReduceMany { .. }, Algorithm::Ring) => {
            false
        }
        (CollectiveKind::ReduceScatter(_), _) => false,
        (CollectiveKind::Reduce { .. }, Algorithm::Ring | Algorithm::Chain) => true,
        (CollectiveKind::Reduce { root, .. }, _) => root == 0,
        _ => true,
    }
}

fn check(kind: CollectiveKind, algorithm: Algorithm, ranks: usize, len: usize, results: &[Words]) {
    let what = format!("{kind} by {algorithm}, {ranks} ranks, {len} elements");
    let ordered = keeps_order(kind, algorithm, ranks);
    let folded = |value: &str, e: usize| {
        if ordered {
            assert_eq!(value, in_order(0..ranks, e), "{what}: element {e}");
        } else {
            let all = in_order(0..ranks, e);
            assert_eq!(sorted(value), sorted(&all), "{what}: element {e}");
        }
    };
    match kind {
        CollectiveKind::AllReduce(_) | CollectiveKind::AllReduceMany { .. } => {
            for result in results {
                assert_eq!(result.values, results[0].values, "{what}: ranks differ");
                for (e, value) in result.values.iter().enumerate() {
                    folded(value, e);
                }
            }
        }
        CollectiveKind::ReduceScatter(_) => {
            for (rank, result) in results.iter().enumerate() {
                for e in segment(len, ranks, rank) {
                    folded(&result.values[e], e);
                }
            }
        }
        CollectiveKind::Reduce { root, .. } => {
            for (e, value) in results[root].values.iter().enumerate() {
                folded(value, e);
            }
        }
        CollectiveKind::Broadcast { root } => {
            for result in results {
                assert_eq!(
                    result.values,
                    input(kind, ranks, root, len).values,
                    "{what}"
                );
            }
        }
        CollectiveKind::AllGather => {
            for result in results {
                for (e, value) in result.values.iter().enumerate() {
                    let owner = (0..ranks)
                        .find(|&r| segment(len, ranks, r).contains(&e))
                        .unwrap();
                    assert_eq!(value, &word(owner, e), "{what}: element {e}");
                }
            }
        }
        // Nothing to hold: that every rank heard every other is the vouching test's.
        CollectiveKind::Barrier => {}
        CollectiveKind::Messages => unreachable!("checked by its own test"),
    }
}

#[test]
fn the_messages_collective_gives_each_rank_what_every_other_rank_sent_it() {
    // Element s × n + d is rank s's batch for rank d: rank r starts with its own row and
    // must end with column r from every rank — each piece crossing once, in any order of
    // delivery.
    for ranks in 1..=9 {
        for seed in [1, 7, 99] {
            let len = ranks * ranks;
            let inputs = (0..ranks)
                .map(|r| {
                    words(
                        (0..len)
                            .map(|e| match e / ranks == r {
                                true => word(r, e),
                                false => String::new(),
                            })
                            .collect(),
                    )
                })
                .collect();
            let call = call(CollectiveKind::Messages, Algorithm::Ring, len, 1);
            let results = run(call, inputs, seed);
            for (r, result) in results.iter().enumerate() {
                for s in 0..ranks {
                    let e = s * ranks + r;
                    assert_eq!(
                        result.values[e],
                        word(s, e),
                        "{ranks} ranks: rank {r} from {s}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_collective_by_every_algorithm_ends_with_the_answer_on_every_rank() {
    for ranks in 1..=9 {
        for len in [0, 1, 2, 5, 17] {
            for chunk in [1, 3, 64] {
                for algorithm in ALGORITHMS {
                    for kind in kinds(ranks, 2) {
                        let inputs = (0..ranks).map(|r| input(kind, ranks, r, len)).collect();
                        let results = run(call(kind, algorithm, len, chunk), inputs, 99);
                        check(kind, algorithm, ranks, len, &results);
                    }
                }
            }
        }
    }
}

/// The ranks whose values reach a rank's result (its own among them).
fn reached(rank: Rank, result: &Words) -> std::collections::BTreeSet<Rank> {
    let mut ranks: std::collections::BTreeSet<Rank> = result
        .values
        .iter()
        .flat_map(|v| v.split_inclusive('>'))
        .filter_map(|w| w.strip_prefix('<')?.split('.').next()?.parse().ok())
        .collect();
    ranks.insert(rank);
    ranks
}

#[test]
fn a_result_vouches_for_every_rank_only_when_every_rank_s_value_reached_it() {
    // A rank returns a result without the master's node's word when its exchange says the
    // result vouches for every rank: each piece is checked against the receiver's call, so
    // a value of every rank's in it proves that every rank made this very call. It must
    // never vouch for a rank whose value did not reach it; and where a value of every
    // rank's reaches every rank (`all_reduce`, the messages, a full `all_gather`), it
    // vouches.
    for ranks in 1..=9 {
        for len in [0, 1, 2, 5, 9, 17] {
            for chunk in [1, 3, 64] {
                for algorithm in ALGORITHMS {
                    let mut kinds = kinds(ranks, 2);
                    kinds.push(CollectiveKind::Messages);
                    for kind in kinds {
                        let len = match kind {
                            CollectiveKind::Messages => ranks * ranks,
                            _ => len,
                        };
                        let inputs: Vec<Words> = (0..ranks)
                            .map(|r| match kind {
                                CollectiveKind::Messages => words(
                                    (0..len)
                                        .map(|e| match e / ranks == r {
                                            true => word(r, e),
                                            false => String::new(),
                                        })
                                        .collect(),
                                ),
                                _ => input(kind, ranks, r, len),
                            })
                            .collect();
                        let call = call(kind, algorithm, len, chunk);
                        let vouch: Vec<bool> = (0..ranks)
                            .map(|r| Exchange::new(call, ranks, r, inputs[r].clone()).vouches())
                            .collect();
                        assert_eq!(
                            all_vouch(kind, ranks, len),
                            vouch.iter().all(|&v| v),
                            "{kind}, {ranks} ranks, {len} elements: every rank vouches"
                        );
                        let results = run(call, inputs, 7);
                        for (r, result) in results.iter().enumerate() {
                            let all = reached(r, result).len() == ranks;
                            let what = format!(
                                "{kind} by {algorithm}, rank {r} of {ranks}, {len} elements, chunk {chunk}"
                            );
                            assert!(
                                !vouch[r] || all,
                                "{what}: vouches for ranks it did not hear"
                            );
                            let complete = matches!(
                                kind,
                                CollectiveKind::AllReduce(_)
                                    | CollectiveKind::AllReduceMany { .. }
                                    | CollectiveKind::Messages
                                    | CollectiveKind::Barrier
                            ) || (kind == CollectiveKind::AllGather && len >= ranks);
                            if complete && len > 0 {
                                assert!(vouch[r], "{what}: heard every rank, does not vouch");
                            }
                        }
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the ranks, lengths, chunks, root and the order pieces arrive in across
    /// links, every collective ends on every rank with its answer.
    #[test]
    fn any_delivery_order_ends_with_the_answer(
        ranks in 1usize..12,
        len in 0usize..40,
        chunk in 1u32..8,
        root in 0usize..12,
        algorithm in 0usize..4,
        kind in 0usize..5,
        seed in any::<u64>(),
    ) {
        let algorithm = ALGORITHMS[algorithm];
        let kind = kinds(ranks, root)[kind];
        let inputs = (0..ranks).map(|r| input(kind, ranks, r, len)).collect();
        let results = run(call(kind, algorithm, len, chunk), inputs, seed);
        check(kind, algorithm, ranks, len, &results);
    }

    /// Along the chain, floats are summed exactly as the master folds them: one rank after
    /// another, in rank order, bit for bit.
    #[test]
    fn the_chain_sums_floats_bit_for_bit_as_the_master_folds_them(
        values in prop::collection::vec(prop::collection::vec(-1e6f64..1e6, 9), 1..9),
        chunk in 1u32..5,
        seed in any::<u64>(),
    ) {
        let expected: Vec<f64> = (0..9)
            .map(|e| values.iter().skip(1).fold(values[0][e], |acc, v| acc + v[e]))
            .collect();
        let inputs = values.iter().cloned().map(sums).collect();
        let kind = CollectiveKind::AllReduce(Some(ReduceOp::Sum));
        let results = run(call(kind, Algorithm::Chain, 9, chunk), inputs, seed);
        for result in results {
            let bits: Vec<u64> = result.values.iter().map(|x| x.to_bits()).collect();
            let want: Vec<u64> = expected.iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(bits, want);
        }
    }

    /// A peer's piece, whatever it holds, is applied or refused with an error: never a
    /// panic, and a refused piece changes nothing.
    #[test]
    fn any_piece_is_applied_or_refused(
        step in 0u32..200,
        chunk in 0u32..10,
        part_len in 0usize..10,
        from in 0usize..6,
        other_len in any::<bool>(),
    ) {
        let kind = CollectiveKind::AllReduce(None);
        let mut ours = call(kind, Algorithm::Ring, 8, 2);
        let mut exchange = Exchange::new(ours, 4, 1, input(kind, 4, 1, 8));
        while exchange.poll_send().is_some() {}
        let waiting = exchange.waiting_on();
        if other_len {
            ours.len = 9;
        }
        let piece = Piece { call: ours, step, chunk, part: vec![String::new(); part_len] };
        let _ = exchange.handle_piece(from, piece);
        if other_len {
            prop_assert_eq!(exchange.waiting_on(), waiting);
        }
    }
}

#[test]
fn a_different_call_is_refused_naming_both_ranks_and_calls() {
    let kind = CollectiveKind::AllReduce(Some(ReduceOp::Sum));
    let ours = call(kind, Algorithm::Ring, 10, 4);
    let mut exchange = Exchange::new(ours, 3, 1, sums(vec![0.0; 10]));
    let mut refused = |theirs: CollectiveCall| {
        let piece = Piece {
            call: theirs,
            step: 0,
            chunk: 0,
            part: vec![0.0; 4],
        };
        exchange.handle_piece(0, piece).unwrap_err().to_string()
    };
    assert_eq!(
        refused(CollectiveCall { len: 12, ..ours }),
        "different collectives at call 2 of iteration 3: rank 0 called all_reduce(sum) with 12 \
         element(s), rank 1 with 10; every rank must pass a value of the same length"
    );
    let broadcast = CollectiveKind::Broadcast { root: 2 };
    assert_eq!(
        refused(CollectiveCall {
            kind: broadcast,
            ..ours
        }),
        "different collectives at call 2 of iteration 3: rank 0 called broadcast from rank 2 of \
         10 element(s) by ring, rank 1 called all_reduce(sum) of 10 element(s) by ring; every \
         rank must make the same collective calls in the same order"
    );
}

#[test]
fn a_piece_that_does_not_fit_is_refused_naming_the_peer_and_what_does_not_fit() {
    let kind = CollectiveKind::AllReduce(Some(ReduceOp::Sum));
    let ours = call(kind, Algorithm::Ring, 9, 2);
    // Rank 1 of 3 receives from rank 0: segments of 3 elements, chunks of 2.
    let mut exchange = Exchange::new(ours, 3, 1, sums(vec![1.0; 9]));
    assert_eq!(exchange.waiting_on(), vec![0]);
    let piece = |step, chunk, n| Piece {
        call: ours,
        step,
        chunk,
        part: vec![1.0; n],
    };
    let refused = |exchange: &mut Exchange<Cells<f64>>, from, piece| {
        exchange.handle_piece(from, piece).unwrap_err().to_string()
    };
    assert_eq!(
        refused(&mut exchange, 2, piece(0, 0, 2)),
        "rank 1 got a piece of all_reduce(sum) of 9 element(s) by ring (call 2 of iteration 3) from \
         rank 2 that does not fit it: rank 2 sends nothing at step 0 to rank 1"
    );
    assert!(refused(&mut exchange, 0, piece(0, 2, 2)).ends_with("step 0 has no chunk 2"));
    assert!(refused(&mut exchange, 0, piece(0, 1, 2))
        .ends_with("chunk 1 of step 0 holds 2 element(s), not 1"));
    exchange.handle_piece(0, piece(0, 1, 1)).unwrap();
    assert!(refused(&mut exchange, 0, piece(0, 1, 1)).ends_with("chunk 1 of step 0 came twice"));
    exchange.handle_piece(0, piece(0, 0, 2)).unwrap();
    assert!(refused(&mut exchange, 0, piece(0, 0, 2)).ends_with("chunk 0 of step 0 came twice"));
}

#[test]
fn a_ring_all_reduce_moves_about_twice_the_value_through_each_rank() {
    // The bandwidth-optimal bound: 2 (n − 1) / n of the value out of each rank.
    let (ranks, len) = (8, 8000);
    let kind = CollectiveKind::AllReduce(Some(ReduceOp::Sum));
    for rank in 0..ranks {
        let sent: usize = plan::plan(kind, Algorithm::Ring, ranks, rank, len)
            .iter()
            .filter(|t| matches!(t, Transfer::Send { .. }))
            .map(|t| t.range().len())
            .sum();
        assert_eq!(sent, 2 * (ranks - 1) * len / ranks);
    }
}
