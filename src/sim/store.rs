//! The simulated master's checkpoint store: it survives the master's crashes, keeps each
//! checkpoint as its file holds it, and can crash its process around a write.

use std::sync::{Arc, Mutex};

use super::lock;
use crate::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, Loaded};
use crate::ids::Iteration;

/// Where the master's process crashes around a checkpoint write, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteCrash {
    Before,
    During,
    /// During, leaving the file torn.
    Torn,
    After,
}

/// The checkpoint store of the simulated master: shared by every master process of the run,
/// and able to crash its process around a write. It keeps each checkpoint as its file
/// holds it (`checkpoint::encode`: header, checksum, body) and reads them back as the
/// filesystem store does, skipping damaged ones.
#[derive(Clone, Default)]
pub(super) struct SimStore {
    /// By iteration: the bytes of each checkpoint's file.
    pub(super) files: Arc<Mutex<Files>>,
    pub(super) plan: Arc<Mutex<(Option<WriteCrash>, bool)>>,
    /// How many damaged checkpoints reads skipped.
    pub(super) skipped: Arc<Mutex<u32>>,
}

/// Checkpoint files by iteration.
type Files = std::collections::BTreeMap<Iteration, Vec<u8>>;

impl SimStore {
    fn write(&self, iteration: Iteration, bytes: Vec<u8>) {
        lock(&self.files).insert(iteration, bytes);
    }
}

impl CheckpointStore for SimStore {
    fn location(&self) -> String {
        "the simulated store".into()
    }

    fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let bytes = crate::checkpoint::encode(checkpoint)?;
        let mut plan = lock(&self.plan);
        let crashed = || {
            Err(CheckpointError::io(
                "sim",
                std::io::Error::other("the process crashed"),
            ))
        };
        match plan.0.take() {
            // The process dies before the write is whole: the one before stays.
            Some(WriteCrash::Before | WriteCrash::During) => {
                plan.1 = true;
                crashed()
            }
            // It dies mid-write, and the storage keeps what was written.
            Some(WriteCrash::Torn) => {
                plan.1 = true;
                self.write(checkpoint.iteration, bytes[..bytes.len() / 2].to_vec());
                crashed()
            }
            Some(WriteCrash::After) => {
                plan.1 = true;
                self.write(checkpoint.iteration, bytes);
                Ok(())
            }
            None => {
                self.write(checkpoint.iteration, bytes);
                Ok(())
            }
        }
    }

    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
        // Each file read as it is reached, newest first, as on disk.
        let files = lock(&self.files);
        let newest_first = files.iter().rev().map(|(iteration, bytes)| {
            let path = std::path::PathBuf::from(format!("sim/checkpoint-{iteration}"));
            Ok((path, Ok(bytes.clone())))
        });
        let loaded = crate::checkpoint::newest_readable(newest_first)?;
        drop(files);
        *lock(&self.skipped) += loaded.as_ref().map_or(0, |l| l.skipped.len() as u32);
        Ok(loaded)
    }
}
