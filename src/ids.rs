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

/// Which ranks a collective is among: every rank of the job ([`GroupId::ALL`]), or a
/// group of them (`collective::Group`), known by a hash of its ranks — the same on every
/// rank and every platform. A group's calls are counted apart from every other's.
/// Displayed `group 1a2b3c4d5e6f7a8b`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub struct GroupId(pub u64);

impl GroupId {
    /// Every rank of the job.
    pub const ALL: GroupId = GroupId(0);

    /// The id of the group of `ranks` (in rank order, without duplicates): their
    /// `fingerprint`, never [`GroupId::ALL`].
    pub fn of(ranks: &[Rank]) -> GroupId {
        GroupId(fingerprint(ranks).max(1))
    }
}

/// A fingerprint of numbers, in order: 64-bit FNV-1a over each one's eight bytes, little
/// end first — the same on every rank and every platform.
pub(crate) fn fingerprint(numbers: &[usize]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for number in numbers {
        for byte in (*number as u64).to_le_bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == GroupId::ALL {
            return f.write_str("every rank");
        }
        write!(f, "group {:016x}", self.0)
    }
}

/// Where a sync call or a collective stands, as every message names it: the iteration it
/// was made in, and its number among that iteration's sync calls and collectives, counted
/// from 1 (the same on every rank: the n-th call of each meets the n-th of every other),
/// among the calls of its group of ranks. Displayed `call 2 of iteration 5`, or for a
/// group's call `call 2 of group 1a2b3c4d5e6f7a8b in iteration 5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct CallAt {
    /// The iteration the call was made in.
    pub iteration: Iteration,
    /// The call's number among the iteration's calls of its group, from 1.
    pub call: u64,
    /// The ranks it is among.
    pub group: GroupId,
}

impl CallAt {
    /// The call of `epoch` in an iteration whose first call had `first`, among every
    /// rank.
    pub(crate) fn of(iteration: Iteration, first: Epoch, epoch: Epoch) -> Self {
        CallAt {
            iteration,
            call: epoch.saturating_sub(first) + 1,
            group: GroupId::ALL,
        }
    }

    /// The same call, of `group`'s calls.
    pub(crate) fn in_group(self, group: GroupId) -> Self {
        CallAt { group, ..self }
    }
}

impl fmt::Display for CallAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group == GroupId::ALL {
            return write!(f, "call {} of iteration {}", self.call, self.iteration);
        }
        write!(
            f,
            "call {} of {} in iteration {}",
            self.call, self.group, self.iteration
        )
    }
}

/// A rank's call as its pieces and answers find it: its group's, and its number among
/// that group's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CallKey {
    pub(crate) group: GroupId,
    pub(crate) epoch: Epoch,
}

impl CallKey {
    /// Call `epoch` among every rank.
    pub(crate) fn all(epoch: Epoch) -> Self {
        CallKey {
            group: GroupId::ALL,
            epoch,
        }
    }

    /// Whether this is a call of the same group before `other`.
    pub(crate) fn before(self, other: CallKey) -> bool {
        self.group == other.group && self.epoch < other.epoch
    }
}

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

/// How [`all_reduce`](crate::WorkerContext::all_reduce),
/// [`reduce_scatter`](crate::WorkerContext::reduce_scatter) and a job's
/// [`combine_by`](crate::JobBuilder::combine_by) combine the ranks' values, element by
/// element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    /// The sum (integers wrap around).
    Sum,
    /// The least (for floats, as `f64::min`: a NaN gives way to a number).
    Min,
    /// The greatest (for floats, as `f64::max`).
    Max,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        })
    }
}

