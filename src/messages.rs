//! Pregel's messages between supersteps: in compute of superstep i a worker sends messages
//! to ranks ([`WorkerContext::send`]), and at superstep i + 1 each rank reads what was
//! sent to it ([`WorkerContext::messages`]), in the order of the sender's rank, then of
//! its sends.
//!
//! After each compute (and its interceptors' `post_iteration`) the runtime runs the
//! exchange, rounds of the collective [`CollectiveKind::Messages`]: in each every rank
//! sends each other rank one piece — its batch of messages for that rank, possibly empty,
//! or across processes a part of it no larger than a frame — and receives one from each,
//! over the peer mesh, never through the master; one round, unless a batch needs more
//! frames (see [`exchange`]). The collective's rules are the other
//! collectives' (every rank makes it; a peer that does not send within the sync timeout
//! is named; a lost peer fails it), so a superstep whose messages did not all arrive
//! fails naming the sender, and pieces of another attempt are dropped.
//!
//! A job's messages have one type, declared with
//! [`JobBuilder::messages`](crate::JobBuilder::messages) (or a combiner,
//! [`JobBuilder::combine_messages`](crate::JobBuilder::combine_messages)): messages to
//! another process with the same key are folded into one before they leave the sender, and
//! the batches from every sender again as they arrive; in one process they are handed over
//! as they were sent.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::collective::buffers::{decode_as_is, encode_as_is};
use crate::compute::{Post, WorkerContext};
use crate::error::{MessageError, SyncError};
use crate::ids::{Algorithm, CollectiveKind, Rank};
use crate::protocol::{Buffer, Carried, MailCount};

/// Makes a worker's mailbox: the job's message type and combiner, known where the job is
/// built.
pub(crate) type MakePost<M, W> = Arc<dyn Fn(usize) -> Box<dyn Post<M, W>> + Send + Sync>;

/// How messages with one key to one rank fold into one.
pub(crate) trait MessageCombiner<G>: Send + Sync {
    /// Moves the messages of the batches `from`, one batch after the other, into `into`
    /// (emptied first), each key once, where it first came, the later messages with its
    /// key folded into it in order. The batches are read where they lie and left empty
    /// with their capacity, for the next superstep. `scratch` is the caller's, kept from
    /// one call to the next.
    fn combine(&self, from: &mut [Vec<G>], into: &mut Vec<G>, scratch: &mut Scratch);
}

/// What a combiner keeps between its calls: where each key's message stands.
#[derive(Default)]
pub(crate) struct Scratch {
    /// By key less the least key, for keys that are whole numbers close together: the
    /// index of its message, or [`NONE`].
    slots: Vec<u32>,
    /// Each message's key, as a whole number, while a batch is combined through slots.
    keys: Vec<u64>,
    /// For other keys: a map of the combiner's key type to the index of its message.
    index: Option<Box<dyn Any + Send>>,
}

/// A slot with no message yet.
const NONE: u32 = u32::MAX;

type Index<K> = HashMap<K, usize, foldhash::fast::RandomState>;

/// A combiner by a key and a fold (`JobBuilder::combine_messages`).
pub(crate) struct ByKey<K, F> {
    key: K,
    fold: F,
}

impl<K, F> ByKey<K, F> {
    pub(crate) fn new(key: K, fold: F) -> Self {
        ByKey { key, fold }
    }
}

/// A key as a whole number, when its type is one of Rust's unsigned integers (or a signed
/// one, from 0): vertex ids, most often. Decided by type, so each use compiles to one way.
fn whole<Key: 'static>(key: &Key) -> Option<u64> {
    let key = key as &dyn Any;
    if let Some(&k) = key.downcast_ref::<u32>() {
        Some(u64::from(k))
    } else if let Some(&k) = key.downcast_ref::<u64>() {
        Some(k)
    } else if let Some(&k) = key.downcast_ref::<usize>() {
        Some(k as u64)
    } else if let Some(&k) = key.downcast_ref::<i64>() {
        u64::try_from(k).ok()
    } else if let Some(&k) = key.downcast_ref::<i32>() {
        u64::try_from(k).ok()
    } else if let Some(&k) = key.downcast_ref::<u16>() {
        Some(u64::from(k))
    } else if let Some(&k) = key.downcast_ref::<u8>() {
        Some(u64::from(k))
    } else {
        None
    }
}

impl<K, F> ByKey<K, F> {
    /// The least key of the messages of `batches` and how many keys from it the slots
    /// span, when every key is a whole number and the span is at most twice the messages
    /// (and 64 Ki more): the slots then cost less than a map's entries. Each message's key
    /// goes in `keys`, so that the key of a message is asked once.
    fn span<G, Key: 'static>(&self, batches: &[Vec<G>], keys: &mut Vec<u64>) -> Option<(u64, usize)>
    where
        K: Fn(&G) -> Key,
    {
        keys.clear();
        let (mut least, mut most) = (u64::MAX, 0);
        for message in batches.iter().flatten() {
            let key = whole(&(self.key)(message))?;
            least = least.min(key);
            most = most.max(key);
            keys.push(key);
        }
        let span = usize::try_from(most.checked_sub(least)?.checked_add(1)?).ok()?;
        let messages = keys.len();
        (span <= messages.saturating_mul(2).saturating_add(1 << 16) && messages < NONE as usize)
            .then_some((least, span))
    }

