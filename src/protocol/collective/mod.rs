//! Collectives among the workers, sans-IO: one rank's part in an `all_reduce`,
//! `reduce_scatter`, `reduce`, `broadcast` or `all_gather`, as a state machine that sends
//! and receives pieces of a value and never waits, reads a clock or does I/O.
//!
//! Every rank computes its own plan from the call (`plan.rs`): which ranges of the value
//! it sends to which peer, and which it receives and folds or puts, in which order. The
//! value is cut into chunks; each chunk index goes through the plan on its own, so
//! sending one chunk overlaps receiving and folding the next (a pipeline), and a large
//! `all_reduce` around the ring moves about twice the value's size through each rank,
//! whatever the number of ranks.
//!
//! What the value is, and how its elements fold, is the caller's: a [`Buffer`]. The
//! mesh that carries pieces between ranks, and the waits with their deadlines, are the
//! runtime's.
//!
//! Call order: [`Exchange::new`] (its first pieces are ready at once), then, until
//! [`Exchange::is_done`], [`Exchange::poll_send`] until it returns `None` and
//! [`Exchange::handle_piece`] for each piece a peer sent; then
//! [`Exchange::into_buffer`]. A piece that does not fit the call — another call, a step
//! or a chunk the plan does not have, a duplicate, a part of another length — is an error
//! naming the peer, never a panic.

mod call;
mod flight;
mod plan;
#[cfg(test)]
mod tests;

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::SyncError;
use crate::ids::{Algorithm, Attempt, CallAt, CollectiveCall, CollectiveKind, Epoch, Rank};

pub use call::PeerEvent;
pub(crate) use call::{exchange, CallSetup, CallStart, Carried, Early, RankCall, SendFailure};
pub(crate) use flight::{Flight, Flights, Flying};
#[cfg(test)]
use plan::effective;
pub(crate) use plan::{all_vouch, segment, vouches};
use plan::{plan, Apply, Transfer};

/// The value a collective runs on, as a row of elements: what a piece of it is, and how a
/// received piece is put into it or folded with it.
pub trait Buffer {
    /// A range of elements as it travels.
    type Part;

    /// How many elements the value has.
    fn len(&self) -> usize;

    /// Whether the value has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the elements in `range`.
    fn part(&self, range: Range<usize>) -> Self::Part;

    /// How many elements `part` holds.
    fn part_len(part: &Self::Part) -> usize;

    /// Replaces the elements in `range` with `part` (of the same length).
    fn put(&mut self, range: Range<usize>, part: Self::Part);

    /// Folds `part` with the elements in `range`: `part` before them when `part_first`
    /// (it holds lower ranks' values), after them otherwise.
    fn fold(&mut self, range: Range<usize>, part: Self::Part, part_first: bool);
}

/// What a rank's collective call is beyond its kind, as it tells the master's node with
/// the call (`None`: a broadcast's receiver, which learns it from the first piece). The
/// node compares every rank's, and fails the call on every rank at once when two differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CallShape {
    /// How many elements the value has.
    pub(crate) len: u64,
    /// How the values travel.
    pub(crate) algorithm: Algorithm,
    /// How many elements travel in one piece.
    pub(crate) chunk: u32,
}

impl CallShape {
    /// The call of `kind` with this shape (`None`: known by its kind alone) as call `seq`,
    /// at `at`.
    pub(crate) fn call(
        shape: Option<CallShape>,
        seq: Epoch,
        at: CallAt,
        kind: CollectiveKind,
    ) -> CollectiveCall {
        let CallShape {
            len,
            algorithm,
            chunk,
        } = shape.unwrap_or(CallShape {
            len: 0,
            algorithm: Algorithm::Tree,
            chunk: 0,
        });
        CollectiveCall {
            seq,
            at,
            kind,
            len,
            algorithm,
            chunk,
        }
    }
}

/// A piece of a collective on its way from one rank to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Piece<P> {
    /// The call it belongs to, as the sender made it.
    pub call: CollectiveCall,
    /// The plan's step.
    pub step: u32,
    /// The chunk of the step's range.
    pub chunk: u32,
    /// The elements.
    pub part: P,
}

/// What one worker sends another in a collective: a piece's place — the call, the step,
/// the chunk — and its elements, as bytes (over a network: the crate's encoding of the
/// part) or as the part itself (between workers of one process).
#[derive(Debug)]
pub struct PeerMessage {
    /// The attempt the sender runs: a piece of another attempt is stale.
    pub attempt: Attempt,
    /// The sender.
    pub from: Rank,
    /// The call, as the sender made it.
    pub call: CollectiveCall,
    /// The plan's step.
    pub step: u32,
    /// The chunk of the step's range.
    pub chunk: u32,
    /// The elements.
    pub body: PeerBody,
}

