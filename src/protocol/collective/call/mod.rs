//! One rank's collective call, sans-IO: the [`Exchange`] and the rules around it — the
//! fence on attempt and epoch, pieces that came before the call, lost peers, the shape
//! check before any piece is decoded, the master's node's word on the call, and a silence
//! timer. Every input comes with `now`; nothing here reads a clock, waits or does I/O.
//!
//! Call order: [`RankCall::new`], then until [`RankCall::poll_outcome`] gives the end:
//! [`RankCall::poll_send`] until `None` (each piece sent, or its failure handed back with
//! [`RankCall::handle_send_failed`]); then wait for the next input until
//! [`RankCall::poll_timeout`] and hand it in — a peer's event
//! ([`RankCall::handle_peer`]), the master's node's answer ([`RankCall::handle_answer`]),
//! the job's failure ([`RankCall::handle_job_failed`]) or the time
//! ([`RankCall::handle_timeout`]). A blocking call and an async one differ only in how
//! they wait.

use std::time::{Duration, Instant};

use bytes::Bytes;

#[cfg(test)]
mod tests;

use super::{Buffer, CallShape, Exchange, PeerBody, PeerMessage, Piece};
use crate::error::SyncError;
use std::sync::Arc;

use crate::ids::{Attempt, CallAt, CallKey, CollectiveCall, CollectiveKind, Epoch, GroupId, Rank};

/// How long a rank that lost a peer in a call the master's node has not released yet
/// waits for the node's word on it.
pub(crate) const LOSS_GRACE: Duration = Duration::from_secs(1);

/// A [`Buffer`] whose parts can travel: as values between workers of one process, or
/// encoded between processes.
pub(crate) trait Carried: Buffer {
    /// From now on, [`part`](Buffer::part) makes parts that travel encoded.
    fn travel_encoded(&mut self) {}

    /// `part`, encoded.
    fn encode(part: Self::Part) -> Result<Bytes, String>;

    /// A part a peer sent encoded.
    fn decode(bytes: Bytes) -> Result<Self::Part, String>;

    /// What a part holds, as an error that it does not decode names it.
    fn what() -> String {
        "its elements".to_owned()
    }
}

/// What a worker's connections to its peers bring it.
#[derive(Debug)]
pub enum PeerEvent {
    /// A piece of a collective.
    Message(PeerMessage),
    /// The connection to a peer was lost: its collectives cannot go on.
    Lost {
        /// The peer.
        rank: Rank,
        /// The attempt the connection was made in: a worker of another attempt (one that
        /// replaced the worker in a gang restart) is not concerned.
        attempt: Attempt,
        /// What happened, with the peer's address where it has one.
        reason: String,
    },
}

/// What a worker's peers brought for calls it has not made yet, and the peers it lost:
/// only what belongs to its attempt.
pub(crate) struct Early {
    attempt: Attempt,
    events: Vec<PeerEvent>,
}

impl Early {
    /// Nothing yet, for a worker of `attempt`.
    pub(crate) fn new(attempt: Attempt) -> Self {
        Early {
            attempt,
            events: Vec::new(),
        }
    }

    /// Keeps what a peer sent for call `key` or a later one (the pieces of an
    /// `all_gather` that goes around the ring may come before the master's node's answer
    /// that starts it), or for another group's calls, and word of a lost peer; drops
    /// pieces of earlier calls of `key`'s group, and pieces and losses of other attempts
    /// (a connection of the attempt this worker replaced, found lost after the gang
    /// restart, is no loss of its).
    pub(crate) fn keep(&mut self, event: PeerEvent, key: CallKey) {
        match &event {
            PeerEvent::Message(m) if m.attempt != self.attempt || m.call.key().before(key) => {}
            PeerEvent::Lost { attempt, .. } if *attempt != self.attempt => {}
            _ => self.events.push(event),
        }
    }

    /// The pieces of call `key` that came early, taken out, in the order they came; and
    /// the first peer lost that `concerns` the call, if any was (kept: every later call
    /// fails on it too). Pieces of earlier calls of its group (kept while this rank made
    /// another call of their epoch, which the master's node failed) are dropped.
    pub(crate) fn take(
        &mut self,
        key: CallKey,
        concerns: impl Fn(Rank) -> bool,
    ) -> (Vec<PeerMessage>, Option<(Rank, String)>) {
        let mut lost = None;
        let mut pieces = Vec::new();
        let mut kept = Vec::new();
        for event in self.events.drain(..) {
            match event {
                PeerEvent::Message(m) if m.call.key() == key => pieces.push(m),
                PeerEvent::Message(m) if m.call.key().before(key) => {}
                PeerEvent::Lost {
                    rank,
                    attempt,
                    reason,
                } => {
                    if lost.is_none() && concerns(rank) {
                        lost = Some((rank, reason.clone()));
                    }
                    kept.push(PeerEvent::Lost {
                        rank,
                        attempt,
                        reason,
                    });
                }
                other => kept.push(other),
            }
        }
        self.events = kept;
        (pieces, lost)
    }
}