    /// [`combine`](MessageCombiner::combine) through slots by key (`keys`, each message's,
    /// from [`span`](Self::span)): one array read and one write per message, no hashing.
    fn by_slots<G>(
        &self,
        from: &mut [Vec<G>],
        into: &mut Vec<G>,
        slots: &mut [u32],
        (keys, least): (&[u64], u64),
    ) where
        F: Fn(&mut G, G),
    {
        let messages = from.iter_mut().flat_map(|batch| batch.drain(..));
        for (message, &key) in messages.zip(keys) {
            let slot = &mut slots[(key - least) as usize];
            if *slot == NONE {
                *slot = into.len() as u32;
                into.push(message);
            } else {
                (self.fold)(&mut into[*slot as usize], message);
            }
        }
    }

    /// [`combine`](MessageCombiner::combine) through a map by key.
    fn by_map<G, Key: Hash + Eq>(&self, from: &mut [Vec<G>], into: &mut Vec<G>, at: &mut Index<Key>)
    where
        K: Fn(&G) -> Key,
        F: Fn(&mut G, G),
    {
        at.clear();
        for message in from.iter_mut().flat_map(|batch| batch.drain(..)) {
            match at.entry((self.key)(&message)) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    (self.fold)(&mut into[*e.get()], message)
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(into.len());
                    into.push(message);
                }
            }
        }
    }
}

impl<G, Key, K, F> MessageCombiner<G> for ByKey<K, F>
where
    G: Send + 'static,
    Key: Hash + Eq + Send + 'static,
    K: Fn(&G) -> Key + Send + Sync + 'static,
    F: Fn(&mut G, G) + Send + Sync + 'static,
{
    fn combine(&self, from: &mut [Vec<G>], into: &mut Vec<G>, scratch: &mut Scratch) {
        into.clear();
        if let Some((least, span)) = self.span(from, &mut scratch.keys) {
            let slots = &mut scratch.slots;
            slots.clear();
            slots.resize(span, NONE);
            self.by_slots(from, into, slots, (&scratch.keys, least));
            return;
        }
        let index = scratch
            .index
            .get_or_insert_with(|| Box::new(Index::<Key>::default()));
        match index.downcast_mut::<Index<Key>>() {
            Some(at) => self.by_map(from, into, at),
            None => self.by_map(from, into, &mut Index::default()),
        }
    }
}

/// A worker's mailbox: what its compute sends this superstep, by rank, and what it was
/// sent in the one before.
pub(crate) struct Mailbox<G> {
    /// By rank; made on the first send, kept with their capacity from one superstep to
    /// the next.
    out: Vec<Vec<G>>,
    /// By rank, how many messages its batch held when it was last sent, and how many
    /// bytes they took encoded.
    last: Vec<usize>,
    last_bytes: Vec<usize>,
    /// By rank, whether its batch holds one message a key already, this superstep: not
    /// combined again before it leaves.
    folded: Vec<bool>,
    workers: usize,
    inbox: Vec<G>,
    /// A batch as combined, before it is encoded.
    combined: Vec<G>,
    scratch: Scratch,
    sent: u64,
    combiner: Option<Arc<dyn MessageCombiner<G>>>,
    /// Whether the batches that arrive from other processes are combined again, all
    /// senders' together (not where the receiver folds them into its own places itself,
    /// as a graph job's workers do).
    arrivals: bool,
}

