//! Row counts: how many rows a worker read, wrote and rejected, and the policy for a
//! malformed one. Kept in every build: the protocol carries them and the report totals
//! them, whether or not the `pipeline` feature's readers produced them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The most rejected rows a worker records one by one; past it they are only counted.
pub const MAX_RECORDED_REJECTS: usize = 1_000;

/// What a malformed row does ([`JobBuilder::malformed_rows`](crate::JobBuilder::malformed_rows)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum MalformedRows {
    /// The row fails the worker (and the job), naming its file and line. The default.
    #[default]
    Fail,
    /// The row is skipped, counted as rejected, and recorded with its file, line and why.
    Skip,
}

/// A row that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejected {
    /// The file.
    pub file: PathBuf,
    /// Its 1-based line number.
    pub line: u64,
    /// Why it was rejected.
    pub reason: String,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.reason)
    }
}

/// How many rows a worker (or the job) read, wrote and rejected, and the rejected ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowCounts {
    /// Rows read (rejected ones included).
    pub read: u64,
    /// Rows written.
    pub written: u64,
    /// Rows rejected as malformed.
    pub rejected: u64,
    /// The rejected rows, up to [`MAX_RECORDED_REJECTS`] per worker; `rejected` counts
    /// them all.
    pub rejects: Vec<Rejected>,
}

impl RowCounts {
    /// Adds `other`'s counts and records.
    pub fn add(&mut self, other: &RowCounts) {
        self.read += other.read;
        self.written += other.written;
        self.rejected += other.rejected;
        self.rejects.extend(other.rejects.iter().cloned());
    }

    /// Counts a rejected row, recording it while there is room.
    pub fn reject(&mut self, rejected: Rejected) {
        self.rejected += 1;
        if self.rejects.len() < MAX_RECORDED_REJECTS {
            self.rejects.push(rejected);
        }
    }
}
