//! A rank's calls under way, sans-IO: the one its compute waits on, and those it started
//! and has not finished yet ([`Flights`]), all driven by the same wait — so a call
//! started early goes on while the compute waits on another, and no wait leaves a peer
//! without the pieces it waits for.

use std::any::Any;
use std::time::Instant;

use super::call::{Carried, Early, PeerEvent, RankCall, SendFailure};
use super::PeerMessage;
use crate::error::SyncError;
use crate::ids::{Attempt, CallKey, CollectiveCall, Rank};
use crate::protocol::SyncResult;

/// What a wait drives: a call this rank made, as the inputs that reach it come. The
/// order is [`RankCall`]'s, with [`settled`](Flight::settled) for its `poll_outcome`.
pub(crate) trait Flight {
    /// The call's group, and its number among the rank's calls of that group.
    fn key(&self) -> CallKey;

    /// The next piece to send, to whom.
    fn poll_send(&mut self) -> Option<(Rank, PeerMessage)> {
        None
    }

    /// The piece of `call` for `to` could not be sent.
    fn handle_send_failed(
        &mut self,
        now: Instant,
        to: Rank,
        call: CollectiveCall,
        failure: SendFailure,
    ) {
        let _ = (now, to, call, failure);
    }

    /// A peer's event that is this call's, or no other call's: what the call does not
    /// take goes to `early`.
    fn handle_peer(&mut self, now: Instant, event: PeerEvent, early: &mut Early);

    /// A peer of `attempt` was lost (kept in `early` by whoever took the event).
    fn handle_lost(&mut self, now: Instant, peer: Rank, attempt: Attempt, reason: &str) {
        let _ = (now, peer, attempt, reason);
    }

    /// The rank waits again, at `now`, having done other work while this call was under
    /// way.
    fn resume(&mut self, now: Instant) {
        let _ = now;
    }

    /// The master's node's answer to this rank's call `answered`.
    fn handle_answer(&mut self, answered: CallKey, result: &SyncResult);

    /// The job failed, as the worker heard.
    fn handle_job_failed(&mut self, failure: SyncError);

    /// It is `now`, the time it asked to be woken at or later.
    fn handle_timeout(&mut self, now: Instant);

    /// When it is to be woken if nothing comes before.
    fn poll_timeout(&self) -> Option<Instant>;

    /// Whether the call ended (its end kept until taken).
    fn settled(&mut self) -> bool;
}

/// A collective call and, once it ended, its end.
pub(crate) struct Flying<B: Carried> {
    call: RankCall<B>,
    end: Option<Result<B, SyncError>>,
}

impl<B> Flying<B>
where
    B: Carried,
    B::Part: Send + 'static,
{
    pub(crate) fn new(call: RankCall<B>) -> Self {
        Flying { call, end: None }
    }

    /// The call's end: the buffer its exchange made, or why it failed. Only once
    /// [`settled`](Flight::settled).
    pub(crate) fn end(self) -> Option<Result<B, SyncError>> {
        self.end
    }
}

impl<B> Flight for Flying<B>
where
    B: Carried,
    B::Part: Send + 'static,
{
    fn key(&self) -> CallKey {
        self.call.call().key()
    }

    fn poll_send(&mut self) -> Option<(Rank, PeerMessage)> {
        self.call.poll_send()
    }

    fn handle_send_failed(
        &mut self,
        now: Instant,
        to: Rank,
        call: CollectiveCall,
        failure: SendFailure,
    ) {
        self.call.handle_send_failed(now, to, call, failure);
    }

    fn handle_peer(&mut self, now: Instant, event: PeerEvent, early: &mut Early) {
        self.call.handle_peer(now, event, early);
    }

    fn handle_lost(&mut self, now: Instant, peer: Rank, attempt: Attempt, reason: &str) {
        self.call.handle_lost(now, peer, attempt, reason);
    }

    fn resume(&mut self, now: Instant) {
        self.call.resume(now);
    }

    fn handle_answer(&mut self, answered: CallKey, result: &SyncResult) {
        self.call
            .handle_answer(answered, result.as_ref().map(drop).map_err(Clone::clone));
    }

    fn handle_job_failed(&mut self, failure: SyncError) {
        self.call.handle_job_failed(failure);
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.call.handle_timeout(now);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.call.poll_timeout()
    }

    fn settled(&mut self) -> bool {
        if self.end.is_none() {
            self.end = self.call.poll_outcome();
        }
        self.end.is_some()
    }
}

/// A call started and kept in flight: its end taken as a value of any type.
pub(crate) trait Parked: Flight + Send {
    /// What the call is, as an error naming it says.
    fn call(&self) -> CollectiveCall;

