//! Collectives among the workers, inside `compute` in barrier mode: `all_reduce` (of one
//! value, or of several in one exchange: `all_reduce_many`), `reduce_scatter`,
//! `broadcast` and a fold of any serde type, carried worker to worker
//! over the transport's peer mesh — never through the master. So does `all_gather`
//! (log₂(ranks) steps; across processes a large message then around the ring of ranks).
//!
//! Large values go around the ring of ranks in segments, chunked so that sending one
//! chunk overlaps receiving and folding the next: each rank sends and receives about
//! twice the value's size in all, whatever the number of ranks. Small ones take
//! log₂(ranks) exchanges (recursive doubling, or a tree). Either can be chosen
//! ([`Algorithm`]).
//!
//! The rules are the sync calls' ([`WorkerContext::barrier`]): every rank makes the same
//! calls, with values of the same length, in the same order — otherwise every rank's call
//! fails naming two that differ; a rank that returns from compute without the call, or
//! does not make it within `sync_timeout` of the first, is named; a job's failure releases
//! every rank waiting at once. A call whose peers all made it but stop sending for longer
//! than `sync_timeout` (and a few seconds) fails naming the ranks it waits for; a lost peer
//! fails it naming the peer — at once once the master's node said every rank made the
//! call, otherwise when its word comes, the job's failure, or a second, whichever is first
//! (the word may say the peer's process ended over a call of another kind: that mistake is
//! then the error). Collectives and sync calls share one count (the epoch).
//!
//! A call can also be started and finished later ([`WorkerContext::start_all_reduce`],
//! [`WorkerContext::start_barrier`], [`WorkerContext::start_broadcast`],
//! [`WorkerContext::finish`]): several may be under
//! way at once, each wait of the rank's driving them all; they count in the order they
//! were started.
//!
//! Every collective can also run among a [`Group`] of the ranks alone
//! ([`WorkerContext::among`]), as among an MPI communicator made of some of the world's
//! ranks: its calls are counted apart from the job's and other groups', with the same
//! rules inside the group, errors naming ranks as the job does and the call as `call 2 of
//! group … in iteration 5`.
//!
//! The master's node holds these rules without standing in a call's way: a call whose
//! result holds a piece of every rank's (an `all_reduce`, a barrier among the workers, the
//! fold of results on rank 0), each piece checked against the receiver's own call, proves
//! that every rank made it, and returns once its exchange is done. A broadcast's ranks,
//! the fold's other ranks and an empty value wait for the node's word that every rank made
//! the call. So the error a rank gets is its own call's: a rank whose call met a piece of
//! another names both calls at once, while others may hear the node's word of the same
//! mistake.

use std::ops::Range;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::compute::WorkerContext;
use crate::error::SyncError;
pub(crate) mod buffers;
mod fold;
mod group;
mod started;

pub use crate::group::Group;
use crate::ids::{fingerprint, Epoch, Rank, SyncKind};
pub use crate::ids::{
    Aggregation, Algorithm, CollectiveCall, CollectiveKind, FoldRoute, GroupId, ReduceOp,
};
use crate::payload::{Element, Floats};
use crate::protocol::{
    all_vouch, exchange, placed, segment, vouches, CallSetup, CallShape, CallStart, Carried,
    Flying, RankCall,
};
use crate::sync_link::{awaitable, block, in_span, Notice, Wait};
pub(crate) use buffers::fold_into;
use buffers::{Elements, Whole};
pub(crate) use fold::FoldAmong;
pub use group::Among;
pub use started::Started;

/// Below this many bytes a value takes the latency-optimal way (log₂(ranks) steps),
/// above it the ring.
const SMALL: usize = 64 * 1024;

/// About how many bytes travel in one piece: small enough that a ring step's sending and
/// the next step's overlap, and that a chain of N ranks fills quickly (a piece's time per
/// hop), large enough that a piece's overhead does not count. On the emulated 1 Gbit/s
/// cluster at 8 ranks, 64 KiB against 128 KiB: the fold along the ring of 1 MB 0.82×, of
/// 8 MB 0.98×, `all_reduce` level; 32 KiB to 512 KiB gave `all_reduce` the same times
/// within 3%, 2 MiB 25% more.
const CHUNK: usize = 64 * 1024;

/// The shortest sync timeout under which a call's word to the master's node may go soon
/// (`Notice::Soon`: held back a few milliseconds at most, over TCP): fifty times the
/// longest hold, so that holding it never counts against the timeout.
const SOON_WITHIN: std::time::Duration = std::time::Duration::from_millis(100);

