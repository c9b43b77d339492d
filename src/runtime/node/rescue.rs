//! A round's ranks, where another thread can take them: under `Placement::Auto` the node
//! actor claims each rank from the round's cursor before it hands it the broadcast (and
//! its iteration runs inline, if it is cheap). If an inline compute holds the node's thread
//! past the inline threshold — a compute that was cheap and is not any more — a rescuer
//! thread claims every rank not reached yet and hands each to the compute pool, where a
//! pool thread steps that worker's driver under the lock of its cell ([`PoolHost`]), and
//! its iteration runs on the pool as pool work does. So no
//! worker's compute waits for another's, and what they do (a failure, above all: it ends
//! the job on the thread it failed on) is known while the slow one runs.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::runtime::lock;
use std::time::{Duration, Instant};

use actix::{Addr, Message};

use super::NodeActor;
use crate::ids::Rank;
use crate::payload::Payload;
use crate::protocol::{Envelope, ToMaster, ToWorker};
use crate::runtime::arrivals::Arrivals;
use crate::runtime::local::{lock_cell, HostedCell};
use crate::runtime::pool::ComputePool;
use crate::runtime::worker::{guarded_send, Homeward, Host, WorkerHome};
use crate::transport::{TransportError, WireCheck};

/// A hosted worker's unit of work came back from the pool.
pub(super) struct HostedHome<M, W> {
    pub(super) rank: Rank,
    pub(super) generation: u64,
    pub(super) done: WorkerHome<M, W>,
}

impl<M: 'static, W: 'static> Message for HostedHome<M, W> {
    type Result = ();
}

/// Where a hosted worker's unit of work done on the pool comes home: the node actor's
/// mailbox, or back to the caller when the actor is gone.
// The unit given back is the one handed in, moved, only when the actor is gone: boxing it
// would cost every round an allocation.
#[allow(clippy::result_large_err)]
pub(super) fn homeward<M: Payload, W: Payload>(
    addr: actix::Addr<NodeActor<M, W>>,
    rank: Rank,
    generation: u64,
) -> Homeward<M, W> {
    Box::new(move |done| {
        match addr.try_send(HostedHome {
            rank,
            generation,
            done,
        }) {
            Err(actix::dev::SendError::Closed(HostedHome { done, .. })) => Err(done),
            // An unbounded mailbox is never full.
            _ => Ok(()),
        }
    })
}

/// A hosted worker's driver asks for its timer, from a thread other than the node
/// actor's (a rank rescued to the pool).
pub(super) struct HostedArm {
    pub(super) rank: Rank,
    pub(super) generation: u64,
    pub(super) after: Duration,
}

impl Message for HostedArm {
    type Result = ();
}

/// A hosted worker stopped on a thread other than the node actor's.
pub(super) struct HostedStopped {
    pub(super) rank: Rank,
    pub(super) generation: u64,
}

impl Message for HostedStopped {
    type Result = ();
}

/// How long the rescuer keeps looking after the last round before it parks: rounds that
/// follow each other closely never wake it.
const LINGER: Duration = Duration::from_millis(20);

/// The cursor's value once the rescuer took the rest of the round.
const TAKEN: usize = usize::MAX / 2;

/// What a rescued rank needs to be stepped away from the node actor.
pub(crate) struct Parts<M: Payload, W: Payload> {
    pub(crate) cells: Arc<[HostedCell<M, W>]>,
    pub(crate) generations: Arc<[AtomicU64]>,
    pub(crate) arrivals: Arc<Arrivals<W>>,
    pub(crate) wire_check: WireCheck,
    pub(crate) home: Addr<NodeActor<M, W>>,
    pub(crate) pool: Arc<ComputePool>,
}

/// The round under way: its broadcast, its cursor, and the rescuer that watches it.
pub(crate) struct Rescue<M: Payload, W: Payload> {
    /// The next rank to claim. It is also the round's progress: a value that does not
    /// move between two looks of the rescuer, below the round's ranks, is an inline
    /// compute holding the node's thread.
    cursor: AtomicUsize,
    ranks: AtomicUsize,
    /// The rounds begun, counted: a look compares the cursor within one round only.
    rounds: AtomicU64,
    /// The round's broadcast and the iteration's span, for the ranks the rescuer takes.
    round: Mutex<Option<(ToWorker<M>, tracing::Span)>>,
    /// Whether a round is being handed out.
    draining: AtomicBool,
    /// Whether the rescuer is parked (the next round wakes it).
    parked: AtomicBool,
    rescuer: std::thread::Thread,
    parts: Parts<M, W>,
}

