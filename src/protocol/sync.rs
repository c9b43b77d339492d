//! `barrier()` and `all_gather()` inside a worker's compute: the epochs of Spark's barrier
//! execution mode.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::JobError;
use crate::error::SyncError;
use crate::ids::{CallAt, Epoch, GroupId, Iteration, Rank, SyncKind};
use crate::protocol::CallShape;

/// What a sync call gets back: every rank's message in rank order (empty ones for
/// `barrier()`), shared by every rank's answer, or the error that ended the epoch.
pub type SyncResult = Result<Arc<Vec<Vec<u8>>>, SyncError>;

/// What the driver must do after an input.
#[derive(Debug, Default, PartialEq)]
pub struct SyncStep {
    /// Answers to send: to each rank, for its call of `epoch`.
    pub replies: Vec<(Rank, Epoch, SyncResult)>,
    /// The job must fail with this error (a mismatch, a timeout, an unmatched call).
    pub failed: Option<SyncError>,
}

/// The epochs of one attempt, of the calls among every rank or among a group of them
/// ([`SyncState::among`]).
///
/// Call order: [`new_iteration`](Self::new_iteration) when an iteration opens;
/// [`on_call`](Self::on_call) for each call; [`on_returned`](Self::on_returned) when a
/// rank's result of the iteration arrives (its compute returned);
/// [`abort`](Self::abort) when the job fails for any reason; and
/// [`handle_timeout`](Self::handle_timeout) when [`poll_timeout`](Self::poll_timeout) has
/// passed. Send every reply of the returned [`SyncStep`]s; after a failure every later
/// call is answered with that failure.
///
/// A rank may call again before its earlier call's epoch met, and return from compute
/// before its last call arrived here: a collective whose result proves that every rank
/// made it returns without this node's word (its `awaits` is false). A rank's calls of
/// later epochs are kept, in order, and taken when their epoch opens; a rank that
/// returned is named as returning without a call only when the count of calls it made
/// says so.
#[derive(Debug)]
pub struct SyncState {
    workers: usize,
    /// The group the calls are among, and its ranks in order (`None`: every rank, whose
    /// place is its rank). Ranks come in and go out as the job's; inside, by place.
    group: GroupId,
    ranks: Option<Arc<[Rank]>>,
    timeout: Duration,
    epoch: Epoch,
    iteration: Iteration,
    /// The epoch of the iteration's first call: calls are named by their number in it.
    iteration_epoch: Epoch,
    kind: Option<SyncKind>,
    calls: Vec<Option<Call>>,
    /// Calls of later epochs, per rank, in the order they came, with when they came.
    ahead: Vec<VecDeque<(Instant, Epoch, Call)>>,
    /// Per rank, the epoch its next call is of.
    next: Vec<Epoch>,
    arrived: usize,
    first_arrival: Option<Instant>,
    /// Per rank whose compute of the iteration returned, how many calls it had made.
    returned: Vec<Option<Epoch>>,
    failure: Option<SyncError>,
}

/// One rank's call.
#[derive(Debug)]
struct Call {
    kind: SyncKind,
    message: Vec<u8>,
    /// Whether the rank waits for this node's word that every rank made the call (every
    /// call but a collective whose result proves it); an error is said to every rank.
    awaits: bool,
}

impl SyncState {
    /// Epochs for `workers` ranks, each waiting at most `timeout` from its first arrival.
    pub fn new(workers: usize, timeout: Duration) -> Self {
        SyncState {
            workers,
            group: GroupId::ALL,
            ranks: None,
            timeout,
            epoch: 0,
            iteration: 0,
            iteration_epoch: 0,
            kind: None,
            calls: (0..workers).map(|_| None).collect(),
            ahead: (0..workers).map(|_| VecDeque::new()).collect(),
            next: vec![0; workers],
            arrived: 0,
            first_arrival: None,
            returned: vec![None; workers],
            failure: None,
        }
    }

    /// Epochs of the calls among the group of `ranks` (in rank order), each waiting at
    /// most `timeout` from its first arrival. Ranks are the job's, in and out.
    pub fn among(ranks: &[Rank], timeout: Duration) -> Self {
        SyncState {
            group: GroupId::of(ranks),
            ranks: Some(ranks.into()),
            ..SyncState::new(ranks.len(), timeout)
        }
    }

