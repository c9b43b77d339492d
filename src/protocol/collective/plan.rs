//! What each rank sends and receives in a collective: one plan per rank, computed from the
//! call alone, so that every rank's plan meets every other's without a word exchanged.
//!
//! A plan is a list of transfers in order. The value is cut into chunks (`chunk` elements
//! of each transfer's range); each chunk index runs through the plan in order on its own, so
//! chunk 2 of a step can travel while chunk 3 of the step before still does (pipelining),
//! and a transfer that reads a range always reads it after every earlier transfer of the
//! plan wrote it. Every plan here is built so that a transfer's range equals the range of
//! the one it depends on, which is what makes a chunk index a unit of its own.

use std::ops::Range;

use crate::ids::{Algorithm, CollectiveKind, Rank};

/// How a received part is applied to the rank's own values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Apply {
    /// It replaces them.
    Put,
    /// It is folded with them, the received part first: it holds lower ranks' values (in
    /// the plan's order) than the rank's own.
    FoldFirst,
    /// It is folded with them, the rank's own first: it holds higher ranks' values.
    FoldAfter,
}

/// One transfer of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transfer {
    /// Send this range to a peer.
    Send {
        to: Rank,
        step: u32,
        range: Range<usize>,
    },
    /// Receive this range from a peer and apply it.
    Recv {
        from: Rank,
        step: u32,
        range: Range<usize>,
        apply: Apply,
    },
}

impl Transfer {
    pub(crate) fn range(&self) -> &Range<usize> {
        match self {
            Transfer::Send { range, .. } | Transfer::Recv { range, .. } => range,
        }
    }
}

/// The algorithm that runs: `Doubling` on a number of ranks that is not a power of two is
/// a tree; an `all_gather` goes by doubling (or its tree) or around the ring.
pub(crate) fn effective(kind: CollectiveKind, algorithm: Algorithm, ranks: usize) -> Algorithm {
    match (kind, algorithm) {
        (CollectiveKind::AllGather, Algorithm::Doubling | Algorithm::Tree)
            if !ranks.is_power_of_two() =>
        {
            Algorithm::Tree
        }
        (CollectiveKind::AllGather, Algorithm::Doubling | Algorithm::Tree) => Algorithm::Doubling,
        (CollectiveKind::AllGather, _) => Algorithm::Ring,
        (CollectiveKind::ReduceScatter(_), _) => Algorithm::Ring,
        (_, Algorithm::Doubling) if !ranks.is_power_of_two() => Algorithm::Tree,
        (CollectiveKind::Broadcast { .. } | CollectiveKind::Reduce { .. }, Algorithm::Doubling) => {
            Algorithm::Tree
        }
        (_, algorithm) => algorithm,
    }
}