impl<G: Send + 'static> Mailbox<G> {
    /// A mailbox for `workers` ranks; with a combiner, batches are combined before they
    /// leave for another process, and, if `arrivals`, again as they arrive.
    pub(crate) fn new(
        workers: usize,
        combiner: Option<Arc<dyn MessageCombiner<G>>>,
        arrivals: bool,
    ) -> Self {
        Mailbox {
            out: Vec::new(),
            last: vec![0; workers],
            last_bytes: vec![0; workers],
            folded: vec![false; workers],
            workers,
            inbox: Vec::new(),
            combined: Vec::new(),
            scratch: Scratch::default(),
            sent: 0,
            combiner,
            arrivals,
        }
    }

    /// The batches by rank, made on the first send.
    pub(crate) fn batches(&mut self) -> &mut [Vec<G>] {
        if self.out.is_empty() {
            self.out = (0..self.workers).map(|_| Vec::new()).collect();
        }
        &mut self.out
    }

    /// Says that the batch for rank `to` holds at most one message a key this superstep,
    /// as it was folded where it was sent: it is not combined again before it leaves.
    pub(crate) fn mark_folded(&mut self, to: Rank) {
        if let Some(folded) = self.folded.get_mut(to) {
            *folded = true;
        }
    }

    /// Counts `n` messages sent into [`batches`](Self::batches) by hand.
    pub(crate) fn count_sent(&mut self, n: u64) {
        self.sent += n;
    }

    /// What was sent to this rank in the superstep before, taken to be read where it
    /// lies; [`give_back`](Self::give_back) returns the buffer.
    pub(crate) fn take_inbox(&mut self) -> Vec<G> {
        std::mem::take(&mut self.inbox)
    }

    /// Returns a taken inbox's buffer, emptied, to be filled again: sent into, if a rank's
    /// batch is empty and has less room than the messages last sent it (so that in one process, where
    /// batches are handed over as they are, a buffer goes from sender to receiver and
    /// back, and a worker does not hold one to read and another to send into), or else
    /// kept to receive into.
    pub(crate) fn give_back(&mut self, mut inbox: Vec<G>) {
        inbox.clear();
        // Only an empty batch: one that was sent into this superstep keeps its messages.
        let short = (self.out.iter().zip(&self.last).enumerate())
            .filter(|(_, (batch, _))| batch.is_empty())
            .map(|(to, (batch, &last))| (to, last.saturating_sub(batch.capacity())))
            .max_by_key(|&(_, short)| short);
        if let Some((to, _)) =
            short.filter(|&(to, short)| short > 0 && inbox.capacity() > self.out[to].capacity())
        {
            inbox = std::mem::replace(&mut self.out[to], inbox);
        }
        if self.inbox.is_empty() && self.inbox.capacity() < inbox.capacity() {
            self.inbox = inbox;
        }
    }
}

/// The mailbox of type `G` of a worker's context, in compute.
pub(crate) fn mailbox<M, W, G: 'static>(
    ctx: &mut WorkerContext<M, W>,
) -> Result<&mut Mailbox<G>, MessageError> {
    outbox::<M, W, G>(&mut ctx.mail, ctx.iteration)
}

/// Sends each rank its batch of `out` (by rank) and returns what every rank sent this
/// one (by sender): the superstep's message exchange, run once more for data of another
/// type — a graph's edges, as they go to the ranks that own them. Every rank must call it
/// in the same compute, as a collective.
pub(crate) fn all_to_all<M, W, T>(
    ctx: &mut WorkerContext<M, W>,
    mut out: Vec<Vec<T>>,
) -> Result<Vec<Vec<T>>, SyncError>
where
    W: 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
{
    let (n, rank) = (ctx.workers, ctx.rank);
    out.resize_with(n, Vec::new);
    let own = std::mem::take(&mut out[rank]);
    let leaving = if ctx.peers_take_values() {
        Leaving::Values(out)
    } else {
        let limit = ctx.max_piece();
        let pieces = out.iter().map(|batch| pieces(batch, limit, 0));
        let pieces = pieces.collect::<Result<Vec<_>, _>>().map_err(|e| {
            SyncError::Codec(format!(
                "rank {rank}'s values of type {} do not encode: {e}",
                std::any::type_name::<T>()
            ))
        })?;
        Leaving::pieces(pieces, rank)
    };
    let mut got: Vec<Vec<T>> = (0..n).map(|_| Vec::new()).collect();
    exchange(ctx, leaving, |came| gather(&mut got, came))?;
    got[rank] = own;
    Ok(got)
}

/// Appends what came from each sender in a round to what came from it before.
fn gather<G>(got: &mut [Vec<G>], came: &mut [Vec<G>]) {
    for (got, came) in got.iter_mut().zip(came) {
        if got.is_empty() {
            std::mem::swap(got, came);
        } else {
            got.append(came);
        }
    }
}

/// The head of a piece of the messages exchange — one rank's batch for another, or a
/// part of it — in MessagePack: an array of two, how many rounds its sender's pieces
/// take (a `uint 32`) and the messages (an `array 32`), so that it decodes as
/// `(u32, Vec<G>)`. Its numbers are written once they are known.
const HEAD: [u8; 11] = [0x92, 0xce, 0, 0, 0, 0, 0xdd, 0, 0, 0, 0];

/// `batch` encoded in pieces of at most `limit` bytes each (with no limit, in one),
/// every message whole in one piece; each head says how many messages its piece holds.
/// `hint` is how many bytes the pieces may take in all (the batch before this one's, say):
/// made that large at once, a piece does not grow from nothing, copied at every doubling.
/// A message larger than the limit makes a piece of its own, which the transport refuses
/// naming both ranks, the size and the limit.
fn pieces<G: Serialize>(
    batch: &[G],
    limit: Option<usize>,
    hint: usize,
) -> Result<Vec<Vec<u8>>, rmp_serde::encode::Error> {
    let limit = limit.unwrap_or(usize::MAX);
    let mut left = hint;
    // A piece of what is left of the hint, a message over the limit included.
    let made = |left: usize| {
        let mut piece = Vec::with_capacity(left.min(limit).saturating_add(64).max(HEAD.len()));
        piece.extend_from_slice(&HEAD);
        piece
    };
    let mut pieces = Vec::new();
    let mut piece = made(left);
    let mut count = 0u32;
    for message in batch {
        let at = piece.len();
        crate::codec::write(&mut piece, message)?;
        if count > 0 && (piece.len() > limit || count == u32::MAX) {
            left = left.saturating_sub(at);
            let mut next = made(left);
            next.extend_from_slice(&piece[at..]);
            piece.truncate(at);
            piece[7..11].copy_from_slice(&count.to_be_bytes());
            pieces.push(std::mem::replace(&mut piece, next));
            count = 0;
        }
        count += 1;
    }
    piece[7..11].copy_from_slice(&count.to_be_bytes());
    pieces.push(piece);
    Ok(pieces)
}

