//! The network between the master's process and each worker's: a connection a rank,
//! delivering in order as TCP does, with the latency and the faults drawn from the seed
//! or scheduled (delays, duplicates, drops retransmitted later, partitions); every message
//! crosses the wire encoding on its way.

use std::ops::Range;
use std::time::Duration;

use rand::RngExt;

use super::*;
use crate::protocol::{CallRun, Envelope, PeerMessage, Reach, HOLD};
use crate::transport::PeerEvent;

pub(super) const LATENCY_US: Range<u64> = 50..500;
pub(super) const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(30);
pub(super) const RETRANSMIT: Duration = Duration::from_millis(25);

/// `msg` as the receiving side of a wire gets it: encoded and decoded (every message, as
/// between processes: a type that breaks over TCP breaks here); the error is the one a TCP
/// peer would report.
pub(super) fn wire_copy<T: Payload>(
    msg: T,
    direction: impl FnOnce() -> String,
) -> Result<T, JobError> {
    crate::codec::through_wire(msg, direction).map_err(|u| u.sent_by("the simulated network"))
}

/// A direction of a rank's connection.
#[derive(Debug, Clone, Copy)]
pub(super) enum Way {
    ToMaster,
    ToWorker,
}

/// Which ranks the simulated network connects to the current master.
pub(super) struct SimReach(Vec<bool>);

impl Reach for SimReach {
    fn is_connected(&self, rank: Rank) -> bool {
        self.0.get(rank).copied().unwrap_or(false)
    }
    fn may_reach(&self, rank: Rank) -> bool {
        self.is_connected(rank)
    }
    fn refusals(&self, _: &[Rank]) -> Vec<String> {
        Vec::new()
    }
    /// A worker of a process of its own is on a host of its own: the host the master's
    /// crash may lose ([`Fault::MasterHostLost`]) is the master's alone.
    fn on_another_host(&self, rank: Rank) -> Option<bool> {
        self.is_connected(rank).then_some(true)
    }
}

