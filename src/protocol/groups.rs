//! The epochs of the calls among groups of ranks (`collective::Group`): a [`SyncState`]
//! per group, as the master's node keeps it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::sync::{SyncState, SyncStep};
use crate::error::{JobError, SyncError};
use crate::ids::{CallAt, Epoch, GroupId, Iteration, Rank, SyncKind};

/// The epochs of the groups of ranks the workers make calls among
/// (`collective::Group`), each a [`SyncState`] of its own, made when its first call comes
/// and kept for the attempt. Every input of every group's goes here; each step returned
/// comes with its group.
#[derive(Debug)]
pub(crate) struct GroupEpochs {
    workers: usize,
    timeout: Duration,
    iteration: Iteration,
    groups: BTreeMap<GroupId, SyncState>,
    /// Per rank, the iteration its compute last returned in and its count of calls per
    /// group then: a group whose first call comes later in that iteration hears of it.
    /// (Tagged rather than cleared: an iteration opens without a pass over the ranks.)
    returned: Vec<(Iteration, Vec<(GroupId, Epoch)>)>,
}

impl GroupEpochs {
    /// No group yet, among `workers` ranks, each epoch waiting at most `timeout`.
    pub(crate) fn new(workers: usize, timeout: Duration) -> Self {
        GroupEpochs {
            workers,
            timeout,
            iteration: 0,
            groups: BTreeMap::new(),
            // Iterations count from 1: no rank returned in iteration 0.
            returned: vec![(0, Vec::new()); workers],
        }
    }

    /// Where a rank's call `epoch` among `group` in the iteration under way stands, of a
    /// word of its calls from `first`: its group's count, from the group's first call of
    /// the iteration (the group not made yet: the word's first call is its first).
    pub(crate) fn call_at(&self, group: GroupId, (first, epoch): (Epoch, Epoch)) -> CallAt {
        match self.groups.get(&group) {
            Some(state) => state.call_at(epoch),
            None => CallAt::of(self.iteration, first, epoch).in_group(group),
        }
    }

    /// A new attempt: the workers count their calls from the start again.
    pub(crate) fn restart(&mut self) {
        *self = GroupEpochs::new(self.workers, self.timeout);
    }

    /// An iteration opened.
    pub(crate) fn new_iteration(&mut self, iteration: Iteration) {
        self.iteration = iteration;
        for state in self.groups.values_mut() {
            state.new_iteration(iteration);
        }
    }

    /// Rank `rank`'s call `epoch` among `group`, whose ranks (in rank order) come with
    /// the rank's first call among it.
    pub(crate) fn on_call(
        &mut self,
        now: Instant,
        rank: Rank,
        (epoch, group, ranks): (Epoch, GroupId, &[Rank]),
        kind: SyncKind,
        message: Vec<u8>,
        awaits: bool,
    ) -> SyncStep {
        let known = self.groups.get(&group).and_then(SyncState::ranks);
        let refused = match known {
            Some(theirs) if ranks.is_empty() || ranks == theirs => None,
            Some(theirs) => Some(format!(
                "rank {rank} made a call among ranks {ranks:?} and others among {theirs:?}, both as {group}"
            )),
            None if ranks.is_empty() => Some(format!(
                "rank {rank} made call {epoch} among {group}, whose ranks no call said"
            )),
            None if GroupId::of(ranks) != group
                || !ranks.windows(2).all(|w| w[0] < w[1])
                || ranks.last().is_none_or(|&last| last >= self.workers)
                || ranks.binary_search(&rank).is_err() =>
            {
                Some(format!(
                    "rank {rank} made a call among ranks {ranks:?} as {group}: not a group of the {} ranks' in rank order with it",
                    self.workers
                ))
            }
            None => None,
        };
        if let Some(why) = refused {
            // Not a call any rank's context makes.
            return SyncStep {
                failed: Some(SyncError::BadGroup(why)),
                ..SyncStep::default()
            };
        }
        if known.is_none() {
            let mut state = SyncState::among(ranks, self.timeout);
            state.new_iteration(self.iteration);
            for (r, (iteration, counts)) in self.returned.iter().enumerate() {
                if *iteration == self.iteration && state.has(r) {
                    state.on_returned(r, self.iteration, count_of(counts, group));
                }
            }
            self.groups.insert(group, state);
        }
        let state = self.groups.get_mut(&group).expect("made above");
        state.on_call(now, rank, epoch, kind, message, awaits)
    }

    /// Rank `rank`'s compute of `iteration` returned, having made `counts` calls among
    /// each group it made calls among: a step for each group it is in.
    pub(crate) fn on_returned(
        &mut self,
        rank: Rank,
        iteration: Iteration,
        counts: &[(GroupId, Epoch)],
    ) -> Vec<(GroupId, SyncStep)> {
        if iteration == self.iteration {
            if let Some(slot) = self.returned.get_mut(rank) {
                slot.0 = iteration;
                slot.1.clear();
                slot.1.extend_from_slice(counts);
            }
        }
        if self.groups.is_empty() {
            return Vec::new();
        }
        self.groups
            .iter_mut()
            .filter(|(_, state)| state.has(rank))
            .map(|(group, state)| {
                let step = state.on_returned(rank, iteration, count_of(counts, *group));
                (*group, step)
            })
            .collect()
    }