/// What one rank sends each rank in the messages exchange, by rank (its own slot empty).
enum Leaving<G> {
    /// In one process: the batches themselves, handed over in one round.
    Values(Vec<Vec<G>>),
    /// Encoded, each batch in one piece or more; a round carries one of each.
    Pieces {
        pieces: Vec<std::vec::IntoIter<Bytes>>,
        /// The rounds they take: the most pieces of one batch.
        rounds: u32,
    },
}

impl<G> Leaving<G> {
    /// The pieces of each batch by rank, from [`pieces`], their heads given the rounds
    /// they take; `rank`'s own slot is not sent.
    fn pieces(by_rank: Vec<Vec<Vec<u8>>>, rank: Rank) -> Self {
        let most = by_rank.iter().enumerate().filter(|&(to, _)| to != rank);
        let most = most.map(|(_, p)| p.len()).max().unwrap_or(1);
        let rounds = u32::try_from(most.max(1)).unwrap_or(u32::MAX);
        let pieces = by_rank.into_iter().enumerate().map(|(to, pieces)| {
            let pieces = if to == rank { Vec::new() } else { pieces };
            let bytes = pieces.into_iter().map(|mut piece| {
                piece[2..6].copy_from_slice(&rounds.to_be_bytes());
                Bytes::from(piece)
            });
            bytes.collect::<Vec<_>>().into_iter()
        });
        Leaving::Pieces {
            pieces: pieces.collect(),
            rounds,
        }
    }
}

/// Runs the messages exchange of `leaving` with every rank, and hands `fold` what came
/// in each round, decoded, by sender (this rank's own slot empty), to set in place.
///
/// In one process the batches go in one round. Encoded, a round of the `Messages`
/// collective carries one piece from each rank to each, and there are as many rounds as
/// the most pieces any rank's batch took: every first piece says how many its sender
/// needs, so that after the first round every rank knows the most. A receiver so holds at
/// most one frame of each sender (and one of the next round, from a sender ahead of it)
/// before it is decoded and `fold` takes its messages. Returns the rounds.
fn exchange<M, W, G>(
    ctx: &mut WorkerContext<M, W>,
    leaving: Leaving<G>,
    mut fold: impl FnMut(&mut [Vec<G>]),
) -> Result<u32, SyncError>
where
    W: 'static,
    G: Serialize + DeserializeOwned + Send + 'static,
{
    let (mut pieces, mine) = match leaving {
        Leaving::Values(batches) => {
            let mut done = round(ctx, batches.into_iter().map(Bag::Values).collect())?;
            fold(&mut done.inbox);
            return Ok(1);
        }
        Leaving::Pieces { pieces, rounds } => (pieces, rounds),
    };
    let rank = ctx.rank;
    // A batch in fewer pieces than the most sends empty ones after its last.
    let empty = {
        let mut head = HEAD;
        head[2..6].copy_from_slice(&mine.to_be_bytes());
        Bytes::copy_from_slice(&head)
    };
    let mut said: Vec<u32> = Vec::new();
    let mut rounds = mine;
    let mut k = 0;
    loop {
        let bags = pieces.iter_mut().enumerate().map(|(to, pieces)| {
            if to == rank {
                return Bag::Values(Vec::new());
            }
            Bag::Encoded(pieces.next().unwrap_or_else(|| empty.clone()))
        });
        let mut done = round(ctx, bags.collect())?;
        if k == 0 {
            rounds = done.rounds.iter().copied().fold(mine, u32::max);
            said = done.rounds;
        } else if let Some((peer, &now)) =
            (done.rounds.iter().enumerate()).find(|&(peer, &r)| peer != rank && r != said[peer])
        {
            return Err(SyncError::Codec(format!(
                "rank {peer}'s pieces of the superstep's messages for rank {rank} disagree on the rounds they take: {} in its first, {now} in round {}",
                said[peer],
                k + 1
            )));
        }
        fold(&mut done.inbox);
        k += 1;
        if k >= rounds {
            return Ok(rounds);
        }
    }
}