impl<M: Payload, W: Payload> Rescue<M, W> {
    /// The round's cursor, with its rescuer thread looking every `threshold` (at least
    /// 50 µs) while a round is handed out. The thread ends soon after this is dropped.
    pub(crate) fn start(
        name: String,
        threshold: Duration,
        parts: Parts<M, W>,
    ) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = std::sync::mpsc::channel::<Weak<Self>>();
        let look = threshold.max(Duration::from_micros(50));
        let thread = crate::log::spawn(name, move || {
            if let Ok(rescue) = rx.recv() {
                rescuer(rescue, look);
            }
        })?;
        let rescue = Arc::new(Rescue {
            cursor: AtomicUsize::new(TAKEN),
            ranks: AtomicUsize::new(0),
            rounds: AtomicU64::new(0),
            round: Mutex::new(None),
            draining: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            rescuer: thread.thread().clone(),
            parts,
        });
        let _ = tx.send(Arc::downgrade(&rescue));
        Ok(rescue)
    }

    /// A round of `ranks` ranks begins: `msg` is handed to each, under `span`.
    pub(crate) fn begin(&self, msg: &ToWorker<M>, span: Option<&tracing::Span>, ranks: usize) {
        let span = span.cloned().unwrap_or_else(tracing::Span::none);
        let mut round = lock(&self.round);
        *round = Some((msg.clone(), span));
        self.ranks.store(ranks, Ordering::Relaxed);
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.cursor.store(0, Ordering::Release);
        drop(round);
        self.draining.store(true, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            self.rescuer.unpark();
        }
    }

    /// The next rank for the node's thread; `None` once every rank was claimed (by it,
    /// or by the rescuer).
    pub(crate) fn claim(&self) -> Option<Rank> {
        let rank = self.cursor.fetch_add(1, Ordering::AcqRel);
        (rank < self.ranks.load(Ordering::Relaxed)).then_some(rank)
    }

    /// The round was handed out.
    pub(crate) fn end(&self) {
        self.draining.store(false, Ordering::Release);
        // Under the round's lock: a rescue under way has taken its ranks and their
        // message before the round is let go.
        let mut round = lock(&self.round);
        self.cursor.store(TAKEN, Ordering::Release);
        // The master result is not kept past its round.
        *round = None;
    }

    /// Takes the ranks not reached yet when the round and its cursor stood at `seen` at
    /// the last look and still do (a compute held the node's thread since), and hands
    /// each to the pool. Returns where the round and cursor stand, and how many ranks it
    /// took.
    fn rescue(&self, seen: Option<(u64, usize)>) -> ((u64, usize), usize) {
        // Held while the rest is taken: the round cannot end (nor the next begin)
        // between taking its ranks and reading what to hand them.
        let round = lock(&self.round);
        let which = self.rounds.load(Ordering::Relaxed);
        let Some((msg, span)) = round.as_ref() else {
            return ((which, TAKEN), 0);
        };
        let ranks = self.ranks.load(Ordering::Relaxed);
        let at = self.cursor.load(Ordering::Acquire);
        if at >= ranks || seen != Some((which, at)) {
            return ((which, at), 0);
        }
        let from = self.cursor.swap(TAKEN, Ordering::AcqRel);
        if from >= ranks {
            return ((which, from), 0);
        }
        let (msg, span) = (msg.clone(), span.clone());
        drop(round);
        for rank in from..ranks {
            let (msg, span) = (msg.clone(), span.clone());
            let cells = Arc::clone(&self.parts.cells);
            let generations = Arc::clone(&self.parts.generations);
            let arrivals = Arc::clone(&self.parts.arrivals);
            let (wire_check, home) = (self.parts.wire_check, self.parts.home.clone());
            self.parts.pool.spawn(move || {
                let mut cell = lock_cell(&cells[rank]);
                let Some(hosted) = cell.as_deref_mut() else {
                    return;
                };
                let generation = hosted.generation;
                let mut host = PoolHost {
                    rank,
                    generation,
                    generations,
                    arrivals,
                    wire_check,
                    home,
                    span,
                    stopped: false,
                };
                hosted.driver.handle_message(msg, &mut host);
                if host.stopped {
                    drop(cell);
                    host.home.do_send(HostedStopped { rank, generation });
                }
            });
        }
        ((which, TAKEN), ranks - from)
    }
}

/// Looks every `look` while a round is handed out; takes the ranks not reached yet when
/// the cursor did not move since the last look (one inline compute ran at least `look`).
fn rescuer<M: Payload, W: Payload>(rescue: Weak<Rescue<M, W>>, look: Duration) {
    let mut seen = None;
    let mut last_round = Instant::now();
    loop {
        let Some(r) = rescue.upgrade() else {
            return;
        };
        if r.draining.load(Ordering::Acquire) {
            last_round = Instant::now();
            let (at, taken) = r.rescue(seen);
            if taken > 0 {
                tracing::debug!(
                    ranks = taken,
                    "an inline compute held the node's thread past the inline threshold: the rest of the round went to the pool"
                );
            }
            seen = Some(at);
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
                r.parked.store(false, Ordering::SeqCst);
            }
        }
    }
}

/// A pool thread as the host of a rescued worker, stepped under the lock of its cell: its
/// iteration goes to the pool as a unit of its own (the lock is not held while user code
/// runs) and comes home to the node actor, what it sends joins the node actor's arrivals,
/// and its timer and its stop are messages to the node actor.
struct PoolHost<M: Payload, W: Payload> {
    rank: Rank,
    generation: u64,
    generations: Arc<[AtomicU64]>,
    arrivals: Arc<Arrivals<W>>,
    wire_check: WireCheck,
    home: Addr<NodeActor<M, W>>,
    span: tracing::Span,
    stopped: bool,
}

impl<M: Payload, W: Payload> Host<M, W> for PoolHost<M, W> {
    fn send(&mut self, msg: ToMaster<W>) -> Result<(), TransportError> {
        let rank = self.rank;
        let wire_check = self.wire_check;
        let msg = guarded_send(|| wire_check.apply(msg, || format!("worker {rank} → master")))?;
        let current = || self.generations[rank].load(Ordering::Acquire) == self.generation;
        if !self
            .arrivals
            .deliver_if(Envelope { from: rank, msg }, current)
        {
            return Err(TransportError::Replaced { rank });
        }
        Ok(())
    }

    fn homeward(&mut self) -> Homeward<M, W> {
        homeward(self.home.clone(), self.rank, self.generation)
    }

    fn arm(&mut self, after: Duration) {
        self.home.do_send(HostedArm {
            rank: self.rank,
            generation: self.generation,
            after,
        });
    }

    fn runs_inline(&self) -> bool {
        false
    }

    fn stop(&mut self) {
        self.stopped = true;
    }

    fn span(&self) -> tracing::Span {
        self.span.clone()
    }
}
