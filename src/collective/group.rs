//! Collectives among a group of the job's ranks: a [`Group`] made once from a list of
//! ranks, and every collective made through [`WorkerContext::among`] it runs among those
//! ranks alone, with the rules of every collective inside the group.

use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::compute::WorkerContext;
use crate::error::SyncError;
use crate::group::Group;
use crate::ids::{CallAt, CallKey, Epoch, GroupId, Rank};

/// A worker's context whose collectives run among a [`Group`] of ranks
/// ([`WorkerContext::among`]): every method of the context, its collectives made among
/// the group's ranks alone. The context's own scope comes back when this is dropped.
pub struct Among<'a, M, W> {
    ctx: &'a mut WorkerContext<M, W>,
    before: Option<Group>,
}

impl<M, W> Among<'_, M, W> {
    /// The group the collectives are among.
    pub fn group(&self) -> &Group {
        self.ctx
            .scope
            .as_ref()
            .expect("a context among a group has it")
    }
}

impl<M, W> Deref for Among<'_, M, W> {
    type Target = WorkerContext<M, W>;

    fn deref(&self) -> &Self::Target {
        self.ctx
    }
}

impl<M, W> DerefMut for Among<'_, M, W> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.ctx
    }
}

impl<M, W> Drop for Among<'_, M, W> {
    fn drop(&mut self) {
        self.ctx.scope = self.before.take();
    }
}

impl<M, W> fmt::Debug for Among<'_, M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Among")
            .field("rank", &self.ctx.rank)
            .field("group", self.group())
            .finish()
    }
}

impl<M, W> WorkerContext<M, W> {
    /// This context, its collectives made among `group`'s ranks alone: `all_reduce`,
    /// `all_reduce_many`, `all_reduce_with`, `reduce_scatter` (a segment of the group's),
    /// `broadcast` (from a rank of the group), `barrier`, `all_gather` (every rank of the
    /// group's message, in rank order) and the calls started and finished later. Ranks
    /// outside the group make no call among it. Needs workers that reach each other
    /// ([`SyncError::NoPeers`] otherwise, at the first call).
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # use superstep::collective::{Group, ReduceOp};
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// // Made once; kept with the worker's state, say.
    /// let half: Vec<usize> = if ctx.rank() % 2 == 0 {
    ///     (0..ctx.workers()).step_by(2).collect()
    /// } else {
    ///     (1..ctx.workers()).step_by(2).collect()
    /// };
    /// let half = Group::new(half)?;
    /// let mut gradient = Floats::from(vec![0.5; 1 << 10]);
    /// // Summed among the ranks of this rank's half alone.
    /// ctx.among(&half)?.all_reduce(&mut gradient, ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    ///
    /// Fails with [`SyncError::BadGroup`] when the job has no such rank as one of the
    /// group's, [`SyncError::NotInGroup`] when this rank is not in it (a compute that
    /// returns either fails as a mistake in the program; to ask whether a rank is in a
    /// group, [`Group::contains`]).
    pub fn among(&mut self, group: &Group) -> Result<Among<'_, M, W>, SyncError> {
        if let Some(&beyond) = group.ranks().last().filter(|&&r| r >= self.workers) {
            return Err(SyncError::BadGroup(format!(
                "it has rank {beyond}, and the job {} worker(s)",
                self.workers
            )));
        }
        if !group.contains(self.rank) {
            return Err(group.without(self.rank));
        }
        let before = self.scope.replace(group.clone());
        Ok(Among { ctx: self, before })
    }

    /// The group the collectives made now are among.
    pub(crate) fn scope_id(&self) -> GroupId {
        self.scope.as_ref().map_or(GroupId::ALL, Group::id)
    }

    /// This rank's place among the ranks the collectives made now are among, and how many
    /// they are.
    pub(crate) fn place(&self) -> (Rank, usize) {
        match &self.scope {
            None => (self.rank, self.workers),
            Some(group) => (
                group
                    .place(self.rank)
                    .expect("a rank makes calls among its own group"),
                group.size(),
            ),
        }
    }

    /// Counts a call among the ranks the collectives made now are among: its epoch.
    pub(crate) fn count_call(&mut self) -> Epoch {
        let Some(group) = self.scope.as_ref() else {
            let epoch = self.epoch;
            self.epoch += 1;
            return epoch;
        };
        let iteration = self.iteration;
        let count = self.groups.entry(group.id()).or_default();
        if count.iteration != iteration {
            count.first = count.next;
            count.iteration = iteration;
        }
        let epoch = count.next;
        count.next += 1;
        epoch
    }

    /// Where this rank's call `epoch` among the ranks the collectives made now are among
    /// stands in the iteration.
    pub(crate) fn call_at(&self, epoch: Epoch) -> CallAt {
        let group = self.scope_id();
        if group == GroupId::ALL {
            return CallAt::of(self.iteration, self.iteration_epoch, epoch);
        }
        let first = self
            .groups
            .get(&group)
            .filter(|count| count.iteration == self.iteration)
            .map_or(epoch, |count| count.first);
        CallAt::of(self.iteration, first, epoch).in_group(group)
    }

    /// The key of this rank's next call among `group`.
    pub(crate) fn next_call(&self, group: GroupId) -> CallKey {
        let epoch = if group == GroupId::ALL {
            self.epoch
        } else {
            self.groups.get(&group).map_or(0, |count| count.next)
        };
        CallKey { group, epoch }
    }

    /// The groups this rank made calls among, with the count of its calls among each.
    pub(crate) fn group_calls(&self) -> Option<Box<crate::protocol::GroupCalls>> {
        if self.groups.is_empty() {
            return None;
        }
        let counts = self
            .groups
            .iter()
            .map(|(group, count)| (*group, count.next));
        Some(Box::new(crate::protocol::GroupCalls(counts.collect())))
    }
}