/// One round of the messages exchange: `bags` to each rank, by rank.
fn round<M, W, G>(ctx: &mut WorkerContext<M, W>, bags: Vec<Bag<G>>) -> Result<Bags<G>, SyncError>
where
    W: 'static,
    G: Serialize + DeserializeOwned + Send + 'static,
{
    let n = ctx.workers;
    let buffer = Bags {
        n,
        out: RefCell::new(bags),
        inbox: (0..n).map(|_| Vec::new()).collect(),
        rounds: vec![0; n],
    };
    ctx.collective(CollectiveKind::Messages, Algorithm::Ring, 1, buffer)
}

impl<M, W, G> Post<M, W> for Mailbox<G>
where
    W: 'static,
    G: Serialize + DeserializeOwned + Send + 'static,
{
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<G>()
    }

    fn save(&self) -> Result<Vec<u8>, String> {
        // Nothing on its way is nothing saved: a checkpoint whose workers keep no state and
        // have no message coming holds nothing of their shards (see `WorkerSave::is_empty`).
        if self.inbox.is_empty() {
            return Ok(Vec::new());
        }
        crate::codec::to_vec(&self.inbox).map_err(|e| {
            format!(
                "the messages of type {} on their way to this rank do not encode: {e}",
                std::any::type_name::<G>()
            )
        })
    }

    fn restore(&mut self, saved: &[u8]) -> Result<(), String> {
        if saved.is_empty() {
            self.inbox.clear();
            return Ok(());
        }
        self.inbox = decode_as_is(saved).map_err(|e| {
            format!(
                "the checkpoint's messages for this rank do not decode as {}: {e}",
                std::any::type_name::<G>()
            )
        })?;
        Ok(())
    }

    fn exchange(&mut self, ctx: &mut WorkerContext<M, W>) -> Result<MailCount, SyncError> {
        let (rank, n) = (ctx.rank, ctx.workers);
        // Encoded here, before the call, where the peers are in other processes (or the
        // wire check is on): a message that does not encode fails this rank's call, as a
        // result that does not encode fails its worker. Only then are they combined.
        let encoded = !ctx.peers_take_values();
        let limit = ctx.max_piece();
        self.batches();
        let mut count = MailCount {
            sent: std::mem::take(&mut self.sent),
            rounds: 1,
            ..MailCount::default()
        };
        let mut own = Vec::new();
        let leaving = if encoded {
            let mut by_rank = Vec::with_capacity(n);
            for (to, batch) in self.out.iter_mut().enumerate() {
                self.last[to] = batch.len();
                let folded = std::mem::take(&mut self.folded[to]);
                let leaving = match self.combiner.as_ref().filter(|_| !folded) {
                    Some(c) => {
                        c.combine(
                            std::slice::from_mut(batch),
                            &mut self.combined,
                            &mut self.scratch,
                        );
                        &mut self.combined
                    }
                    None => batch,
                };
                count.delivered += leaving.len() as u64;
                if to == rank {
                    own = std::mem::take(leaving);
                    by_rank.push(Vec::new());
                    continue;
                }
                let pieces = pieces(leaving, limit, self.last_bytes[to]).map_err(|e| {
                    SyncError::Codec(format!(
                        "rank {rank}'s messages of type {} to rank {to} do not encode: {e}",
                        std::any::type_name::<G>()
                    ))
                })?;
                self.last_bytes[to] = pieces.iter().map(Vec::len).sum();
                count.bytes += self.last_bytes[to] as u64;
                by_rank.push(pieces);
                leaving.clear();
            }
            Leaving::pieces(by_rank, rank)
        } else {
            let batches = self.out.iter_mut().enumerate().map(|(to, batch)| {
                count.delivered += batch.len() as u64;
                self.last[to] = batch.len();
                let batch = std::mem::take(batch);
                // The own slot is never sent.
                if to == rank {
                    own = batch;
                    Vec::new()
                } else {
                    batch
                }
            });
            Leaving::Values(batches.collect())
        };
        // What came, by sender, this rank's own batch in its place, gathered over the
        // rounds; then, with a combiner (where they were encoded), combined — in one call
        // over them all, so that the inbox is the same whatever the frames.
        let mut got: Vec<Vec<G>> = (0..n).map(|_| Vec::new()).collect();
        count.rounds = exchange(ctx, leaving, |came| {
            // This rank's own batch in its place, in the first round.
            if came[rank].is_empty() {
                came[rank] = std::mem::take(&mut own);
            }
            count.received += came.iter().map(|b| b.len() as u64).sum::<u64>();
            gather(&mut got, came);
        })? as u64;
        self.folded.fill(false);
        match self.combiner.as_ref().filter(|_| encoded && self.arrivals) {
            Some(c) => c.combine(&mut got, &mut self.inbox, &mut self.scratch),
            None => {
                self.inbox.clear();
                let mut full = got.iter().enumerate().filter(|(_, b)| !b.is_empty());
                match (full.next(), full.next()) {
                    // One sender's batch (the other rank's, of two): the inbox itself, not
                    // a copy of it; the inbox's buffer goes back to be sent into.
                    (Some((from, _)), None) => std::mem::swap(&mut self.inbox, &mut got[from]),
                    _ => {
                        for batch in &mut got {
                            self.inbox.append(batch);
                        }
                    }
                }
            }
        }
        // The batches that came, emptied, are the next superstep's to send: no batch
        // grows from nothing again.
        for (slot, batch) in self.out.iter_mut().zip(got) {
            if slot.capacity() < batch.capacity() {
                *slot = batch;
            }
        }
        ctx.record_mail(&count);
        Ok(count)
    }
}