/// How the master's node hears of `rank`'s call of `kind` (of `len` elements, if known)
/// among `workers` ranks, in a job whose sync timeout is `sync_timeout`.
fn notice(
    kind: CollectiveKind,
    (rank, workers): (Rank, usize),
    len: Option<usize>,
    sync_timeout: std::time::Duration,
) -> Notice {
    match len {
        Some(len) if sync_timeout >= SOON_WITHIN && all_vouch(kind, workers, len) => Notice::Soon,
        Some(len) if vouches(kind, workers, rank, len) => Notice::Now,
        _ => Notice::Awaited,
    }
}

/// How a rank's `all_gather` message goes in the exchange of every rank's: small ones
/// (and every one where the ranks share a process) as the bytes themselves; a large one
/// across processes as its length alone, its bytes going around the ring of ranks once
/// that exchange said every rank made the call.
#[derive(Debug, Serialize, serde::Deserialize)]
enum GatherRoute {
    Here(Vec<u8>),
    Ring(u64),
}

impl<M, W: 'static> WorkerContext<M, W> {
    /// Combines every rank's `values` element by element with `op`: when it returns, every
    /// rank holds the same result. The way is chosen by size: recursive doubling below
    /// 64 KiB, the ring above; [`all_reduce_by`](Self::all_reduce_by) chooses it.
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # use superstep::collective::ReduceOp;
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// let mut gradient = Floats::from(vec![0.5; 1 << 20]);
    /// ctx.all_reduce(&mut gradient, ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    ///
    /// Every rank must pass as many elements ([`SyncError::CollectiveMismatch`] otherwise,
    /// naming two ranks and their lengths). Fails as [`barrier`](Self::barrier) does, and
    /// when a peer is lost ([`SyncError::PeerLost`]) or stops sending
    /// ([`SyncError::CollectiveTimedOut`], naming the ranks waited for).
    pub fn all_reduce<T: Element>(
        &mut self,
        values: &mut Floats<T>,
        op: ReduceOp,
    ) -> Result<(), SyncError> {
        let algorithm = by_size::<T>(values.len());
        block(self.all_reduce_in(values, op, algorithm, Wait::Block))
    }

    /// [`all_reduce`](Self::all_reduce) as a future, for a compute that runs an async
    /// runtime: while it waits for its peers, the runtime's other tasks run on the thread.
    /// Await it on a Tokio runtime with its timers (`enable_time` or `enable_all`), which
    /// bound its waits; outside one it fails with [`SyncError::NoTimer`]. Await it to its
    /// end: a future dropped before it finishes leaves the other ranks to fail the call.
    /// The same holds for every `_async` collective.
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # use superstep::collective::ReduceOp;
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    /// let mut gradient = Floats::from(vec![0.5; 1 << 20]);
    /// runtime.block_on(async {
    ///     // Sums with the peers while this thread also serves other tasks.
    ///     ctx.all_reduce_async(&mut gradient, ReduceOp::Sum).await
    /// })?;
    /// # Ok(()) }
    /// ```
    pub async fn all_reduce_async<T: Element>(
        &mut self,
        values: &mut Floats<T>,
        op: ReduceOp,
    ) -> Result<(), SyncError> {
        let algorithm = by_size::<T>(values.len());
        self.all_reduce_in(values, op, algorithm, Wait::Await).await
    }

    /// [`all_reduce`](Self::all_reduce) by `algorithm`. [`Algorithm::Chain`] folds the
    /// ranks' values one after another in rank order, as the master folds workers'
    /// results, so a sum of floats has the same bits as that fold; the others group them
    /// otherwise (the last bits of a float sum may differ between algorithms, never between
    /// ranks or runs).
    pub fn all_reduce_by<T: Element>(
        &mut self,
        values: &mut Floats<T>,
        op: ReduceOp,
        algorithm: Algorithm,
    ) -> Result<(), SyncError> {
        block(self.all_reduce_in(values, op, algorithm, Wait::Block))
    }

    /// [`all_reduce_by`](Self::all_reduce_by) as a future; see
    /// [`all_reduce_async`](Self::all_reduce_async).
    pub async fn all_reduce_by_async<T: Element>(
        &mut self,
        values: &mut Floats<T>,
        op: ReduceOp,
        algorithm: Algorithm,
    ) -> Result<(), SyncError> {
        self.all_reduce_in(values, op, algorithm, Wait::Await).await
    }

    /// Combines several values at once, each element by element with `op` with the same
    /// value of every other rank's, in one exchange: the values go together as one, so `k`
    /// small values cost one call's latency rather than `k` (as Horovod fuses tensors).
    /// The way is chosen by their size together, as [`all_reduce`](Self::all_reduce)
    /// chooses it.
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # use superstep::collective::ReduceOp;
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// let mut weights = Floats::from(vec![0.5; 64]);
    /// let mut bias = Floats::from(vec![0.1; 4]);
    /// let mut loss = Floats::from(vec![1.5]);
    /// ctx.all_reduce_many(&mut [&mut weights, &mut bias, &mut loss], ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    ///
    /// Every rank must pass as many values, each as long as the other ranks' value in its
    /// place ([`SyncError::CollectiveMismatch`] otherwise, naming two ranks and their
    /// calls); it fails as [`all_reduce`](Self::all_reduce) does.
    pub fn all_reduce_many<T: Element>(
        &mut self,
        values: &mut [&mut Floats<T>],
        op: ReduceOp,
    ) -> Result<(), SyncError> {
        block(self.all_reduce_many_in(values, op, Wait::Block))
    }

    /// [`all_reduce_many`](Self::all_reduce_many) as a future; see
    /// [`all_reduce_async`](Self::all_reduce_async).
    pub async fn all_reduce_many_async<T: Element>(
        &mut self,
        values: &mut [&mut Floats<T>],
        op: ReduceOp,
    ) -> Result<(), SyncError> {
        self.all_reduce_many_in(values, op, Wait::Await).await
    }

    async fn all_reduce_many_in<T: Element>(
        &mut self,
        values: &mut [&mut Floats<T>],
        op: ReduceOp,
        wait: Wait,
    ) -> Result<(), SyncError> {
        let lengths: Vec<usize> = values.iter().map(|value| value.len()).collect();
        let kind = CollectiveKind::AllReduceMany {
            op,
            values: u32::try_from(values.len()).unwrap_or(u32::MAX),
            // The same on every rank and platform: ranks that split their elements
            // otherwise make calls that differ.
            lengths: fingerprint(&lengths),
        };
        let mut together = Vec::with_capacity(lengths.iter().sum());
        for value in values.iter() {
            together.extend_from_slice(&value.0);
        }
        let algorithm = by_size::<T>(together.len());
        let buffer = Elements::new(&mut together[..], op);
        self.collective_in(kind, algorithm, chunk_of::<T>(), buffer, wait)
            .await?;
        let mut rest = &together[..];
        for value in values.iter_mut() {
            let (mine, others) = rest.split_at(value.len());
            value.0.copy_from_slice(mine);
            rest = others;
        }
        Ok(())
    }

    async fn all_reduce_in<T: Element>(
        &mut self,
        values: &mut Floats<T>,
        op: ReduceOp,
        algorithm: Algorithm,
        wait: Wait,
    ) -> Result<(), SyncError> {
        let kind = CollectiveKind::AllReduce(Some(op));
        let chunk = chunk_of::<T>();
        let buffer = Elements::new(&mut values.0[..], op);
        self.collective_in(kind, algorithm, chunk, buffer, wait)
            .await
            .map(drop)
    }

    /// Combines every rank's `values` element by element with `op`, and returns this
    /// rank's segment of the result: [`segment`](Self::segment) of the length, a
    /// near-equal share. Around the ring: each rank sends and receives about the value's
    /// size. Every rank must pass as many elements.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        values: Floats<T>,
        op: ReduceOp,
    ) -> Result<Floats<T>, SyncError> {
        block(self.reduce_scatter_in(values, op, Wait::Block))
    }

    /// [`reduce_scatter`](Self::reduce_scatter) as a future; see
    /// [`all_reduce_async`](Self::all_reduce_async).
    pub async fn reduce_scatter_async<T: Element>(
        &mut self,
        values: Floats<T>,
        op: ReduceOp,
    ) -> Result<Floats<T>, SyncError> {
        self.reduce_scatter_in(values, op, Wait::Await).await
    }

    async fn reduce_scatter_in<T: Element>(
        &mut self,
        mut values: Floats<T>,
        op: ReduceOp,
        wait: Wait,
    ) -> Result<Floats<T>, SyncError> {
        let kind = CollectiveKind::ReduceScatter(Some(op));
        let range = self.segment(values.len());
        let buffer = Elements::new(&mut values.0[..], op);
        self.collective_in(kind, Algorithm::Ring, chunk_of::<T>(), buffer, wait)
            .await?;
        values.truncate(range.end);
        values.drain(..range.start);
        Ok(values)
    }

    /// The elements of a value of `len` elements that
    /// [`reduce_scatter`](Self::reduce_scatter) gives this rank.
    /// Among a group ([`among`](Self::among)), this rank's segment of the group's.
    pub fn segment(&self, len: usize) -> Range<usize> {
        let (place, ranks) = self.place();
        segment(len, ranks, place)
    }

    /// Every rank gets rank `from`'s value: `from` passes `Some`, the others `None` (their
    /// value is not read). Any serde type. Large values travel along the ranks in chunks,
    /// each rank passing on what it received while it receives the rest; small ones down
    /// a binomial tree.
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// let mine = (ctx.rank() == 0).then(|| vec![1u64, 2, 3]);
    /// let plan: Vec<u64> = ctx.broadcast(0, mine.as_ref())?;
    /// # Ok(()) }
    /// ```
    pub fn broadcast<T>(&mut self, from: Rank, value: Option<&T>) -> Result<T, SyncError>
    where
        T: Serialize + DeserializeOwned,
    {
        block(self.broadcast_in(from, value, Wait::Block))
    }

    /// [`broadcast`](Self::broadcast) as a future; see
    /// [`all_reduce_async`](Self::all_reduce_async).
    pub async fn broadcast_async<T>(
        &mut self,
        from: Rank,
        value: Option<&T>,
    ) -> Result<T, SyncError>
    where
        T: Serialize + DeserializeOwned,
    {
        self.broadcast_in(from, value, Wait::Await).await
    }

    async fn broadcast_in<T>(
        &mut self,
        from: Rank,
        value: Option<&T>,
        wait: Wait,
    ) -> Result<T, SyncError>
    where
        T: Serialize + DeserializeOwned,
    {
        let result = self.broadcast_made(from, value, wait).await;
        self.note(result)
    }

    /// [`broadcast_in`](Self::broadcast_in), its failure not noted yet.
    async fn broadcast_made<T>(
        &mut self,
        from: Rank,
        value: Option<&T>,
        wait: Wait,
    ) -> Result<T, SyncError>
    where
        T: Serialize + DeserializeOwned,
    {
        let kind = CollectiveKind::Broadcast { root: from };
        let bytes = if self.rank == from {
            let (mut bytes, algorithm) = self.broadcast_bytes(from, value)?;
            let buffer = Elements::new(&mut bytes[..], ReduceOp::Sum);
            self.collective_in(kind, algorithm, CHUNK as u32, buffer, wait)
                .await?;
            bytes
        } else {
            self.broadcast_received(kind, wait).await?
        };
        decode_broadcast(&bytes, from, self.rank)
    }

    /// The root's value to broadcast, encoded, and the way it goes by its size.
    fn broadcast_bytes<T: Serialize>(
        &self,
        from: Rank,
        value: Option<&T>,
    ) -> Result<(Vec<u8>, Algorithm), SyncError> {
        let Some(value) = value else {
            return Err(SyncError::NothingToBroadcast(from));
        };
        let bytes = crate::codec::to_vec(value).map_err(|e| {
            SyncError::Codec(format!(
                "rank {from}'s value to broadcast, a {}, does not encode: {e}",
                std::any::type_name::<T>()
            ))
        })?;
        let algorithm = if bytes.len() < SMALL {
            Algorithm::Tree
        } else {
            Algorithm::Ring
        };
        Ok((bytes, algorithm))
    }

    /// Every rank's `value` folded by `fold` (which must be associative), for any serde
    /// type: every rank gets the same result. Values are never swapped — a lower rank's
    /// comes first in every fold — but grouped as a tree groups them (recursive doubling,
    /// log₂(ranks) steps).
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// let words = ctx.all_reduce_with(format!("{};", ctx.rank()), |a, b| a.push_str(&b))?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_with<T, F>(&mut self, value: T, fold: F) -> Result<T, SyncError>
    where
        T: Serialize + DeserializeOwned + Clone + Send + 'static,
        F: Fn(&mut T, T),
    {
        block(self.all_reduce_with_in(value, fold, Wait::Block))
    }

    /// [`all_reduce_with`](Self::all_reduce_with) as a future; see
    /// [`all_reduce_async`](Self::all_reduce_async).
    pub async fn all_reduce_with_async<T, F>(&mut self, value: T, fold: F) -> Result<T, SyncError>
    where
        T: Serialize + DeserializeOwned + Clone + Send + 'static,
        F: Fn(&mut T, T),
    {
        self.all_reduce_with_in(value, fold, Wait::Await).await
    }

    async fn all_reduce_with_in<T, F>(
        &mut self,
        value: T,
        fold: F,
        wait: Wait,
    ) -> Result<T, SyncError>
    where
        T: Serialize + DeserializeOwned + Clone + Send + 'static,
        F: Fn(&mut T, T),
    {
        let kind = CollectiveKind::AllReduce(None);
        let buffer = Whole {
            value: vec![value],
            fold,
        };
        let done = self
            .collective_in(kind, Algorithm::Doubling, 1, buffer, wait)
            .await?;
        Ok(done
            .value
            .into_iter()
            .next()
            .expect("a whole value keeps its one element"))
    }

    /// `barrier()`: where the workers reach each other (a peer mesh: in one process, or
    /// TCP's), a dissemination among them — no word of the master's node awaited, each
    /// rank's call proven by the pieces that reach it; otherwise a sync call the node
    /// answers once every rank made it.
    pub(crate) async fn barrier_in(&mut self, wait: Wait) -> Result<(), SyncError> {
        let peers = self.sync.as_ref().is_some_and(|sync| sync.peers.is_ok());
        if !peers && self.scope.is_none() {
            return self
                .sync_call_in(SyncKind::Barrier, Vec::new(), wait)
                .await
                .map(drop);
        }
        let buffer = Whole {
            value: vec![()],
            // A barrier carries nothing.
            fold: |_: &mut (), _: ()| {},
        };
        self.collective_in(
            CollectiveKind::Barrier,
            Algorithm::Doubling,
            1,
            buffer,
            wait,
        )
        .await
        .map(drop)
    }

    /// Every rank's encoded `all_gather` message, in rank order. Where the workers reach
    /// each other, among them alone: every rank's message (or, a large one across
    /// processes, its length: [`GatherRoute`]) by recursive doubling — log₂(ranks) steps,
    /// the result proving that every rank made the call, no word of the master's node
    /// awaited — and then, if some rank's went by its length, the large ones around the
    /// ring of ranks, a call of its own: (ranks − 1) messages each way, the least an
    /// all-gather can move. Otherwise a sync call the master's node answers with every
    /// rank's message.
    pub(crate) async fn gather(
        &mut self,
        bytes: Vec<u8>,
        wait: Wait,
    ) -> Result<Vec<Vec<u8>>, SyncError> {
        let rank = self.rank;
        let (place, workers) = self.place();
        // Among a group, the messages' places are its ranks'.
        let group = self.scope.clone();
        let name = |at: usize| group.as_ref().map_or(at, |g| g.ranks()[at]);
        let far = match self.sync.as_ref().map(|sync| &sync.peers) {
            Some(Ok(peers)) => peers.spans_processes(),
            _ => {
                let answer = self.sync_call_in(SyncKind::AllGather, bytes, wait).await?;
                if answer.len() != workers {
                    return Err(SyncError::Codec(format!(
                        "the all_gather answer holds {} message(s), not one for each of the {workers} ranks",
                        answer.len()
                    )));
                }
                return Ok(answer.to_vec());
            }
        };
        let (sent, own) = if far && bytes.len() >= SMALL {
            (GatherRoute::Ring(bytes.len() as u64), bytes)
        } else {
            (GatherRoute::Here(bytes), Vec::new())
        };
        let sent = crate::codec::to_vec(&sent).map_err(|e| {
            SyncError::Codec(format!(
                "rank {rank}'s all_gather message does not encode: {e}"
            ))
        })?;
        let mut slots = vec![None; workers];
        slots[place] = Some(sent);
        let routes = Whole {
            value: slots,
            fold: keep_held as fn(&mut Option<Vec<u8>>, Option<Vec<u8>>),
        };
        let kind = CollectiveKind::AllGather;
        // The whole value in one piece a step.
        let chunk = u32::try_from(workers).unwrap_or(u32::MAX);
        let routes = self
            .collective_in(kind, Algorithm::Doubling, chunk, routes, wait)
            .await?
            .value;
        let mut rows = Vec::with_capacity(workers);
        let mut around = Vec::new();
        for (at, entry) in routes.into_iter().enumerate() {
            let from = name(at);
            let decoded = entry
                .ok_or_else(|| "it never came".to_owned())
                .and_then(|entry| {
                    crate::codec::from_slice::<GatherRoute>(&entry).map_err(|e| e.to_string())
                });
            match decoded {
                Ok(GatherRoute::Here(bytes)) => rows.push(bytes),
                Ok(GatherRoute::Ring(len)) => {
                    around.push((at, len));
                    rows.push(Vec::new());
                }
                Err(e) => {
                    return Err(SyncError::Codec(format!(
                        "rank {from}'s all_gather message on rank {rank}: {e}"
                    )))
                }
            }
        }
        if around.is_empty() {
            return Ok(rows);
        }
        // Some rank's message goes around the ring: every rank's part in it is its own
        // message when it went that way, nothing when the first exchange carried it.
        let mut ring = vec![Vec::new(); workers];
        ring[place] = own;
        let buffer = Whole {
            value: ring,
            // An all-gather only puts.
            fold: |_: &mut Vec<u8>, _: Vec<u8>| {},
        };
        let mut ring = self
            .collective_in(kind, Algorithm::Ring, 1, buffer, wait)
            .await?
            .value;
        for (at, len) in around {
            let bytes = std::mem::take(&mut ring[at]);
            let from = name(at);
            if bytes.len() as u64 != len {
                return Err(SyncError::Codec(format!(
                    "rank {from}'s all_gather message came to rank {rank} as {} byte(s), not the {len} it announced",
                    bytes.len()
                )));
            }
            rows[at] = bytes;
        }
        Ok(rows)
    }

    /// A broadcast's bytes, on a rank that does not know their length until the first
    /// piece says it.
    async fn broadcast_received(
        &mut self,
        kind: CollectiveKind,
        wait: Wait,
    ) -> Result<Vec<u8>, SyncError> {
        let epoch = self.start_collective(kind, None, wait)?;
        let start = CallStart::Awaited {
            kind,
            make: received,
        };
        Ok(self.drive(epoch, start, false, wait).await?.values)
    }

    /// Runs `kind` on `buffer` with this rank's peers, blocking the thread.
    pub(crate) fn collective<B>(
        &mut self,
        kind: CollectiveKind,
        algorithm: Algorithm,
        chunk: u32,
        buffer: B,
    ) -> Result<B, SyncError>
    where
        B: Carried,
        B::Part: Send + 'static,
    {
        block(self.collective_in(kind, algorithm, chunk, buffer, Wait::Block))
    }

    /// Runs `kind` on `buffer` with this rank's peers, waiting as `wait` says.
    async fn collective_in<B>(
        &mut self,
        kind: CollectiveKind,
        algorithm: Algorithm,
        chunk: u32,
        buffer: B,
        wait: Wait,
    ) -> Result<B, SyncError>
    where
        B: Carried,
        B::Part: Send + 'static,
    {
        let result = match self.begin(kind, algorithm, chunk, buffer, wait) {
            Ok((epoch, start)) => self.drive(epoch, start, false, wait).await,
            Err(e) => Err(e),
        };
        self.note(result)
    }

    /// Makes call `kind` on `buffer` (the master's node hears of it): its epoch, and this
    /// rank's exchange, its first pieces ready.
    fn begin<B>(
        &mut self,
        kind: CollectiveKind,
        algorithm: Algorithm,
        chunk: u32,
        buffer: B,
        wait: Wait,
    ) -> Result<(Epoch, CallStart<B>), SyncError>
    where
        B: Carried,
    {
        let shape = CallShape {
            len: buffer.len() as u64,
            algorithm,
            chunk,
        };
        let epoch = self.start_collective(kind, Some(shape), wait)?;
        let call = CallShape::call(Some(shape), epoch, self.call_at(epoch), kind);
        let exchange = exchange(call, &self.call_setup(epoch)?, buffer);
        Ok((epoch, CallStart::Known(Box::new(exchange))))
    }

    /// Whether this rank's peers take pieces as values (in one process), rather than
    /// encoded.
    pub(crate) fn peers_take_values(&self) -> bool {
        let peers = self.sync.as_ref().and_then(|s| s.peers.as_ref().ok());
        peers.is_some_and(|p| p.carries_values())
    }

    /// The most bytes of an encoded piece the peers' transport carries in one frame, if
    /// it has a limit (see [`PeerLink::max_piece`](crate::transport::PeerLink::max_piece)).
    pub(crate) fn max_piece(&self) -> Option<usize> {
        let peers = self.sync.as_ref().and_then(|s| s.peers.as_ref().ok());
        peers.and_then(|p| p.max_piece())
    }

    /// Checks that a collective can start, and counts it: its epoch.
    fn start_collective(
        &mut self,
        kind: CollectiveKind,
        shape: Option<CallShape>,
        wait: Wait,
    ) -> Result<Epoch, SyncError> {
        if wait == Wait::Await {
            awaitable()?;
        }
        if let CollectiveKind::Broadcast { root } | CollectiveKind::Reduce { root, .. } = kind {
            if root >= self.workers {
                let workers = self.workers;
                return Err(SyncError::NoSuchRank {
                    rank: root,
                    workers,
                });
            }
            if let Some(group) = self.scope.as_ref().filter(|g| !g.contains(root)) {
                return Err(group.without(root));
            }
        }
        let called = kind.sync_kind();
        let sync = self.sync.as_ref().ok_or(SyncError::NotEnabled(called))?;
        if self.iteration == 0 {
            return Err(SyncError::OutsideCompute(called));
        }
        if let Some(e) = sync.failure() {
            return Err(e);
        }
        if let Err(why) = &sync.peers {
            return Err(SyncError::NoPeers((*why).to_owned()));
        }
        let sync_timeout = sync.config.job.sync_timeout;
        let epoch = self.count_call();
        // The master's node hears of the call as of a sync call, and holds the rules: the
        // same call on every rank, within the sync timeout of the first, none returned
        // without it; it answers every rank when they are broken. The values themselves
        // go worker to worker; a rank whose result will prove that every rank made the
        // call (`vouches`) does not wait for the node's word that they did; where no rank
        // does, its word may go soon (a few milliseconds later at most), unless the sync
        // timeout is so short that those would count.
        // (A group's calls, the same among its ranks.)
        let len = shape.and_then(|s| usize::try_from(s.len).ok());
        let placed = self
            .scope
            .as_ref()
            .map_or(kind, |g| placed(kind, g.ranks()));
        let notice = notice(placed, self.place(), len, sync_timeout);
        let shape = crate::codec::to_vec(&shape).map_err(|e| SyncError::Codec(e.to_string()))?;
        // A group's ranks go with the rank's first call among it: the node knows the group
        // from then on.
        let ranks = match &self.scope {
            Some(group) if epoch == 0 => group.ranks(),
            _ => &[],
        };
        let sync = self.sync.as_ref().expect("looked at above");
        let len = len.map(|len| len as u64);
        let call = (epoch, self.scope_id(), ranks);
        sync.call(call, (called, len), shape, notice)?;
        Ok(epoch)
    }

    /// Sends and receives the pieces of call `epoch` until this rank's part is done and its
    /// result proves that every rank made the call, or the master's node said so
    /// (`released`: it said so already) — and with it the calls in flight. The call's rules
    /// are its [`RankCall`]'s: this only carries what it sends, waits as long as it says,
    /// and hands it what comes, with the link's time.
    async fn drive<B>(
        &mut self,
        epoch: Epoch,
        start: CallStart<B>,
        released: bool,
        wait: Wait,
    ) -> Result<B, SyncError>
    where
        B: Carried,
        B::Part: Send + 'static,
    {
        let span = self.call_span(epoch, start.kind());
        in_span(span, async move {
            let call = self.rank_call(epoch, start, released)?;
            let mut flying = Flying::new(call);
            let group = self.scope_id();
            let sync = self
                .sync
                .as_mut()
                .expect("a rank call is made with a sync link");
            sync.drive(&mut flying, wait).await;
            let result = flying.end().expect("a driven call ends settled");
            sync.ended((epoch, group), &result);
            result
        })
        .await
    }

    /// The span a wait in call `epoch` of `kind` is in: a barrier's a `sync` span, as a
    /// barrier through the master's node is; every other call's a `collective` span.
    fn call_span(&self, epoch: Epoch, kind: CollectiveKind) -> tracing::Span {
        match kind {
            CollectiveKind::Barrier => {
                tracing::debug_span!("sync", rank = self.rank, epoch, kind = %SyncKind::Barrier)
            }
            _ => tracing::debug_span!("collective", rank = self.rank, epoch),
        }
    }

    /// This rank's call `epoch` from `start`, with what came early for it.
    fn rank_call<B>(
        &mut self,
        epoch: Epoch,
        start: CallStart<B>,
        released: bool,
    ) -> Result<RankCall<B>, SyncError>
    where
        B: Carried,
        B::Part: Send + 'static,
    {
        let setup = self.call_setup(epoch)?;
        let sync = self.sync.as_mut().expect("a call set up has a sync link");
        Ok(RankCall::new(
            setup,
            start,
            released,
            sync.now(),
            &mut sync.early,
        ))
    }

    /// Who makes this rank's call `epoch`, among the ranks the collectives made now are
    /// among, and the limits it keeps.
    fn call_setup(&self, epoch: Epoch) -> Result<CallSetup, SyncError> {
        let sync = self
            .sync
            .as_ref()
            .ok_or(SyncError::NotEnabled(SyncKind::Barrier))?;
        let peers = match &sync.peers {
            Ok(peers) => peers,
            Err(why) => return Err(SyncError::NoPeers((*why).to_owned())),
        };
        Ok(CallSetup {
            rank: self.rank,
            workers: self.workers,
            group: self.scope_id(),
            members: self.scope.as_ref().map(Group::members),
            attempt: sync.attempt,
            epoch,
            at: self.call_at(epoch),
            patience: sync.config.sync_patience,
            values: peers.carries_values(),
        })
    }
}

