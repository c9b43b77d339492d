//! An error that wraps another keeps it as its `source()`: a caller can walk the chain, or
//! downcast to the operating system's error, as with any `std::error::Error`.

use std::error::Error as _;
use std::io;
use std::sync::Arc;

mod common;

use common::{summing_master, FnWorker};
use superstep::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, Loaded};
use superstep::prelude::*;
use superstep::transport::{TcpSettings, TcpTransport, TransportError};

#[test]
fn a_transport_failure_keeps_the_operating_systems_error_as_its_source() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut settings = TcpSettings::new(0, 2, addr.to_string());
    settings.bind = Some(addr);
    let err = TcpTransport::<u64, u64>::new(settings).unwrap_err();
    let os = err
        .source()
        .and_then(|e| e.downcast_ref::<io::Error>())
        .unwrap_or_else(|| panic!("no io::Error under {err:?}"));
    assert_eq!(os.kind(), io::ErrorKind::AddrInUse);
    // As the job's error: the transport's error, and the operating system's under it.
    let job = JobError::from(err);
    assert!(matches!(job, JobError::Transport { .. }), "{job}");
    let transport = job.source().expect("the transport's error");
    assert!(transport.downcast_ref::<TransportError>().is_some());
    let os = transport.source().expect("the operating system's");
    assert_eq!(
        os.downcast_ref::<io::Error>().map(io::Error::kind),
        Some(io::ErrorKind::AddrInUse)
    );
}

/// A store whose disk is gone.
struct Unreadable;

impl CheckpointStore for Unreadable {
    fn save(&mut self, _: &Checkpoint) -> Result<(), CheckpointError> {
        Ok(())
    }

    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
        Err(CheckpointError::Io {
            path: "/ckpt".into(),
            source: Arc::new(io::Error::other("the disk is gone")),
        })
    }
}

#[test]
fn a_checkpoint_failure_keeps_the_stores_error_as_its_source() {
    let err = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .checkpoint(Unreadable, 2)
    .run()
    .unwrap_err();
    assert!(matches!(err, JobError::Checkpoint { .. }), "{err}");
    let store = err
        .source()
        .and_then(|e| e.downcast_ref::<CheckpointError>())
        .unwrap_or_else(|| panic!("no CheckpointError under {err:?}"));
    assert!(matches!(store, CheckpointError::Io { .. }), "{store}");
    assert_eq!(
        store.source().map(ToString::to_string).as_deref(),
        Some("the disk is gone")
    );
}

#[test]
fn a_sync_failure_keeps_the_epochs_error_and_the_jobs_first_failure() {
    let failed = SyncError::JobFailed(Box::new(JobError::Cancelled));
    let first = failed.source().expect("the job's first failure");
    assert_eq!(first.to_string(), JobError::Cancelled.to_string());
    let job = JobError::Sync(failed.clone());
    let sync = job.source().expect("the epoch's error");
    assert_eq!(sync.downcast_ref::<SyncError>(), Some(&failed));
}
