//! Output: part files in a staging directory, merged into one file or committed to an
//! output directory — atomically either way, and removed when the job fails.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Coordinator, WorkerReport};
use crate::error::{BoxError, JobError};
use crate::ids::Rank;

/// A job's staging directory, where each worker writes its part files
/// (`part-00003.jsonl` for rank 3). Clone it into the worker factory; the coordinator that
/// owns it creates it at the start and removes it at the end. Write parts in `compute`, not
/// in `init`: the directory is made in `on_start`, which comes before the first iteration
/// but, over TCP, not necessarily before another process's `init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staging {
    dir: PathBuf,
}

impl Staging {
    /// Parts go to `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Staging { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where rank `rank` writes its part with extension `ext`.
    pub fn part(&self, rank: Rank, ext: &str) -> PathBuf {
        self.dir.join(format!("part-{rank:05}.{ext}"))
    }

    /// The part files there, in rank order (by name): the files named as
    /// [`part`](Staging::part) names them (`part-00003.jsonl`), so a worker's
    /// `part-00003.jsonl.tmp` or any other file is never taken for a part.
    pub fn parts(&self) -> io::Result<Vec<PathBuf>> {
        let mut parts: Vec<PathBuf> = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(is_part))
            .collect();
        parts.sort();
        Ok(parts)
    }

    /// Flushes every part, and the directory, to disk.
    fn sync(&self) -> io::Result<()> {
        for part in self.parts()? {
            File::open(part)?.sync_all()?;
        }
        sync_dir(&self.dir)
    }

    /// An empty directory: what an earlier run left there is removed.
    pub fn reset(&self) -> io::Result<()> {
        self.remove()?;
        fs::create_dir_all(&self.dir)
    }

    /// Removes the directory and everything in it (nothing to do if it is gone).
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Whether `name` is a part's: `part-`, the rank's digits, `.`, an extension without dots.
fn is_part(name: &str) -> bool {
    let Some((rank, ext)) = name.strip_prefix("part-").and_then(|n| n.split_once('.')) else {
        return false;
    };
    !rank.is_empty()
        && rank.bytes().all(|b| b.is_ascii_digit())
        && !ext.is_empty()
        && !ext.contains('.')
}

/// Writes `bytes` to `target` atomically: a temporary file in the same directory, flushed
/// to disk, renamed over the target, and the directory flushed.
fn write_atomically(
    target: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = parent(target);
    let mut builder = tempfile::Builder::new();
    let prefix = temp_prefix(target);
    builder.prefix(&prefix);
    // A file readers can read, as the one it replaces: the temporary file's own 0600 would
    // be kept by the rename.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    let mut temp = builder.tempfile_in(dir)?;
    if let Ok(old) = fs::metadata(target) {
        temp.as_file().set_permissions(old.permissions())?;
    }
    write(temp.as_file_mut())?;
    temp.as_file().sync_all()?;
    temp.persist(target).map_err(|e| e.error)?;
    sync_dir(dir)
}

/// The prefix of [`write_atomically`]'s temporary files.
const TEMP_PREFIX: &str = ".superstep-";

/// The prefix of the temporary files [`write_atomically`] writes for `target`, beside it:
/// [`TEMP_PREFIX`], the target's file name and a dot, then random characters — so that
/// what a write killed midway left is known as that target's, and no other's.
fn temp_prefix(target: &Path) -> String {
    let name = target.file_name().map(|n| n.to_string_lossy());
    format!("{TEMP_PREFIX}{}.", name.unwrap_or_default())
}

/// Removes the temporary files a write of `target` killed midway left beside it (a
/// process killed between the temporary file's creation and its rename): the next run
/// of the same write would otherwise leave them for ever. Returns how many.
fn remove_stale_temps(target: &Path) -> io::Result<usize> {
    let prefix = temp_prefix(target);
    let mut removed = 0;
    let entries = match fs::read_dir(parent(target)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        entries => entries?,
    };
    for entry in entries {
        let entry = entry?;
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix));
        if ours && entry.file_type()?.is_file() {
            match fs::remove_file(entry.path()) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => removed += 1,
            }
        }
    }
    Ok(removed)
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// How [`FileMerge`] joins parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeFormat {
    /// CSV with a header line in every part: the merged file has one, the first part's;
    /// a part whose header differs fails the merge.
    Csv,
    /// Lines (JSONL, text): parts one after the other, each ending with a newline.
    Lines,
}

/// Merges the workers' parts into one file when every worker succeeded: CSV (a single
/// header) or JSONL, in rank order, written beside the target and renamed over it, so a
/// reader sees the old file or the whole new one, never half. On an error the staging
/// directory is removed and the target left as it was. A merge killed midway leaves its
/// temporary file beside the target (`.superstep-<target's name>.…`): the next job with
/// the same target removes it as it starts.
#[derive(Debug)]
pub struct FileMerge {
    staging: Staging,
    target: PathBuf,
    format: MergeFormat,
}

