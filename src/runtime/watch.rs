//! The watchdog's view of inline user code.
//!
//! User code that runs inline holds the coordination thread, so no timer of the job can
//! fire until it returns. The actors publish here what runs inline and since when (a few
//! relaxed atomic stores per run); the thread that called `run` reads it while it waits,
//! and gives up on the job when inline code outlives its deadline.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::error::{JobError, Waiting};
use crate::ids::{Iteration, Rank};
use crate::protocol::NodeConfig;

const MASTER: u64 = u64::MAX;

#[derive(Debug)]
pub(crate) struct Watch {
    origin: Instant,
    /// Nanoseconds since `origin`, plus one, at which inline code started; 0 when none runs.
    since: AtomicU64,
    who: AtomicU64,
    during: AtomicU8,
    iteration: AtomicU64,
}

/// Who runs inline.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Who {
    Master,
    Worker(Rank),
}

impl Watch {
    pub(crate) fn new() -> Self {
        Watch {
            origin: Instant::now(),
            since: AtomicU64::new(0),
            who: AtomicU64::new(0),
            during: AtomicU8::new(0),
            iteration: AtomicU64::new(0),
        }
    }

    fn nanos(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// Inline code of `who` starts, during `during`.
    pub(crate) fn enter(&self, who: Who, during: Waiting) {
        self.enter_at(who, during, Instant::now());
    }

    /// Inline code of `who` starts at `at` (a clock read of the caller's), during `during`.
    pub(crate) fn enter_at(&self, who: Who, during: Waiting, at: Instant) {
        let (who, kind, iteration) = Self::code(who, during);
        self.who.store(who, Ordering::Relaxed);
        self.during.store(kind, Ordering::Relaxed);
        self.iteration.store(iteration, Ordering::Relaxed);
        let since = at.saturating_duration_since(self.origin).as_nanos();
        let since = u64::try_from(since).unwrap_or(u64::MAX - 1);
        self.since.store(since + 1, Ordering::Release);
    }

    /// Inline code of `who` goes on from where the code before it left off, during
    /// `during`: units run back to back, the watch entered once for them all at the first
    /// one's start ([`enter_at`](Self::enter_at)), so that their deadline is the run's.
    pub(crate) fn rename(&self, who: Who, during: Waiting) {
        let (who, kind, iteration) = Self::code(who, during);
        self.who.store(who, Ordering::Relaxed);
        self.during.store(kind, Ordering::Relaxed);
        self.iteration.store(iteration, Ordering::Relaxed);
    }

    fn code(who: Who, during: Waiting) -> (u64, u8, u64) {
        let who = match who {
            Who::Master => MASTER,
            Who::Worker(rank) => rank as u64,
        };
        let (kind, iteration) = match during {
            Waiting::Registration | Waiting::Connection => (0, 0),
            Waiting::Iteration(i) => (1, i),
            Waiting::Shutdown => (2, 0),
        };
        (who, kind, iteration)
    }

    /// The inline code returned.
    pub(crate) fn exit(&self) {
        self.since.store(0, Ordering::Release);
    }

    /// Who runs inline now, if anyone ("worker 3's code", "the master's code"), when it
    /// started, and whether it is the end of the job's work (a `post_application`).
    pub(crate) fn running(&self) -> Option<(String, Instant, bool)> {
        let since = self.since.load(Ordering::Acquire);
        if since == 0 {
            return None;
        }
        let who = match self.who.load(Ordering::Relaxed) {
            MASTER => "the master's code".to_string(),
            rank => format!("worker {rank}'s code"),
        };
        let stopping = self.during.load(Ordering::Relaxed) == 2;
        Some((who, self.origin + Duration::from_nanos(since - 1), stopping))
    }

    /// The timeout error for inline code that has run past its deadline, if any.
    pub(crate) fn overdue(&self, config: &NodeConfig) -> Option<JobError> {
        let since = self.since.load(Ordering::Acquire);
        if since == 0 {
            return None;
        }
        let who = self.who.load(Ordering::Relaxed);
        let iteration: Iteration = self.iteration.load(Ordering::Relaxed);
        let during = match self.during.load(Ordering::Relaxed) {
            0 => Waiting::Registration,
            1 => Waiting::Iteration(iteration),
            _ => Waiting::Shutdown,
        };
        let timeout = config.timeout(during);
        if self.since.load(Ordering::Acquire) != since {
            return None; // it returned, or another run started, while we read
        }
        let waited = Duration::from_nanos(self.nanos().saturating_sub(since - 1));
        if waited <= timeout {
            return None;
        }
        Some(if who == MASTER {
            JobError::MasterTimedOut { during, waited }
        } else {
            JobError::WorkersTimedOut {
                during,
                missing: vec![who as Rank],
                waited,
                refused: Vec::new(),
                heard: Vec::new(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_code_past_its_deadline_is_named() {
        let config = crate::protocol::NodeConfig::of(crate::protocol::JobConfig {
            iteration_timeout: Duration::from_millis(1),
            ..crate::protocol::JobConfig::default()
        });
        let watch = Watch::new();
        assert_eq!(watch.overdue(&config), None);
        watch.enter(Who::Worker(4), Waiting::Iteration(9));
        std::thread::sleep(Duration::from_millis(5));
        match watch.overdue(&config) {
            Some(JobError::WorkersTimedOut {
                during, missing, ..
            }) => {
                assert_eq!(during, Waiting::Iteration(9));
                assert_eq!(missing, vec![4]);
            }
            other => panic!("unexpected {other:?}"),
        }
        watch.exit();
        assert_eq!(watch.overdue(&config), None);
        watch.enter(Who::Master, Waiting::Registration);
        assert_eq!(watch.overdue(&config), None, "within the startup timeout");
    }
}