/// Where a call comes from: this rank's own, or — for a `broadcast` seen from a rank that
/// does not know the value's length — the first piece of it.
pub(crate) enum CallStart<B: Buffer> {
    /// The rank knows its part: the exchange is under way.
    Known(Box<Exchange<B>>),
    /// The first piece of a call of `kind` says the call; `make` makes the buffer it
    /// runs on, or says why the piece's call cannot be.
    Awaited {
        kind: CollectiveKind,
        make: fn(&CollectiveCall) -> Result<B, String>,
    },
}

impl<B: Buffer> CallStart<B> {
    /// What was called.
    pub(crate) fn kind(&self) -> CollectiveKind {
        match self {
            CallStart::Known(exchange) => exchange.call().kind,
            CallStart::Awaited { kind, .. } => *kind,
        }
    }
}

/// Who makes a call and the limits it keeps.
#[derive(Debug, Clone)]
pub(crate) struct CallSetup {
    /// The rank, among `workers`.
    pub(crate) rank: Rank,
    pub(crate) workers: usize,
    /// The group of ranks the call is among, and its ranks in order (`None`: every rank).
    pub(crate) group: GroupId,
    pub(crate) members: Option<Arc<[Rank]>>,
    /// The attempt its worker runs: pieces and losses of another are not this call's.
    pub(crate) attempt: Attempt,
    /// The call's number among the rank's sync calls of its group.
    pub(crate) epoch: Epoch,
    /// Where the call stands in the iteration.
    pub(crate) at: CallAt,
    /// How long the call waits with nothing coming before it fails (`Duration::MAX`: as
    /// long as it takes). The master's node answers first when a rank did not make the
    /// call; this limit is for peers that made it but send nothing.
    pub(crate) patience: Duration,
    /// Whether the peers take parts as values (in one process), rather than encoded.
    pub(crate) values: bool,
}

impl CallSetup {
    /// Whether `peer` is one of the ranks the call is among.
    pub(crate) fn concerns(&self, peer: Rank) -> bool {
        self.members
            .as_ref()
            .is_none_or(|members| members.binary_search(&peer).is_ok())
    }

    /// The call's key: its group's, and its number among them.
    pub(crate) fn key(&self) -> CallKey {
        CallKey {
            group: self.group,
            epoch: self.epoch,
        }
    }
}

/// Why a piece could not be sent.
#[derive(Debug)]
pub(crate) enum SendFailure {
    /// The piece's frame, `bytes` long, is over the transport's `limit`.
    TooLarge { bytes: usize, limit: usize },
    /// The connection to the peer is gone, for this reason.
    Lost(String),
}

/// Where a call stands.
enum Stage<B> {
    /// Exchanging pieces.
    Running,
    /// A peer was lost before the master's node released the call: the node's word on
    /// it, until `until`, may say the program broke the rules (another call on some rank,
    /// whose process then ended), which is then what the call fails with.
    Grace { lost: SyncError, until: Instant },
    /// Ended; its end not taken yet.
    Ended(Result<B, SyncError>),
    /// Its end taken.
    Over,
}

/// One rank's collective call. See the [module docs](self).
pub(crate) struct RankCall<B: Carried> {
    setup: CallSetup,
    start: CallStart<B>,
    /// The master's node said every rank made the call, the same to the length.
    released: bool,
    started: Instant,
    /// The silence limit: pushed back by every piece that comes.
    deadline: Option<Instant>,
    /// How often a long wait says it still waits, and when it says so next.
    every: Duration,
    word: Instant,
    stage: Stage<B>,
}

