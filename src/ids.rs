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
}

impl fmt::Display for SyncKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncKind::Barrier => "barrier()",
            SyncKind::AllGather => "all_gather()",
        })
    }
}
