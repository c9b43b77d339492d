//! Collectives started now and finished later: a rank may have several under way at
//! once, and compute between starting one and finishing it. Every wait of the rank's —
//! finishing one of them, or any other call — drives them all, so a call started early
//! goes on while the compute waits on another.

use std::any::Any;
use std::fmt;

use super::buffers::{Elements, Whole};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{
    by_size, chunk_of, decode_broadcast, received, Algorithm, CollectiveKind, ReduceOp, CHUNK,
};
use crate::compute::WorkerContext;
use crate::error::SyncError;
use crate::ids::{CallKey, Epoch, Rank};
use crate::payload::{Element, Floats};
use crate::protocol::{CallStart, Carried, Flying, RankCall};
use crate::sync_link::{awaitable, block, in_span, Wait};

/// A collective this rank started and has not finished: give it to
/// [`WorkerContext::finish`] (or [`finish_async`](WorkerContext::finish_async)) for its
/// result, before the compute returns.
///
/// Its rules are every collective's: every rank makes the same calls in the same order —
/// the order they are started in — whatever the order it finishes them in. A compute that
/// returns with a call started and not finished fails ([`SyncError::Unfinished`]): its
/// peers would wait for its part.
#[must_use = "a started call must be finished (WorkerContext::finish): its peers wait for this rank's part"]
pub struct Started<T> {
    rank: Rank,
    key: CallKey,
    end: Ending<T>,
}

impl<T> fmt::Debug for Started<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Started")
            .field("rank", &self.rank)
            .field("group", &self.key.group)
            .field("epoch", &self.key.epoch)
            .finish()
    }
}

/// How a call's result is made from the end its flight kept on a rank, for a call of a
/// kind (`None`: the end is of another call's type).
type Ending<T> = fn(Box<dyn Any>, Rank, CollectiveKind) -> Option<Result<T, SyncError>>;

/// A barrier's buffer: one value of nothing, folded by doing nothing.
type Passing = Whole<(), fn(&mut (), ())>;

