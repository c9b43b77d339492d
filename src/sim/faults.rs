//! The faults a simulated run injects: drawn from its seed with the probabilities of
//! [`Faults`], or given as data ([`Fault`]s at given points: a schedule, which a property
//! test generates and shrinks).

use std::time::Duration;

#[cfg(doc)]
use super::Simulation;
use crate::ids::{Iteration, Rank};

/// One fault at a point of a simulated run, given as data: a schedule of them
/// ([`Simulation::schedule`]) is what a property test generates, and what it shrinks to a
/// minimal failing one. Each fires once, the first time the run reaches its point (an
/// iteration redone after a recovery does not crash again).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Fault {
    /// The worker of `rank` crashes in `iteration`: during its compute, or right after its
    /// result left (the result is then in flight). In iteration 0: during its start-up,
    /// before it registers.
    WorkerCrash {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
        /// Whether it crashes after its result left, rather than during its compute.
        after_result: bool,
    },
    /// The worker of `rank` computes `iteration` twenty times as long (a straggler).
    Slow {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
    },
    /// The result of `rank` for `iteration` is delivered twice.
    Duplicate {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
    },
    /// The result of `rank` for `iteration` is lost on the way and retransmitted later.
    Drop {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
    },
    /// The result of `rank` for `iteration` is delayed by `millis` beyond the usual
    /// latency.
    Delay {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
        /// The extra delay, in milliseconds of virtual time.
        millis: u64,
    },
    /// The master's process crashes in `iteration`, at `point`. In iteration 0: during
    /// start-up, while its workers register (whatever the point).
    MasterCrash {
        /// The iteration.
        iteration: Iteration,
        /// Where in it.
        point: CrashPoint,
    },
    /// The master's process crashes once it told its workers how the job ended, before
    /// any of them said it stopped: during the drain.
    MasterCrashInDrain,
    /// The master's host is lost while it gathers `iteration`: its process crashes (as
    /// [`MasterCrash`](Fault::MasterCrash) at [`CrashPoint::Gathering`]) and its
    /// checkpoint store is lost with it, so that it starts again as on a fresh host, with
    /// an empty store — and resumes from the copy of the newest checkpoint a worker's
    /// process keeps (`JobConfig::checkpoint_replicas`), where a worker outlived it.
    MasterHostLost {
        /// The iteration.
        iteration: Iteration,
    },
    /// The network between the master and the worker of `rank` is cut for `millis` of
    /// virtual time, from when the master begins `iteration`. Shorter than the heartbeat
    /// timeout (30 ms here), nothing is lost: every message sent across it arrives once it
    /// heals, in order. Longer, both ends hear silence: the master's node loses the worker
    /// (as over TCP, after the heartbeat timeout), whose process ends on the master's
    /// loss; what either sent meanwhile is lost. Under `RestartWorker` its launcher starts
    /// it again once the network heals; a process of the rank started during the cut (in
    /// the place of one that crashed) connects once it heals, and what it sent meanwhile
    /// goes then. (Not where every worker restarts — `RestartAll`, or `RestartWorker` in
    /// barrier mode —: its workers share the master's process.) In
    /// barrier mode the worker's connections to its peers are cut alike: a collective's
    /// pieces wait for a short cut to heal; across a long one both ends of each
    /// connection hear the other lost after the heartbeat timeout.
    Partition {
        /// The rank cut off.
        rank: Rank,
        /// The iteration it begins in.
        iteration: Iteration,
        /// How long it lasts, in milliseconds of virtual time.
        millis: u64,
    },
}

/// Where in an iteration the master's process crashes ([`Fault::MasterCrash`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum CrashPoint {
    /// While it gathers the workers' results.
    Gathering,
    /// Once the results are in, before its compute.
    BeforeCompute,
    /// After its compute, before its checkpoint write.
    BeforeCheckpoint,
    /// During its checkpoint write (which is then lost: the one before stays).
    DuringCheckpoint,
    /// After its checkpoint write.
    AfterCheckpoint,
    /// During its checkpoint write, on storage that keeps what was written (no atomic
    /// rename, say): the torn file stays as the newest, and the master started again must
    /// find it damaged and resume from the one before.
    TornCheckpoint,
}

/// Which faults a simulated run draws, and how often. Every probability is in `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// That a worker crashes in an iteration it computes: during its compute, or right
    /// after its result left (the result is then in flight).
    pub worker_crash: f64,
    /// That the master's process crashes in an iteration: while it gathers results, or
    /// once they are in — before its compute, or before, during or after its checkpoint
    /// write.
    pub master_crash: f64,
    /// That a crash of the master's process loses its host's checkpoint store too: it
    /// starts again with an empty one (see [`Fault::MasterHostLost`]).
    pub host_lost: f64,
    /// That a message is delayed by up to [`max_delay`](Faults::max_delay) beyond the
    /// usual latency, so messages overtake each other.
    pub delay: f64,
    /// That a worker's result is delivered twice.
    pub duplicate: f64,
    /// That a worker's result, or a piece of a collective between workers, is lost on
    /// the way and retransmitted later.
    pub drop: f64,
    /// That a worker's compute takes twenty times as long (a straggler).
    pub slow: f64,
    /// The most crashes of each kind (workers, master) in one run.
    pub max_crashes: u32,
    /// The longest extra delay of a delayed message.
    pub max_delay: Duration,
}

impl Default for Faults {
    /// No faults.
    fn default() -> Self {
        Faults {
            worker_crash: 0.0,
            master_crash: 0.0,
            host_lost: 0.0,
            delay: 0.0,
            duplicate: 0.0,
            drop: 0.0,
            slow: 0.0,
            max_crashes: 3,
            max_delay: Duration::from_millis(20),
        }
    }
}

impl Faults {
    /// No faults.
    pub fn none() -> Self {
        Faults::default()
    }

    /// Crashes only: of a worker, and of the master, with these probabilities per
    /// iteration.
    pub fn crashes(worker: f64, master: f64) -> Self {
        Faults {
            worker_crash: worker,
            master_crash: master,
            ..Faults::default()
        }
    }

    /// Network faults only: delays, duplicates and drops, each with this probability.
    pub fn network(p: f64) -> Self {
        Faults {
            delay: p,
            duplicate: p,
            drop: p,
            ..Faults::default()
        }
    }

    /// Every fault, each with this probability.
    pub fn all(p: f64) -> Self {
        Faults {
            worker_crash: p,
            master_crash: p,
            slow: p,
            ..Faults::network(p)
        }
    }
}
