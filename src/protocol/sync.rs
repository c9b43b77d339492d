//! `barrier()` and `all_gather()` inside a worker's compute: the epochs of Spark's barrier
//! execution mode.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::JobError;
use crate::error::SyncError;
use crate::ids::{Epoch, Iteration, Rank, SyncKind};

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

/// The epochs of one attempt.
///
/// Call order: [`new_iteration`](Self::new_iteration) when an iteration opens;
/// [`on_call`](Self::on_call) for each call; [`on_returned`](Self::on_returned) when a
/// rank's result of the iteration arrives (its compute returned);
/// [`abort`](Self::abort) when the job fails for any reason; and
/// [`handle_timeout`](Self::handle_timeout) when [`poll_timeout`](Self::poll_timeout) has
/// passed. Send every reply of the returned [`SyncStep`]s; after a failure every later
/// call is answered with that failure.
#[derive(Debug)]
pub struct SyncState {
    workers: usize,
    timeout: Duration,
    epoch: Epoch,
    iteration: Iteration,
    kind: Option<SyncKind>,
    calls: Vec<Option<(SyncKind, Vec<u8>)>>,
    arrived: usize,
    first_arrival: Option<Instant>,
    returned: Vec<bool>,
    failure: Option<SyncError>,
}

impl SyncState {
    /// Epochs for `workers` ranks, each waiting at most `timeout` from its first arrival.
    pub fn new(workers: usize, timeout: Duration) -> Self {
        SyncState {
            workers,
            timeout,
            epoch: 0,
            iteration: 0,
            kind: None,
            calls: vec![None; workers],
            arrived: 0,
            first_arrival: None,
            returned: vec![false; workers],
            failure: None,
        }
    }

    /// The epoch now gathering.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Forgets every epoch, for a new attempt whose workers count their sync calls from
    /// the start again. Release the old attempt's waiting ranks first ([`SyncState::abort`]).
    pub fn restart(&mut self) {
        *self = SyncState::new(self.workers, self.timeout);
    }

    /// An iteration opened: every rank computes again.
    pub fn new_iteration(&mut self, iteration: Iteration) {
        self.iteration = iteration;
        self.returned.iter_mut().for_each(|r| *r = false);
    }

    /// Rank `rank` made its call `epoch` of kind `kind` with `message`.
    pub fn on_call(
        &mut self,
        now: Instant,
        rank: Rank,
        epoch: Epoch,
        kind: SyncKind,
        message: Vec<u8>,
    ) -> SyncStep {
        let mut step = SyncStep::default();
        if rank >= self.workers {
            return step;
        }
        if let Some(failure) = &self.failure {
            step.replies.push((rank, epoch, Err(failure.clone())));
            return step;
        }
        if epoch != self.epoch {
            // The rank is out of step with the others: no later epoch can meet either.
            let error = SyncError::StaleEpoch {
                rank,
                epoch,
                current: self.epoch,
            };
            let mut step = self.fail(error.clone());
            step.replies.push((rank, epoch, Err(error)));
            return step;
        }
        if self.poll_timeout().is_some_and(|deadline| now >= deadline) {
            // The deadline holds at arrival too, not only when the driver's timer fires.
            let mut step = self.handle_timeout(now);
            if let Some(failure) = &self.failure {
                step.replies.push((rank, epoch, Err(failure.clone())));
            }
            return step;
        }
        if self.calls[rank].is_some() {
            return step; // the same call delivered twice
        }
        self.calls[rank] = Some((kind, message));
        self.arrived += 1;
        if self.first_arrival.is_none() {
            self.first_arrival = Some(now);
        }
        match self.kind {
            None => self.kind = Some(kind),
            Some(first) if first != kind => {
                let calls = self
                    .calls
                    .iter()
                    .enumerate()
                    .filter_map(|(r, c)| c.as_ref().map(|(k, _)| (r, *k)))
                    .collect();
                return self.fail(SyncError::Mismatch {
                    epoch: self.epoch,
                    calls,
                });
            }
            Some(_) => {}
        }
        if let Some(unmatched) = self.unmatched() {
            return self.fail(unmatched);
        }
        if self.arrived == self.workers {
            let messages: Arc<Vec<Vec<u8>>> = Arc::new(
                self.calls
                    .iter_mut()
                    .map(|c| c.take().map(|(_, m)| m).unwrap_or_default())
                    .collect(),
            );
            for r in 0..self.workers {
                step.replies
                    .push((r, self.epoch, Ok(Arc::clone(&messages))));
            }
            self.next_epoch();
        }
        step
    }

    /// Rank `rank`'s compute of the current iteration returned: it makes no more calls in
    /// this iteration.
    pub fn on_returned(&mut self, rank: Rank, iteration: Iteration) -> SyncStep {
        if rank >= self.workers || self.failure.is_some() || iteration != self.iteration {
            return SyncStep::default();
        }
        self.returned[rank] = true;
        match self.unmatched() {
            Some(unmatched) => self.fail(unmatched),
            None => SyncStep::default(),
        }
    }

