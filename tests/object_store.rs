//! Checkpoints in object storage (`ObjectCheckpointStore`, feature `object-store`): a job
//! that fails resumes from them in a process that holds nothing of the first one's — no
//! directory, no store object — as a master started again on another host would: through
//! a `file://` URL, and against a real S3-compatible server (moto's, which this test
//! starts on loopback and stops).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{summing_master, FnWorker};
use superstep::checkpoint::{CheckpointStore, ObjectCheckpointStore};
use superstep::prelude::*;
use superstep::JobBuilder;

/// A job of 3 workers over 8 iterations whose rank 1 fails in iteration 5 when `fails`,
/// checkpointing every 2 into `store`.
fn job(store: impl CheckpointStore, fails: bool) -> JobBuilder<u64, u64> {
    let failed = Arc::new(AtomicBool::new(!fails));
    Job::builder(summing_master(), move |rank| {
        let failed = Arc::clone(&failed);
        FnWorker {
            f: move |ctx: &mut WorkerContext<u64, u64>| {
                if rank == 1 && ctx.iteration() == 5 && !failed.swap(true, Ordering::SeqCst) {
                    return Err("the master's host went down with this worker".into());
                }
                let last = ctx.last_master_result().copied().unwrap_or(0);
                Ok(last % 1_000 + rank as u64 * 10 + ctx.iteration())
            },
        }
    })
    .job_id("object-store")
    .workers(3)
    .iterations(8)
    .checkpoint(store, 2)
}

fn fault_free() -> u64 {
    let store = superstep::checkpoint::MemoryCheckpointStore::new();
    *job(store, false).run().unwrap().result
}

/// Runs the job until it fails in iteration 5, then again with a store `open` makes anew:
/// it resumes from the checkpoint of 4 to the fault-free result.
fn fails_then_resumes(open: impl Fn() -> ObjectCheckpointStore) {
    let expected = fault_free();
    let err = job(open(), true).run().unwrap_err();
    assert_eq!(err.iteration(), Some(5), "{err}");
    let objects = open().objects().unwrap();
    let iterations: Vec<_> = objects.iter().map(|o| o.0).collect();
    assert_eq!(iterations, vec![2, 4], "{objects:?}");
    let outcome = job(open(), false).run().unwrap();
    assert_eq!(outcome.report.resumed_from(), Some(4));
    assert_eq!(*outcome.result, expected);
    // Kept: the newest 2 (of 2, 4, 6, 8).
    let kept: Vec<_> = open().objects().unwrap().iter().map(|o| o.0).collect();
    assert_eq!(kept, vec![6, 8]);
}

#[test]
fn a_job_resumes_from_checkpoints_under_a_file_url() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/jobs/lr", dir.path().display());
    fails_then_resumes(|| ObjectCheckpointStore::from_url(&url, 2).unwrap());
}

/// moto's S3 server on a free loopback port, stopped when dropped (a failed test too).
struct Moto {
    child: Child,
    port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Starts it, and waits up to 60 s for it to answer; `None`, said on stderr, when moto
    /// is not installed — but in CI (`CI` set), whose `.ci/run` installs it, its absence
    /// fails the test.
    fn start() -> Option<Moto> {
        let installed = Command::new("python3")
            .args(["-c", "import moto.server"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            assert!(
                std::env::var_os("CI").is_none(),
                "moto is not installed; .ci/run installs it (pip install 'moto[server]')"
            );
            eprintln!("skipped: moto is not installed (pip install 'moto[server]' to run this)");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let moto = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto did not listen on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(moto)
    }

    /// Creates `bucket` (object stores do not create buckets).
    fn create_bucket(&self, bucket: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let request = format!(
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    fn options(&self) -> Vec<(&'static str, String)> {
        vec![
            ("aws_endpoint", format!("http://127.0.0.1:{}", self.port)),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "test".into()),
            ("aws_secret_access_key", "test".into()),
            ("aws_region", "us-east-1".into()),
        ]
    }
}

#[test]
fn against_an_s3_compatible_server_a_job_resumes_from_its_checkpoints_and_a_missing_bucket_is_named(
) {
    let Some(moto) = Moto::start() else {
        return;
    };
    moto.create_bucket("checkpoints");
    let open = |url: &str| ObjectCheckpointStore::from_url_opts(url, moto.options(), 2).unwrap();
    fails_then_resumes(|| open("s3://checkpoints/jobs/lr"));
    // A bucket that is not there fails the job's start, naming the store.
    let err = job(open("s3://no-such-bucket/jobs/lr"), false)
        .run()
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, JobError::Checkpoint { .. }), "{message}");
    assert!(
        message.contains("checkpoint store s3://no-such-bucket/jobs/lr"),
        "{message}"
    );
}

/// Stops (SIGSTOP) or continues (SIGCONT) moto's process: a store that stalls.
fn signal(moto: &Moto, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &moto.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal}");
}

#[test]
fn a_paused_s3_server_stalls_no_iteration_and_its_slow_write_is_said_while_it_lasts() {
    let Some(moto) = Moto::start() else {
        return;
    };
    moto.create_bucket("paused");
    let open =
        || ObjectCheckpointStore::from_url_opts("s3://paused/jobs/lr", moto.options(), 3).unwrap();
    common::logs();
    // The server is paused once iteration 2 completed (its checkpoint being written, or
    // about to be), and continued once iteration 40 did: by the job's own progress, which a
    // master that waited for the store could not make. A watchdog continues it after 60 s
    // whatever happens, so that a job that stalls fails the test instead of hanging it.
    let paused = Arc::new(AtomicBool::new(false));
    let continued_by_job = Arc::new(AtomicBool::new(false));
    let pid = moto.child.id().to_string();
    let watchdog = {
        let pid = pid.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(60));
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
        })
    };
    let (on_pause, on_continue) = (Arc::clone(&paused), Arc::clone(&continued_by_job));
    let moto_pid = pid.clone();
    let outcome = job(open(), false)
        .iterations(60)
        .checkpoint(open(), 1)
        .checkpoint_slow(Duration::from_millis(100))
        .on_event(move |event| {
            if let superstep::JobEvent::IterationCompleted(report) = event {
                let kill = |s: &str| Command::new("kill").args([s, &moto_pid]).status();
                if report.iteration == 2 && !on_pause.swap(true, Ordering::SeqCst) {
                    kill("-STOP").unwrap();
                }
                if report.iteration == 40 {
                    on_continue.store(true, Ordering::SeqCst);
                    // Said once the job went on 38 iterations without its store.
                    std::thread::sleep(Duration::from_millis(300));
                    kill("-CONT").unwrap();
                }
            }
        })
        .run()
        .unwrap();
    drop(watchdog);
    assert!(
        continued_by_job.load(Ordering::SeqCst),
        "the job did not go on while its store was paused"
    );
    signal(&moto, "-CONT");
    assert_eq!(outcome.iterations, 60);
    // The same result as a job whose store never stalled.
    let expected_60 = {
        let store = superstep::checkpoint::MemoryCheckpointStore::new();
        *job(store, false).iterations(60).run().unwrap().result
    };
    assert_eq!(*outcome.result, expected_60);
    // Said while it lasted, naming the store.
    let said = common::lines_with(&[
        "WARN",
        "s3://paused/jobs/lr has been writing the checkpoint of iteration",
        "the job goes on meanwhile",
    ]);
    assert!(!said.is_empty(), "{:?}", common::lines_with(&["WARN"]));
    // Written as the job ended: its last checkpoint is the newest.
    let newest = open().objects().unwrap().last().map(|o| o.0);
    assert_eq!(newest, Some(60));
}
