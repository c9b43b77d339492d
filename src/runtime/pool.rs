//! Where user code runs: inline on the coordination thread, or on the compute pool.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use crate::error::{BoxError, Cause, JobError};
use crate::protocol::Placement;

/// The compute pool: one thread per core (by default), shared by the master and every
/// worker of one job (in barrier mode workers have threads of their own), dropped with the
/// job. Work is queued first in, first out.
pub(crate) struct ComputePool {
    pool: rayon::ThreadPool,
}

impl ComputePool {
    /// Starts `threads` threads; each counts itself out in `exits` when it ends.
    pub(crate) fn new(threads: usize, job_id: &str, exits: &PoolExits) -> Result<Self, JobError> {
        let name = crate::config::thread_prefix(job_id);
        let counter = exits.clone();
        // Its threads log where the job's thread does.
        let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("{name}-compute-{i}"))
            .start_handler(move |_| crate::log::adopt(&dispatch))
            // User code runs under `catch_unwind`; a panic that still escapes is a bug in
            // the runtime. Rayon's default would abort the whole process.
            .panic_handler(|payload| {
                tracing::error!(cause = %Cause::from_panic(payload), "a compute thread panicked");
            })
            .exit_handler(move |_| counter.exited())
            .build()
            .map_err(|e| JobError::Runtime {
                message: format!("could not start {threads} compute threads: {e}"),
            })?;
        exits.expect(threads);
        Ok(ComputePool { pool })
    }

    /// Runs `work` on a pool thread. It must report back by itself (a message to its actor).
    pub(crate) fn spawn(&self, work: impl FnOnce() + Send + 'static) {
        self.pool.spawn(work);
    }
}

/// Counts the compute threads of a job (the pool's and the gang's) that have ended, so
/// that the job can wait for them: dropping a rayon pool only asks its threads to end.
#[derive(Clone, Default)]
pub(crate) struct PoolExits(Arc<(Mutex<usize>, Condvar)>, Arc<AtomicUsize>);

impl PoolExits {
    fn expect(&self, threads: usize) {
        self.1.fetch_add(threads, Ordering::AcqRel);
    }

    fn exited(&self) {
        let (exited, ended) = &*self.0;
        *exited.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        ended.notify_all();
    }

    /// Waits until every compute thread ended, or `bound` passed; returns how many are
    /// still running.
    pub(crate) fn wait(&self, bound: Duration) -> usize {
        let expected = self.1.load(Ordering::Acquire);
        let (exited, ended) = &*self.0;
        let guard = exited.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = ended
            .wait_timeout_while(guard, bound, |n| *n < expected)
            .unwrap_or_else(|e| e.into_inner());
        expected.saturating_sub(*guard)
    }
}

type Work = Box<dyn FnOnce() + Send + 'static>;

/// Where a worker's units of work run off the coordination thread.
pub(crate) enum Executor {
    /// The job's shared pool.
    Pool(Arc<ComputePool>),
    /// A thread of the worker's own, on which nothing else ever runs (barrier mode): a rank
    /// waiting in a sync call can never hold up another rank's work, as it could on a pool
    /// whose waiting threads pick up queued work.
    Own(mpsc::Sender<Work>),
}

impl Executor {
    /// Starts a thread of its own for one worker; it ends when the executor is dropped.
    pub(crate) fn own(name: String, exits: &PoolExits) -> Result<Self, JobError> {
        let (tx, rx) = mpsc::channel::<Work>();
        let exits = exits.clone();
        exits.expect(1);
        let counted = exits.clone();
        crate::log::spawn(name, move || {
                for work in rx {
                    // Units run under their own guards; this one keeps the thread alive.
                    if let Err(payload) = catch_unwind(AssertUnwindSafe(work)) {
                        tracing::error!(cause = %Cause::from_panic(payload), "a gang thread's work panicked");
                    }
                }
                counted.exited();
            })
            .map_err(|e| {
                exits.exited();
                JobError::Runtime {
                    message: format!("could not start a worker's thread: {e}"),
                }
            })?;
        Ok(Executor::Own(tx))
    }

    pub(crate) fn spawn(&self, work: impl FnOnce() + Send + 'static) {
        match self {
            Executor::Pool(pool) => pool.spawn(work),
            Executor::Own(thread) => {
                // The thread ends only when this sender is dropped, so it is there.
                let _ = thread.send(Box::new(work));
            }
        }
    }
}