    /// The job failed: release every waiting rank with the job's failure.
    pub fn abort(&mut self, error: &JobError) -> SyncStep {
        if self.failure.is_some() {
            return SyncStep::default();
        }
        let mut step = self.fail(SyncError::JobFailed(Box::new(error.clone())));
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
        let missing: Vec<Rank> = (0..self.workers)
            .filter(|&r| self.calls[r].is_none())
            .collect();
        let waited = now.saturating_duration_since(self.first_arrival.unwrap_or(now));
        self.fail(SyncError::TimedOut {
            epoch: self.epoch,
            kind: self.kind.unwrap_or(SyncKind::Barrier),
            missing,
            waited,
        })
    }

    /// An epoch in progress that some rank can no longer join: it returned from compute
    /// without the call.
    fn unmatched(&self) -> Option<SyncError> {
        let kind = self.kind?;
        let returned: Vec<Rank> = (0..self.workers)
            .filter(|&r| self.returned[r] && self.calls[r].is_none())
            .collect();
        if returned.is_empty() {
            return None;
        }
        Some(SyncError::Unmatched {
            epoch: self.epoch,
            kind,
            iteration: self.iteration,
            returned,
            waiting: (0..self.workers)
                .filter(|&r| self.calls[r].is_some())
                .collect(),
        })
    }

    /// Answers every waiting rank with `error`, and keeps it for every later call.
    fn fail(&mut self, error: SyncError) -> SyncStep {
        let mut step = SyncStep::default();
        for (r, call) in self.calls.iter().enumerate() {
            if call.is_some() {
                step.replies.push((r, self.epoch, Err(error.clone())));
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

#[cfg(test)]
mod tests {
    use super::*;

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
            .on_call(t0, 2, 0, SyncKind::AllGather, b"c".to_vec())
            .replies
            .is_empty());
        assert!(s
            .on_call(t0, 0, 0, SyncKind::AllGather, b"a".to_vec())
            .replies
            .is_empty());
        let step = s.on_call(t0, 1, 0, SyncKind::AllGather, b"b".to_vec());
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
        s.on_call(t0, 0, 0, SyncKind::Barrier, vec![]);
        let step = s.on_call(t0, 2, 0, SyncKind::AllGather, vec![]);
        let error = SyncError::Mismatch {
            epoch: 0,
            calls: vec![(0, SyncKind::Barrier), (2, SyncKind::AllGather)],
        };
        assert_eq!(step.failed, Some(error.clone()));
        assert_eq!(step.replies.len(), 2);
        assert_eq!(
            error.to_string(),
            "different sync calls in epoch 0: rank 0 called barrier(), rank 2 called all_gather(); every rank must make the same calls in the same order"
        );
        let late = s.on_call(t0, 1, 0, SyncKind::Barrier, vec![]);
        assert_eq!(
            late.replies,
            vec![(1, 0, Err(error))],
            "later calls get the failure"
        );
    }

    #[test]
    fn a_timeout_from_the_first_arrival_names_the_missing_ranks_and_the_epoch() {
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        let t1 = t0 + Duration::from_secs(100);
        s.on_call(t1, 1, 0, SyncKind::Barrier, vec![]);
        assert_eq!(s.poll_timeout(), Some(t1 + T));
        assert_eq!(
            s.handle_timeout(t1 + T - Duration::from_millis(1)),
            SyncStep::default()
        );
        let step = s.handle_timeout(t1 + T);
        match step.failed {
            Some(SyncError::TimedOut {
                epoch: 0, missing, ..
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
        s.on_call(t0, 0, 0, SyncKind::Barrier, vec![]);
        let step = s.on_call(t0 + T, 1, 0, SyncKind::Barrier, vec![]);
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
        s.on_call(t0, 2, 0, SyncKind::Barrier, vec![]);
        assert!(s.is_gathering());
        let step = s.expire(t0 + T);
        assert!(
            matches!(step.failed, Some(SyncError::TimedOut { epoch: 0, ref missing, .. }) if missing == &vec![0, 1])
        );
    }

    #[test]
    fn a_rank_that_returned_without_the_call_fails_the_epoch_at_once() {
        let t0 = Instant::now();
        let mut s = SyncState::new(3, T);
        s.new_iteration(4);
        // Rank 1 returns first; rank 0 then calls.
        assert_eq!(s.on_returned(1, 4), SyncStep::default());
        let step = s.on_call(t0, 0, 0, SyncKind::Barrier, vec![]);
        assert_eq!(
            step.failed,
            Some(SyncError::Unmatched {
                epoch: 0,
                kind: SyncKind::Barrier,
                iteration: 4,
                returned: vec![1],
                waiting: vec![0],
            })
        );
        // And the other way round: a call waits, then a rank returns.
        let mut s = SyncState::new(2, T);
        s.new_iteration(1);
        s.on_call(t0, 0, 0, SyncKind::AllGather, vec![]);
        let step = s.on_returned(1, 1);
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
            s.on_call(t0, 0, epoch, SyncKind::Barrier, vec![]);
            assert_eq!(
                s.on_call(t0, 1, epoch, SyncKind::Barrier, vec![])
                    .replies
                    .len(),
                2
            );
            s.on_returned(0, epoch + 1);
            s.on_returned(1, epoch + 1);
        }
        let step = s.on_call(t0, 0, 7, SyncKind::Barrier, vec![]);
        assert_eq!(
            step.replies,
            vec![(
                0,
                7,
                Err(SyncError::StaleEpoch {
                    rank: 0,
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
        s.on_call(t0, 0, 0, SyncKind::Barrier, vec![]);
        s.on_call(t0, 2, 0, SyncKind::Barrier, vec![]);
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
}