impl<M, W: 'static> WorkerContext<M, W> {
    /// Starts an [`all_reduce`](Self::all_reduce) of `values` and returns at once, its
    /// first pieces sent: [`finish`](Self::finish) gives the result. Its other steps go
    /// while this rank waits — in `finish` or in any other call, each wait driving every
    /// call in flight — so calls started together overlap their latencies (as MPI's
    /// `MPI_Iallreduce`; to send several small values as one, see
    /// [`all_reduce_many`](Self::all_reduce_many)). Compute between starting and finishing
    /// holds back the steps the peers need from this rank.
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # use superstep::collective::ReduceOp;
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// let first = ctx.start_all_reduce(Floats::from(vec![0.5; 1 << 16]), ReduceOp::Sum)?;
    /// let second = ctx.start_all_reduce(Floats::from(vec![1.0; 1 << 16]), ReduceOp::Max)?;
    /// // ... compute; both calls' first pieces are on their way ...
    /// let first = ctx.finish(first)?;
    /// let second = ctx.finish(second)?;
    /// # Ok(()) }
    /// ```
    ///
    /// Fails as [`all_reduce`](Self::all_reduce) does: where it cannot start at once, the
    /// rest when it is finished.
    pub fn start_all_reduce<T: Element>(
        &mut self,
        values: Floats<T>,
        op: ReduceOp,
    ) -> Result<Started<Floats<T>>, SyncError> {
        fn reduced<T: Element>(
            end: Box<dyn Any>,
            _: Rank,
            _: CollectiveKind,
        ) -> Option<Result<Floats<T>, SyncError>> {
            ended::<Elements<Vec<T>, T>>(end).map(|r| r.map(|done| Floats(done.values)))
        }
        let kind = CollectiveKind::AllReduce(Some(op));
        let algorithm = by_size::<T>(values.len());
        let buffer = Elements::new(values.0, op);
        let result = self.start(kind, algorithm, chunk_of::<T>(), buffer, reduced::<T>);
        self.note(result)
    }

    /// Starts a [`broadcast`](Self::broadcast) from rank `from` and returns at once (as
    /// MPI's `MPI_Ibcast`): `from` passes `Some`, the others `None`;
    /// [`finish`](Self::finish) gives every rank `from`'s value.
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// let mine = (ctx.rank() == 0).then(|| vec![0.5f32; 1 << 20]);
    /// let weights = ctx.start_broadcast(0, mine.as_ref())?;
    /// // ... compute what does not need the weights ...
    /// let weights: Vec<f32> = ctx.finish(weights)?;
    /// # Ok(()) }
    /// ```
    pub fn start_broadcast<T>(
        &mut self,
        from: Rank,
        value: Option<&T>,
    ) -> Result<Started<T>, SyncError>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        fn decoded<T: DeserializeOwned>(
            end: Box<dyn Any>,
            rank: Rank,
            kind: CollectiveKind,
        ) -> Option<Result<T, SyncError>> {
            let CollectiveKind::Broadcast { root } = kind else {
                return None;
            };
            let bytes = ended::<Elements<Vec<u8>, u8>>(end)?;
            Some(bytes.and_then(|bytes| decode_broadcast(&bytes.values, root, rank)))
        }
        let result = self.start_broadcast_made(from, value, decoded::<T>);
        self.note(result)
    }

    /// [`start_broadcast`](Self::start_broadcast), its failure not noted yet.
    fn start_broadcast_made<T: Serialize>(
        &mut self,
        from: Rank,
        value: Option<&T>,
        end: Ending<T>,
    ) -> Result<Started<T>, SyncError> {
        let kind = CollectiveKind::Broadcast { root: from };
        if self.rank == from {
            let (bytes, algorithm) = self.broadcast_bytes(from, value)?;
            let buffer = Elements::new(bytes, ReduceOp::Sum);
            return self.start(kind, algorithm, CHUNK as u32, buffer, end);
        }
        let epoch = self.start_collective(kind, None, Wait::Block)?;
        let start = CallStart::Awaited {
            kind,
            make: received,
        };
        let call = self.rank_call(epoch, start, false)?;
        Ok(self.keep(epoch, call, end))
    }

    /// Starts a [`barrier`](Self::barrier) among the workers and returns at once:
    /// [`finish`](Self::finish) returns once every rank reached it (as MPI's
    /// `MPI_Ibarrier`). Needs workers that reach each other ([`SyncError::NoPeers`]
    /// otherwise).
    pub fn start_barrier(&mut self) -> Result<Started<()>, SyncError> {
        fn passed(end: Box<dyn Any>, _: Rank, _: CollectiveKind) -> Option<Result<(), SyncError>> {
            ended::<Passing>(end).map(|r| r.map(drop))
        }
        let nothing: fn(&mut (), ()) = |_, _| {};
        let buffer: Passing = Whole {
            value: vec![()],
            fold: nothing,
        };
        let kind = CollectiveKind::Barrier;
        let result = self.start(kind, Algorithm::Doubling, 1, buffer, passed);
        self.note(result)
    }

    /// Waits until `started` ends, driving every other call in flight meanwhile, and gives
    /// its result — or its error, as the blocking call would have.
    ///
    /// A call this context did not start fails with [`SyncError::NotStarted`].
    pub fn finish<T>(&mut self, started: Started<T>) -> Result<T, SyncError> {
        block(self.finish_in(started, Wait::Block))
    }

    /// [`finish`](Self::finish) as a future; see
    /// [`all_reduce_async`](Self::all_reduce_async).
    pub async fn finish_async<T>(&mut self, started: Started<T>) -> Result<T, SyncError> {
        self.finish_in(started, Wait::Await).await
    }

    async fn finish_in<T>(&mut self, started: Started<T>, wait: Wait) -> Result<T, SyncError> {
        let result = self.finish_made(started, wait).await;
        self.note(result)
    }

    /// [`finish_in`](Self::finish_in), its failure not noted yet.
    async fn finish_made<T>(&mut self, started: Started<T>, wait: Wait) -> Result<T, SyncError> {
        if wait == Wait::Await {
            awaitable()?;
        }
        let Started { rank, key, end } = started;
        let not_started = SyncError::NotStarted {
            rank: self.rank,
            epoch: key.epoch,
        };
        let call = match self.sync.as_ref() {
            Some(sync) if rank == self.rank => sync.flying.call(key),
            _ => None,
        };
        let Some(call) = call else {
            return Err(not_started);
        };
        let span = self.call_span(key.epoch, call.kind);
        let next = self.next_call(key.group);
        let sync = self
            .sync
            .as_mut()
            .expect("a call in flight has a sync link");
        // Driven where it is: a future dropped half-way leaves the call in flight.
        in_span(span, sync.finish(key, next, wait)).await;
        let Some(flight) = sync.flying.take(key) else {
            return Err(not_started);
        };
        let result = end(flight.into_end(), rank, call.kind).unwrap_or(Err(not_started));
        sync.ended((key.epoch, key.group), &result);
        result
    }

    /// Makes call `kind` on `buffer` and keeps it in flight, its first pieces sent.
    fn start<B, T>(
        &mut self,
        kind: CollectiveKind,
        algorithm: Algorithm,
        chunk: u32,
        buffer: B,
        end: Ending<T>,
    ) -> Result<Started<T>, SyncError>
    where
        B: Carried + Send + 'static,
        B::Part: Send + 'static,
    {
        let (epoch, start) = self.begin(kind, algorithm, chunk, buffer, Wait::Block)?;
        let call = self.rank_call(epoch, start, false)?;
        Ok(self.keep(epoch, call, end))
    }

    /// Keeps call `epoch` in flight, its first pieces sent.
    fn keep<B, T>(&mut self, epoch: Epoch, call: RankCall<B>, end: Ending<T>) -> Started<T>
    where
        B: Carried + Send + 'static,
        B::Part: Send + 'static,
    {
        let sync = self
            .sync
            .as_mut()
            .expect("a rank call is made with a sync link");
        sync.flying.push(Box::new(Flying::new(call)));
        sync.send_flights();
        Started {
            rank: self.rank,
            key: CallKey {
                group: self.scope_id(),
                epoch,
            },
            end,
        }
    }
}

/// The end a flight of buffer `B` kept, if `end` is one.
fn ended<B: 'static>(end: Box<dyn Any>) -> Option<Result<B, SyncError>> {
    end.downcast::<Option<Result<B, SyncError>>>()
        .ok()
        .and_then(|end| *end)
}