/// Decides, per unit of user work, whether it runs inline or on the pool.
#[derive(Debug)]
pub(crate) struct Placer {
    placement: Placement,
    threshold: Duration,
    last: Option<Duration>,
}

impl Placer {
    pub(crate) fn new(placement: Placement, threshold: Duration) -> Self {
        Placer {
            placement,
            threshold,
            last: None,
        }
    }

    /// Whether the next iteration runs inline.
    pub(crate) fn inline_iteration(&self) -> bool {
        match self.placement {
            Placement::Inline => true,
            Placement::Pool => false,
            Placement::Auto => self.last.is_some_and(|d| d < self.threshold),
        }
    }

    /// Whether start-up and shutdown run inline (they are one-off and often slow: loading a
    /// shard, writing output).
    pub(crate) fn inline_lifecycle(&self) -> bool {
        self.placement == Placement::Inline
    }

    /// Whether a round's ranks not reached yet may be taken to the pool when an inline
    /// iteration holds the coordination thread (`Placement::Auto`: see
    /// `runtime/node/rescue.rs`); `Inline` keeps them on that thread whatever it costs.
    pub(crate) fn defers(&self) -> bool {
        self.placement == Placement::Auto
    }

    /// The inline threshold.
    pub(crate) fn threshold(&self) -> Duration {
        self.threshold
    }

    /// Records how long the last iteration took.
    pub(crate) fn observe(&mut self, elapsed: Duration) {
        self.last = Some(elapsed);
    }
}

/// Runs user code, turning an `Err` or a panic into a [`Cause`]. The panic does not unwind
/// into the runtime: the actor that called it carries on and fails the job cleanly. The
/// error's message is taken inside the guard too, since its `Display` is user code.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, BoxError>) -> Result<T, Cause> {
    match catch_unwind(AssertUnwindSafe(|| f().map_err(Cause::from_error))) {
        Ok(result) => result,
        Err(payload) => Err(Cause::from_panic(payload)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_placement_moves_short_iterations_inline_and_long_ones_to_the_pool() {
        let mut p = Placer::new(Placement::Auto, Duration::from_micros(50));
        assert!(!p.inline_iteration(), "unmeasured work goes to the pool");
        p.observe(Duration::from_micros(3));
        assert!(p.inline_iteration());
        p.observe(Duration::from_millis(3));
        assert!(!p.inline_iteration());
        assert!(!p.inline_lifecycle());
        assert!(Placer::new(Placement::Inline, Duration::ZERO).inline_lifecycle());
    }

    #[test]
    fn the_job_can_wait_for_its_compute_threads_to_end() {
        let exits = PoolExits::default();
        let pool = ComputePool::new(3, "t", &exits).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        pool.spawn(move || tx.send(()).unwrap());
        rx.recv().unwrap();
        assert_eq!(exits.wait(Duration::from_millis(10)), 3, "still running");
        drop(pool);
        assert_eq!(exits.wait(Duration::from_secs(10)), 0);
    }

    #[test]
    fn a_worker_thread_of_its_own_runs_its_work_and_ends_when_dropped() {
        let exits = PoolExits::default();
        let own = Executor::own("t-own".into(), &exits).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        own.spawn(move || panic!("caught, the thread lives on"));
        own.spawn(move || {
            tx.send(std::thread::current().name().map(String::from))
                .unwrap()
        });
        assert_eq!(rx.recv().unwrap().as_deref(), Some("t-own"));
        drop(own);
        assert_eq!(exits.wait(Duration::from_secs(10)), 0);
    }

    #[test]
    fn errors_and_panics_become_causes() {
        let err = guarded::<()>(|| Err("bad shard".into())).unwrap_err();
        assert_eq!(err.to_string(), "bad shard");
        assert!(err.source_error().is_some());
        let panic = guarded::<()>(|| panic!("index {} out of range", 9)).unwrap_err();
        assert!(panic.is_panic());
        assert_eq!(panic.to_string(), "panicked: index 9 out of range");
    }

    trait SourceError {
        fn source_error(&self) -> Option<&(dyn std::error::Error + 'static)>;
    }
    impl SourceError for Cause {
        fn source_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
            std::error::Error::source(self)
        }
    }
}
