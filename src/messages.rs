//! Pregel's messages between supersteps: in compute of superstep i a worker sends messages
//! to ranks ([`WorkerContext::send`]), and at superstep i + 1 each rank reads what was
//! sent to it ([`WorkerContext::messages`]), in the order of the sender's rank, then of
//! its sends.
//!
//! After each compute (and its interceptors' `post_iteration`) the runtime runs one
//! collective, [`CollectiveKind::Messages`]: every rank sends each other rank one piece —
//! its batch of messages for that rank, possibly empty — and receives one from each,
//! over the peer mesh, never through the master. The collective's rules are the other
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
    /// An empty batch for one rank.
    fn batch(&self) -> Box<dyn Batch<G>>;
    /// Every sender's batch, in rank order, folded into one list: each key once, where it
    /// first came.
    fn merge(&self, batches: Vec<Vec<G>>) -> Vec<G>;
}

/// The messages on their way to one rank.
pub(crate) trait Batch<G>: Send {
    fn push(&mut self, message: G);
    fn take(&mut self) -> Vec<G>;
}

struct Plain<G>(Vec<G>);

impl<G: Send> Batch<G> for Plain<G> {
    fn push(&mut self, message: G) {
        self.0.push(message);
    }
    fn take(&mut self) -> Vec<G> {
        std::mem::take(&mut self.0)
    }
}

type Index<K> = HashMap<K, usize, foldhash::fast::RandomState>;

/// A combiner by a key and a fold (`JobBuilder::combine_messages`).
pub(crate) struct ByKey<K, F> {
    key: Arc<K>,
    fold: Arc<F>,
}

impl<K, F> ByKey<K, F> {
    pub(crate) fn new(key: K, fold: F) -> Self {
        ByKey {
            key: Arc::new(key),
            fold: Arc::new(fold),
        }
    }
}

struct Keyed<G, Key, K, F> {
    messages: Vec<G>,
    at: Index<Key>,
    key: Arc<K>,
    fold: Arc<F>,
}

impl<G, Key, K, F> Keyed<G, Key, K, F>
where
    Key: Hash + Eq,
    K: Fn(&G) -> Key,
    F: Fn(&mut G, G),
{
    fn add(&mut self, message: G) {
        let key = (self.key)(&message);
        match self.at.get(&key) {
            Some(&i) => (self.fold)(&mut self.messages[i], message),
            None => {
                self.at.insert(key, self.messages.len());
                self.messages.push(message);
            }
        }
    }
}

impl<G, Key, K, F> Batch<G> for Keyed<G, Key, K, F>
where
    G: Send,
    Key: Hash + Eq + Send,
    K: Fn(&G) -> Key + Send + Sync,
    F: Fn(&mut G, G) + Send + Sync,
{
    fn push(&mut self, message: G) {
        self.add(message);
    }
    fn take(&mut self) -> Vec<G> {
        self.at.clear();
        std::mem::take(&mut self.messages)
    }
}

impl<G, Key, K, F> MessageCombiner<G> for ByKey<K, F>
where
    G: Send + 'static,
    Key: Hash + Eq + Send + 'static,
    K: Fn(&G) -> Key + Send + Sync + 'static,
    F: Fn(&mut G, G) + Send + Sync + 'static,
{
    fn batch(&self) -> Box<dyn Batch<G>> {
        Box::new(self.keyed())
    }

    fn merge(&self, batches: Vec<Vec<G>>) -> Vec<G> {
        let mut all = self.keyed();
        for message in batches.into_iter().flatten() {
            all.add(message);
        }
        all.messages
    }
}

impl<K, F> ByKey<K, F> {
    fn keyed<G, Key>(&self) -> Keyed<G, Key, K, F> {
        Keyed {
            messages: Vec::new(),
            at: Index::default(),
            key: Arc::clone(&self.key),
            fold: Arc::clone(&self.fold),
        }
    }
}

/// A worker's mailbox: what its compute sends this superstep, by rank, and what it was
/// sent in the one before.
pub(crate) struct Mailbox<G> {
    /// By rank; made on the first send (see `batches`).
    out: Vec<Box<dyn Batch<G>>>,
    workers: usize,
    /// Whether the batches travel encoded (to other processes, or with the wire check):
    /// then they combine, when the job has a combiner.
    encoded: bool,
    inbox: Vec<G>,
    sent: u64,
    combiner: Option<Arc<dyn MessageCombiner<G>>>,
}

