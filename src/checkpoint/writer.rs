//! Checkpoint writes off the iteration's path: [`Writer`] writes a job's checkpoints to its
//! store on a thread of its own, one at a time, and says so while a write is slow.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Checkpoint, CheckpointStore};
use crate::ids::Iteration;

/// A store shared by the job's master and its coordinator, and the thread that writes to
/// it.
type Store = Arc<Mutex<Box<dyn CheckpointStore>>>;

/// Writes checkpoints handed to it to a store, on a thread of its own, so that the master
/// hands a made checkpoint over and goes on with the next iteration.
///
/// At most one write is in flight, and one checkpoint waits for it. One handed over while
/// another already waits waits too — the master holds on — until the waiting one's write
/// starts; but once the write in flight has lasted `slow`, the store is stalled: the
/// newer checkpoint takes the waiting one's place (which is skipped, said at WARN) and the
/// master goes on. So a store that keeps up gets every checkpoint, and one that stalls
/// holds the master at most `slow` per write it stalls on. A write that lasts longer than
/// `slow` is said at WARN, naming the store, and again each `slow` while it lasts. A write
/// that fails is said at WARN; the store keeps the one before. Dropped, the writer writes
/// what was handed over within `bound`, and leaves a store that does not answer to its
/// thread. [`flush`](Self::flush)
/// waits until everything handed over is written: before the store is read again (a
/// restart), before the job's commit is recorded, and as the job ends.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// How long a flush, and the writer's end, wait for the store.
    bound: Duration,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Where the store keeps them (`CheckpointStore::location`), for what is said.
    location: String,
    slow: Duration,
}