/// A piece's elements.
pub enum PeerBody {
    /// Encoded with the crate's encoding (`codec`): over TCP, a slice of the frame it came
    /// in, not a copy.
    Encoded(bytes::Bytes),
    /// The part itself.
    Value(Box<dyn Any + Send>),
}

impl fmt::Debug for PeerBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerBody::Encoded(bytes) => write!(f, "Encoded({} byte(s))", bytes.len()),
            PeerBody::Value(_) => f.write_str("Value(..)"),
        }
    }
}

/// `rank`'s place among `members` (in rank order): its rank in the group. A rank the
/// group does not have is past its places.
fn place(members: &[Rank], rank: Rank) -> usize {
    members.binary_search(&rank).unwrap_or(members.len())
}

/// `kind` as a group of `members` runs it: a root named by its rank is at its place.
pub(crate) fn placed(kind: CollectiveKind, members: &[Rank]) -> CollectiveKind {
    match kind {
        CollectiveKind::Broadcast { root } => CollectiveKind::Broadcast {
            root: place(members, root),
        },
        CollectiveKind::Reduce { root, op } => CollectiveKind::Reduce {
            root: place(members, root),
            op,
        },
        kind => kind,
    }
}

/// One rank's part in one collective call.
pub struct Exchange<B: Buffer> {
    call: CollectiveCall,
    rank: Rank,
    chunk: usize,
    plan: Vec<Transfer>,
    /// Per chunk index, the next transfer of the plan it has to go through.
    cursors: Vec<usize>,
    /// Chunk indexes not through the plan yet.
    running: usize,
    /// The plan's receive for each (peer, step).
    receives: HashMap<(Rank, u32), usize>,
    /// Pieces received before their chunk index reached their transfer.
    early: HashMap<(usize, u32), B::Part>,
    outbox: VecDeque<(Rank, Piece<B::Part>)>,
    buffer: B,
    /// Whether the result, once done, holds a piece of every rank's (`plan::vouches`).
    vouches: bool,
}

impl<B: Buffer> fmt::Debug for Exchange<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exchange")
            .field("call", &self.call)
            .field("rank", &self.rank)
            .field("running", &self.running)
            .field("waiting_on", &self.waiting_on())
            .finish_non_exhaustive()
    }
}

impl<B: Buffer> Exchange<B> {
    /// Rank `rank`'s part, among `ranks` ranks, in `call` on `buffer` (whose length is
    /// `call.len`). The first pieces to send are ready at once.
    pub fn new(call: CollectiveCall, ranks: usize, rank: Rank, buffer: B) -> Self {
        Exchange::made(call, ranks, rank, buffer, None)
    }

    /// Rank `rank`'s part in `call` on `buffer` among the ranks of a group, `members` (in
    /// rank order, `rank` among them): the plan is the group's as if its ranks were `0..`,
    /// its pieces going to and coming from the ranks themselves.
    pub(crate) fn among(call: CollectiveCall, members: &[Rank], rank: Rank, buffer: B) -> Self {
        Exchange::made(call, members.len(), rank, buffer, Some(members))
    }

    fn made(
        call: CollectiveCall,
        ranks: usize,
        rank: Rank,
        buffer: B,
        members: Option<&[Rank]>,
    ) -> Self {
        debug_assert_eq!(buffer.len() as u64, call.len);
        let chunk = usize::try_from(call.chunk.max(1)).unwrap_or(usize::MAX);
        // A group's plan is made among its places, `0..ranks`.
        let (kind, local) = match members {
            None => (call.kind, rank),
            Some(members) => (placed(call.kind, members), place(members, rank)),
        };
        let mut plan = plan(kind, call.algorithm, ranks, local, buffer.len());
        if let Some(members) = members {
            for transfer in &mut plan {
                match transfer {
                    Transfer::Send { to: peer, .. } | Transfer::Recv { from: peer, .. } => {
                        *peer = members[*peer];
                    }
                }
            }
        }
        let chunks = plan
            .iter()
            .map(|t| t.range().len().div_ceil(chunk))
            .max()
            .unwrap_or(0);
        let receives = plan
            .iter()
            .enumerate()
            .filter_map(|(i, t)| match t {
                Transfer::Recv { from, step, .. } => Some(((*from, *step), i)),
                Transfer::Send { .. } => None,
            })
            .collect();
        let mut exchange = Exchange {
            call,
            rank,
            chunk,
            plan,
            cursors: vec![0; chunks],
            running: chunks,
            receives,
            early: HashMap::new(),
            outbox: VecDeque::new(),
            vouches: vouches(kind, ranks, local, buffer.len()),
            buffer,
        };
        for index in 0..chunks {
            exchange.advance(index);
        }
        exchange
    }

