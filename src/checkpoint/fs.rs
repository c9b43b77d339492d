//! The filesystem store: one file per checkpoint, written atomically, with a checksum.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::format::{decode, encode, file_name, iteration_of};
use super::{Checkpoint, CheckpointError, CheckpointStore, Loaded};
use crate::ids::Iteration;

const TEMP_PREFIX: &str = ".checkpoint-";

/// Checkpoints as files in one directory: `checkpoint-<iteration>.ssck`.
///
/// Each is written to a temporary file in the same directory, flushed to disk (`fsync`),
/// renamed over its final name and the directory flushed, so a crash leaves either the
/// whole new checkpoint or none of it, and the previous one untouched. Each file carries a
/// CRC-32 of its body: [`latest`](CheckpointStore::latest) skips a corrupt one with a
/// warning and returns the one before. After each save only the newest `keep` are kept.
///
/// The directory belongs to one job: opening a store removes the temporary files it finds
/// there, so two jobs running at once must not share a directory.
#[derive(Debug, Clone)]
pub struct FsCheckpointStore {
    dir: PathBuf,
    keep: usize,
}

impl FsCheckpointStore {
    /// A store in `dir` (created if missing) that keeps the newest `keep` checkpoints (at
    /// least one; two or more leave a fallback if the newest is damaged). Removes the
    /// temporary files of saves that a crash interrupted.
    pub fn new(dir: impl Into<PathBuf>, keep: usize) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io(&dir, e))?;
        let store = FsCheckpointStore {
            dir,
            keep: keep.max(1),
        };
        for entry in store.entries()? {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with(TEMP_PREFIX) {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| CheckpointError::io(path, e))?;
            }
        }
        Ok(store)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the checkpoint of `iteration`.
    pub fn path_of(&self, iteration: Iteration) -> PathBuf {
        self.dir.join(file_name(iteration))
    }

    /// The checkpoint files present, oldest first.
    pub fn files(&self) -> Result<Vec<(Iteration, PathBuf)>, CheckpointError> {
        let mut files: Vec<_> = self
            .entries()?
            .into_iter()
            .filter_map(|entry| Some((iteration_of(entry.file_name().to_str()?)?, entry.path())))
            .collect();
        files.sort();
        Ok(files)
    }

    fn entries(&self) -> Result<Vec<fs::DirEntry>, CheckpointError> {
        let io = |e| CheckpointError::io(&self.dir, e);
        fs::read_dir(&self.dir)
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)
    }

    fn prune(&self) -> Result<(), CheckpointError> {
        let files = self.files()?;
        let excess = files.len().saturating_sub(self.keep);
        for (_, path) in &files[..excess] {
            fs::remove_file(path).map_err(|e| CheckpointError::io(path, e))?;
        }
        Ok(())
    }
}

impl CheckpointStore for FsCheckpointStore {
    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let bytes = encode(checkpoint)?;
        let target = self.path_of(checkpoint.iteration);
        let io = |e| CheckpointError::io(&self.dir, e);
        // Dropped (and so removed) on every error below, before the rename.
        let mut temp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.dir)
            .map_err(io)?;
        temp.write_all(&bytes).map_err(io)?;
        temp.as_file().sync_all().map_err(io)?;
        temp.persist(&target)
            .map_err(|e| CheckpointError::io(&target, e.error))?;
        sync_dir(&self.dir)?;
        // Written: the older ones left behind are no failure of this save.
        if let Err(error) = self.prune() {
            said_prune_failed(checkpoint.iteration, &self.location(), &error);
        }
        Ok(())
    }

    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
        let files = self.files()?.into_iter().rev().map(|(_, path)| {
            let bytes = fs::read(&path).map_err(|e| CheckpointError::io(&path, e));
            (path, bytes)
        });
        newest_readable(files.map(Ok))
    }
}

/// Says that the checkpoint of `iteration` was saved in `location` but that removing the
/// older ones failed (they stay, and are removed by a later save).
pub(crate) fn said_prune_failed(iteration: Iteration, location: &str, error: &CheckpointError) {
    tracing::warn!(
        iteration,
        %error,
        "the checkpoint of iteration {iteration} is saved in {location}; removing the older ones failed (a later save tries again)"
    );
}

