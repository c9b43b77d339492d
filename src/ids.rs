//! The plain ids every layer speaks of: ranks, iterations, attempts, sync epochs and the
//! kind of a sync call. The floor of the crate: this module imports nothing of it, so any
//! module may import it without making a circle.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A worker's rank: `0..workers`.
pub type Rank = usize;

/// An iteration number. The first iteration is 1; 0 stands for start-up.
pub type Iteration = u64;

/// An attempt of the job; messages of another attempt are stale. The first attempt is 0.
pub type Attempt = u32;

/// A sync call's number, counted per rank from 0: the n-th call of every rank meets the
/// n-th call of every other.
pub type Epoch = u64;

/// Which sync call a rank made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SyncKind {
    /// `barrier()`.
    Barrier,
    /// `all_gather(message)`.
    AllGather,
    /// A collective among the workers (`all_reduce`, `broadcast`, …).
    Collective(CollectiveKind),
}

impl fmt::Display for SyncKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncKind::Barrier => "barrier()",
            SyncKind::AllGather => "all_gather()",
            SyncKind::Collective(kind) => return write!(f, "{kind}"),
        })
    }
}

/// How a collective combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Element by element, the sum.
    Sum,
    /// Element by element, the least.
    Min,
    /// Element by element, the greatest.
    Max,
    /// The user's own fold.
    Fold,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Fold => "a fold",
        })
    }
}

/// Which collective a rank called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CollectiveKind {
    /// Every rank ends with every rank's values combined.
    AllReduce(ReduceOp),
    /// Every rank ends with its own segment of every rank's values combined.
    ReduceScatter(ReduceOp),
    /// One rank ends with every rank's values combined.
    Reduce {
        /// The rank that ends with the result.
        root: Rank,
        /// How values are combined.
        op: ReduceOp,
    },
    /// Every rank ends with one rank's value.
    Broadcast {
        /// The rank whose value every rank gets.
        root: Rank,
    },
    /// Every rank ends with every rank's value, in rank order.
    AllGather,
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollectiveKind::AllReduce(op) => write!(f, "all_reduce({op})"),
            CollectiveKind::ReduceScatter(op) => write!(f, "reduce_scatter({op})"),
            CollectiveKind::Reduce { root, op } => write!(f, "reduce({op}) to rank {root}"),
            CollectiveKind::Broadcast { root } => write!(f, "broadcast from rank {root}"),
            CollectiveKind::AllGather => f.write_str("all_gather"),
        }
    }
}

/// How a collective's values travel between the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Algorithm {
    /// Around the ring of ranks, in segments: each rank sends and receives about twice the
    /// value's size in all, whatever the number of ranks (bandwidth-optimal for
    /// `all_reduce`; a chain for `broadcast` and `reduce`).
    Ring,
    /// Along the ranks in order, 0 to the last and back: the ranks' values are folded in
    /// rank order, one after another, as the master folds them.
    Chain,
    /// A binomial tree: about log₂(ranks) steps.
    Tree,
    /// Recursive doubling: log₂(ranks) exchanges of the whole value between pairs (a tree
    /// when the number of ranks is not a power of two).
    Doubling,
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::Ring => "ring",
            Algorithm::Chain => "chain",
            Algorithm::Tree => "tree",
            Algorithm::Doubling => "recursive doubling",
        })
    }
}

/// One collective call as every rank must make it: its place in the ranks' sequence of
/// collectives, what it is, how many elements, and how they travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CollectiveCall {
    /// The call's number, counted per rank from 0 (as sync calls' epochs are).
    pub seq: u64,
    /// What was called.
    pub kind: CollectiveKind,
    /// How many elements the value has (1 for a value that is not split).
    pub len: u64,
    /// How the values travel.
    pub algorithm: Algorithm,
    /// How many elements travel in one piece.
    pub chunk: u64,
}

impl fmt::Display for CollectiveCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} element(s) by {} (collective {})",
            self.kind, self.len, self.algorithm, self.seq
        )
    }
}