/// An all-gather's fold of two ranks' elements: the one that holds a message (each rank's
/// element holds its own, every other none until it comes).
fn keep_held(mine: &mut Option<Vec<u8>>, other: Option<Vec<u8>>) {
    if mine.is_none() {
        *mine = other;
    }
}

/// The bytes a broadcast's first piece announces, as the root makes them (its pieces,
/// and a way of its); allocated without aborting on a length too large. A broadcast only
/// puts: the op is never used.
fn received(call: &CollectiveCall) -> Result<Elements<Vec<u8>, u8>, String> {
    if call.chunk != CHUNK as u32 || !matches!(call.algorithm, Algorithm::Tree | Algorithm::Ring) {
        return Err(format!(
            "a broadcast is sent in pieces of {CHUNK} bytes by tree or ring, not {} by {}",
            call.chunk, call.algorithm
        ));
    }
    let len = usize::try_from(call.len)
        .map_err(|_| format!("{} bytes do not fit in memory", call.len))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len)
        .map_err(|_| format!("{len} bytes could not be allocated"))?;
    bytes.resize(len, 0);
    Ok(Elements::new(bytes, ReduceOp::Sum))
}

/// Rank `from`'s broadcast value, from its `bytes` as rank `rank` got them.
fn decode_broadcast<T: DeserializeOwned>(
    bytes: &[u8],
    from: Rank,
    rank: Rank,
) -> Result<T, SyncError> {
    crate::codec::from_slice(bytes).map_err(|e| {
        SyncError::Codec(format!(
            "the value rank {from} broadcast does not decode as {} on rank {rank}: {e}",
            std::any::type_name::<T>()
        ))
    })
}

