//! The object-storage store: one object per checkpoint, in S3, Google Cloud Storage, Azure
//! Blob Storage or a local directory, through the `object_store` crate.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::format::{encode, file_name, iteration_of};
use super::fs::newest_readable;
use super::{Checkpoint, CheckpointError, CheckpointStore, Loaded};
use crate::ids::Iteration;

/// Checkpoints as objects under a prefix of an object store:
/// `<prefix>/checkpoint-<iteration>.ssck`, in the format of [`FsCheckpointStore`]'s files
/// (a header with a CRC-32 of the body), so that a master started again on another host —
/// its own disk gone — resumes from the newest one.
///
/// A put is atomic in every object store: an object is there whole or not at all, and a
/// crash mid-write leaves the previous checkpoint as it was. [`latest`] lists the prefix,
/// reads the newest object first and skips a damaged one (its checksum or its body wrong)
/// with a warning for the one before. After each save only the newest `keep` are kept.
/// One job per prefix.
///
/// The store runs its requests on a runtime of its own, on a thread of its own per call,
/// so it may be called from inside an async runtime (the job's, or the caller's) as from
/// anywhere else. Clones share the store.
///
/// ```no_run
/// # use superstep::checkpoint::ObjectCheckpointStore;
/// // Credentials and the region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
/// // AWS_REGION (and AWS_ENDPOINT for an S3-compatible server) in the environment.
/// let store = ObjectCheckpointStore::from_url("s3://my-bucket/jobs/lr", 3)?;
/// # Ok::<(), superstep::checkpoint::CheckpointError>(())
/// ```
///
/// [`FsCheckpointStore`]: super::FsCheckpointStore
/// [`latest`]: CheckpointStore::latest
#[derive(Debug, Clone)]
pub struct ObjectCheckpointStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    keep: usize,
    /// The store and prefix as errors and warnings name them (the URL, where one was given).
    name: String,
    runtime: Arc<OwnRuntime>,
    /// Whether the store is one every host reaches (not a local directory or memory).
    outlives_host: bool,
}

/// The store's runtime, shut down without waiting when the last clone is dropped: the
/// store may be dropped inside another runtime (the job's), where waiting is not allowed.
#[derive(Debug)]
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The environment variables an object store's URL takes its options from: the
/// `object_store` builders' own (`AWS_*`, `GOOGLE_*`, `AZURE_*`), lower-cased as their
/// configuration keys are.
const OPTION_PREFIXES: [&str; 3] = ["AWS_", "GOOGLE_", "AZURE_"];