/// One rank's batch for another, as it travels.
enum Bag<G> {
    /// Handed over in one process.
    Values(Vec<G>),
    /// A piece to send, encoded (see [`HEAD`]).
    Encoded(Bytes),
    /// A piece received and decoded: the rounds its sender said it takes, and its
    /// messages.
    Came(u32, Vec<G>),
}

/// One round of the messages exchange as the `Messages` collective runs on it: element
/// `s × n + d` is rank `s`'s batch (or piece) for rank `d` (see the plan's `all_to_all`).
struct Bags<G> {
    n: usize,
    /// This rank's batch for each rank, by rank: each taken once, when it is sent.
    out: RefCell<Vec<Bag<G>>>,
    /// What each rank sent this one, by sender.
    inbox: Vec<Vec<G>>,
    /// The rounds each sender said its pieces take (0 where nothing was encoded).
    rounds: Vec<u32>,
}

impl<G> Buffer for Bags<G> {
    type Part = Bag<G>;

    fn len(&self) -> usize {
        self.n * self.n
    }

    fn part(&self, range: Range<usize>) -> Bag<G> {
        let to = range.start % self.n;
        std::mem::replace(&mut self.out.borrow_mut()[to], Bag::Values(Vec::new()))
    }

    fn part_len(_: &Bag<G>) -> usize {
        // A batch is one element of the collective, however many messages it holds.
        1
    }

    fn put(&mut self, range: Range<usize>, part: Bag<G>) {
        let from = range.start / self.n;
        // Received pieces are decoded before they are put (`Carried::decode`).
        match part {
            Bag::Values(batch) => self.inbox[from] = batch,
            Bag::Came(rounds, batch) => {
                self.inbox[from] = batch;
                self.rounds[from] = rounds;
            }
            Bag::Encoded(_) => debug_assert!(false, "a piece put before it was decoded"),
        }
    }

    fn fold(&mut self, range: Range<usize>, part: Bag<G>, _: bool) {
        // The plan only puts.
        self.put(range, part);
    }
}

impl<G: Serialize + DeserializeOwned> Carried for Bags<G> {
    fn encode(part: Bag<G>) -> Result<Bytes, String> {
        match part {
            Bag::Encoded(bytes) => Ok(bytes),
            Bag::Values(batch) | Bag::Came(_, batch) => encode_as_is(&(1u32, batch)),
        }
    }

    fn what() -> String {
        format!("its messages of type {}", std::any::type_name::<G>())
    }

    fn decode(bytes: Bytes) -> Result<Bag<G>, String> {
        // A piece as `pieces` writes it: its messages into a vector made for as many as
        // its head says, not grown as they are decoded.
        let (rounds, batch) = match bytes.split_first_chunk::<11>() {
            Some((head, body)) if [head[0], head[1], head[6]] == [HEAD[0], HEAD[1], HEAD[6]] => {
                let rounds = u32::from_be_bytes([head[2], head[3], head[4], head[5]]);
                let count = u32::from_be_bytes([head[7], head[8], head[9], head[10]]);
                (rounds, crate::codec::from_slice_each(body, count as usize)?)
            }
            _ => decode_as_is(&bytes)?,
        };
        match rounds {
            0 => Err("a piece that says its sender's batches take 0 rounds".into()),
            rounds => Ok(Bag::Came(rounds, batch)),
        }
    }
}

impl<M, W: 'static> WorkerContext<M, W> {
    /// Sends `message` to rank `to`: the compute of rank `to` reads it in the next
    /// superstep ([`messages`](Self::messages)). It goes worker to worker, never through
    /// the master, after this compute returns. `G` must be the job's message type
    /// ([`JobBuilder::messages`](crate::JobBuilder::messages)).
    ///
    /// Fails — and, returned with `?`, fails this worker's compute — for a rank outside
    /// the job ([`MessageError::NoSuchRank`]), in a job without messages or with another
    /// message type, and outside compute.
    pub fn send<G: Send + 'static>(&mut self, to: Rank, message: G) -> Result<(), MessageError> {
        self.send_all(std::iter::once((to, message)))
    }

    /// Sends each `(rank, message)` of `messages`, in order, as [`send`](Self::send)
    /// does; stops at the first that fails.
    pub fn send_all<G: Send + 'static>(
        &mut self,
        messages: impl IntoIterator<Item = (Rank, G)>,
    ) -> Result<(), MessageError> {
        let workers = self.workers;
        let mailbox = outbox::<M, W, G>(&mut self.mail, self.iteration)?;
        let mut sent = 0;
        let batches = mailbox.batches();
        for (to, message) in messages {
            let Some(batch) = batches.get_mut(to) else {
                mailbox.sent += sent;
                return Err(MessageError::NoSuchRank { rank: to, workers });
            };
            batch.push(message);
            sent += 1;
        }
        mailbox.sent += sent;
        Ok(())
    }

    /// The messages sent to this rank in the superstep before, in the order of their
    /// senders' ranks, then of each sender's sends (this rank's own included, in its
    /// place). With a combiner, what came from other processes was folded by key —
    /// each key once, where it first came, folded in that order —, what came from this
    /// process was not (see [`JobBuilder::combine_messages`](crate::JobBuilder::combine_messages)).
    /// Empty in the first superstep.
    pub fn messages<G: 'static>(&self) -> Result<&[G], MessageError> {
        let post = self.mail.as_ref().ok_or(MessageError::NotDeclared {
            type_name: std::any::type_name::<G>(),
        })?;
        match post.as_any().downcast_ref::<Mailbox<G>>() {
            Some(mailbox) => Ok(&mailbox.inbox),
            None => Err(MessageError::OtherType {
                used: std::any::type_name::<G>(),
                job: post.type_name(),
            }),
        }
    }
}