/// The newest checkpoint of `files` (newest first, each read lazily) that decodes, and the
/// damaged ones skipped on the way, each logged. Each file is its name and its bytes, or
/// why they are damaged (skipped for the one before); an `Err` instead is a read that
/// failed outright (a store that did not answer), which fails the whole read: falling back
/// past a checkpoint that may be whole would resume from an older one.
pub(crate) fn newest_readable(
    files: impl IntoIterator<
        Item = Result<(PathBuf, Result<Vec<u8>, CheckpointError>), CheckpointError>,
    >,
) -> Result<Option<Loaded>, CheckpointError> {
    let mut skipped = Vec::new();
    for file in files {
        let (path, bytes) = file?;
        match bytes.and_then(|bytes| decode(&path, &bytes)) {
            Ok(checkpoint) => {
                return Ok(Some(Loaded {
                    checkpoint,
                    skipped,
                }))
            }
            Err(error) => {
                tracing::warn!(%error, "skipping a damaged checkpoint, falling back to the one before");
                skipped.push(error);
            }
        }
    }
    if !skipped.is_empty() {
        tracing::warn!(
            damaged = skipped.len(),
            "no usable checkpoint: the job starts from the beginning"
        );
    }
    Ok(None)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CheckpointError::io(dir, e))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), CheckpointError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::format::HEADER;
    use super::super::tests::checkpoint;
    use super::*;

    fn store(keep: usize) -> (tempfile::TempDir, FsCheckpointStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = FsCheckpointStore::new(dir.path().join("ckpt"), keep).unwrap();
        (dir, store)
    }

    #[test]
    fn saves_round_trip_and_only_the_newest_few_are_kept() {
        let (_dir, mut store) = store(3);
        assert!(store.latest().unwrap().is_none(), "an empty store");
        for i in [2, 4, 6, 8, 10] {
            store.save(&checkpoint(i)).unwrap();
        }
        let kept: Vec<_> = store.files().unwrap().iter().map(|f| f.0).collect();
        assert_eq!(kept, vec![6, 8, 10]);
        let loaded = store.latest().unwrap().unwrap();
        assert_eq!(loaded.checkpoint, checkpoint(10));
        assert!(loaded.skipped.is_empty());
        let names: Vec<_> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 3, "no temporary files left: {names:?}");
    }

    #[test]
    fn a_damaged_newest_checkpoint_falls_back_to_the_one_before_naming_what_was_wrong() {
        let (_dir, mut store) = store(4);
        for i in 1..=4 {
            store.save(&checkpoint(i)).unwrap();
        }
        // 4: a flipped bit in the body; 3: truncated; 2: not a checkpoint at all.
        let mut bytes = fs::read(store.path_of(4)).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        fs::write(store.path_of(4), &bytes).unwrap();
        let bytes = fs::read(store.path_of(3)).unwrap();
        fs::write(store.path_of(3), &bytes[..HEADER + 2]).unwrap();
        fs::write(store.path_of(2), b"hello").unwrap();
        let loaded = store.latest().unwrap().unwrap();
        assert_eq!(loaded.checkpoint, checkpoint(1));
        let reasons: Vec<String> = loaded.skipped.iter().map(|e| e.to_string()).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons[0].contains("checksum"), "{}", reasons[0]);
        assert!(
            reasons[0].contains(&format!("{:020}", 4)),
            "names the file: {}",
            reasons[0]
        );
        assert!(reasons[1].contains("the header says"), "{}", reasons[1]);
        assert!(reasons[2].contains("shorter than"), "{}", reasons[2]);
        // With every checkpoint damaged the job starts over rather than failing.
        fs::write(store.path_of(1), b"").unwrap();
        assert!(store.latest().unwrap().is_none());
    }

    #[test]
    fn a_save_interrupted_before_its_rename_leaves_the_previous_checkpoint_and_is_cleaned_up() {
        let (_dir, mut store) = store(2);
        store.save(&checkpoint(1)).unwrap();
        // What a crash in the middle of a save leaves: a partial temporary file.
        let full = encode(&checkpoint(2)).unwrap();
        let partial = store.dir().join(format!("{TEMP_PREFIX}crashed"));
        fs::write(&partial, &full[..full.len() / 3]).unwrap();
        assert_eq!(store.latest().unwrap().unwrap().checkpoint, checkpoint(1));
        let reopened = FsCheckpointStore::new(store.dir(), 2).unwrap();
        assert!(
            !partial.exists(),
            "the temporary file of the crashed save is removed"
        );
        assert_eq!(reopened.files().unwrap().len(), 1);
    }

    #[test]
    fn a_save_that_fails_leaves_the_previous_checkpoint_usable() {
        let (_dir, mut store) = store(2);
        store.save(&checkpoint(1)).unwrap();
        // The final name is taken by a directory: the rename fails.
        fs::create_dir(store.path_of(2)).unwrap();
        let err = store.save(&checkpoint(2)).unwrap_err();
        assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
        let names: Vec<_> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file left behind: {names:?}");
        fs::remove_dir(store.path_of(2)).unwrap();
        assert_eq!(store.latest().unwrap().unwrap().checkpoint, checkpoint(1));
    }
}
