//! Copies of the master's checkpoints kept by workers of other processes: sent after each
//! checkpoint, offered back by each worker when its link reaches a master's node, and taken
//! before the first iteration by a master whose own store is older or empty.

use super::*;

impl<M, W> MasterNode<M, W> {
    /// The ranks that keep a copy of each checkpoint now: of other processes (on other
    /// hosts first), connected and not lost.
    pub(super) fn replica_holders(&self, reach: &dyn Reach) -> Vec<Rank> {
        let gate = &self.gate;
        let keeps = |rank| !gate.is_lost(rank) && reach.is_connected(rank);
        let elsewhere = |rank| reach.on_another_host(rank);
        self.config
            .replica_holders(&self.settings.local, keeps, elsewhere)
    }

    /// Sends the copy of a checkpoint just saved to each rank that keeps one.
    pub(super) fn replicate(&mut self, replica: Replica, reach: &dyn Reach) {
        for rank in self.replica_holders(reach) {
            self.send(rank, ToWorker::Replica(replica.clone()));
        }
    }

    /// The worker of `from` offered the copy of a checkpoint its process keeps. Before
    /// the first iteration, one newer than what the master resumed from is kept (in place
    /// of what the rank offered before), to resume from once every worker registered;
    /// after it, the master's own checkpoints are newer.
    pub(super) fn offered(&mut self, from: Rank, replica: Replica) {
        let own = self.resumed.map_or(0, |(iteration, _)| iteration);
        self.offers.retain(|(rank, _)| *rank != from);
        if self.begun || replica.iteration <= own {
            tracing::debug!(
                rank = from,
                iteration = replica.iteration,
                "a worker's copy of a checkpoint is not newer than the master's: not taken"
            );
            return;
        }
        tracing::info!(
            rank = from,
            iteration = replica.iteration,
            resumed_from = own,
            "worker {from} keeps a copy of the checkpoint of iteration {}, newer than the master's store has",
            replica.iteration
        );
        self.offers.push((from, replica));
    }

    /// Every worker registered: if one offered a copy newer than what the master resumed
    /// from, the master resumes from the newest before the first iteration (one found
    /// damaged is dropped, and the next newest tried). Returns whether it does (the start
    /// waits for it).
    pub(super) fn adopt_offer(&mut self, now: Instant) -> bool {
        let own = self.resumed.map_or(0, |(iteration, _)| iteration);
        self.offers.retain(|(_, replica)| replica.iteration > own);
        let newest = (0..self.offers.len()).max_by_key(|&i| {
            (
                self.offers[i].1.iteration,
                std::cmp::Reverse(self.offers[i].0),
            )
        });
        let Some(newest) = newest else {
            return false;
        };
        let (from, replica) = self.offers.swap_remove(newest);
        self.adopting = Some((from, replica.clone()));
        if let Stage::Starting { master_ready, .. } = &mut self.stage {
            *master_ready = false;
        }
        self.run_master(now, MasterWork::Adopt { from, replica });
        true
    }
}