    /// The call's end, once [`settled`](Flight::settled): a `Result<B, SyncError>` of
    /// its buffer's type.
    fn into_end(self: Box<Self>) -> Box<dyn Any>;
}

impl<B> Parked for Flying<B>
where
    B: Carried + Send + 'static,
    B::Part: Send + 'static,
{
    fn call(&self) -> CollectiveCall {
        self.call.call()
    }

    fn into_end(self: Box<Self>) -> Box<dyn Any> {
        Box::new(self.end)
    }
}

/// The calls a rank started and has not finished, in the order it started them: each
/// wait drives them with the call it waits on.
#[derive(Default)]
pub(crate) struct Flights {
    started: Vec<Box<dyn Parked>>,
}

impl Flights {
    /// Keeps `call` in flight.
    pub(crate) fn push(&mut self, call: Box<dyn Parked>) {
        self.started.push(call);
    }

    /// Takes call `key` out, if it is in flight.
    pub(crate) fn take(&mut self, key: CallKey) -> Option<Box<dyn Parked>> {
        let at = self.started.iter().position(|c| c.key() == key)?;
        Some(self.started.remove(at))
    }

    /// Call `key`, if it is in flight.
    pub(crate) fn call(&self, key: CallKey) -> Option<CollectiveCall> {
        self.started
            .iter()
            .find(|c| c.key() == key)
            .map(|c| c.call())
    }

    /// Whether call `key` is in flight and ended.
    pub(crate) fn ended(&mut self, key: CallKey) -> bool {
        self.started
            .iter_mut()
            .any(|c| c.key() == key && c.settled())
    }

    /// The rank waits again, at `now`: see [`Flight::resume`].
    pub(crate) fn resume(&mut self, now: Instant) {
        for c in &mut self.started {
            c.resume(now);
        }
    }

    /// The calls in flight, in the order they were started.
    pub(crate) fn calls(&self) -> Vec<CollectiveCall> {
        self.started.iter().map(|c| c.call()).collect()
    }

    /// Whether no call is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.started.is_empty()
    }

    /// Forgets every call in flight (a compute that failed: its calls end with it).
    pub(crate) fn clear(&mut self) {
        self.started.clear();
    }

    /// The next piece of any call in flight to send, to whom.
    pub(crate) fn poll_send(&mut self) -> Option<(Rank, PeerMessage)> {
        self.started.iter_mut().find_map(|c| c.poll_send())
    }

    /// The piece of `call` for `to` could not be sent.
    pub(crate) fn handle_send_failed(
        &mut self,
        now: Instant,
        to: Rank,
        call: CollectiveCall,
        failure: SendFailure,
    ) {
        if let Some(c) = self.started.iter_mut().find(|c| c.key() == call.key()) {
            c.handle_send_failed(now, to, call, failure);
        }
    }

    /// Hands `event` to the call in flight it is for, or — a peer lost — to every one;
    /// gives back what is for none of them (and a loss, for the call waited on and
    /// `early`).
    pub(crate) fn handle_peer(
        &mut self,
        now: Instant,
        event: PeerEvent,
        early: &mut Early,
    ) -> Option<PeerEvent> {
        match &event {
            PeerEvent::Message(m) => {
                let key = m.call.key();
                match self.started.iter_mut().find(|c| c.key() == key) {
                    Some(c) => {
                        c.handle_peer(now, event, early);
                        None
                    }
                    None => Some(event),
                }
            }
            PeerEvent::Lost {
                rank,
                attempt,
                reason,
            } => {
                for c in &mut self.started {
                    c.handle_lost(now, *rank, *attempt, reason);
                }
                Some(event)
            }
        }
    }

    /// The master's node's answer to this rank's call `answered`; `failure`: the job's,
    /// if it failed.
    pub(crate) fn handle_answer(
        &mut self,
        answered: CallKey,
        result: &SyncResult,
        failure: Option<&SyncError>,
    ) {
        for c in &mut self.started {
            c.handle_answer(answered, result);
            if let Some(e) = failure.filter(|_| c.key() != answered) {
                c.handle_job_failed(e.clone());
            }
        }
    }

    /// The job failed.
    pub(crate) fn handle_job_failed(&mut self, failure: &SyncError) {
        for c in &mut self.started {
            c.handle_job_failed(failure.clone());
        }
    }

    /// It is `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        for c in &mut self.started {
            if c.poll_timeout().is_some_and(|at| now >= at) {
                c.handle_timeout(now);
            }
        }
    }

    /// The earliest time a call in flight is to be woken at.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.started.iter().filter_map(|c| c.poll_timeout()).min()
    }

    /// Keeps each ended call's end until it is finished.
    pub(crate) fn settle(&mut self) {
        for c in &mut self.started {
            c.settled();
        }
    }
}