    /// The group its calls are among.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// The group's ranks (`None`: every rank).
    pub fn ranks(&self) -> Option<&[Rank]> {
        self.ranks.as_deref()
    }

    /// Whether `rank` makes calls among its ranks.
    pub fn has(&self, rank: Rank) -> bool {
        self.place(rank).is_some()
    }

    /// `rank`'s place among its ranks.
    fn place(&self, rank: Rank) -> Option<usize> {
        match &self.ranks {
            None => (rank < self.workers).then_some(rank),
            Some(ranks) => ranks.binary_search(&rank).ok(),
        }
    }

    /// The rank at `place`.
    fn name(&self, place: usize) -> Rank {
        self.ranks.as_ref().map_or(place, |ranks| ranks[place])
    }

    /// The ranks at `places`.
    fn names(&self, places: impl IntoIterator<Item = usize>) -> Vec<Rank> {
        places.into_iter().map(|p| self.name(p)).collect()
    }

    /// The epoch now gathering.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Forgets every epoch, for a new attempt whose workers count their sync calls from
    /// the start again. Release the old attempt's waiting ranks first ([`SyncState::abort`]).
    pub fn restart(&mut self) {
        *self = SyncState {
            group: self.group,
            ranks: self.ranks.take(),
            ..SyncState::new(self.workers, self.timeout)
        };
    }

    /// An iteration opened: every rank computes again.
    pub fn new_iteration(&mut self, iteration: Iteration) {
        self.iteration = iteration;
        self.iteration_epoch = self.epoch;
        self.returned.iter_mut().for_each(|r| *r = None);
    }

    /// Rank `rank` made its call `epoch` of kind `kind` with `message`; `awaits`: it waits
    /// for the word that every rank made it (an error is said to it either way).
    pub fn on_call(
        &mut self,
        now: Instant,
        rank: Rank,
        epoch: Epoch,
        kind: SyncKind,
        message: Vec<u8>,
        awaits: bool,
    ) -> SyncStep {
        let step = SyncStep::default();
        let Some(rank) = self.place(rank) else {
            return step;
        };
        let call = Call {
            kind,
            message,
            awaits,
        };
        if self.failure.is_none() && epoch > self.epoch {
            if epoch == self.next[rank] {
                // Ahead of the epoch gathering: kept until it opens.
                self.next[rank] = epoch + 1;
                self.ahead[rank].push_back((now, epoch, call));
                return step;
            }
            if epoch < self.next[rank] {
                return step; // a call kept already, delivered twice
            }
            // A call that skips one of the rank's: out of step, refused below.
        }
        let mut step = self.arrive(now, rank, epoch, call);
        self.take_ahead(&mut step);
        step
    }

    /// Takes the calls kept for the epochs that opened, as they came.
    fn take_ahead(&mut self, step: &mut SyncStep) {
        while self.failure.is_none() {
            let epoch = self.epoch;
            let Some(rank) = (0..self.workers)
                .find(|&r| self.ahead[r].front().is_some_and(|(_, e, _)| *e == epoch))
            else {
                return;
            };
            let (at, epoch, call) = self.ahead[rank].pop_front().expect("looked at above");
            let taken = self.arrive(at, rank, epoch, call);
            step.replies.extend(taken.replies);
            if step.failed.is_none() {
                step.failed = taken.failed;
            }
        }
    }

