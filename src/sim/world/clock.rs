//! Virtual time: the queue of what happens next, each event at its instant, in the order
//! it was queued among those of one instant — so that a seed replays one run.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The simulated clock and its queue of events.
pub(super) struct Clock<E> {
    /// The instant virtual time 0 stands for (nodes take `Instant`s).
    base: Instant,
    /// Virtual time now.
    pub(super) now: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    events: HashMap<u64, E>,
    /// Virtual time now, for the computes on their own threads.
    shared: VirtualNow,
}

/// Virtual time now, as a compute's sync calls read it on its own thread (while the
/// simulator waits for it, so it reads what the simulator last set).
#[derive(Debug, Clone)]
pub(super) struct VirtualNow {
    base: Instant,
    nanos: Arc<AtomicU64>,
}

impl VirtualNow {
    pub(super) fn instant(&self) -> Instant {
        self.base + Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }
}

impl<E> Clock<E> {
    pub(super) fn new() -> Self {
        let base = Instant::now();
        Clock {
            shared: VirtualNow {
                base,
                nanos: Arc::default(),
            },
            base,
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
        }
    }

    /// `event` happens `after` from now.
    pub(super) fn at(&mut self, after: Duration, event: E) {
        self.seq += 1;
        self.queue.push(Reverse((self.now + after, self.seq)));
        self.events.insert(self.seq, event);
    }

    /// Virtual time now, for a compute's thread.
    pub(super) fn shared(&self) -> VirtualNow {
        self.shared.clone()
    }

    /// Now, as the nodes read it.
    pub(super) fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// `at` in virtual time.
    pub(super) fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.base)
    }

    /// Advances to the next event and takes it; `None` when nothing is left to happen.
    pub(super) fn next(&mut self) -> Option<E> {
        let Reverse((at, seq)) = self.queue.pop()?;
        self.now = at;
        let nanos = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
        self.shared.nanos.store(nanos, Ordering::Release);
        Some(
            self.events
                .remove(&seq)
                .expect("every queued event is stored"),
        )
    }
}
