//! Checkpoints: the master's state every K iterations, kept where a restarted job finds it.
//!
//! A [`Checkpoint`] holds the iteration, the attempt, the last master result and the
//! master computable's own state, both as bytes, what each worker saved, and the job's
//! [`JobShape`] — its world size and input — which a job resuming from it must match (or
//! opt in to re-sharding, [`JobConfig::reshard_on_resume`](crate::JobConfig::reshard_on_resume)). A [`CheckpointStore`] keeps them:
//! [`FsCheckpointStore`] on a filesystem, written atomically (a temporary file, `fsync`,
//! rename, `fsync` of the directory) with a checksum, keeping the last few, and falling
//! back to the one before when the newest is corrupt; `ObjectCheckpointStore` (feature
//! `object-store`) as objects in S3, Google Cloud Storage, Azure Blob Storage or a local
//! directory, in the same format, so that checkpoints outlive the master's host;
//! [`MemoryCheckpointStore`] in memory, for tests and simulations.
//!
//! Whatever the store, workers of other processes keep a copy of the newest checkpoint
//! ([`JobConfig::checkpoint_replicas`](crate::JobConfig::checkpoint_replicas), one by
//! default in a job across hosts): a master started again on a fresh host, its store
//! empty, resumes from the newest copy its workers offer as they reconnect, checked as a
//! file of its own store is.

mod format;
mod fs;
#[cfg(feature = "object-store")]
mod object;
mod resume;
mod writer;

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::params::JobParams;
use crate::protocol::HaltedBy;

use crate::ids::{Attempt, Iteration};

pub use crate::protocol::WorkerSave;
pub(crate) use format::{decode, encode};
#[cfg(feature = "sim")]
pub(crate) use fs::newest_readable;
pub use fs::FsCheckpointStore;
#[cfg(feature = "object-store")]
pub use object::ObjectCheckpointStore;
pub(crate) use resume::{fit, resume, resume_from, Resume, Resuming};
pub(crate) use writer::Writer;

/// The master's state after an iteration: what a restarted job resumes from.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The job it belongs to; a store refuses to resume another job's.
    pub job_id: String,
    /// The last iteration it covers: a resumed job goes on with the one after.
    pub iteration: Iteration,
    /// The attempt that wrote it.
    pub attempt: Attempt,
    /// The master result of `iteration`, serialized (rmp-serde).
    pub master_result: Vec<u8>,
    /// The master computable's own state, as it saved it.
    pub master_state: Vec<u8>,
    /// Whether `iteration` halted the job: a job resumed from it finishes at once with
    /// its master result instead of going on past the halt.
    #[serde(default)]
    pub halted: Option<HaltedBy>,
    /// What each worker saved, by rank (`WorkerComputable::save_state` and the messages
    /// on their way to it); empty in a checkpoint of an iteration that halted the job,
    /// which a resumed job ends with at once, and in one written before workers saved. A
    /// rank left out of the iteration has none: it resumes from its `init`.
    #[serde(default)]
    pub workers: Vec<Option<WorkerSave>>,
    /// The shape of the job that wrote it; `None` in a checkpoint written before
    /// checkpoints recorded it (its world size is then known only from `workers`).
    #[serde(default)]
    pub shape: Option<JobShape>,
    /// Whether the job's coordinator committed the job's output after this checkpoint's
    /// iteration, the job's last (its `on_finish` returned): the durable record that the
    /// job is finished. A master started again with it ends at once with its result and
    /// runs no hook of its coordinator again — neither a second commit nor an `on_error`.
    #[serde(default)]
    pub committed: bool,
}

/// What a job was when it wrote a checkpoint, as far as resuming from it matters: how
/// many workers it had and what input they were sharded from. A job resumes from a
/// checkpoint of another shape only when it opts in to re-sharding
/// ([`JobConfig::reshard_on_resume`](crate::JobConfig::reshard_on_resume)), and never from
/// one that holds its workers' states, which belong to the old shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobShape {
    /// The world size: how many workers the job had.
    pub workers: usize,
    /// The input the workers were sharded from, as the job's fingerprint describes it
    /// (`rows 0..n`, files with their count, bytes and a checksum of their names, or
    /// `none`).
    pub input: String,
    /// The job's own parameters ([`JobBuilder::params`](crate::JobBuilder::params)); `None`
    /// in a checkpoint written before checkpoints recorded them. Unlike the world size
    /// and the input, they are never re-sharded: a checkpoint of other parameters is
    /// another job's.
    #[serde(default)]
    pub params: Option<JobParams>,
}

impl JobShape {
    /// The shape of a job of `workers` workers over `input`, with no parameters of its
    /// own.
    pub fn new(workers: usize, input: Option<&crate::coordinator::Input>) -> Self {
        JobShape {
            workers,
            input: input.map_or_else(|| "none".to_string(), crate::coordinator::Input::describe),
            params: Some(JobParams::default()),
        }
    }

