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