    /// The call.
    pub fn call(&self) -> &CollectiveCall {
        &self.call
    }

    /// Whether the result, once [`is_done`](Self::is_done), proves that every rank made
    /// this call: it holds a piece of every other rank's, come straight from it or through
    /// ranks that folded or passed it on, each checked against the receiver's call. An
    /// `all_reduce` does; a broadcast, a reduce off its root, an empty value do not.
    pub fn vouches(&self) -> bool {
        self.vouches
    }

    /// Whether every piece was received and every piece to send handed out by
    /// [`poll_send`](Self::poll_send).
    pub fn is_done(&self) -> bool {
        self.running == 0 && self.outbox.is_empty()
    }

    /// The next piece to send, and to whom.
    pub fn poll_send(&mut self) -> Option<(Rank, Piece<B::Part>)> {
        self.outbox.pop_front()
    }

    /// The peers a piece is awaited from, in rank order: whom a wait that times out names.
    pub fn waiting_on(&self) -> Vec<Rank> {
        let mut peers: Vec<Rank> = self
            .cursors
            .iter()
            .filter_map(|&at| match self.plan.get(at) {
                Some(Transfer::Recv { from, .. }) => Some(*from),
                _ => None,
            })
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// A piece `from` sent. Whatever it holds, it is applied in its turn or refused with
    /// an error naming `from`; the exchange is unchanged by a refused piece.
    pub fn handle_piece(&mut self, from: Rank, piece: Piece<B::Part>) -> Result<(), SyncError> {
        if piece.call != self.call {
            return Err(SyncError::CollectiveMismatch {
                rank: self.rank,
                call: Box::new(self.call),
                peer: from,
                peer_call: Box::new(piece.call),
            });
        }
        let Some(&at) = self.receives.get(&(from, piece.step)) else {
            return Err(self.bad(
                from,
                format!(
                    "rank {from} sends nothing at step {} to rank {}",
                    piece.step, self.rank
                ),
            ));
        };
        let range = self.chunk_range(at, piece.chunk as usize);
        if range.is_empty() {
            return Err(self.bad(
                from,
                format!("step {} has no chunk {}", piece.step, piece.chunk),
            ));
        }
        let index = piece.chunk as usize;
        if self.cursors[index] > at || self.early.contains_key(&(at, piece.chunk)) {
            return Err(self.bad(
                from,
                format!("chunk {} of step {} came twice", piece.chunk, piece.step),
            ));
        }
        let got = B::part_len(&piece.part);
        if got != range.len() {
            return Err(self.bad(
                from,
                format!(
                    "chunk {} of step {} holds {got} element(s), not {}",
                    piece.chunk,
                    piece.step,
                    range.len()
                ),
            ));
        }
        self.early.insert((at, piece.chunk), piece.part);
        self.advance(index);
        Ok(())
    }

    /// The value, once [`is_done`](Self::is_done).
    pub fn into_buffer(self) -> B {
        self.buffer
    }

    fn bad(&self, peer: Rank, reason: String) -> SyncError {
        SyncError::BadPiece {
            rank: self.rank,
            call: self.call,
            peer,
            reason,
        }
    }

    /// Chunk `index` of transfer `at`'s range (empty when the range has no such chunk).
    fn chunk_range(&self, at: usize, index: usize) -> Range<usize> {
        let range = self.plan[at].range();
        let start = range
            .start
            .saturating_add(index.saturating_mul(self.chunk))
            .min(range.end);
        start..start.saturating_add(self.chunk).min(range.end)
    }

    /// Moves chunk index `index` through the plan as far as the pieces it has received
    /// let it: sends go out, receives received are applied, and it stops at the first
    /// receive still awaited.
    fn advance(&mut self, index: usize) {
        let mut at = self.cursors[index];
        while at < self.plan.len() {
            let range = self.chunk_range(at, index);
            if !range.is_empty() {
                match &self.plan[at] {
                    Transfer::Send { to, step, .. } => {
                        let piece = Piece {
                            call: self.call,
                            step: *step,
                            chunk: index as u32,
                            part: self.buffer.part(range),
                        };
                        self.outbox.push_back((*to, piece));
                    }
                    Transfer::Recv { apply, .. } => {
                        let Some(part) = self.early.remove(&(at, index as u32)) else {
                            break;
                        };
                        match apply {
                            Apply::Put => self.buffer.put(range, part),
                            Apply::FoldFirst => self.buffer.fold(range, part, true),
                            Apply::FoldAfter => self.buffer.fold(range, part, false),
                        }
                    }
                }
            }
            at += 1;
        }
        // A chunk index is advanced only while it is short of the end (a piece for one
        // at the end is refused as a duplicate), so reaching the end counts once.
        self.cursors[index] = at;
        if at == self.plan.len() {
            self.running -= 1;
        }
    }
}