impl FileMerge {
    /// Merges into `target`, from a staging directory beside it (`<target>.parts`).
    pub fn new(target: impl Into<PathBuf>, format: MergeFormat) -> Self {
        let target = target.into();
        let mut staging = target.clone().into_os_string();
        staging.push(".parts");
        FileMerge {
            staging: Staging::new(staging),
            target,
            format,
        }
    }

    /// Where the workers write their parts.
    pub fn staging(&self) -> &Staging {
        &self.staging
    }

    fn merge(&self, out: &mut File) -> io::Result<()> {
        let mut out = io::BufWriter::with_capacity(1 << 20, out);
        let mut header: Option<Vec<u8>> = None;
        for part in self.staging.parts()? {
            let mut reader = BufReader::with_capacity(1 << 20, File::open(&part)?);
            if self.format == MergeFormat::Csv {
                let mut first = Vec::new();
                if reader.read_until(b'\n', &mut first)? == 0 {
                    continue;
                }
                ensure_newline(&mut first);
                match &header {
                    None => {
                        out.write_all(&first)?;
                        header = Some(first);
                    }
                    Some(h) if *h == first => {}
                    Some(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "{} has another header than the parts before it",
                                part.display()
                            ),
                        ))
                    }
                }
            }
            let mut last = b'\n';
            loop {
                let buf = reader.fill_buf()?;
                if buf.is_empty() {
                    break;
                }
                out.write_all(buf)?;
                last = *buf.last().expect("not empty");
                let n = buf.len();
                reader.consume(n);
            }
            if last != b'\n' {
                out.write_all(b"\n")?;
            }
        }
        out.flush()
    }
}

fn ensure_newline(line: &mut Vec<u8>) {
    if line.last() != Some(&b'\n') {
        line.push(b'\n');
    }
}

impl Coordinator for FileMerge {
    fn on_start(&mut self) -> Result<(), BoxError> {
        self.staging.reset()?;
        let removed = remove_stale_temps(&self.target).map_err(|e| {
            format!(
                "removing what an earlier merge into {} left beside it: {e}",
                self.target.display()
            )
        })?;
        if removed > 0 {
            tracing::info!(target = %self.target.display(), removed, "removed the temporary files of a merge killed midway");
        }
        Ok(())
    }

    fn on_finish(&mut self, _reports: &[WorkerReport]) -> Result<(), BoxError> {
        write_atomically(&self.target, |out| self.merge(out))
            .map_err(|e| format!("merging the parts into {}: {e}", self.target.display()))?;
        tracing::info!(target = %self.target.display(), "merged the parts");
        // The merged file is in place: the job's output is done, whatever the cleanup says.
        if let Err(error) = self.staging.remove() {
            tracing::warn!(staging = %self.staging.dir().display(), %error, "could not remove the staging directory");
        }
        Ok(())
    }

    fn on_error(&mut self, _error: &JobError) -> Result<(), BoxError> {
        self.staging.remove()?;
        Ok(())
    }
}

/// A step of [`AtomicCommit`]'s commit, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CommitStep {
    /// The staging directory became the new version's directory (not visible yet).
    Staged,
    /// The new version's manifest is written (not visible yet).
    Manifest,
    /// `CURRENT` names the new version: the commit point.
    Switched,
    /// Versions older than the kept ones are removed.
    Cleaned,
}

/// What a committed version of an output directory holds
/// ([`AtomicCommit::committed`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The version, from 1.
    pub version: u64,
    /// The job that committed it.
    pub job_id: String,
    /// Its files, relative to the output directory, in rank order.
    pub files: Vec<PathBuf>,
}

/// Commits all parts of a job to an output directory in one atomic step, as table formats
/// do: the parts become a new version's directory, its manifest lists them, and a pointer
/// file, `CURRENT`, is switched to it by a rename. Readers ([`AtomicCommit::committed`])
/// follow `CURRENT`, so they see the previous version or the new one, never a mix; a
/// crash at any step leaves the previous version current, and the next start clears what
/// the crash left. On an error the staging directory is removed.
///
/// Layout: `CURRENT`, `v00000002/part-00000.jsonl…`, `v00000002.manifest.json`,
/// `_staging/` while a job runs.
#[derive(Debug)]
pub struct AtomicCommit {
    output: PathBuf,
    staging: Staging,
    job_id: String,
    keep: usize,
    crash_after: Option<CommitStep>,
}

impl AtomicCommit {
    /// Commits to `output`, keeping the newest two versions (a reader still on the one
    /// before keeps its files); parts are staged in `output/_staging`.
    pub fn new(output: impl Into<PathBuf>, job_id: impl Into<String>) -> Self {
        let output = output.into();
        AtomicCommit {
            staging: Staging::new(output.join("_staging")),
            output,
            job_id: job_id.into(),
            keep: 2,
            crash_after: None,
        }
    }