    /// The rank at place `rank`'s call `epoch`, which is not ahead of the epoch gathering.
    fn arrive(&mut self, now: Instant, rank: usize, epoch: Epoch, call: Call) -> SyncStep {
        let mut step = SyncStep::default();
        let named = self.name(rank);
        if let Some(failure) = &self.failure {
            step.replies.push((named, epoch, Err(failure.clone())));
            return step;
        }
        if epoch != self.epoch {
            // The rank is out of step with the others: no later epoch can meet either.
            let error = SyncError::StaleEpoch {
                rank: named,
                group: self.group,
                epoch,
                current: self.epoch,
            };
            let mut step = self.fail(error.clone());
            step.replies.push((named, epoch, Err(error)));
            return step;
        }
        if self.poll_timeout().is_some_and(|deadline| now >= deadline) {
            // The deadline holds at arrival too, not only when the driver's timer fires.
            let mut step = self.handle_timeout(now);
            if let Some(failure) = &self.failure {
                step.replies.push((named, epoch, Err(failure.clone())));
            }
            return step;
        }
        if self.calls[rank].is_some() {
            return step; // the same call delivered twice
        }
        let kind = call.kind;
        self.calls[rank] = Some(call);
        self.next[rank] = self.next[rank].max(epoch + 1);
        self.arrived += 1;
        // A kept call may have come before one taken earlier (kept calls are taken rank by
        // rank): the epoch's wait counts from the first to come.
        self.first_arrival = Some(self.first_arrival.map_or(now, |first| first.min(now)));
        if let Some(differ) = self.differs(rank) {
            return self.fail(differ);
        }
        self.kind.get_or_insert(kind);
        if let Some(unmatched) = self.unmatched() {
            return self.fail(unmatched);
        }
        if self.arrived == self.workers {
            let awaiting: Vec<Rank> = (0..self.workers)
                .filter(|&r| self.calls[r].as_ref().is_some_and(|c| c.awaits))
                .collect();
            if !awaiting.is_empty() {
                let messages: Arc<Vec<Vec<u8>>> = Arc::new(
                    self.calls
                        .iter_mut()
                        .map(|c| c.take().map(|c| c.message).unwrap_or_default())
                        .collect(),
                );
                for r in awaiting {
                    step.replies
                        .push((self.name(r), self.epoch, Ok(Arc::clone(&messages))));
                }
            }
            self.next_epoch();
        }
        step
    }

    /// Rank `rank`'s compute of the current iteration returned, having made `calls` calls
    /// in the attempt (the epoch of its next): it makes no more calls in this iteration.
    pub fn on_returned(&mut self, rank: Rank, iteration: Iteration, calls: Epoch) -> SyncStep {
        let place = self.place(rank);
        let Some(rank) = place.filter(|_| self.failure.is_none() && iteration == self.iteration)
        else {
            return SyncStep::default();
        };
        self.returned[rank] = Some(calls);
        match self.unmatched() {
            Some(unmatched) => self.fail(unmatched),
            None => SyncStep::default(),
        }
    }

    /// The job failed: release every waiting rank with the job's failure, as a waiting
    /// rank gets it (`JobError::as_sync_failure`: a rank's mismatch as that mismatch).
    pub fn abort(&mut self, error: &JobError) -> SyncStep {
        if self.failure.is_some() {
            return SyncStep::default();
        }
        let mut step = self.fail(error.as_sync_failure());
        step.failed = None; // the job has failed already
        step
    }

    /// Whether an epoch is gathering: some rank waits in a call.
    pub fn is_gathering(&self) -> bool {
        self.arrived > 0 && self.failure.is_none()
    }

    /// Fails the gathering epoch now, as its timeout would: for when a longer wait that
    /// contains it (the iteration's) ran out first, so that the error names the ranks that
    /// did not arrive in the epoch rather than every rank of the iteration.
    pub fn expire(&mut self, now: Instant) -> SyncStep {
        if !self.is_gathering() {
            return SyncStep::default();
        }
        self.time_out(now)
    }