    /// The job failed: every group releases its waiting ranks.
    pub(crate) fn abort(&mut self, error: &JobError) -> Vec<(GroupId, SyncStep)> {
        self.each(|state| state.abort(error))
    }

    /// Whether some group's epoch is gathering.
    pub(crate) fn is_gathering(&self) -> bool {
        self.groups.values().any(SyncState::is_gathering)
    }

    /// Fails every gathering epoch now ([`SyncState::expire`]).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<(GroupId, SyncStep)> {
        self.each(|state| state.expire(now))
    }

    /// When the first gathering epoch times out.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.groups
            .values()
            .filter_map(SyncState::poll_timeout)
            .min()
    }

    /// Fails the epochs whose timeout passed at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Vec<(GroupId, SyncStep)> {
        self.each(|state| state.handle_timeout(now))
    }

    fn each(
        &mut self,
        mut step: impl FnMut(&mut SyncState) -> SyncStep,
    ) -> Vec<(GroupId, SyncStep)> {
        let steps = self.groups.iter_mut();
        steps.map(|(group, state)| (*group, step(state))).collect()
    }
}

/// The count of calls among `group` in `counts` (none: 0).
fn count_of(counts: &[(GroupId, Epoch)], group: GroupId) -> Epoch {
    counts
        .iter()
        .find(|(g, _)| *g == group)
        .map_or(0, |(_, count)| *count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Algorithm, CollectiveKind, ReduceOp};
    use crate::protocol::CallShape;

    const T: Duration = Duration::from_secs(10);
    const SUM: SyncKind = SyncKind::Collective(CollectiveKind::AllReduce(Some(ReduceOp::Sum)));

    /// A collective's call of `len` elements, as its rank tells the node.
    fn shape(len: u64) -> Vec<u8> {
        crate::codec::to_vec(&Some(CallShape {
            len,
            algorithm: Algorithm::Doubling,
            chunk: 1,
        }))
        .unwrap()
    }

    #[test]
    fn the_last_call_of_a_groups_first_word_of_several_is_named_by_its_count_in_the_word() {
        let group = GroupId::of(&[1, 3]);
        let mut groups = GroupEpochs::new(5, T);
        groups.new_iteration(2);
        let at = groups.call_at(group, (0, 4));
        assert_eq!((at.iteration, at.call, at.group), (2, 5, group));
        assert_eq!(groups.call_at(group, (0, 0)).call, 1);
    }

    #[test]
    fn a_groups_epochs_name_ranks_as_the_job_does_and_hear_of_ranks_returned_before_its_first_call()
    {
        let t0 = Instant::now();
        let ranks = [1, 3, 4];
        let group = GroupId::of(&ranks);
        let mut groups = GroupEpochs::new(5, T);
        groups.new_iteration(2);
        // Rank 3 returned, having made no call among the group, before its first call came.
        assert!(groups.on_returned(3, 2, &[]).is_empty(), "no group yet");
        let step = groups.on_call(t0, 4, (0, group, &ranks[..]), SUM, shape(1), false);
        let Some(SyncError::Unmatched {
            at,
            returned,
            waiting,
            ..
        }) = step.failed
        else {
            panic!("{step:?}");
        };
        assert_eq!((returned, waiting), (vec![3], vec![4]));
        assert_eq!((at.group, at.call, at.iteration), (group, 1, 2));
        // The ranks answered are the job's: the rank that called.
        assert_eq!(
            step.replies.iter().map(|(r, ..)| *r).collect::<Vec<_>>(),
            vec![4]
        );
        // A rank that counted the group's call among its calls is not named; one that
        // times out is, as the job names it. A rank's later calls name the group alone.
        let mut groups = GroupEpochs::new(5, T);
        groups.new_iteration(1);
        groups.on_returned(3, 1, &[(group, 1)]);
        let step = groups.on_call(t0, 3, (0, group, &ranks[..]), SUM, shape(1), false);
        assert_eq!(step, SyncStep::default());
        groups.on_call(t0, 1, (0, group, &ranks[..]), SUM, shape(1), false);
        assert_eq!(groups.poll_timeout(), Some(t0 + T));
        let steps = groups.handle_timeout(t0 + T);
        assert!(
            matches!(
                &steps[..],
                [(id, SyncStep { failed: Some(SyncError::TimedOut { missing, .. }), .. })]
                    if *id == group && missing == &vec![4]
            ),
            "{steps:?}"
        );
        // Calls no context makes fail the job naming them: a group's first call without
        // its ranks, ranks out of order or another group's under its id.
        let bad = |ranks: &[Rank], said: &[Rank]| {
            let mut groups = GroupEpochs::new(5, T);
            let id = GroupId::of(ranks);
            groups.on_call(t0, 1, (0, id, ranks), SUM, shape(1), false);
            let step = groups.on_call(t0, 2, (1, id, said), SUM, shape(1), false);
            matches!(step.failed, Some(SyncError::BadGroup(_)))
        };
        assert!(bad(&[1, 2], &[1, 2, 3]), "ranks that differ under one id");
        assert!(
            bad(&[2, 1], &[]),
            "ranks out of order, then an unknown group"
        );
        assert!(!bad(&[1, 2], &[]), "a later call names the group alone");
    }
}