impl<B> RankCall<B>
where
    B: Carried,
    B::Part: Send + 'static,
{
    /// The call `setup` says, from `start`, at `now`; `released`: the master's node said
    /// already that every rank made it. Takes what came early for it out of `early`: its
    /// pieces, and a peer lost before it (the call then fails on it).
    pub(crate) fn new(
        setup: CallSetup,
        start: CallStart<B>,
        released: bool,
        now: Instant,
        early: &mut Early,
    ) -> Self {
        let every = (setup.patience / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
        let key = setup.key();
        let deadline = now.checked_add(setup.patience);
        let mut call = RankCall {
            setup,
            start,
            released,
            started: now,
            deadline,
            every,
            word: now + every,
            stage: Stage::Running,
        };
        let (pieces, lost) = early.take(key, |peer| call.setup.concerns(peer));
        if let Some((peer, reason)) = lost {
            call.lose(now, peer, reason);
            return call;
        }
        for m in pieces {
            call.take_piece(m);
        }
        call
    }

    /// The call this rank makes, as far as it knows it.
    pub(crate) fn call(&self) -> CollectiveCall {
        match &self.start {
            CallStart::Known(exchange) => *exchange.call(),
            CallStart::Awaited { kind, .. } => {
                CallShape::call(None, self.setup.epoch, self.setup.at, *kind)
            }
        }
    }

    /// The next piece to send, to whom; `None` when there is none now (or the call
    /// ended).
    pub(crate) fn poll_send(&mut self) -> Option<(Rank, PeerMessage)> {
        if !matches!(self.stage, Stage::Running) {
            return None;
        }
        let CallStart::Known(exchange) = &mut self.start else {
            return None;
        };
        let (to, piece) = exchange.poll_send()?;
        let (rank, values) = (self.setup.rank, self.setup.values);
        let body = if values {
            PeerBody::Value(Box::new(piece.part))
        } else {
            match B::encode(piece.part) {
                Ok(bytes) => PeerBody::Encoded(bytes),
                Err(e) => {
                    let error = SyncError::Codec(format!(
                        "rank {rank}'s part of {} for rank {to} does not encode: {e}",
                        piece.call
                    ));
                    self.stage = Stage::Ended(Err(error));
                    return None;
                }
            }
        };
        let msg = PeerMessage {
            attempt: self.setup.attempt,
            from: rank,
            call: piece.call,
            step: piece.step,
            chunk: piece.chunk,
            body,
        };
        Some((to, msg))
    }

    /// The piece of `call` for `to` could not be sent.
    pub(crate) fn handle_send_failed(
        &mut self,
        now: Instant,
        to: Rank,
        call: CollectiveCall,
        failure: SendFailure,
    ) {
        if !matches!(self.stage, Stage::Running) {
            return;
        }
        match failure {
            SendFailure::TooLarge { bytes, limit } => {
                let rank = self.setup.rank;
                self.stage = Stage::Ended(Err(SyncError::TooLarge {
                    rank,
                    call,
                    peer: to,
                    bytes,
                    limit,
                }));
            }
            SendFailure::Lost(reason) => self.lose(now, to, reason),
        }
    }

    /// What a peer's connection brought: this call's pieces are taken in (each pushes the
    /// silence limit back), a peer of this attempt lost fails the call (and is kept in
    /// `early`, so that later calls fail on it too); the rest is kept in `early` for the
    /// calls it belongs to, or dropped there.
    pub(crate) fn handle_peer(&mut self, now: Instant, event: PeerEvent, early: &mut Early) {
        let key = self.setup.key();
        if !matches!(self.stage, Stage::Running) {
            return early.keep(event, key);
        }
        match event {
            PeerEvent::Message(m) if m.attempt == self.setup.attempt && m.call.key() == key => {
                self.deadline = now.checked_add(self.setup.patience);
                self.take_piece(m);
            }
            PeerEvent::Lost {
                rank: peer,
                attempt,
                reason,
            } if attempt == self.setup.attempt => {
                self.handle_lost(now, peer, attempt, &reason);
                early.keep(
                    PeerEvent::Lost {
                        rank: peer,
                        attempt,
                        reason,
                    },
                    key,
                );
            }
            other => early.keep(other, key),
        }
    }

    /// A peer of `attempt` was lost (kept by whoever took the event): a call of that
    /// attempt under way among the peer fails on it (a group's call, not on a rank outside
    /// the group).
    pub(crate) fn handle_lost(&mut self, now: Instant, peer: Rank, attempt: Attempt, reason: &str) {
        let concerned = attempt == self.setup.attempt && self.setup.concerns(peer);
        if matches!(self.stage, Stage::Running) && concerned {
            self.lose(now, peer, reason.to_owned());
        }
    }

    /// The rank waits again, at `now`, after doing other work with this call under way: its
    /// peers' silence counts from now at the earliest (while the rank did not wait, its
    /// peers may have waited for it before they could send).
    pub(crate) fn resume(&mut self, now: Instant) {
        if matches!(self.stage, Stage::Running) {
            if let Some(later) = now.checked_add(self.setup.patience) {
                self.deadline = self.deadline.max(Some(later));
            }
        }
    }

    /// The master's node's answer to this rank's sync call `answered`: for this call,
    /// `Ok` says every rank made it, the same to the length (its values may still be on
    /// their way), an error that the call broke — another call on some rank, a rank that
    /// returned without it, or one that did not make it in time.
    pub(crate) fn handle_answer(&mut self, answered: CallKey, result: Result<(), SyncError>) {
        if answered != self.setup.key() {
            return;
        }
        match std::mem::replace(&mut self.stage, Stage::Over) {
            Stage::Running => match result {
                Ok(()) => {
                    self.released = true;
                    self.stage = Stage::Running;
                }
                Err(e) => self.stage = Stage::Ended(Err(e)),
            },
            Stage::Grace { lost, .. } => {
                let e = match result {
                    Err(e) if e.is_mistake() => e,
                    _ => lost,
                };
                self.stage = Stage::Ended(Err(e));
            }
            ended => self.stage = ended,
        }
    }

    /// The job failed, as the worker heard: the call fails with it — after a peer lost,
    /// only when it says the program broke the rules; the loss otherwise.
    pub(crate) fn handle_job_failed(&mut self, failure: SyncError) {
        match std::mem::replace(&mut self.stage, Stage::Over) {
            Stage::Running => self.stage = Stage::Ended(Err(failure)),
            Stage::Grace { lost, .. } => {
                let e = if failure.is_mistake() { failure } else { lost };
                self.stage = Stage::Ended(Err(e));
            }
            ended => self.stage = ended,
        }
    }

    /// It is `now`: a silence limit past fails the call naming the peers it waits for
    /// (or, waiting for none, the master's node's answer); a grace past fails it on its
    /// lost peer; a long wait says it still waits.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match std::mem::replace(&mut self.stage, Stage::Over) {
            Stage::Running => {
                self.stage = Stage::Running;
                if self.deadline.is_some_and(|d| now >= d) {
                    let error = match self.waiting_on() {
                        // Waiting for no peer: for the master's node's word.
                        waiting_on if waiting_on.is_empty() => {
                            SyncError::NoAnswer(self.setup.patience)
                        }
                        waiting_on => SyncError::CollectiveTimedOut {
                            rank: self.setup.rank,
                            call: Box::new(self.call()),
                            waiting_on,
                            waited: now.saturating_duration_since(self.started),
                            heard: Vec::new(),
                        },
                    };
                    self.stage = Stage::Ended(Err(error));
                } else if now >= self.word {
                    let waited = now.saturating_duration_since(self.started);
                    tracing::warn!(
                        rank = self.setup.rank,
                        call = %self.call(),
                        waiting_on = ?self.waiting_on(),
                        ?waited,
                        "a collective still waits for its peers (it fails after {:?} of silence)",
                        self.setup.patience
                    );
                    while self.word <= now {
                        self.word += self.every;
                    }
                }
            }
            Stage::Grace { lost, until } if now >= until => self.stage = Stage::Ended(Err(lost)),
            stage => self.stage = stage,
        }
    }

    /// When the call is to be woken with [`handle_timeout`](Self::handle_timeout) if
    /// nothing comes before; `None`: not by time.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match &self.stage {
            Stage::Running => Some(self.deadline.map_or(self.word, |d| d.min(self.word))),
            Stage::Grace { until, .. } => Some(*until),
            Stage::Ended(_) | Stage::Over => None,
        }
    }

    /// The call's end, once it ended (taken once): the buffer its exchange made, when
    /// this rank's part is done and either its result proves that every rank made the
    /// call ([`Exchange::vouches`]: an `all_reduce`, the messages — no word of the master's
    /// node awaited, so its round trip is off the call's path) or the node said so. A rank
    /// whose result proves nothing of some rank (a broadcast, a reduce off its root, an
    /// empty value) never returns it before that word.
    pub(crate) fn poll_outcome(&mut self) -> Option<Result<B, SyncError>> {
        let done = matches!(
            (&self.stage, &self.start),
            (Stage::Running, CallStart::Known(exchange))
                if exchange.is_done() && (self.released || exchange.vouches())
        );
        if done {
            self.stage = Stage::Over;
            let kind = self.start.kind();
            let taken = CallStart::Awaited {
                kind,
                make: |_| Err("the call is over".to_owned()),
            };
            if let CallStart::Known(exchange) = std::mem::replace(&mut self.start, taken) {
                return Some(Ok(exchange.into_buffer()));
            }
        }
        // Looked at before it is moved: a stage holds an error, large to move to and fro
        // on every poll.
        if !matches!(self.stage, Stage::Ended(_)) {
            return None;
        }
        match std::mem::replace(&mut self.stage, Stage::Over) {
            Stage::Ended(end) => Some(end),
            _ => None,
        }
    }

    /// The peers a piece is awaited from: for a broadcast not started, its root.
    fn waiting_on(&self) -> Vec<Rank> {
        match &self.start {
            CallStart::Known(exchange) => exchange.waiting_on(),
            CallStart::Awaited {
                kind: CollectiveKind::Broadcast { root },
                ..
            } => vec![*root],
            CallStart::Awaited { .. } => Vec::new(),
        }
    }

    /// `peer` was lost: the call fails on it — at once when the master's node released
    /// the call, after its word or [`LOSS_GRACE`] otherwise.
    fn lose(&mut self, now: Instant, peer: Rank, reason: String) {
        let lost = SyncError::PeerLost {
            rank: self.setup.rank,
            peer,
            reason,
        };
        self.stage = if self.released {
            Stage::Ended(Err(lost))
        } else {
            let until = now + LOSS_GRACE.min(self.setup.patience);
            Stage::Grace { lost, until }
        };
    }

    /// A piece of this call (its attempt and epoch): it starts a broadcast awaited, and
    /// goes to the exchange; a piece that does not fit ends the call (the first such
    /// piece names the call's failure: later ones are not read).
    fn take_piece(&mut self, m: PeerMessage) {
        if !matches!(self.stage, Stage::Running) {
            return;
        }
        let rank = self.setup.rank;
        if let CallStart::Awaited { kind, make } = &self.start {
            if *kind != m.call.kind {
                // Another call of this epoch: the master's node says so to every rank.
                return;
            }
            match make(&m.call) {
                Ok(buffer) => {
                    let exchange = exchange(m.call, &self.setup, buffer);
                    self.start = CallStart::Known(Box::new(exchange));
                }
                Err(reason) => {
                    let error = SyncError::BadPiece {
                        rank,
                        call: m.call,
                        peer: m.from,
                        reason,
                    };
                    self.stage = Stage::Ended(Err(error));
                    return;
                }
            }
        }
        if let CallStart::Known(exchange) = &mut self.start {
            if let Err(e) = feed(exchange, rank, m) {
                self.stage = Stage::Ended(Err(e));
            }
        }
    }
}