    /// Keeps the newest `keep` versions (at least 1).
    pub fn keep(mut self, keep: usize) -> Self {
        self.keep = keep.max(1);
        self
    }

    /// Stops the commit right after `step`, as a crash there would (for tests of what
    /// readers see).
    #[doc(hidden)]
    pub fn crash_after(mut self, step: CommitStep) -> Self {
        self.crash_after = Some(step);
        self
    }

    /// Where the workers write their parts.
    pub fn staging(&self) -> &Staging {
        &self.staging
    }

    /// The committed version of `output`, with its files as paths under it; `None` before
    /// the first commit.
    pub fn committed(output: &Path) -> io::Result<Option<(Manifest, Vec<PathBuf>)>> {
        let Some(version) = current(output)? else {
            return Ok(None);
        };
        let bytes = fs::read(manifest_path(output, version))?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let files = manifest.files.iter().map(|f| output.join(f)).collect();
        Ok(Some((manifest, files)))
    }

    fn step(&self, step: CommitStep) -> io::Result<()> {
        if self.crash_after == Some(step) {
            return Err(io::Error::other(format!("simulated crash after {step:?}")));
        }
        Ok(())
    }

    fn commit(&self) -> io::Result<u64> {
        let version = current(&self.output)?.unwrap_or(0) + 1;
        let dir = self.output.join(version_dir(version));
        remove_dir(&dir)?;
        // The parts are on disk before anything names them.
        self.staging.sync()?;
        fs::rename(self.staging.dir(), &dir)?;
        sync_dir(&self.output)?;
        self.step(CommitStep::Staged)?;
        let files = Staging::new(&dir)
            .parts()?
            .into_iter()
            .map(|p| {
                PathBuf::from(version_dir(version)).join(p.file_name().expect("a part's name"))
            })
            .collect();
        let manifest = Manifest {
            version,
            job_id: self.job_id.clone(),
            files,
        };
        let json = serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?;
        write_atomically(&manifest_path(&self.output, version), |f| {
            f.write_all(&json)
        })?;
        self.step(CommitStep::Manifest)?;
        write_atomically(&self.output.join("CURRENT"), |f| writeln!(f, "{version}"))?;
        self.step(CommitStep::Switched)?;
        // Committed: removing old versions is housekeeping, never the job's failure.
        if let Err(error) = self.clean(version, false) {
            tracing::warn!(output = %self.output.display(), %error, "could not remove old versions");
        }
        self.step(CommitStep::Cleaned)?;
        Ok(version)
    }

    /// Removes versions older than the kept ones, and with `uncommitted` also those newer
    /// than `current` and temporary files (what a crashed commit left).
    fn clean(&self, current: u64, uncommitted: bool) -> io::Result<()> {
        for entry in fs::read_dir(&self.output)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if uncommitted && name.starts_with(TEMP_PREFIX) && path.is_file() {
                fs::remove_file(&path)?;
                continue;
            }
            let Some(version) = parse_version(name) else {
                continue;
            };
            let old = version + (self.keep as u64) <= current;
            if old || (uncommitted && version > current) {
                if path.is_dir() {
                    remove_dir(&path)?;
                } else {
                    fs::remove_file(&path)?;
                }
            }
        }
        Ok(())
    }
}

fn version_dir(version: u64) -> String {
    format!("v{version:08}")
}

fn manifest_path(output: &Path, version: u64) -> PathBuf {
    output.join(format!("{}.manifest.json", version_dir(version)))
}

/// The version a `v00000003` directory or `v00000003.manifest.json` belongs to.
fn parse_version(name: &str) -> Option<u64> {
    let digits = name.strip_prefix('v')?;
    let digits = digits.strip_suffix(".manifest.json").unwrap_or(digits);
    (digits.len() == 8).then(|| digits.parse().ok()).flatten()
}

fn current(output: &Path) -> io::Result<Option<u64>> {
    match fs::read_to_string(output.join("CURRENT")) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}/CURRENT holds {text:?}, not a version", output.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn remove_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl Coordinator for AtomicCommit {
    fn on_start(&mut self) -> Result<(), BoxError> {
        fs::create_dir_all(&self.output)?;
        let current = current(&self.output)?.unwrap_or(0);
        self.clean(current, true)?;
        self.staging.reset()?;
        Ok(())
    }

    fn on_finish(&mut self, _reports: &[WorkerReport]) -> Result<(), BoxError> {
        let version = self
            .commit()
            .map_err(|e| format!("committing to {}: {e}", self.output.display()))?;
        tracing::info!(output = %self.output.display(), version, "committed the job's output");
        Ok(())
    }

    fn on_error(&mut self, _error: &JobError) -> Result<(), BoxError> {
        self.staging.remove()?;
        Ok(())
    }
}