    /// When the epoch now gathering times out.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.first_arrival?.checked_add(self.timeout)
    }

    /// Fails the epoch if its timeout has passed at `now`, naming the ranks that did not
    /// arrive.
    pub fn handle_timeout(&mut self, now: Instant) -> SyncStep {
        match self.poll_timeout() {
            Some(deadline) if now >= deadline && self.failure.is_none() => {}
            _ => return SyncStep::default(),
        }
        self.time_out(now)
    }

    /// Fails the gathering epoch as timed out, naming the ranks that did not arrive.
    fn time_out(&mut self, now: Instant) -> SyncStep {
        let missing = self.names((0..self.workers).filter(|&r| self.calls[r].is_none()));
        let waited = now.saturating_duration_since(self.first_arrival.unwrap_or(now));
        self.fail(SyncError::TimedOut {
            at: self.at(),
            kind: self.kind.unwrap_or(SyncKind::Barrier),
            missing,
            waited,
            heard: Vec::new(),
        })
    }

    /// An epoch in progress that some rank can no longer join: it returned from compute
    /// without the call (it had made no more calls than the epochs before).
    fn unmatched(&self) -> Option<SyncError> {
        let kind = self.kind?;
        let returned: Vec<usize> = (0..self.workers)
            .filter(|&r| {
                self.calls[r].is_none() && self.returned[r].is_some_and(|made| made <= self.epoch)
            })
            .collect();
        if returned.is_empty() {
            return None;
        }
        Some(SyncError::Unmatched {
            at: self.at(),
            kind,
            returned: self.names(returned),
            waiting: self.names((0..self.workers).filter(|&r| self.calls[r].is_some())),
        })
    }

    /// Where a rank's call `epoch` of the iteration under way stands.
    pub(crate) fn call_at(&self, epoch: Epoch) -> CallAt {
        CallAt::of(self.iteration, self.iteration_epoch, epoch).in_group(self.group)
    }

    /// Where the call gathering stands in its iteration.
    fn at(&self) -> CallAt {
        self.call_at(self.epoch)
    }

    /// Whether `rank`'s call, just arrived, differs from those that came before: another
    /// kind than the first's, or — collectives — another call (root, length, way) than the
    /// first whose shape is known. Two collectives are named as calls, the two ranks in
    /// rank order; other calls by every rank's kind.
    fn differs(&self, rank: Rank) -> Option<SyncError> {
        let Call { kind, message, .. } = self.calls[rank].as_ref()?;
        let others = || {
            self.calls
                .iter()
                .enumerate()
                .filter(move |(r, _)| *r != rank)
                .filter_map(|(r, c)| c.as_ref().map(|c| (r, c)))
        };
        let (
            first,
            Call {
                kind: first_kind,
                message: first_message,
                ..
            },
        ) = others().next()?;
        let (SyncKind::Collective(mine), SyncKind::Collective(theirs)) = (kind, first_kind) else {
            if kind == first_kind {
                return None;
            }
            let calls = self
                .calls
                .iter()
                .enumerate()
                .filter_map(|(r, c)| c.as_ref().map(|c| (self.name(r), c.kind)))
                .collect();
            return Some(SyncError::Mismatch {
                at: self.at(),
                calls,
            });
        };
        let (other, other_kind, other_shape) = if mine != theirs {
            (first, *theirs, shape_of(first_message))
        } else {
            let shape = shape_of(message)?;
            others()
                .find_map(|(r, c)| match c.kind {
                    SyncKind::Collective(k) => shape_of(&c.message).map(|s| (r, k, Some(s))),
                    _ => None,
                })
                .filter(|(_, _, theirs)| *theirs != Some(shape))?
        };
        let call = |kind, shape| CallShape::call(shape, self.epoch, self.at(), kind);
        let mut a = (rank, call(*mine, shape_of(message)));
        let mut b = (other, call(other_kind, other_shape));
        if a.0 > b.0 {
            std::mem::swap(&mut a, &mut b);
        }
        Some(SyncError::CollectiveMismatch {
            rank: self.name(a.0),
            call: Box::new(a.1),
            peer: self.name(b.0),
            peer_call: Box::new(b.1),
        })
    }

    /// Answers every waiting rank with `error` — those in the epoch gathering, and those
    /// whose later calls are kept — and keeps it for every later call.
    fn fail(&mut self, error: SyncError) -> SyncStep {
        let mut step = SyncStep::default();
        for (r, call) in self.calls.iter().enumerate() {
            if call.is_some() {
                step.replies
                    .push((self.name(r), self.epoch, Err(error.clone())));
            }
        }
        for r in 0..self.workers {
            let name = self.name(r);
            for (_, epoch, _) in self.ahead[r].drain(..) {
                step.replies.push((name, epoch, Err(error.clone())));
            }
        }
        self.next_epoch();
        self.failure = Some(error.clone());
        step.failed = Some(error);
        step
    }

    fn next_epoch(&mut self) {
        self.epoch += 1;
        self.kind = None;
        self.calls.iter_mut().for_each(|c| *c = None);
        self.arrived = 0;
        self.first_arrival = None;
    }
}