/// The way an `all_reduce` of `len` elements takes: recursive doubling below [`SMALL`]
/// bytes, the ring above.
fn by_size<T: Element>(len: usize) -> Algorithm {
    if len.saturating_mul(std::mem::size_of::<T>()) < SMALL {
        Algorithm::Doubling
    } else {
        Algorithm::Ring
    }
}

/// How many elements of `T` travel in one piece.
fn chunk_of<T>() -> u32 {
    (CHUNK / std::mem::size_of::<T>().max(1)) as u32
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_call_goes_soon_only_where_no_rank_awaits_the_word_and_the_sync_timeout_is_not_short() {
        let sum = CollectiveKind::AllReduce(Some(ReduceOp::Sum));
        let minute = Duration::from_secs(60);
        assert_eq!(notice(sum, (1, 4), Some(1), minute), Notice::Soon);
        assert_eq!(notice(sum, (1, 4), Some(1), SOON_WITHIN), Notice::Soon);
        // A sync timeout a hold of a few milliseconds would count against.
        let short = Duration::from_millis(5);
        assert_eq!(notice(sum, (1, 4), Some(1), short), Notice::Now);
        // A reduce's root proves the call, the other ranks await the word: it goes now.
        let reduce = CollectiveKind::Reduce {
            op: Some(ReduceOp::Sum),
            root: 0,
        };
        assert_eq!(notice(reduce, (0, 4), Some(1), minute), Notice::Now);
        assert_eq!(notice(reduce, (1, 4), Some(1), minute), Notice::Awaited);
        // An empty value proves nothing; nor does a call known by its kind alone.
        assert_eq!(notice(sum, (1, 4), Some(0), minute), Notice::Awaited);
        assert_eq!(notice(sum, (1, 4), None, minute), Notice::Awaited);
    }
}