/// The `i`-th of `n` near-equal segments of `0..len` (the first `len % n` one longer).
pub(crate) fn segment(len: usize, n: usize, i: usize) -> Range<usize> {
    let base = len / n;
    let extra = len % n;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Whether rank `rank`'s result of `kind` on `len` elements among `ranks` ranks holds a
/// piece of every other rank's — come straight from it or through ranks that folded or
/// passed it on. Every piece is checked against the receiver's own call before it is
/// applied (`RankCall`), so such a result proves that every rank made this very call: the
/// rank may return it without the master's node's word. The others — a broadcast, a
/// reduce's ranks other than its root, a segment of no elements, an empty value — prove
/// nothing of some rank, and wait for that word.
pub(crate) fn vouches(kind: CollectiveKind, ranks: usize, rank: Rank, len: usize) -> bool {
    if ranks <= 1 {
        return true;
    }
    if len == 0 {
        return false;
    }
    match kind {
        CollectiveKind::AllReduce(_)
        | CollectiveKind::AllReduceMany { .. }
        | CollectiveKind::Messages
        | CollectiveKind::Barrier => true,
        // Its own segment comes folded over every rank.
        CollectiveKind::ReduceScatter(_) => !segment(len, ranks, rank).is_empty(),
        // Every rank's segment comes around the ring to every rank.
        CollectiveKind::AllGather => len >= ranks,
        CollectiveKind::Reduce { root, .. } => rank == root,
        CollectiveKind::Broadcast { .. } => false,
    }
}

/// Whether every rank's result of `kind` on `len` elements among `ranks` ranks vouches for
/// every rank ([`vouches`]): then no rank waits for the master's node's word on the call.
pub(crate) fn all_vouch(kind: CollectiveKind, ranks: usize, len: usize) -> bool {
    if ranks <= 1 {
        return true;
    }
    match kind {
        CollectiveKind::AllReduce(_)
        | CollectiveKind::AllReduceMany { .. }
        | CollectiveKind::Messages
        | CollectiveKind::Barrier => len > 0,
        // Every rank's segment holds elements.
        CollectiveKind::ReduceScatter(_) | CollectiveKind::AllGather => len >= ranks,
        CollectiveKind::Reduce { .. } | CollectiveKind::Broadcast { .. } => false,
    }
}

/// Rank `rank`'s plan for `kind` by `algorithm` among `ranks` ranks, on a value of `len`
/// elements. `algorithm` is taken as [`effective`] says.
pub(crate) fn plan(
    kind: CollectiveKind,
    algorithm: Algorithm,
    ranks: usize,
    rank: Rank,
    len: usize,
) -> Vec<Transfer> {
    let mut plan = Vec::new();
    if ranks <= 1 {
        return plan;
    }
    let n = ranks;
    let all = 0..len;
    match (kind, effective(kind, algorithm, ranks)) {
        (CollectiveKind::AllGather, Algorithm::Ring) => ring_gather(&mut plan, n, rank, len, 0),
        (CollectiveKind::Messages, _) => all_to_all(&mut plan, n, rank),
        (CollectiveKind::Barrier, _) => dissemination(&mut plan, n, rank, all),
        (CollectiveKind::ReduceScatter(_), _) => ring_scatter(&mut plan, n, rank, len),
        (CollectiveKind::AllReduce(_) | CollectiveKind::AllReduceMany { .. }, Algorithm::Ring) => {
            ring_scatter(&mut plan, n, rank, len);
            ring_gather(&mut plan, n, rank, len, n as u32);
        }
        (CollectiveKind::AllReduce(_) | CollectiveKind::AllReduceMany { .. }, Algorithm::Chain) => {
            chain_reduce(&mut plan, n, rank, all.clone(), 0);
            // Back along the chain: each link's other direction, so the way back overlaps
            // the way out.
            if rank + 1 < n {
                plan.push(recv(rank + 1, 1, all.clone(), Apply::Put));
            }
            if rank > 0 {
                plan.push(send(rank - 1, 1, all));
            }
        }
        // An all-gather by doubling or its tree is an all-reduce whose fold keeps the
        // element that holds something (each rank's own element holds its message, every
        // other nothing yet): every transfer carries the whole value, so each chunk goes
        // through the plan on its own as an all-reduce's does.
        (
            CollectiveKind::AllReduce(_)
            | CollectiveKind::AllReduceMany { .. }
            | CollectiveKind::AllGather,
            Algorithm::Doubling,
        ) => {
            let mut bit = 0u32;
            while (1usize << bit) < n {
                let partner = rank ^ (1 << bit);
                plan.push(send(partner, bit, all.clone()));
                let apply = if partner < rank {
                    Apply::FoldFirst
                } else {
                    Apply::FoldAfter
                };
                plan.push(recv(partner, bit, all.clone(), apply));
                bit += 1;
            }
        }
        (
            CollectiveKind::AllReduce(_)
            | CollectiveKind::AllReduceMany { .. }
            | CollectiveKind::AllGather,
            _,
        ) => {
            tree_reduce(&mut plan, n, rank, 0, all.clone(), 0);
            tree_broadcast(&mut plan, n, rank, 0, all, 64);
        }
        (CollectiveKind::Reduce { root, .. }, Algorithm::Ring | Algorithm::Chain) => {
            // Along the ranks in order (the master's bits), then from the last to the root
            // when the root is another rank. To rank 0 (the fold among the workers), which
            // receives nothing along the chain, each link direction carries the value once,
            // pipelined as the chain is; another root's way in carries it twice.
            chain_reduce(&mut plan, n, rank, all.clone(), 0);
            if root != n - 1 {
                if rank == n - 1 {
                    plan.push(send(root, 1, all));
                } else if rank == root {
                    plan.push(recv(n - 1, 1, all, Apply::Put));
                }
            }
        }
        (CollectiveKind::Reduce { root, .. }, _) => tree_reduce(&mut plan, n, rank, root, all, 0),
        (CollectiveKind::Broadcast { root }, Algorithm::Ring | Algorithm::Chain) => {
            let v = (rank + n - root) % n;
            if v > 0 {
                plan.push(recv((rank + n - 1) % n, 0, all.clone(), Apply::Put));
            }
            if v + 1 < n {
                plan.push(send((rank + 1) % n, 0, all));
            }
        }
        (CollectiveKind::Broadcast { root }, _) => tree_broadcast(&mut plan, n, rank, root, all, 0),
    }
    plan
}

/// Every rank to every other directly, on a value of `n × n` elements where element
/// `s × n + d` is what rank `s` sends rank `d`: rank `r` sends element `r × n + d` to each
/// other rank `d` (at step `k`, to the `k`-th rank after it), then receives element
/// `s × n + r` from each other rank `s` (at step `k`, from the `k`-th rank before it).
/// Sends come first, so no rank waits for another to send; each pair of ranks exchanges
/// one piece each way.
fn all_to_all(plan: &mut Vec<Transfer>, n: usize, rank: Rank) {
    for k in 1..n {
        let to = (rank + k) % n;
        let at = rank * n + to;
        plan.push(send(to, k as u32, at..at + 1));
    }
    for k in 1..n {
        let from = (rank + n - k) % n;
        let at = from * n + rank;
        plan.push(recv(from, k as u32, at..at + 1, Apply::Put));
    }
}

/// A dissemination barrier (Hensgen, Finkel and Manber): at step `k` each rank sends to the
/// rank `2^k` after it and receives from the rank `2^k` before it, so after ⌈log₂ n⌉ steps
/// what every rank sent has reached every rank, through the ranks between. What comes is
/// folded after the rank's own (a barrier's value is nothing; a test's words show who was
/// heard).
fn dissemination(plan: &mut Vec<Transfer>, n: usize, rank: Rank, all: Range<usize>) {
    let mut k = 0u32;
    while (1usize << k) < n {
        let hop = 1usize << k;
        plan.push(send((rank + hop) % n, k, all.clone()));
        plan.push(recv((rank + n - hop) % n, k, all.clone(), Apply::FoldAfter));
        k += 1;
    }
}

fn send(to: Rank, step: u32, range: Range<usize>) -> Transfer {
    Transfer::Send { to, step, range }
}

fn recv(from: Rank, step: u32, range: Range<usize>, apply: Apply) -> Transfer {
    Transfer::Recv {
        from,
        step,
        range,
        apply,
    }
}

/// Reduce-scatter around the ring: after `n - 1` steps rank `r` holds segment `r` folded
/// over every rank. At step `s` it sends segment `r - s - 1` to the next rank and folds
/// segment `r - s - 2` from the one before; what it sends at a step is what it folded at
/// the step before.
fn ring_scatter(plan: &mut Vec<Transfer>, n: usize, rank: Rank, len: usize) {
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    for s in 0..n - 1 {
        plan.push(send(
            next,
            s as u32,
            segment(len, n, (rank + 2 * n - s - 1) % n),
        ));
        let into = segment(len, n, (rank + 2 * n - s - 2) % n);
        plan.push(recv(prev, s as u32, into, Apply::FoldFirst));
    }
}

/// All-gather around the ring, rank `r` starting with segment `r`: at step `t` it sends
/// segment `r - t` and receives segment `r - t - 1`. Steps are numbered from `first`.
fn ring_gather(plan: &mut Vec<Transfer>, n: usize, rank: Rank, len: usize, first: u32) {
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    for t in 0..n - 1 {
        let step = first + t as u32;
        plan.push(send(next, step, segment(len, n, (rank + n - t) % n)));
        let into = segment(len, n, (rank + 2 * n - t - 1) % n);
        plan.push(recv(prev, step, into, Apply::Put));
    }
}

/// Along the ranks 0, 1, …, n − 1: each folds what the one before sent (its fold of every
/// lower rank) before its own value and passes it on, so the last rank ends with the rank
/// order's fold, one after another as the master folds.
fn chain_reduce(plan: &mut Vec<Transfer>, n: usize, rank: Rank, all: Range<usize>, step: u32) {
    if rank > 0 {
        plan.push(recv(rank - 1, step, all.clone(), Apply::FoldFirst));
    }
    if rank + 1 < n {
        plan.push(send(rank + 1, step, all));
    }
}

/// A binomial tree's reduce to `root`. Relative to the root, a rank gathers its subtrees
/// from the smallest up — each holds higher ranks than the rank and every subtree before —
/// and then sends to its parent, so with root 0 the ranks' values are folded in rank
/// order, grouped as the tree groups them. Steps are `first + bit`.
fn tree_reduce(
    plan: &mut Vec<Transfer>,
    n: usize,
    rank: Rank,
    root: Rank,
    all: Range<usize>,
    first: u32,
) {
    let v = (rank + n - root) % n;
    let mut bit = 0u32;
    while (1usize << bit) < n {
        let mask = 1usize << bit;
        if v & mask != 0 {
            plan.push(send((v - mask + root) % n, first + bit, all));
            return;
        }
        if v + mask < n {
            let child = (v + mask + root) % n;
            plan.push(recv(child, first + bit, all.clone(), Apply::FoldAfter));
        }
        bit += 1;
    }
}

/// A binomial tree's broadcast from `root`: a rank receives from its parent, then sends
/// to its children, the largest subtree first. Steps are `first + bit`.
fn tree_broadcast(
    plan: &mut Vec<Transfer>,
    n: usize,
    rank: Rank,
    root: Rank,
    all: Range<usize>,
    first: u32,
) {
    let v = (rank + n - root) % n;
    let top = usize::BITS - (n - 1).leading_zeros();
    // The bit a rank receives at: its lowest set bit (the root receives nothing).
    let below = if v == 0 {
        top
    } else {
        let low = v.trailing_zeros();
        let parent = (v - (1 << low) + root) % n;
        plan.push(recv(parent, first + low, all.clone(), Apply::Put));
        low
    };
    for bit in (0..below).rev() {
        let child = v + (1 << bit);
        if child < n {
            plan.push(send((child + root) % n, first + bit, all.clone()));
        }
    }
}