/// Which collective a rank called. More may come: match it with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CollectiveKind {
    /// Every rank ends with every rank's values combined, element by element by the op,
    /// or (`None`) by the user's own fold
    /// ([`all_reduce_with`](crate::WorkerContext::all_reduce_with)).
    AllReduce(Option<ReduceOp>),
    /// Every rank ends with each of its values combined with the same value of every other
    /// rank's, element by element by the op, the values carried in one exchange
    /// ([`all_reduce_many`](crate::WorkerContext::all_reduce_many)).
    AllReduceMany {
        /// How elements are combined.
        op: ReduceOp,
        /// How many values the call passed.
        values: u32,
        /// A fingerprint of the values' lengths, in order: calls that split the same
        /// number of elements otherwise differ in it.
        lengths: u64,
    },
    /// Every rank ends with its own segment of every rank's values combined, element by
    /// element by the op (`None`: by a fold of the user's).
    ReduceScatter(Option<ReduceOp>),
    /// One rank ends with every rank's values combined.
    Reduce {
        /// The rank that ends with the result.
        root: Rank,
        /// How values are combined: element by element by the op, or (`None`) by the
        /// job's fold of whole results.
        op: Option<ReduceOp>,
    },
    /// Every rank ends with one rank's value.
    Broadcast {
        /// The rank whose value every rank gets.
        root: Rank,
    },
    /// Every rank ends with every rank's value, in rank order.
    AllGather,
    /// Every rank sends each rank its own part and ends with the part every rank sent it:
    /// the messages of a superstep (`WorkerContext::send`).
    Messages,
    /// Every rank waits until every rank made the call, no value carried:
    /// [`barrier`](crate::WorkerContext::barrier) where the workers reach each other, a
    /// dissemination among them (log₂(ranks) steps, each rank sending one piece a step).
    /// The master's node knows it as [`SyncKind::Barrier`].
    Barrier,
}

impl CollectiveKind {
    /// The call as the master's node and the errors of sync calls know it: a barrier is
    /// `barrier()`, an all-gather `all_gather()`, whichever way they go.
    pub fn sync_kind(self) -> SyncKind {
        match self {
            CollectiveKind::Barrier => SyncKind::Barrier,
            CollectiveKind::AllGather => SyncKind::AllGather,
            kind => SyncKind::Collective(kind),
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The user's own fold: the call that makes it.
            CollectiveKind::AllReduce(None) => f.write_str("all_reduce_with"),
            CollectiveKind::AllReduce(Some(op)) => write!(f, "all_reduce({op})"),
            CollectiveKind::AllReduceMany {
                op,
                values,
                lengths,
            } => write!(
                f,
                "all_reduce_many({op}) [{values} value(s), lengths #{lengths:016x}]"
            ),
            CollectiveKind::ReduceScatter(Some(op)) => write!(f, "reduce_scatter({op})"),
            CollectiveKind::ReduceScatter(None) => f.write_str("reduce_scatter by a fold"),
            CollectiveKind::Reduce { root, op: Some(op) } => {
                write!(f, "reduce({op}) to rank {root}")
            }
            CollectiveKind::Reduce { root, op: None } => write!(f, "reduce(a fold) to rank {root}"),
            CollectiveKind::Broadcast { root } => write!(f, "broadcast from rank {root}"),
            CollectiveKind::AllGather => f.write_str("all_gather()"),
            CollectiveKind::Messages => f.write_str("messages"),
            CollectiveKind::Barrier => f.write_str("barrier()"),
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
    /// The call's epoch: its number, counted per rank from 0 over the attempt among its
    /// group's calls (as sync calls' are), by which pieces find their call.
    pub seq: u64,
    /// Where it stands in its iteration, as messages name it.
    pub at: CallAt,
    /// What was called.
    pub kind: CollectiveKind,
    /// How many elements the value has (1 for a value that is not split; for
    /// `AllReduceMany`, every value's together).
    pub len: u64,
    /// How the values travel.
    pub algorithm: Algorithm,
    /// How many elements travel in one piece.
    pub chunk: u32,
}

impl CollectiveCall {
    /// The call as pieces find it: its group's, and its number among that group's calls.
    pub(crate) fn key(&self) -> CallKey {
        CallKey {
            group: self.at.group,
            epoch: self.seq,
        }
    }
}

impl fmt::Display for CollectiveCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == CollectiveKind::Messages {
            // One piece from each rank to each other: no algorithm to name, and its
            // length is the ranks' pairs.
            return write!(f, "the superstep's messages ({})", self.at);
        }
        if self.chunk == 0
            || matches!(
                self.kind,
                CollectiveKind::Barrier | CollectiveKind::AllGather
            )
        {
            // Known by its kind alone: a broadcast's receiver before its first piece, a
            // barrier, which carries no value, or an all-gather, whose elements are the
            // ranks' messages.
            return write!(f, "{} ({})", self.kind, self.at);
        }
        write!(
            f,
            "{} of {} element(s) by {} ({})",
            self.kind, self.len, self.algorithm, self.at
        )
    }
}