#[derive(Default)]
struct State {
    /// The checkpoint that waits for the write in flight.
    waiting: Option<Checkpoint>,
    /// The iteration being written, and since when.
    writing: Option<(Iteration, Instant)>,
    /// No more checkpoints come: the thread ends once the waiting one is written.
    closed: bool,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Writer {
    /// Starts the writing thread (named `name`) for `store`, which keeps its checkpoints
    /// at `location`; a flush waits at most `bound`.
    pub(crate) fn start(
        name: String,
        store: Store,
        location: String,
        slow: Duration,
        bound: Duration,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            location,
            slow: slow.max(Duration::from_millis(1)),
        });
        let writes = Arc::clone(&shared);
        let thread = crate::log::spawn(name, move || write_all(&writes, &store))?;
        Ok(Writer {
            shared,
            thread: Mutex::new(Some(thread)),
            bound,
        })
    }

    /// Hands `checkpoint` over to be written. Returns at once, unless a checkpoint waits
    /// already: then once that one's write started, or the write in flight has lasted
    /// `slow` (the store stalls: the waiting one is skipped).
    pub(crate) fn write(&self, checkpoint: Checkpoint) {
        let shared = &*self.shared;
        let iteration = checkpoint.iteration;
        let mut state = lock(shared);
        loop {
            let writing = state.writing.map(|(i, since)| (i, since.elapsed()));
            if state.waiting.is_none() {
                if let Some((writing, lasted)) = writing.filter(|(_, l)| *l >= shared.slow) {
                    tracing::warn!(
                        iteration,
                        store = %shared.location,
                        "the checkpoint of iteration {iteration} waits: {} has been writing the one of iteration {writing} for {lasted:.1?}",
                        shared.location,
                    );
                }
                state.waiting = Some(checkpoint);
                break;
            }
            match writing {
                Some((writing, lasted)) if lasted >= shared.slow => {
                    let skipped = state.waiting.replace(checkpoint).map(|c| c.iteration);
                    tracing::warn!(
                        iteration,
                        ?skipped,
                        store = %shared.location,
                        "the checkpoint of iteration {} is skipped for the one of iteration {iteration}: {} has been writing the one of iteration {writing} for {lasted:.1?}",
                        skipped.unwrap_or(iteration),
                        shared.location,
                    );
                    break;
                }
                // Until the waiting one's write starts, or the one in flight is slow.
                Some((_, lasted)) => {
                    state = shared
                        .changed
                        .wait_timeout(state, shared.slow - lasted)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                // Taken, but not yet marked as written: a moment.
                None => {
                    state = shared
                        .changed
                        .wait_timeout(state, shared.slow)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        shared.changed.notify_all();
    }

    /// Waits until every checkpoint handed over is written (or failed), at most the
    /// writer's bound; whether it was.
    pub(crate) fn flush(&self) -> bool {
        self.flush_within(self.bound)
    }

    /// [`flush`](Self::flush), waiting at most `bound` (and never past the writer's own).
    pub(crate) fn flush_within(&self, bound: Duration) -> bool {
        let bound = bound.min(self.bound);
        let shared = &*self.shared;
        let state = lock(shared);
        let (state, waited) = shared
            .changed
            .wait_timeout_while(state, bound, |s| s.waiting.is_some() || s.writing.is_some())
            .unwrap_or_else(|e| e.into_inner());
        if waited.timed_out() {
            let writing = state.writing.map(|(i, since)| (i, since.elapsed()));
            tracing::warn!(
                store = %shared.location,
                ?writing,
                "{} did not finish writing the job's checkpoints within {bound:?}",
                shared.location
            );
            return false;
        }
        true
    }
}

impl Drop for Writer {
    /// Writes what was handed over, then ends the thread — within the writer's bound: a
    /// store that does not answer by then is left to its thread (said by the flush).
    fn drop(&mut self) {
        lock(&self.shared).closed = true;
        self.shared.changed.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (true, Some(thread)) = (self.flush(), thread) {
            let _ = thread.join();
        }
    }
}

/// The writing thread: each checkpoint handed over, in turn, until closed.
fn write_all(shared: &Shared, store: &Store) {
    loop {
        let checkpoint = {
            let mut state = lock(shared);
            loop {
                if let Some(next) = state.waiting.take() {
                    state.writing = Some((next.iteration, Instant::now()));
                    // A master waiting to hand over the next one may now.
                    shared.changed.notify_all();
                    break next;
                }
                if state.closed {
                    return;
                }
                state = shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
        };
        let iteration = checkpoint.iteration;
        // A store that panics fails this write, not the thread: later ones are written.
        let written = watched(shared, iteration, || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                store
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .save(&checkpoint)
            }))
            .unwrap_or_else(|panic| {
                Err(super::CheckpointError::Store {
                    location: shared.location.clone(),
                    reason: format!("it panicked: {}", crate::error::Cause::from_panic(panic)),
                })
            })
        });
        match written {
            Ok(()) => tracing::debug!(iteration, "checkpoint saved"),
            Err(error) => tracing::warn!(
                iteration,
                %error,
                store = %shared.location,
                "the checkpoint of iteration {iteration} could not be written; the one before stays"
            ),
        }
        lock(shared).writing = None;
        shared.changed.notify_all();
    }
}