/// The part in `call` on `buffer` of the rank `setup` says, among its group's ranks, its
/// parts made to travel encoded unless the peers take them as values (in one process).
pub(crate) fn exchange<B: Carried>(
    call: CollectiveCall,
    setup: &CallSetup,
    mut buffer: B,
) -> Exchange<B> {
    if !setup.values {
        buffer.travel_encoded();
    }
    match &setup.members {
        None => Exchange::new(call, setup.workers, setup.rank, buffer),
        Some(members) => Exchange::among(call, members, setup.rank, buffer),
    }
}

/// Hands `m`'s piece to `exchange`, decoded where it came encoded — another call's piece
/// is a mismatch whatever its bytes, said before they are read.
fn feed<B: Carried>(exchange: &mut Exchange<B>, rank: Rank, m: PeerMessage) -> Result<(), SyncError>
where
    B::Part: 'static,
{
    let bad = |reason: String| SyncError::BadPiece {
        rank,
        call: *exchange.call(),
        peer: m.from,
        reason,
    };
    if m.call != *exchange.call() {
        return Err(SyncError::CollectiveMismatch {
            rank,
            call: Box::new(*exchange.call()),
            peer: m.from,
            peer_call: Box::new(m.call),
        });
    }
    let part = match m.body {
        PeerBody::Encoded(bytes) => {
            B::decode(bytes).map_err(|e| bad(format!("{} do not decode: {e}", B::what())))?
        }
        PeerBody::Value(value) => *value
            .downcast::<B::Part>()
            .map_err(|_| bad("its elements are of another type".to_owned()))?,
    };
    let piece = Piece {
        call: m.call,
        step: m.step,
        chunk: m.chunk,
        part,
    };
    exchange.handle_piece(m.from, piece)
}