/// How the workers' results of a job that combines them (`JobBuilder::combine`) reach the
/// master: each to the master (a star), or folded among the workers first, over the peer
/// mesh, so that the master receives one folded result an iteration.
///
/// Whatever the way, results are folded in rank order — `combine(combine(r0, r1), r2)` —
/// and [`Ring`](Aggregation::Ring) keeps that grouping too, so its result is the star's to
/// the bit, floats included. [`Tree`](Aggregation::Tree) groups as a binomial tree does
/// (`(r0 ⊕ r1) ⊕ (r2 ⊕ r3)`): the same result for a fold that is associative to the bit
/// (integers, min, max, concatenation), the last bits of a float sum may differ.
///
/// Folding among the workers makes them wait for each other at the end of compute, as a
/// collective does: [`Tree`](Aggregation::Tree) and [`Ring`](Aggregation::Ring) need
/// barrier mode, a combining job and workers that reach each other (as TCP's and the
/// simulator's do); otherwise the job fails at its start naming the setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Aggregation {
    /// The star in one process (results are handed over, not copied) and for small
    /// results; across processes whose transport connects the workers (TCP does), in
    /// barrier mode, the ring for an element-wise fold (`JobBuilder::combine_by`) once an
    /// iteration's folded result reached 64 KiB — the master decides each iteration by the
    /// one before and tells every worker.
    #[default]
    #[serde(alias = "auto")]
    Auto,
    /// Every worker sends its result to the master, which folds them as they arrive.
    #[serde(alias = "star")]
    Star,
    /// A binomial tree towards rank 0: about log₂(workers) steps, each moving the whole
    /// value; rank 0 sends the fold to the master.
    #[serde(alias = "tree")]
    Tree,
    /// Along the ranks in order, 0 to the last, and from the last back to rank 0, which
    /// hands the fold to the master (in a cluster job they share a process, so the fold
    /// crosses no network link to the master). An element-wise fold (`JobBuilder::combine_by`)
    /// travels in chunks, pipelined: each link carries the value once, each way at most,
    /// whatever the number of workers; any other fold travels whole.
    #[serde(alias = "ring")]
    Ring,
}

impl fmt::Display for Aggregation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Aggregation::Auto => "Auto",
            Aggregation::Star => "Star",
            Aggregation::Tree => "Tree",
            Aggregation::Ring => "Ring",
        })
    }
}

impl std::str::FromStr for Aggregation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Aggregation::Auto),
            "star" => Ok(Aggregation::Star),
            "tree" => Ok(Aggregation::Tree),
            "ring" => Ok(Aggregation::Ring),
            _ => Err(format!(
                "unknown aggregation {s:?}: expected auto, star, tree or ring"
            )),
        }
    }
}

/// How the workers fold their results in one iteration, as the master tells them with the
/// iteration (an [`Aggregation`] decided).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FoldRoute {
    /// Each worker sends its own result to the master.
    Star,
    /// By a binomial tree towards rank 0.
    Tree,
    /// Along the ranks in order, and from the last back to rank 0.
    Ring,
}

impl FoldRoute {
    /// The rank a fold by this route ends at — rank 0, which in a cluster job runs beside
    /// the master — or `None` for the star, where no fold is made among workers.
    pub(crate) fn root(self) -> Option<Rank> {
        match self {
            FoldRoute::Star => None,
            FoldRoute::Tree | FoldRoute::Ring => Some(0),
        }
    }
}