impl<G: Send + 'static> Mailbox<G> {
    pub(crate) fn new(workers: usize, combiner: Option<Arc<dyn MessageCombiner<G>>>) -> Self {
        Mailbox {
            out: Vec::new(),
            workers,
            encoded: false,
            inbox: Vec::new(),
            sent: 0,
            combiner,
        }
    }

    /// The batches, made on the first send (asking `encoded` then, once, whether they
    /// travel encoded): combining where they do and the job has a combiner; in one
    /// process a message is handed over as it is, which combining would only slow down.
    fn batches(&mut self, encoded: impl FnOnce() -> bool) -> &mut [Box<dyn Batch<G>>] {
        if self.out.is_empty() {
            self.encoded = encoded();
            let combiner = self.combiner.as_ref().filter(|_| self.encoded);
            self.out = (0..self.workers)
                .map(|_| match combiner {
                    Some(c) => c.batch(),
                    None => Box::new(Plain(Vec::new())) as Box<dyn Batch<G>>,
                })
                .collect();
        }
        &mut self.out
    }
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
        // result that does not encode fails its worker.
        let batches = self.batches(|| !ctx.peers_take_values());
        let mut out: Vec<Vec<G>> = batches.iter_mut().map(|b| b.take()).collect();
        let encoded = self.encoded;
        let mut count = MailCount {
            sent: std::mem::take(&mut self.sent),
            delivered: out.iter().map(|b| b.len() as u64).sum(),
            ..MailCount::default()
        };
        let own = std::mem::take(&mut out[rank]);
        let bags = out
            .into_iter()
            .enumerate()
            .map(|(to, batch)| {
                // The own slot is never sent.
                if !encoded || to == rank {
                    return Ok(Bag::Values(batch));
                }
                let bytes = encode_as_is(&batch).map_err(|e| {
                    SyncError::Codec(format!(
                        "rank {rank}'s messages of type {} to rank {to} do not encode: {e}",
                        std::any::type_name::<G>()
                    ))
                })?;
                count.bytes += bytes.len() as u64;
                Ok(Bag::Encoded(bytes))
            })
            .collect::<Result<Vec<_>, SyncError>>()?;
        let buffer = Bags {
            n,
            out: RefCell::new(bags),
            inbox: (0..n).map(|_| Vec::new()).collect(),
        };
        let done = ctx.collective(CollectiveKind::Messages, Algorithm::Ring, 1, buffer)?;
        let mut inbox = done.inbox;
        inbox[rank] = own;
        count.received = inbox.iter().map(|b| b.len() as u64).sum();
        self.inbox = match &self.combiner {
            Some(c) if self.encoded => c.merge(inbox),
            _ => inbox.into_iter().flatten().collect(),
        };
        Ok(count)
    }
}

/// One rank's batch for another, as it travels.
enum Bag<G> {
    Values(Vec<G>),
    Encoded(Bytes),
}

/// The superstep's batches as the `Messages` collective runs on them: element
/// `s × n + d` is rank `s`'s batch for rank `d` (see the plan's `all_to_all`).
struct Bags<G> {
    n: usize,
    /// This rank's batch for each rank, by rank: each taken once, when it is sent.
    out: RefCell<Vec<Bag<G>>>,
    /// What each rank sent this one, by sender.
    inbox: Vec<Vec<G>>,
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
        // Received batches are decoded before they are put (`Carried::decode`).
        if let Bag::Values(batch) = part {
            self.inbox[range.start / self.n] = batch;
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
            Bag::Values(batch) => encode_as_is(&batch),
        }
    }

    fn what() -> String {
        format!("its messages of type {}", std::any::type_name::<G>())
    }

    fn decode(bytes: Bytes) -> Result<Bag<G>, String> {
        decode_as_is(&bytes).map(Bag::Values)
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
        let sync = &self.sync;
        let mailbox = outbox::<M, W, G>(&mut self.mail, self.iteration)?;
        let mut sent = 0;
        let batches = mailbox.batches(|| !crate::collective::takes_values(sync));
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
        let mut mailbox = Mailbox::<u32>::new(2, None);
        let post: &mut dyn Post<(), ()> = &mut mailbox;
        assert_eq!(post.save().unwrap(), Vec::<u8>::new());
        post.restore(&[]).unwrap();
        mailbox.inbox = vec![4, 5];
        let post: &mut dyn Post<(), ()> = &mut mailbox;
        let saved = post.save().unwrap();
        assert!(!saved.is_empty());
        let mut other = Mailbox::<u32>::new(2, None);
        let into: &mut dyn Post<(), ()> = &mut other;
        into.restore(&saved).unwrap();
        assert_eq!(other.inbox, vec![4, 5]);
    }
}