impl<M: Payload, W: Payload> World<'_, M, W> {
    pub(super) fn latency(&mut self) -> Duration {
        let mut us = self.rng.random_range(LATENCY_US);
        if self.chance(self.sim.faults.delay) {
            let max = self.sim.faults.max_delay.as_micros().max(1) as u64;
            us += self.rng.random_range(0..max);
        }
        Duration::from_micros(us)
    }

    pub(super) fn reach(&self) -> SimReach {
        SimReach(
            self.nodes
                .iter()
                .map(|n| n.alive && n.master == self.master_generation)
                .collect(),
        )
    }

    /// The master's node hears that the worker of `rank` is gone, as a transport tells it.
    pub(super) fn lost(&mut self, rank: Rank, reason: &str) {
        let reason = reason.to_string();
        self.feed(|node, now, reach| {
            let attempt = node.attempt();
            let error = JobError::WorkerLost { rank, reason };
            let msg = ToMaster::Failed { attempt, error };
            node.handle_message(now, Envelope { from: rank, msg }, reach)
        });
    }

    /// How long until everything sent on the connection of `rank` has arrived.
    pub(super) fn until_delivered(&self, rank: Rank) -> Duration {
        let (to_master, _) = self.arrivals[rank];
        to_master.saturating_sub(self.clock.now) + Duration::from_micros(1)
    }

    /// A piece of a collective from the worker of `from` to the worker of `to`, on their
    /// connection: in order, after the latency and the delays drawn; a piece lost is
    /// retransmitted, as TCP does. A peer whose process is gone refuses the connection.
    pub(super) fn send_to_peer(&mut self, from: Rank, to: Rank, msg: PeerMessage) {
        let Some(peer) = self.nodes.get(to) else {
            return;
        };
        if !peer.alive {
            let reason = format!("worker {to}'s process is gone: the connection was refused");
            return self.peer_lost(from, to, reason);
        }
        let generation = peer.pid;
        let mut after = self.latency();
        if self.chance(self.sim.faults.drop) {
            after += RETRANSMIT;
        }
        // A cut of the network at either end holds the piece until it heals; across a
        // long one the connection is lost (both ends hear so: `cut`).
        let Some(after) = self
            .across_cut(from, after)
            .and_then(|after| self.across_cut(to, after))
        else {
            return;
        };
        let arrives = (self.clock.now + after).max(self.peer_arrivals[from][to]);
        self.peer_arrivals[from][to] = arrives;
        let event = PeerEvent::Message(msg);
        self.clock.at(
            arrives - self.clock.now,
            Event::Peer {
                to,
                generation,
                event,
            },
        );
    }

    /// The worker of `to` hears, after a latency, that its connection to the worker of
    /// `peer` broke.
    pub(super) fn peer_lost(&mut self, to: Rank, peer: Rank, reason: String) {
        self.peer_lost_after(to, peer, reason, Duration::ZERO);
    }

    /// [`peer_lost`](Self::peer_lost), `wait` from now.
    pub(super) fn peer_lost_after(&mut self, to: Rank, peer: Rank, reason: String, wait: Duration) {
        if !self.job.barrier_mode {
            // Workers connect to each other only for collectives, in barrier mode.
            return;
        }
        let generation = self.nodes[to].pid;
        // After every piece the connection carried: its end is read last.
        let arrives = (self.clock.now + wait + self.latency())
            .max(self.peer_arrivals[peer][to] + Duration::from_micros(1));
        let after = arrives - self.clock.now;
        // A worker of `to` that joined a newer attempt than the worker of `peer` ran had no
        // connection to it: over TCP a loss from before a worker joined never reaches it
        // (`Mesh::joined`), nor does one here. One still in an older attempt hears it in
        // its own, as over its lanes opened then.
        let attempt = self.nodes[to].worker.attempt();
        if self.nodes[peer].worker.attempt() < attempt {
            return;
        }
        let event = PeerEvent::Lost {
            rank: peer,
            attempt,
            reason,
        };
        self.clock.at(
            after,
            Event::Peer {
                to,
                generation,
                event,
            },
        );
    }

    /// What a peer sent the worker of `to` arrives: its compute, if it waits, goes on.
    pub(super) fn deliver_to_peer(&mut self, to: Rank, event: PeerEvent) {
        self.stats.messages += 1;
        if matches!(event, PeerEvent::Message(_)) {
            self.stats.pieces += 1;
        }
        if let Some(sync) = &self.nodes[to].sync {
            sync.answers.peer(event);
        }
        self.unpark(to);
    }

    /// A call of `from`'s whose word may go soon: held back on its process's link, as
    /// over TCP (`Lane::defer`), joining the calls held before it if it follows them; a
    /// worker in the master's process (its link in memory) sends it now.
    pub(super) fn send_soon(&mut self, from: Rank, msg: ToMaster<W>) {
        let calls = match CallRun::of(msg) {
            Ok(calls) if !self.hosted(from) => calls,
            Ok(calls) => return self.send_to_master(from, calls.word()),
            Err(msg) => return self.send_to_master(from, msg),
        };
        let node = &mut self.nodes[from];
        let unjoined = match &mut node.held {
            Some(held) => held.join(calls).err(),
            None => Some(calls),
        };
        let Some(calls) = unjoined else {
            return;
        };
        match node.held.take() {
            // Not the held calls' next: they go, and these wait on their timer.
            Some(before) => {
                self.send_calls(from, before);
                self.nodes[from].held = Some(calls);
            }
            None => {
                node.held = Some(calls);
                let generation = node.pid;
                self.clock.at(
                    HOLD,
                    Event::CallsHeld {
                        rank: from,
                        generation,
                    },
                );
            }
        }
    }

    /// Sends the calls held back on `from`'s link, if any.
    pub(super) fn send_held(&mut self, from: Rank) {
        if let Some(held) = self.nodes.get_mut(from).and_then(|n| n.held.take()) {
            self.send_calls(from, held);
        }
    }

    /// Sends the word of `from`'s calls `held`.
    fn send_calls(&mut self, from: Rank, held: CallRun) {
        if held.calls() > 1 {
            self.log(|| format!("worker {from}'s {} calls go as one word", held.calls()));
        }
        self.carry_word(from, held.word());
    }

    pub(super) fn send_to_master(&mut self, from: Rank, msg: ToMaster<W>) {
        // What was held back goes ahead of it.
        self.send_held(from);
        self.carry_word(from, msg);
    }

    /// Sends `msg` from `from` to the master's node, nothing held going first.
    fn carry_word(&mut self, from: Rank, msg: ToMaster<W>) {
        // Every message crosses the wire encoding, as it would between processes: what
        // arrives is the decoded copy, or the job fails as it would over TCP.
        let attempt = match &msg {
            ToMaster::Result(report) => report.attempt,
            ToMaster::Registered { attempt }
            | ToMaster::Failed { attempt, .. }
            | ToMaster::Done { attempt, .. }
            | ToMaster::Sync { attempt, .. } => *attempt,
            // Offered by the worker's process, which runs in its worker's attempt.
            ToMaster::Replica(_)
            | ToMaster::Preempt { .. }
            | ToMaster::Recorded { .. }
            | ToMaster::Dump { .. } => self.nodes[from].worker.attempt(),
        };
        let msg = wire_copy(msg, || format!("worker {from} → master"))
            .unwrap_or_else(|error| ToMaster::Failed { attempt, error });
        self.carry_to_master(from, msg);
    }

    /// Carries a message that crossed the wire encoding from `from` to the master, over
    /// the simulated network and its faults.
    pub(super) fn carry_to_master(&mut self, from: Rank, msg: ToMaster<W>) {
        if self.nodes.get(from).is_some_and(|n| n.held.is_some()) {
            // Over TCP what is held goes ahead of every frame: a result behind its calls
            // is what the master's node counts them by.
            self.violations.push(format!(
                "a message of worker {from}'s went ahead of the calls its link held back"
            ));
        }
        let generation = self
            .nodes
            .get(from)
            .map_or(self.master_generation, |n| n.master);
        let latency = self.latency();
        let is_result = msg.carries_result();
        let iteration = match &msg {
            ToMaster::Result(report) => Some(report.iteration),
            _ => None,
        };
        let on_result = |f: &Fault, kind: fn(Rank, Iteration) -> Fault| {
            iteration.is_some_and(|i| *f == kind(from, i))
        };
        let duplicate = self
            .scheduled(|f| on_result(f, |rank, iteration| Fault::Duplicate { rank, iteration }))
            .is_some();
        let dropped = self
            .scheduled(|f| on_result(f, |rank, iteration| Fault::Drop { rank, iteration }))
            .is_some();
        let delayed = match self.scheduled(|f| {
            matches!(f, Fault::Delay { rank, iteration: i, .. } if *rank == from && Some(*i) == iteration)
        }) {
            Some(Fault::Delay { millis, .. }) => Duration::from_millis(millis),
            _ => Duration::ZERO,
        };
        let latency = latency + delayed;
        // Across a cut of the network: held until it heals, or lost with the connection.
        let Some(latency) = self.across_cut(from, latency) else {
            return;
        };
        if duplicate || (is_result && self.chance(self.sim.faults.duplicate)) {
            // The copy a network delivers twice: the same bytes, decoded again.
            if let Ok(copy) = crate::codec::round_trip(&msg) {
                let again = self.latency() + latency;
                self.clock.at(
                    again,
                    Event::ToMaster {
                        generation,
                        from,
                        msg: copy,
                    },
                );
            }
        }
        let latency = if dropped || (is_result && self.chance(self.sim.faults.drop)) {
            latency + RETRANSMIT
        } else {
            latency
        };
        let latency = self.in_order(from, Way::ToMaster, latency);
        self.clock.at(
            latency,
            Event::ToMaster {
                generation,
                from,
                msg,
            },
        );
    }

    /// The latency of a message between the master and `rank` sent now, across the cut of
    /// the network there if any: it arrives once a short cut heals; across a long one
    /// (`None`) it is lost with the connection.
    pub(super) fn across_cut(&mut self, rank: Rank, latency: Duration) -> Option<Duration> {
        let (from, heal, cut) = match self.cuts.get(rank).copied().flatten() {
            Some((from, heal, cut)) if from <= self.clock.now && self.clock.now < heal => {
                (from, heal, cut)
            }
            _ => return Some(latency),
        };
        // A process started during the cut has no connection yet: it connects once the
        // network heals (its tries before fail), and what it sends goes then.
        let connected_since_cut = self.nodes.get(rank).is_some_and(|n| n.pid != cut);
        if heal - from >= HEARTBEAT_TIMEOUT && !connected_since_cut {
            // The connection dies with the cut: nothing it carries from now arrives.
            return None;
        }
        Some(heal - self.clock.now + latency)
    }

    /// The network between the master and `rank` is cut for `millis`, from now.
    pub(super) fn cut(&mut self, rank: Rank, millis: u64) {
        let Some(slot) = self.cuts.get_mut(rank) else {
            return;
        };
        let lasts = Duration::from_millis(millis);
        let generation = self.nodes[rank].pid;
        *slot = Some((self.clock.now, self.clock.now + lasts, generation));
        self.log(|| format!("the network to worker {rank} is cut for {lasts:?}"));
        if lasts >= HEARTBEAT_TIMEOUT {
            // Its connections to its peers go silent too: each end hears the other lost
            // once the heartbeats stop.
            let reason = |r: Rank| {
                format!(
                    "no heartbeat from worker {r} for {HEARTBEAT_TIMEOUT:?} (a network partition)"
                )
            };
            for peer in self.live_peers(rank) {
                self.peer_lost_after(peer, rank, reason(rank), HEARTBEAT_TIMEOUT);
                self.peer_lost_after(rank, peer, reason(peer), HEARTBEAT_TIMEOUT);
            }
            let (generation, master) = (self.nodes[rank].pid, self.master_generation);
            let silence = Event::Silence {
                rank,
                generation,
                master,
            };
            self.clock.at(HEARTBEAT_TIMEOUT, silence);
        }
    }

    /// A connection delivers in order, as TCP does: a message sent on it arrives after
    /// every one sent on it before (a delayed or retransmitted one holds up those behind
    /// it). Returns the latency that keeps the order.
    pub(super) fn in_order(&mut self, rank: Rank, way: Way, latency: Duration) -> Duration {
        let Some(last) = self.arrivals.get_mut(rank) else {
            return latency;
        };
        let last = match way {
            Way::ToMaster => &mut last.0,
            Way::ToWorker => &mut last.1,
        };
        let at = (self.clock.now + latency).max(*last + Duration::from_micros(1));
        *last = at;
        at - self.clock.now
    }

    pub(super) fn send_to_worker(&mut self, rank: Rank, msg: ToWorker<M>) {
        let msg = match wire_copy(msg, || format!("master → worker {rank}")) {
            Ok(msg) => msg,
            // The worker could not read it: the job fails, as over TCP.
            Err(error) => {
                return self.feed(|node, now, reach| node.handle_failure(now, error, reach))
            }
        };
        let node = &self.nodes[rank];
        if !node.alive || node.master != self.master_generation {
            // Not connected: nothing reaches it.
            return;
        }
        let generation = node.pid;
        let latency = self.latency();
        let Some(latency) = self.across_cut(rank, latency) else {
            return;
        };
        let latency = self.in_order(rank, Way::ToWorker, latency);
        self.clock.at(
            latency,
            Event::ToWorker {
                rank,
                generation,
                msg,
            },
        );
    }
}
