//! The handle that cancels a running job.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Cancels a running job ([`JobBuilder::cancel`](crate::JobBuilder::cancel)); clones share the same job. Cancelling
/// before the job starts cancels it as soon as it starts.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
}

impl Cancel {
    /// A handle not cancelled yet.
    pub fn new() -> Self {
        Cancel::default()
    }

    /// Cancels the job: noticed within the job's timeout tick (at most 100 ms).
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

/// Asks a running job to stop for a preemption ([`JobBuilder::preempt`](crate::JobBuilder::preempt)),
/// as its preempt signal does ([`JobConfig::preempt_signal`](crate::JobConfig::preempt_signal)):
/// the master checkpoints at the next iteration boundary and the job ends with
/// [`JobError::Preempted`](crate::JobError::Preempted), from which a run again resumes.
/// Clones share the same job; a request before the job starts stops it as soon as it
/// starts, so a run after a preemption takes a new handle. In a process without the
/// master, the request is sent to the master's.
#[derive(Debug, Clone, Default)]
pub struct Preempt {
    flag: Arc<AtomicBool>,
}

impl Preempt {
    /// A handle not requested yet.
    pub fn new() -> Self {
        Preempt::default()
    }

    /// Asks the job to stop: noticed within the job's timeout tick (at most 100 ms).
    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Whether [`request`](Self::request) was called.
    pub fn is_requested(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}