/// The mailbox of type `G` a context's `mail` holds, to send into in `iteration`.
fn outbox<M, W, G: 'static>(
    mail: &mut Option<Box<dyn Post<M, W>>>,
    iteration: crate::ids::Iteration,
) -> Result<&mut Mailbox<G>, MessageError> {
    let post = mail.as_mut().ok_or(MessageError::NotDeclared {
        type_name: std::any::type_name::<G>(),
    })?;
    if iteration == 0 {
        return Err(MessageError::OutsideCompute);
    }
    let job = post.type_name();
    post.as_any_mut()
        .downcast_mut::<Mailbox<G>>()
        .ok_or(MessageError::OtherType {
            used: std::any::type_name::<G>(),
            job,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_inbox_saves_nothing_and_a_full_one_round_trips() {
        let mut mailbox = Mailbox::<u32>::new(2, None, true);
        let post: &mut dyn Post<(), ()> = &mut mailbox;
        assert_eq!(post.save().unwrap(), Vec::<u8>::new());
        post.restore(&[]).unwrap();
        mailbox.inbox = vec![4, 5];
        let post: &mut dyn Post<(), ()> = &mut mailbox;
        let saved = post.save().unwrap();
        assert!(!saved.is_empty());
        let mut other = Mailbox::<u32>::new(2, None, true);
        let into: &mut dyn Post<(), ()> = &mut other;
        into.restore(&saved).unwrap();
        assert_eq!(other.inbox, vec![4, 5]);
    }

    #[test]
    fn an_inbox_given_back_goes_to_an_empty_batch_short_of_room_and_never_over_a_full_one() {
        let mut mailbox = Mailbox::<u32>::new(3, None, true);
        mailbox.batches();
        mailbox.last = vec![0, 100, 50];
        // Rank 1's batch was sent into this superstep; rank 2's is empty.
        mailbox.out[1] = vec![7, 8];
        mailbox.give_back(Vec::with_capacity(120));
        assert_eq!(
            mailbox.out[1],
            [7, 8],
            "a batch sent into keeps its messages"
        );
        assert!(mailbox.out[2].is_empty() && mailbox.out[2].capacity() >= 120);
        assert_eq!(mailbox.inbox.capacity(), 0);
        // No batch short of room: kept to receive into.
        mailbox.give_back(Vec::with_capacity(30));
        assert!(mailbox.inbox.capacity() >= 30);
        assert_eq!(mailbox.out[1], [7, 8]);
    }

    #[test]
    fn a_piece_whose_head_miscounts_its_messages_fails_to_decode() {
        let batch: Vec<u32> = vec![1, 2, 300];
        let piece = pieces(&batch, None, 0).unwrap().remove(0);
        let mut said = piece.clone();
        said[2..6].copy_from_slice(&1u32.to_be_bytes());
        let Ok(Bag::Came(1, back)) = Bags::<u32>::decode(Bytes::from(said.clone())) else {
            panic!("a piece as written decodes");
        };
        assert_eq!(back, batch);
        for count in [2u32, 4, u32::MAX] {
            let mut wrong = said.clone();
            wrong[7..11].copy_from_slice(&count.to_be_bytes());
            let Err(e) = Bags::<u32>::decode(Bytes::from(wrong)) else {
                panic!("a head that says {count} messages of 3 decodes");
            };
            let want = match count {
                2 => "3 bytes left over after the 2 values it says it holds".to_string(),
                n => format!("its bytes end after 3 of the {n} values it says it holds"),
            };
            assert_eq!(e, want);
        }
    }

    /// Each key once, where it first came, its later messages folded into it in order:
    /// what every way of combining must give.
    fn reference<G: Clone, Key: PartialEq>(
        messages: &[G],
        key: impl Fn(&G) -> Key,
        fold: impl Fn(&mut G, G),
    ) -> Vec<G> {
        let mut out: Vec<G> = Vec::new();
        for m in messages {
            match out.iter_mut().find(|o| key(o) == key(m)) {
                Some(o) => fold(o, m.clone()),
                None => out.push(m.clone()),
            }
        }
        out
    }

    /// Combines `messages` twice with one scratch, as a mailbox does superstep after
    /// superstep.
    fn combined<G: Clone + PartialEq + std::fmt::Debug + Send + 'static>(
        combiner: &dyn MessageCombiner<G>,
        messages: &[G],
    ) -> Vec<G> {
        // In two batches the first time, as they arrive from two senders; in one the next.
        let half = messages.len() / 2;
        let mut from = vec![messages[..half].to_vec(), messages[half..].to_vec()];
        let (mut into, mut scratch) = (Vec::new(), Scratch::default());
        combiner.combine(&mut from, &mut into, &mut scratch);
        assert!(from.iter().all(Vec::is_empty));
        let first = into.clone();
        let mut from = [messages.to_vec()];
        combiner.combine(&mut from, &mut into, &mut scratch);
        assert_eq!(
            into, first,
            "in one batch or two, and with the scratch of a call before"
        );
        into
    }

    #[test]
    fn keys_as_far_apart_as_a_whole_number_goes_combine_through_the_map() {
        let messages: Vec<(u64, u32)> = vec![(u64::MAX, 1), (0, 2), (u64::MAX, 4), (7, 8)];
        let combiner = ByKey::new(
            |m: &(u64, u32)| m.0,
            |into: &mut (u64, u32), m: (u64, u32)| into.1 += m.1,
        );
        assert_eq!(
            combined(&combiner, &messages),
            [(u64::MAX, 5), (0, 2), (7, 8)]
        );
    }

    proptest::proptest! {
        #[test]
        fn a_batch_in_pieces_decodes_to_itself_in_order_each_piece_within_the_limit(
            lens in proptest::collection::vec(0usize..40, 0..300),
            limit in proptest::option::of(12usize..400),
            hint in proptest::sample::select(vec![0usize, 100, 1 << 20]),
        ) {
            // Messages of many sizes: strings of `len` letters.
            let batch: Vec<String> = lens.iter().map(|&n| "x".repeat(n)).collect();
            let pieces = pieces(&batch, limit, hint).unwrap();
            let leaving = Leaving::<String>::pieces(vec![Vec::new(), pieces], 0);
            let Leaving::Pieces { pieces, rounds } = leaving else { unreachable!() };
            let pieces: Vec<Bytes> = pieces.into_iter().nth(1).unwrap().collect();
            proptest::prop_assert_eq!(rounds as usize, pieces.len());
            let mut back = Vec::new();
            for piece in &pieces {
                let Bag::Came(said, part) = Bags::<String>::decode(piece.clone()).unwrap() else {
                    unreachable!()
                };
                proptest::prop_assert_eq!(said, rounds);
                proptest::prop_assert!(!part.is_empty() || pieces.len() == 1);
                // Over the limit only where one message alone is.
                if let Some(limit) = limit {
                    proptest::prop_assert!(piece.len() <= limit || part.len() == 1);
                }
                back.extend(part);
            }
            proptest::prop_assert_eq!(back, batch);
        }

        #[test]
        fn whole_keys_close_together_or_far_apart_combine_as_the_reference(
            keys in proptest::collection::vec(0u32..64, 0..200),
            spread in proptest::sample::select(vec![1u32, 1_000, 10_000_000]),
        ) {
            // (vertex, order sent): the fold keeps the order it saw them in.
            let messages: Vec<(u32, Vec<u32>)> =
                keys.iter().enumerate().map(|(i, &k)| (k * spread, vec![i as u32])).collect();
            let key = |m: &(u32, Vec<u32>)| m.0;
            let fold = |into: &mut (u32, Vec<u32>), m: (u32, Vec<u32>)| into.1.extend(m.1);
            let want = reference(&messages, key, fold);
            proptest::prop_assert_eq!(combined(&ByKey::new(key, fold), &messages), want);
        }

        #[test]
        fn keys_that_are_no_whole_numbers_combine_as_the_reference(
            keys in proptest::collection::vec(-8i64..8, 0..100),
        ) {
            let messages: Vec<(i64, u64)> =
                keys.iter().enumerate().map(|(i, &k)| (k, 1 << (i % 60))).collect();
            let want = reference(&messages, |m| m.0, |into, m| into.1 |= m.1);
            let by_number = ByKey::new(|m: &(i64, u64)| m.0, |into: &mut (i64, u64), m: (i64, u64)| into.1 |= m.1);
            proptest::prop_assert_eq!(combined(&by_number, &messages), want.clone());
            let by_text = ByKey::new(|m: &(i64, u64)| m.0.to_string(), |into: &mut (i64, u64), m: (i64, u64)| into.1 |= m.1);
            proptest::prop_assert_eq!(combined(&by_text, &messages), want);
        }
    }
}
