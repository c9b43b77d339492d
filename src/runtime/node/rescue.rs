//! A round's inline work, where another thread can take it: under `Placement::Auto` the
//! node actor hands a broadcast to every hosted worker first, and the workers whose
//! iteration runs inline leave it here; the node's thread then runs them one after
//! another. If one of them holds the thread past the inline threshold — a compute that was
//! cheap and is not any more — a rescuer thread hands every unit still waiting to the
//! compute pool, so that no worker's compute waits for another's, and what they do
//! (a failure, above all: it ends the job on the thread it failed on) is known while the
//! slow one runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use actix::Addr;

use super::hosting::HostedHome;
use super::NodeActor;
use crate::compute::JobEnd;
use crate::ids::Rank;
use crate::payload::Payload;
use crate::protocol::Work;
use crate::runtime::pool::ComputePool;
use crate::runtime::worker::WorkDone;
use crate::runtime::worker_task::{stop_given_up, WorkerTask};

/// How long the rescuer keeps looking after the last round of inline work before it
/// parks: rounds that follow each other closely never wake it.
const LINGER: Duration = Duration::from_millis(20);

/// One worker's iteration, left to run inline.
pub(crate) struct Deferred<M, W> {
    pub(crate) rank: Rank,
    pub(crate) generation: u64,
    pub(crate) task: Box<WorkerTask<M, W>>,
    pub(crate) work: Work<M>,
}

/// The units of a round waiting to run inline, and what the rescuer needs to run them
/// elsewhere.
pub(crate) struct Rescue<M: Payload, W: Payload> {
    /// The round's units still waiting, the next one last (so that taking it is a
    /// `pop`). How many wait is the round's progress: a count that does not move between
    /// two looks of the rescuer is a unit holding the node's thread.
    waiting: Mutex<Vec<Deferred<M, W>>>,
    /// Whether the node's thread is running a round's units.
    draining: AtomicBool,
    /// Whether the rescuer is parked (the next round wakes it).
    parked: AtomicBool,
    rescuer: std::thread::Thread,
    home: Addr<NodeActor<M, W>>,
    pool: Arc<ComputePool>,
    end: JobEnd,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<M: Payload, W: Payload> Rescue<M, W> {
    /// The queue, with its rescuer thread looking every `threshold` (at least 50 µs)
    /// while a round runs. The thread ends soon after the queue is dropped.
    pub(crate) fn start(
        name: String,
        threshold: Duration,
        home: Addr<NodeActor<M, W>>,
        pool: Arc<ComputePool>,
        end: JobEnd,
    ) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = std::sync::mpsc::channel::<Weak<Self>>();
        let look = threshold.max(Duration::from_micros(50));
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            if let Ok(rescue) = rx.recv() {
                rescuer(rescue, look);
            }
        })?;
        let rescue = Arc::new(Rescue {
            waiting: Mutex::new(Vec::new()),
            draining: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            rescuer: thread.thread().clone(),
            home,
            pool,
            end,
        });
        let _ = tx.send(Arc::downgrade(&rescue));
        Ok(rescue)
    }

    /// A round's units begin to run: `units`, in the order they run. `units` is left
    /// empty (with the capacity of the last round's queue: no allocation per round).
    pub(crate) fn begin(&self, units: &mut Vec<Deferred<M, W>>) {
        units.reverse();
        std::mem::swap(&mut *lock(&self.waiting), units);
        self.draining.store(true, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            self.rescuer.unpark();
        }
    }

    /// The next unit for the node's thread; `None` when none waits (every one ran, or
    /// the rescuer took the rest).
    pub(crate) fn next(&self) -> Option<Deferred<M, W>> {
        lock(&self.waiting).pop()
    }

    /// The round's units are done with.
    pub(crate) fn end(&self) {
        self.draining.store(false, Ordering::Release);
    }

    /// Hands every unit still waiting to the pool: each comes home to the node actor as
    /// pool work does.
    /// Hands every unit still waiting to the pool when `seen` units waited at the last
    /// look and as many wait now (one held the node's thread since); returns how many
    /// wait now, and how many it moved.
    fn rescue(&self, seen: Option<usize>) -> (usize, usize) {
        let units: Vec<_> = {
            let mut waiting = lock(&self.waiting);
            let now = waiting.len();
            if now == 0 || seen != Some(now) {
                return (now, 0);
            }
            // In the order they would have run.
            waiting.drain(..).rev().collect()
        };
        let count = units.len();
        for unit in units {
            let (home, end) = (self.home.clone(), self.end.clone());
            let Deferred {
                rank,
                generation,
                mut task,
                work,
            } = unit;
            self.pool.spawn(move || {
                let worked = task.run(work);
                let done = WorkDone { task, worked };
                if let Err(actix::dev::SendError::Closed(back)) = home.try_send(HostedHome {
                    rank,
                    generation,
                    done,
                }) {
                    let mut task = back.done.task;
                    stop_given_up(&mut task, None, &end);
                }
            });
        }
        (0, count)
    }
}

/// Looks every `look` while a round's units run; takes the units still waiting when as
/// many wait as at the last look (one unit ran at least `look`).
fn rescuer<M: Payload, W: Payload>(rescue: Weak<Rescue<M, W>>, look: Duration) {
    let mut seen = None;
    let mut last_round = Instant::now();
    loop {
        let Some(r) = rescue.upgrade() else {
            return;
        };
        if r.draining.load(Ordering::Acquire) {
            last_round = Instant::now();
            let (waiting, moved) = r.rescue(seen);
            if moved > 0 {
                tracing::debug!(
                    units = moved,
                    "a worker's inline compute held the node's thread past the inline threshold: the rest of the round went to the pool"
                );
            }
            seen = Some(waiting);
            drop(r);
            std::thread::sleep(look);
        } else if last_round.elapsed() < LINGER {
            seen = None;
            drop(r);
            std::thread::sleep(look);
        } else {
            seen = None;
            r.parked.store(true, Ordering::SeqCst);
            // A round that began between the look and the flag is seen at once.
            let draining = r.draining.load(Ordering::SeqCst);
            drop(r);
            if !draining {
                std::thread::park_timeout(LINGER);
            }
            if let Some(r) = rescue.upgrade() {
                r.parked.store(false, Ordering::Release);
            }
        }
    }
}