impl ObjectCheckpointStore {
    /// A store of the checkpoints under `prefix` (a path of `/`-separated parts, empty for
    /// the store's root) of `store`, keeping the newest `keep` (at least one; two or more
    /// leave a fallback if the newest is damaged). It is taken to outlive the master's host,
    /// as S3, GCS and Azure do ([`CheckpointStore::outlives_host`]), so that workers keep
    /// no copies unless the job asks for them.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        keep: usize,
    ) -> Result<Self, CheckpointError> {
        let name = format!("{store}/{prefix}");
        let prefix = Path::parse(prefix).map_err(|e| CheckpointError::Store {
            location: name.clone(),
            reason: format!("not a prefix of objects: {e}"),
        })?;
        Self::build(store, prefix, keep, name, true)
    }

    /// A store at `url` — `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix`, `file:///absolute/dir`, or `memory:///` — with its options
    /// (credentials, region, endpoint) from the environment: every `AWS_*`, `GOOGLE_*` and
    /// `AZURE_*` variable, as the `object_store` builders read them (`AWS_ENDPOINT` and
    /// `AWS_ALLOW_HTTP=true` for an S3-compatible server over plain HTTP). One at a
    /// `file://` or `memory://` URL is of the master's host, as far as
    /// [`CheckpointStore::outlives_host`] goes; the others outlive it.
    pub fn from_url(url: &str, keep: usize) -> Result<Self, CheckpointError> {
        let options = std::env::vars().filter_map(|(var, value)| {
            OPTION_PREFIXES
                .iter()
                .any(|p| var.starts_with(p))
                .then(|| (var.to_ascii_lowercase(), value))
        });
        Self::from_url_opts(url, options, keep)
    }

    /// A store at `url` (as [`from_url`](Self::from_url)) with the given options only:
    /// `object_store`'s configuration keys (`aws_endpoint`, `aws_access_key_id`,
    /// `aws_allow_http`, `google_service_account`, …) and their values.
    pub fn from_url_opts<K: AsRef<str>, V: Into<String>>(
        url: &str,
        options: impl IntoIterator<Item = (K, V)>,
        keep: usize,
    ) -> Result<Self, CheckpointError> {
        let refused = |reason: String| CheckpointError::Store {
            location: url.to_string(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| refused(format!("not a URL: {e}")))?;
        let (store, prefix) = object_store::parse_url_opts(&parsed, options)
            .map_err(|e| refused(format!("not a store this build reaches: {e}")))?;
        let outlives_host = !matches!(parsed.scheme(), "file" | "memory");
        Self::build(
            Arc::from(store),
            prefix,
            keep,
            url.trim_end_matches('/').into(),
            outlives_host,
        )
    }

    fn build(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        keep: usize,
        name: String,
        outlives_host: bool,
    ) -> Result<Self, CheckpointError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CheckpointError::Store {
                location: name.clone(),
                reason: format!("no runtime for its requests: {e}"),
            })?;
        Ok(ObjectCheckpointStore {
            store,
            prefix,
            keep: keep.max(1),
            name,
            runtime: Arc::new(OwnRuntime(Some(runtime))),
            outlives_host,
        })
    }

    /// The checkpoint objects present, oldest first: each one's iteration and its path in
    /// the store.
    pub fn objects(&self) -> Result<Vec<(Iteration, String)>, CheckpointError> {
        let listed = self.listed()?;
        Ok(listed
            .into_iter()
            .map(|(i, p)| (i, p.to_string()))
            .collect())
    }

    /// The checkpoint objects present, oldest first, each with its location as the store
    /// gave it (not rebuilt from text, which would encode some characters again).
    fn listed(&self) -> Result<Vec<(Iteration, Path)>, CheckpointError> {
        let listed = self
            .run(self.store.list(Some(&self.prefix)).try_collect::<Vec<_>>())
            .map_err(|e| self.refused(&self.prefix, e))?;
        let mut objects: Vec<_> = listed
            .into_iter()
            // Only the prefix's own objects, not those of a deeper one.
            .filter(|meta| {
                meta.location
                    .prefix_match(&self.prefix)
                    .map(Iterator::count)
                    == Some(1)
            })
            .filter_map(|meta| {
                let iteration = iteration_of(meta.location.filename()?)?;
                Some((iteration, meta.location))
            })
            .collect();
        objects.sort();
        Ok(objects)
    }

    fn location_of(&self, iteration: Iteration) -> Path {
        self.prefix.clone().join(file_name(iteration))
    }

    /// The object at `location` as errors name it.
    fn describe(&self, location: &Path) -> String {
        let within = location
            .prefix_match(&self.prefix)
            .map(|parts| {
                parts
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| location.to_string());
        format!("{}/{within}", self.name)
    }

    fn refused(&self, location: &Path, error: object_store::Error) -> CheckpointError {
        CheckpointError::Store {
            location: self.describe(location),
            reason: error.to_string(),
        }
    }

    /// Runs `request` to its end on the store's runtime, on a thread of its own: the
    /// caller may be inside another runtime, whose thread must not block on this one's.
    fn run<F>(&self, request: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        std::thread::scope(|scope| {
            let runtime = self.runtime.0.as_ref().expect("taken only when dropped");
            let ran = scope.spawn(|| runtime.block_on(request)).join();
            ran.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn prune(&self) -> Result<(), CheckpointError> {
        let objects = self.listed()?;
        let excess = objects.len().saturating_sub(self.keep);
        for (_, location) in &objects[..excess] {
            self.run(self.store.delete(location))
                .map_err(|e| self.refused(location, e))?;
        }
        Ok(())
    }
}

impl CheckpointStore for ObjectCheckpointStore {
    fn outlives_host(&self) -> bool {
        self.outlives_host
    }

    fn location(&self) -> String {
        self.name.clone()
    }

    fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let bytes = encode(checkpoint)?;
        let location = self.location_of(checkpoint.iteration);
        self.run(self.store.put(&location, bytes.into()))
            .map_err(|e| self.refused(&location, e))?;
        // Written: the older ones left behind are no failure of this save.
        if let Err(error) = self.prune() {
            super::fs::said_prune_failed(checkpoint.iteration, &self.name, &error);
        }
        Ok(())
    }

    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
        let objects = self.listed()?;
        let newest_first = objects.into_iter().rev().map(|(_, location)| {
            let read = self.run(async {
                let got = self.store.get(&location).await?;
                got.bytes().await
            });
            let named = PathBuf::from(self.describe(&location));
            match read {
                Ok(bytes) => Ok((named, Ok(bytes.to_vec()))),
                // Gone since it was listed (pruned by a newer save): skipped.
                Err(e @ object_store::Error::NotFound { .. }) => {
                    Ok((named, Err(self.refused(&location, e))))
                }
                // The store did not answer: the read fails rather than fall back past a
                // checkpoint that may be whole (the newest, or the record of a commit).
                Err(e) => Err(self.refused(&location, e)),
            }
        });
        newest_readable(newest_first)
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    use super::super::tests::checkpoint;
    use super::*;

    fn in_memory(keep: usize) -> (Arc<InMemory>, ObjectCheckpointStore) {
        let memory = Arc::new(InMemory::new());
        let store = ObjectCheckpointStore::new(memory.clone(), "jobs/lr", keep).unwrap();
        (memory, store)
    }

    #[test]
    fn saves_round_trip_and_only_the_newest_few_are_kept() {
        let (_, mut store) = in_memory(3);
        assert!(store.latest().unwrap().is_none(), "an empty store");
        for i in [2, 4, 6, 8, 10] {
            store.save(&checkpoint(i)).unwrap();
        }
        let kept: Vec<_> = store.objects().unwrap().iter().map(|o| o.0).collect();
        assert_eq!(kept, vec![6, 8, 10]);
        let loaded = store.latest().unwrap().unwrap();
        assert_eq!(loaded.checkpoint, checkpoint(10));
        assert!(loaded.skipped.is_empty());
        assert_eq!(
            store.objects().unwrap()[0].1,
            "jobs/lr/checkpoint-00000000000000000006.ssck"
        );
    }

    #[test]
    fn a_damaged_newest_object_falls_back_to_the_one_before_naming_it() {
        let (memory, mut store) = in_memory(4);
        for i in 1..=3 {
            store.save(&checkpoint(i)).unwrap();
        }
        let newest = store.location_of(3);
        let bytes = encode(&checkpoint(3)).unwrap();
        let torn = PutPayload::from(bytes[..bytes.len() - 3].to_vec());
        store.run(memory.put(&newest, torn)).unwrap();
        let loaded = store.latest().unwrap().unwrap();
        assert_eq!(loaded.checkpoint, checkpoint(2));
        let skipped = loaded.skipped[0].to_string();
        assert!(
            skipped.contains("jobs/lr/checkpoint-00000000000000000003.ssck")
                && skipped.contains("the header says"),
            "{skipped}"
        );
    }

    /// An in-memory store whose reads fail (a store that does not answer) while `down`.
    #[derive(Debug)]
    struct Flaky {
        inner: InMemory,
        down: std::sync::atomic::AtomicBool,
        /// Whether its deletes fail.
        no_deletes: std::sync::atomic::AtomicBool,
    }

    impl std::fmt::Display for Flaky {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Flaky")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for Flaky {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            self.inner.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(object_store::Error::Generic {
                    store: "Flaky",
                    source: "503 Slow Down".into(),
                });
            }
            self.inner.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: futures_util::stream::BoxStream<'static, object_store::Result<Path>>,
        ) -> futures_util::stream::BoxStream<'static, object_store::Result<Path>> {
            use futures_util::StreamExt;
            if self.no_deletes.load(std::sync::atomic::Ordering::SeqCst) {
                return locations
                    .map(|_| {
                        Err(object_store::Error::Generic {
                            store: "Flaky",
                            source: "403 AccessDenied: s3:DeleteObject".into(),
                        })
                    })
                    .boxed();
            }
            self.inner.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.inner.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<object_store::ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    #[test]
    fn a_store_that_does_not_answer_fails_the_read_instead_of_falling_back() {
        let flaky = Arc::new(Flaky {
            inner: InMemory::new(),
            down: false.into(),
            no_deletes: false.into(),
        });
        let mut store = ObjectCheckpointStore::new(flaky.clone(), "jobs/lr", 3).unwrap();
        store.save(&checkpoint(1)).unwrap();
        store.save(&checkpoint(2)).unwrap();
        flaky.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let err = store.latest().unwrap_err().to_string();
        assert!(
            err.contains("checkpoint store Flaky/jobs/lr/checkpoint-00000000000000000002.ssck")
                && err.contains("503 Slow Down"),
            "{err}"
        );
        flaky.down.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(store.latest().unwrap().unwrap().checkpoint, checkpoint(2));
    }

    #[test]
    fn a_store_every_host_reaches_outlives_the_masters_and_a_local_one_does_not() {
        let at = |url: &str| {
            ObjectCheckpointStore::from_url_opts(url, [("aws_region", "us-east-1")], 3)
                .unwrap()
                .outlives_host()
        };
        assert!(at("s3://bucket/jobs/lr"));
        assert!(!at("memory:///"));
        let dir = tempfile::tempdir().unwrap();
        assert!(!at(&format!("file://{}", dir.path().display())));
        let given = ObjectCheckpointStore::new(Arc::new(InMemory::new()), "lr", 3).unwrap();
        assert!(
            given.outlives_host(),
            "a store given as it is: S3, GCS, Azure"
        );
        let fs = crate::checkpoint::FsCheckpointStore::new(dir.path(), 1).unwrap();
        assert!(!fs.outlives_host(), "a directory is the host's");
    }

    #[test]
    fn a_prefix_with_characters_paths_encode_still_finds_and_prunes_its_objects() {
        let memory = Arc::new(InMemory::new());
        let mut store = ObjectCheckpointStore::new(memory.clone(), "jobs/lr #1 [a]", 2).unwrap();
        for i in 1..=3 {
            store.save(&checkpoint(i)).unwrap();
        }
        let kept: Vec<_> = store.objects().unwrap().iter().map(|o| o.0).collect();
        assert_eq!(kept, vec![2, 3]);
        assert_eq!(store.latest().unwrap().unwrap().checkpoint, checkpoint(3));
    }

    #[test]
    fn objects_of_a_deeper_prefix_or_of_another_name_are_not_checkpoints() {
        let (memory, mut store) = in_memory(2);
        store.save(&checkpoint(1)).unwrap();
        let other = encode(&checkpoint(9)).unwrap();
        for location in [
            "jobs/lr/old/checkpoint-00000000000000000009.ssck",
            "jobs/lr/notes.txt",
        ] {
            let payload = PutPayload::from(other.clone());
            store
                .run(memory.put(&Path::from(location), payload))
                .unwrap();
        }
        assert_eq!(store.latest().unwrap().unwrap().checkpoint, checkpoint(1));
        store.save(&checkpoint(2)).unwrap();
        store.save(&checkpoint(3)).unwrap();
        // Pruning leaves what is not its own alone.
        let left = store
            .run(memory.list(None).try_collect::<Vec<_>>())
            .unwrap();
        assert_eq!(left.len(), 4, "{left:?}");
    }

    #[test]
    fn it_runs_and_is_dropped_inside_an_async_runtime_too() {
        let (_, mut store) = in_memory(2);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async move {
            store.save(&checkpoint(5)).unwrap();
            assert_eq!(store.latest().unwrap().unwrap().checkpoint, checkpoint(5));
            drop(store);
        });
    }

    #[test]
    fn a_url_that_is_not_a_store_is_refused_naming_it() {
        let err = ObjectCheckpointStore::from_url("ftp://host/dir", 2).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("checkpoint store ftp://host/dir: not a store this build reaches"),
            "{message}"
        );
        let err = ObjectCheckpointStore::from_url("not a url", 2).unwrap_err();
        assert!(err.to_string().contains("not a URL"), "{err}");
    }

    #[test]
    fn a_save_whose_older_ones_cannot_be_removed_is_saved_all_the_same() {
        let flaky = Arc::new(Flaky {
            inner: InMemory::new(),
            down: false.into(),
            no_deletes: true.into(),
        });
        let mut store = ObjectCheckpointStore::new(flaky.clone(), "jobs/lr", 2).unwrap();
        for i in [1, 2, 3] {
            // Not "checkpoint skipped": written, only the pruning failed.
            store.save(&checkpoint(i)).unwrap();
        }
        let kept: Vec<_> = store.objects().unwrap().iter().map(|o| o.0).collect();
        assert_eq!(kept, vec![1, 2, 3]);
        assert_eq!(store.latest().unwrap().unwrap().checkpoint, checkpoint(3));
        // Deletes back: the next save removes what the failed ones left.
        flaky
            .no_deletes
            .store(false, std::sync::atomic::Ordering::SeqCst);
        store.save(&checkpoint(4)).unwrap();
        let kept: Vec<_> = store.objects().unwrap().iter().map(|o| o.0).collect();
        assert_eq!(kept, vec![3, 4]);
    }
}