/// The shape a collective's call carries, where the rank knew it.
fn shape_of(message: &[u8]) -> Option<CallShape> {
    crate::codec::from_slice::<Option<CallShape>>(message)
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Algorithm, CollectiveKind, ReduceOp};

    const T: Duration = Duration::from_secs(10);

    fn ok(step: &SyncStep) -> Vec<(Rank, Epoch, Vec<Vec<u8>>)> {
        step.replies
            .iter()
            .map(|(r, e, res)| (*r, *e, res.clone().expect("a successful reply").to_vec()))
            .collect()
    }

    #[test]
    fn all_gather_answers_every_rank_with_every_message_in_rank_order_once_the_last_arrives() {
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        assert!(s
            .on_call(t0, 2, 0, SyncKind::AllGather, b"c".to_vec(), true)
            .replies
            .is_empty());
        assert!(s
            .on_call(t0, 0, 0, SyncKind::AllGather, b"a".to_vec(), true)
            .replies
            .is_empty());
        let step = s.on_call(t0, 1, 0, SyncKind::AllGather, b"b".to_vec(), true);
        let all = vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()];
        assert_eq!(
            ok(&step),
            vec![(0, 0, all.clone()), (1, 0, all.clone()), (2, 0, all)]
        );
        assert_eq!(s.epoch(), 1);
        assert_eq!(s.poll_timeout(), None, "no epoch is gathering");
    }

    #[test]
    fn mixed_calls_fail_every_rank_of_the_epoch_naming_who_called_what() {
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        s.new_iteration(1);
        s.on_call(t0, 0, 0, SyncKind::Barrier, vec![], true);
        let step = s.on_call(t0, 2, 0, SyncKind::AllGather, vec![], true);
        let error = SyncError::Mismatch {
            at: CallAt {
                iteration: 1,
                call: 1,
                group: crate::ids::GroupId::ALL,
            },
            calls: vec![(0, SyncKind::Barrier), (2, SyncKind::AllGather)],
        };
        assert_eq!(step.failed, Some(error.clone()));
        assert_eq!(step.replies.len(), 2);
        assert_eq!(
            error.to_string(),
            "different calls at call 1 of iteration 1: rank 0 called barrier(), rank 2 called all_gather(); every rank must make the same sync calls and collectives in the same order"
        );
        let late = s.on_call(t0, 1, 0, SyncKind::Barrier, vec![], true);
        assert_eq!(
            late.replies,
            vec![(1, 0, Err(error))],
            "later calls get the failure"
        );
    }

    fn collective(kind: CollectiveKind, len: Option<u64>) -> (SyncKind, Vec<u8>) {
        let shape = len.map(|len| CallShape {
            len,
            algorithm: Algorithm::Doubling,
            chunk: 8192,
        });
        (
            SyncKind::Collective(kind),
            crate::codec::to_vec(&shape).unwrap(),
        )
    }

    #[test]
    fn collectives_that_differ_fail_at_once_as_a_collective_mismatch_naming_both_calls() {
        let t0 = Instant::now();
        let sum = CollectiveKind::AllReduce(Some(ReduceOp::Sum));
        // Another length, on the second arrival: both ranks named in rank order.
        let mut s = SyncState::new(3, T);
        s.new_iteration(2);
        let (k, m) = collective(sum, Some(5));
        assert_eq!(s.on_call(t0, 2, 0, k, m, true), SyncStep::default());
        let (k, m) = collective(sum, Some(4));
        let step = s.on_call(t0, 0, 0, k, m, true);
        let error = step.failed.expect("the length differs");
        assert_eq!(step.replies.len(), 2, "both waiting ranks are answered");
        assert_eq!(
            error.to_string(),
            "different collectives at call 1 of iteration 2: rank 0 called all_reduce(sum) with 4 element(s), rank 2 with 5; every rank must pass a value of the same length"
        );
        assert!(error.is_mistake());
        // Another collective: a broadcast's receiver (no shape) against an all_reduce.
        let mut s = SyncState::new(3, T);
        s.new_iteration(1);
        let (k, m) = collective(CollectiveKind::Broadcast { root: 0 }, None);
        s.on_call(t0, 1, 0, k, m, true);
        let (k, m) = collective(sum, Some(1));
        let error = s
            .on_call(t0, 2, 0, k, m, true)
            .failed
            .expect("the kinds differ");
        assert_eq!(
            error.to_string(),
            "different collectives at call 1 of iteration 1: rank 1 called broadcast from rank 0, rank 2 called all_reduce(sum) of 1 element(s) by recursive doubling; every rank must make the same collective calls in the same order"
        );
        // A broadcast's root and receivers are one call.
        let mut s = SyncState::new(3, T);
        s.new_iteration(1);
        let bcast = CollectiveKind::Broadcast { root: 1 };
        for (rank, len) in [(0, None), (1, Some(9)), (2, None)] {
            let (k, m) = collective(bcast, len);
            assert_eq!(
                s.on_call(t0, rank, 0, k, m, true).failed,
                None,
                "rank {rank}"
            );
        }
        assert_eq!(s.epoch(), 1, "the broadcast met");
    }

    #[test]
    fn calls_are_numbered_from_1_in_each_iteration() {
        let t0 = Instant::now();
        let mut s = SyncState::new(2, T);
        s.new_iteration(1);
        for epoch in 0..3 {
            s.on_call(t0, 0, epoch, SyncKind::Barrier, vec![], true);
            s.on_call(t0, 1, epoch, SyncKind::Barrier, vec![], true);
        }
        s.new_iteration(2);
        s.on_call(t0, 0, 3, SyncKind::Barrier, vec![], true);
        s.on_call(t0, 1, 3, SyncKind::Barrier, vec![], true);
        s.on_call(t0, 0, 4, SyncKind::Barrier, vec![], true);
        let error = s
            .on_call(t0, 1, 4, SyncKind::AllGather, vec![], true)
            .failed;
        assert!(
            matches!(
                error,
                Some(SyncError::Mismatch {
                    at: CallAt {
                        iteration: 2,
                        call: 2,
                        ..
                    },
                    ..
                })
            ),
            "{error:?}"
        );
    }

    #[test]
    fn a_timeout_from_the_first_arrival_names_the_missing_ranks_and_the_epoch() {
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        let t1 = t0 + Duration::from_secs(100);
        s.on_call(t1, 1, 0, SyncKind::Barrier, vec![], true);
        assert_eq!(s.poll_timeout(), Some(t1 + T));
        assert_eq!(
            s.handle_timeout(t1 + T - Duration::from_millis(1)),
            SyncStep::default()
        );
        let step = s.handle_timeout(t1 + T);
        match step.failed {
            Some(SyncError::TimedOut {
                at: CallAt { call: 1, .. },
                missing,
                ..
            }) => {
                assert_eq!(missing, vec![0, 2]);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(step.replies.len(), 1);
        assert_eq!(step.replies[0].0, 1);
    }

    #[test]
    fn a_call_arriving_after_the_deadline_fails_the_epoch_instead_of_completing_it() {
        let t0 = Instant::now();
        let mut s = SyncState::new(2, T);
        s.on_call(t0, 0, 0, SyncKind::Barrier, vec![], true);
        let step = s.on_call(t0 + T, 1, 0, SyncKind::Barrier, vec![], true);
        assert!(
            matches!(step.failed, Some(SyncError::TimedOut { ref missing, .. }) if missing == &vec![1])
        );
        assert_eq!(step.replies.len(), 2, "the waiting rank and the late one");
        assert!(step.replies.iter().all(|(_, _, r)| r.is_err()));
    }

    #[test]
    fn an_expiring_outer_wait_fails_the_gathering_epoch_naming_who_did_not_arrive() {
        let t0 = Instant::now();
        let mut s = SyncState::new(3, Duration::MAX);
        assert_eq!(s.expire(t0), SyncStep::default(), "nothing gathers");
        s.on_call(t0, 2, 0, SyncKind::Barrier, vec![], true);
        assert!(s.is_gathering());
        let step = s.expire(t0 + T);
        assert!(
            matches!(step.failed, Some(SyncError::TimedOut { at: CallAt { call: 1, .. }, ref missing, .. }) if missing == &vec![0, 1])
        );
    }

    #[test]
    fn a_rank_that_returned_without_the_call_fails_the_epoch_at_once() {
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        s.new_iteration(4);
        // Rank 1 returns first; rank 0 then calls.
        assert_eq!(s.on_returned(1, 4, 0), SyncStep::default());
        let step = s.on_call(t0, 0, 0, SyncKind::Barrier, vec![], true);
        assert_eq!(
            step.failed,
            Some(SyncError::Unmatched {
                at: CallAt {
                    iteration: 4,
                    call: 1,
                    group: crate::ids::GroupId::ALL,
                },
                kind: SyncKind::Barrier,
                returned: vec![1],
                waiting: vec![0],
            })
        );
        // And the other way round: a call waits, then a rank returns.
        let mut s = SyncState::new(2, T);
        s.new_iteration(1);
        s.on_call(t0, 0, 0, SyncKind::AllGather, vec![], true);
        let step = s.on_returned(1, 1, 0);
        assert!(
            matches!(step.failed, Some(SyncError::Unmatched { ref returned, .. }) if returned == &vec![1])
        );
        assert_eq!(step.replies.len(), 1);
    }

    #[test]
    fn epochs_are_counted_per_rank_and_an_out_of_step_call_is_refused() {
        let t0 = Instant::now();
        let mut s = SyncState::new(2, T);
        for epoch in 0..3 {
            s.new_iteration(epoch + 1);
            s.on_call(t0, 0, epoch, SyncKind::Barrier, vec![], true);
            assert_eq!(
                s.on_call(t0, 1, epoch, SyncKind::Barrier, vec![], true)
                    .replies
                    .len(),
                2
            );
            s.on_returned(0, epoch + 1, epoch + 1);
            s.on_returned(1, epoch + 1, epoch + 1);
        }
        let step = s.on_call(t0, 0, 7, SyncKind::Barrier, vec![], true);
        assert_eq!(
            step.replies,
            vec![(
                0,
                7,
                Err(SyncError::StaleEpoch {
                    rank: 0,
                    group: GroupId::ALL,
                    epoch: 7,
                    current: 3
                })
            )]
        );
    }

    #[test]
    fn an_abort_releases_every_waiting_rank_with_the_job_failure() {
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        s.on_call(t0, 0, 0, SyncKind::Barrier, vec![], true);
        s.on_call(t0, 2, 0, SyncKind::Barrier, vec![], true);
        let error = JobError::Runtime {
            message: "rank 1 died".into(),
        };
        let step = s.abort(&error);
        assert_eq!(step.failed, None);
        let expected = Err(SyncError::JobFailed(Box::new(error)));
        assert_eq!(
            step.replies,
            vec![(0, 0, expected.clone()), (2, 0, expected)]
        );
    }

    #[test]
    fn an_abort_for_a_ranks_mismatch_answers_every_waiting_rank_with_that_mismatch() {
        use crate::error::{BoxError, Cause, Phase};
        // Ranks 0 and 1 made the same call; rank 2 made another, whose call had not
        // reached the node when rank 0 met its piece and failed its compute of it.
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        s.on_call(t0, 0, 0, SyncKind::Barrier, vec![], true);
        s.on_call(t0, 1, 0, SyncKind::Barrier, vec![], true);
        let mismatch = SyncError::Mismatch {
            at: CallAt {
                iteration: 1,
                call: 1,
                group: crate::ids::GroupId::ALL,
            },
            calls: vec![(0, SyncKind::Barrier), (2, SyncKind::AllGather)],
        };
        let cause = Cause::from_error(BoxError::from(mismatch.to_string()));
        let error = JobError::Worker {
            rank: 0,
            iteration: 1,
            phase: Phase::Compute,
            cause: cause.mistaken(mismatch.clone()),
        };
        let step = s.abort(&error);
        assert_eq!(step.failed, None);
        let expected = Err(mismatch.clone());
        assert_eq!(
            step.replies,
            vec![(0, 0, expected.clone()), (1, 0, expected)]
        );
        // Rank 2's call, once it comes, gets it too.
        let step = s.on_call(t0, 2, 0, SyncKind::AllGather, vec![], true);
        assert_eq!(step.replies, vec![(2, 0, Err(mismatch))]);
    }

    /// An `all_reduce(sum)` of `len` elements, as its call carries it.
    fn shape(len: u64) -> Vec<u8> {
        collective(CollectiveKind::AllReduce(Some(ReduceOp::Sum)), Some(len)).1
    }

    const SUM: SyncKind = SyncKind::Collective(CollectiveKind::AllReduce(Some(ReduceOp::Sum)));

    #[test]
    fn calls_ahead_of_the_epoch_are_kept_for_it_and_only_ranks_that_await_are_answered() {
        // Rank 0's all_reduces return without a word of this node's: it calls epochs 1
        // and 2 before the other ranks' calls of epoch 0 come.
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        s.new_iteration(1);
        for epoch in 0..3 {
            let step = s.on_call(t0, 0, epoch, SUM, shape(1), false);
            assert_eq!(step, SyncStep::default(), "epoch {epoch}");
        }
        assert_eq!(s.epoch(), 0);
        // The same call delivered twice, kept or gathering, changes nothing.
        assert_eq!(
            s.on_call(t0, 0, 1, SUM, shape(1), false),
            SyncStep::default()
        );
        assert_eq!(
            s.on_call(t0, 0, 0, SUM, shape(1), false),
            SyncStep::default()
        );
        // Rank 0 returned, its three calls made: two are still to be met, none missing.
        assert_eq!(s.on_returned(0, 1, 3), SyncStep::default());
        s.on_call(t0, 1, 0, SUM, shape(1), false);
        // Rank 2 awaits the word (say its result proves nothing of the others): the epoch
        // meets, and it alone is answered; rank 0's call of epoch 1 is taken at once.
        let step = s.on_call(t0, 2, 0, SUM, shape(1), true);
        assert_eq!(step.failed, None);
        assert_eq!(
            step.replies
                .iter()
                .map(|(r, e, _)| (*r, *e))
                .collect::<Vec<_>>(),
            vec![(2, 0)]
        );
        assert_eq!(s.epoch(), 1);
        assert!(s.is_gathering(), "rank 0's call of epoch 1 is in");
        // Rank 1's result overtook its call of epoch 1: it made two calls, so that call
        // is on its way, not missing.
        assert_eq!(s.on_returned(1, 1, 2), SyncStep::default());
        s.on_call(t0, 1, 1, SUM, shape(1), false);
        // Epoch 1 meets, answering no one (no rank awaits a word); epoch 2 opens with rank
        // 0's call in it — which rank 1, returned after two calls, never makes.
        let step = s.on_call(t0, 2, 1, SUM, shape(1), false);
        assert!(
            matches!(
                &step.failed,
                Some(SyncError::Unmatched { returned, waiting, .. })
                    if returned == &vec![1] && waiting == &vec![0]
            ),
            "{step:?}"
        );
        assert_eq!(
            step.replies
                .iter()
                .map(|(r, e, _)| (*r, *e))
                .collect::<Vec<_>>(),
            vec![(0, 2)],
            "rank 0, ahead in epoch 2, hears of it"
        );
    }

    #[test]
    fn a_mismatch_answers_the_ranks_whose_later_calls_are_kept() {
        let t0 = Instant::now();
        let mut s = SyncState::new(2, T);
        s.new_iteration(1);
        s.on_call(t0, 0, 0, SUM, shape(4), false);
        s.on_call(t0, 0, 1, SUM, shape(4), false);
        s.on_call(t0, 0, 2, SUM, shape(4), false);
        let step = s.on_call(t0, 1, 0, SUM, shape(5), false);
        assert!(matches!(
            step.failed,
            Some(SyncError::CollectiveMismatch {
                rank: 0,
                peer: 1,
                ..
            })
        ));
        let mut answered: Vec<(Rank, Epoch)> =
            step.replies.iter().map(|(r, e, _)| (*r, *e)).collect();
        answered.sort_unstable();
        assert_eq!(answered, vec![(0, 0), (0, 1), (0, 2), (1, 0)]);
        assert!(step.replies.iter().all(|(_, _, result)| result.is_err()));
    }

    #[test]
    fn a_kept_call_times_out_from_when_it_came() {
        let t0 = Instant::now();
        let mut s = SyncState::new(2, T);
        s.new_iteration(1);
        s.on_call(t0, 0, 0, SUM, shape(1), false);
        s.on_call(t0, 0, 1, SUM, shape(1), false);
        s.on_call(t0 + T / 2, 1, 0, SUM, shape(1), false);
        // Epoch 1 gathers from rank 0's call, which came at t0.
        assert_eq!(s.epoch(), 1);
        assert_eq!(s.poll_timeout(), Some(t0 + T));
        let step = s.handle_timeout(t0 + T);
        assert!(matches!(
            step.failed,
            Some(SyncError::TimedOut { ref missing, .. }) if missing == &vec![1]
        ));
        // Kept calls of several ranks: the epoch counts from the first to come, not from
        // the lowest rank's.
        let mut s = SyncState::new(3, T);
        s.new_iteration(1);
        s.on_call(t0, 1, 0, SUM, shape(1), false);
        s.on_call(t0, 1, 1, SUM, shape(1), false);
        s.on_call(t0 + T / 4, 0, 0, SUM, shape(1), false);
        s.on_call(t0 + T / 4, 0, 1, SUM, shape(1), false);
        s.on_call(t0 + T / 2, 2, 0, SUM, shape(1), false);
        assert_eq!(s.epoch(), 1);
        assert_eq!(s.poll_timeout(), Some(t0 + T), "rank 1's call came first");
    }
}