    /// This shape, of a job given `params`.
    pub fn with_params(mut self, params: JobParams) -> Self {
        self.params = Some(params);
        self
    }
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("job_id", &self.job_id)
            .field("iteration", &self.iteration)
            .field("attempt", &self.attempt)
            .field(
                "master_result",
                &format_args!("{} bytes", self.master_result.len()),
            )
            .field(
                "master_state",
                &format_args!("{} bytes", self.master_state.len()),
            )
            .field("halted", &self.halted)
            .field("workers", &self.workers.len())
            .field("shape", &self.shape)
            .field("committed", &self.committed)
            .finish()
    }
}

/// Why a checkpoint could not be written or read.
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The filesystem refused.
    ///
    /// Remedy: check that the directory exists, is writable and has space.
    #[error("checkpoint I/O on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A checkpoint file is damaged: torn, truncated, or not a checkpoint at all. The
    /// store falls back to the one before.
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The checkpoint could not be encoded.
    #[error("checkpoint could not be encoded: {0}")]
    Encode(String),
    /// An object store refused or could not be reached (`ObjectCheckpointStore`, feature
    /// `object-store`), or its address is not one.
    ///
    /// Remedy: check the URL, the credentials in the environment (`AWS_ACCESS_KEY_ID`,
    /// `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, …) and that the bucket or
    /// container exists.
    #[error("checkpoint store {location}: {reason}")]
    Store {
        /// The store and the object, as a URL where one is known.
        location: String,
        /// What went wrong.
        reason: String,
    },
}

crate::error::debug_as_sentence!(CheckpointError);

impl CheckpointError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.into(),
            source: Arc::new(source),
        }
    }
}

/// The newest usable checkpoint, and the newer ones that were skipped because they were
/// corrupt.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The checkpoint to resume from.
    pub checkpoint: Checkpoint,
    /// Newer checkpoints that could not be read, newest first (each also logged as a
    /// warning).
    pub skipped: Vec<CheckpointError>,
}

/// Where checkpoints are kept.
pub trait CheckpointStore: Send + 'static {
    /// Stores `checkpoint` so that a later [`latest`](CheckpointStore::latest) returns it;
    /// on an error the checkpoint stored before must still be readable.
    fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError>;

    /// The newest checkpoint that can be read, falling back past corrupt ones; `None` when
    /// there is none (a job then starts from the beginning).
    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError>;

    /// Whether what it keeps outlives the master's host (storage every host reaches, such
    /// as an object store): then workers keep no copies of the checkpoints unless the job
    /// asks for them ([`JobConfig::checkpoint_replicas`](crate::JobConfig::checkpoint_replicas)).
    /// The default: `false`.
    fn outlives_host(&self) -> bool {
        false
    }

    /// Where it keeps its checkpoints, as the job's messages name it: a directory, a URL.
    /// The default names the store's type.
    fn location(&self) -> String {
        format!("a store of type {}", std::any::type_name::<Self>())
    }
}

/// Checkpoints in memory, shared by its clones: a test can hand one clone to a job and
/// read or hand on the other (to a restarted job, say).
#[derive(Debug, Clone, Default)]
pub struct MemoryCheckpointStore {
    saved: Arc<Mutex<Vec<Checkpoint>>>,
    keep: Option<usize>,
}

impl MemoryCheckpointStore {
    /// An empty store that keeps every checkpoint.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that keeps the last `keep` checkpoints (at least one).
    pub fn keeping(keep: usize) -> Self {
        MemoryCheckpointStore {
            saved: Arc::default(),
            keep: Some(keep.max(1)),
        }
    }

    /// Every checkpoint kept, oldest first.
    pub fn checkpoints(&self) -> Vec<Checkpoint> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Checkpoint>> {
        // A panic while holding the lock cannot leave the vector half-changed.
        self.saved.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl CheckpointStore for MemoryCheckpointStore {
    fn location(&self) -> String {
        "memory (a MemoryCheckpointStore)".into()
    }

    fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let mut saved = self.lock();
        // A checkpoint of the same iteration replaces the one there, as a file of the same
        // name does (the record of a commit saves the last one again).
        saved.retain(|c| c.iteration != checkpoint.iteration);
        saved.push(checkpoint.clone());
        if let Some(keep) = self.keep {
            let excess = saved.len().saturating_sub(keep);
            saved.drain(..excess);
        }
        Ok(())
    }

    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
        Ok(self.lock().last().cloned().map(|checkpoint| Loaded {
            checkpoint,
            skipped: Vec::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn checkpoint(iteration: Iteration) -> Checkpoint {
        Checkpoint {
            job_id: "job".into(),
            iteration,
            attempt: 0,
            master_result: vec![iteration as u8; 3],
            master_state: b"state".to_vec(),
            halted: None,
            workers: Vec::new(),
            shape: None,
            committed: false,
        }
    }

    #[test]
    fn the_memory_store_returns_the_newest_and_keeps_the_last_few() {
        let mut store = MemoryCheckpointStore::keeping(2);
        assert!(store.latest().unwrap().is_none());
        for i in 1..=4 {
            store.save(&checkpoint(i)).unwrap();
        }
        let kept: Vec<_> = store.checkpoints().iter().map(|c| c.iteration).collect();
        assert_eq!(kept, vec![3, 4]);
        let clone = store.clone();
        assert_eq!(store.latest().unwrap().unwrap().checkpoint, checkpoint(4));
        assert_eq!(clone.checkpoints().len(), 2, "clones share the checkpoints");
    }
}