/// Runs `write`, saying at WARN each `slow` while it lasts that it does (from a thread
/// that logs where this one does; without one, unsaid).
fn watched<T: Send>(shared: &Shared, iteration: Iteration, write: impl FnOnce() -> T + Send) -> T {
    let (done, ended) = std::sync::mpsc::channel::<()>();
    let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
    std::thread::scope(|scope| {
        let watch = move || {
            let started = Instant::now();
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                ended.recv_timeout(shared.slow)
            {
                tracing::warn!(
                    iteration,
                    store = %shared.location,
                    "{} has been writing the checkpoint of iteration {iteration} for {:.1?}; the job goes on meanwhile",
                    shared.location,
                    started.elapsed()
                );
            }
        };
        let _ = std::thread::Builder::new()
            .name("checkpoint-watch".into())
            .spawn_scoped(scope, move || {
                tracing::dispatcher::with_default(&dispatch, watch)
            });
        let written = write();
        drop(done);
        written
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{CheckpointError, Loaded, MemoryCheckpointStore};

    /// A store whose saves wait until `gate` opens.
    struct Gated {
        inner: MemoryCheckpointStore,
        gate: Arc<(Mutex<bool>, Condvar)>,
    }

    impl CheckpointStore for Gated {
        fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
            let (open, opened) = &*self.gate;
            let guard = open.lock().unwrap();
            drop(opened.wait_while(guard, |open| !*open).unwrap());
            self.inner.save(checkpoint)
        }
        fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
            self.inner.latest()
        }
    }

    fn checkpoint(iteration: Iteration) -> Checkpoint {
        crate::checkpoint::tests::checkpoint(iteration)
    }

    #[test]
    fn a_write_waits_for_a_store_that_keeps_up_and_gives_way_on_one_that_stalls() {
        let memory = MemoryCheckpointStore::new();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let store: Store = Arc::new(Mutex::new(Box::new(Gated {
            inner: memory.clone(),
            gate: Arc::clone(&gate),
        })));
        let slow = Duration::from_millis(200);
        let writer = Writer::start(
            "w".into(),
            store,
            "gated".into(),
            slow,
            Duration::from_secs(10),
        )
        .unwrap();
        // The store holds every write; handing over 1, then 2 (which waits for 1's write),
        // returns at once.
        writer.write(checkpoint(1));
        while lock(&writer.shared).writing.is_none() {
            std::thread::yield_now();
        }
        writer.write(checkpoint(2));
        // 3 finds 2 waiting: it waits until 1's write has lasted `slow`, then 2 gives way.
        let handed = Instant::now();
        writer.write(checkpoint(3));
        assert!(handed.elapsed() < Duration::from_secs(30));
        let state = lock(&writer.shared);
        assert!(state.writing.unwrap().1.elapsed() >= slow);
        assert_eq!(state.waiting.as_ref().map(|c| c.iteration), Some(3));
        drop(state);
        assert!(
            !writer.flush_within(Duration::from_millis(50)),
            "still writing"
        );
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        assert!(writer.flush());
        let written: Vec<_> = memory.checkpoints().iter().map(|c| c.iteration).collect();
        assert_eq!(written, [1, 3], "2 gave way to 3");
    }

    #[test]
    fn a_store_that_keeps_up_gets_every_checkpoint() {
        let memory = MemoryCheckpointStore::new();
        let store: Store = Arc::new(Mutex::new(Box::new(memory.clone())));
        let long = Duration::from_secs(60);
        let writer = Writer::start("w".into(), store, "memory".into(), long, long).unwrap();
        for i in 1..=50 {
            writer.write(checkpoint(i));
        }
        assert!(writer.flush());
        let written: Vec<_> = memory.checkpoints().iter().map(|c| c.iteration).collect();
        assert_eq!(written, (1..=50).collect::<Vec<_>>());
    }

    #[test]
    fn dropping_the_writer_writes_what_was_handed_over() {
        let second = Duration::from_secs(1);
        let memory = MemoryCheckpointStore::new();
        let store: Store = Arc::new(Mutex::new(Box::new(memory.clone())));
        let writer = Writer::start("w".into(), store, "memory".into(), second, second).unwrap();
        writer.write(checkpoint(4));
        drop(writer);
        assert_eq!(memory.checkpoints().last().map(|c| c.iteration), Some(4));
    }

    #[test]
    fn a_writer_whose_store_never_answers_ends_within_its_bound() {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let store: Store = Arc::new(Mutex::new(Box::new(Gated {
            inner: MemoryCheckpointStore::new(),
            gate: Arc::clone(&gate),
        })));
        let bound = Duration::from_millis(100);
        let writer = Writer::start("w".into(), store, "gated".into(), bound, bound).unwrap();
        writer.write(checkpoint(1));
        let dropped = Instant::now();
        drop(writer);
        assert!(
            dropped.elapsed() < Duration::from_secs(20),
            "the drop waited for the store"
        );
        // Let the thread left to it end.
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
    }
}
