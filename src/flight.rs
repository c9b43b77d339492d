//! The flight recorder: each rank keeps its last events — in barrier mode the iterations
//! its compute entered, its sync calls and collectives (kind, length, number, when each
//! began and ended, and how), its messages of each superstep, what it saved for
//! checkpoints, the peers it lost; and, for a rank reached through a transport, in any
//! mode, its link's connections to the master's node and their losses — in a bounded ring
//! ([`JobConfig::flight_events`](crate::JobConfig::flight_events) each, 256 by default),
//! at the cost of a clock read and a few stores an event.
//!
//! A dump writes every rank's ring — those of other processes asked for over the job's
//! links — to two files a person can read: JSON lines (one event a line, a header line
//! first) and the Chrome trace format (each call a slice on its rank's track: open it in
//! <https://ui.perfetto.dev> or `chrome://tracing`). Ask for one with
//! [`FlightRecorder::dump`](crate::FlightRecorder::dump), or with the job's dump signal
//! ([`JobConfig::dump_signal`](crate::JobConfig::dump_signal), `SIGUSR2` by default) to
//! any of its processes; the files go to
//! [`JobConfig::flight_dir`](crate::JobConfig::flight_dir).
//!
//! Besides, a wait for ranks that times out names what the master's node last heard from
//! each of them ([`LastHeard`](crate::LastHeard)), in its error.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::ids::{Epoch, GroupId, Iteration, Rank, SyncKind};

/// One event of a rank's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When, in microseconds since the Unix epoch (the wall clock of the rank's host).
    pub at_us: u64,
    /// What happened.
    pub what: What,
}

/// What happened, in a rank's [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum What {
    /// Its compute entered this iteration.
    Compute {
        /// The iteration.
        iteration: Iteration,
    },
    /// It made a sync call or a collective.
    Call {
        /// The ranks it is among.
        group: GroupId,
        /// Its number among the group's calls of the attempt.
        epoch: Epoch,
        /// Which call.
        kind: SyncKind,
        /// How many elements its value has, where it has a length.
        len: Option<u64>,
    },
    /// The call `epoch` of `group` returned.
    Ended {
        /// The ranks it was among.
        group: GroupId,
        /// Its number among the group's calls.
        epoch: Epoch,
        /// Its error, if it failed.
        error: Option<String>,
    },
    /// Its messages of a superstep were exchanged.
    Messages {
        /// The superstep (iteration).
        iteration: Iteration,
        /// How many it sent.
        sent: u64,
        /// How many reached it.
        received: u64,
    },
    /// It saved what it needs to resume, for the checkpoint of this iteration.
    Saved {
        /// The iteration.
        iteration: Iteration,
    },
    /// Its link reached the master's node, which runs this attempt (at start, or again).
    Connected {
        /// The master's attempt.
        attempt: crate::ids::Attempt,
    },
    /// Its link lost the master's node, and tries to reach it again.
    MasterLost {
        /// How it was lost.
        reason: String,
    },
    /// Its connection to a peer was lost.
    PeerLost {
        /// The peer.
        peer: Rank,
        /// What happened.
        reason: String,
    },
}

/// One rank's recorder: its last events, at most a capacity of them.
#[derive(Debug)]
pub(crate) struct Recorder {
    /// How many events it keeps (0: none, and recording costs a branch).
    capacity: usize,
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<Event>,
    /// How many older events made room for newer ones.
    dropped: u64,
}

/// Now, in microseconds since the Unix epoch.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Recorder {
    /// A recorder of `capacity` events (0: none recorded).
    pub(crate) fn new(capacity: usize) -> Self {
        Recorder {
            capacity,
            // Grown as events come: a rank that records few holds little.
            ring: Mutex::new(Ring::default()),
        }
    }

    /// Records `what`, now; the oldest event makes room once the ring is full.
    pub(crate) fn record(&self, what: What) {
        if self.capacity == 0 {
            return;
        }
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        // Read under the lock: the events of the compute's thread and the transport's go
        // in in the order of their times.
        let at_us = now_us();
        if ring.events.len() == self.capacity {
            ring.events.pop_front();
            ring.dropped += 1;
        }
        ring.events.push_back(Event { at_us, what });
    }

    /// The events kept, oldest first, and how many older ones were dropped.
    fn read(&self) -> (Vec<Event>, u64) {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        (ring.events.iter().cloned().collect(), ring.dropped)
    }
}

/// The recorders of the ranks of one process, for one job: made for a rank when its first
/// worker starts, and kept across its replacements (one rank, one history).
#[derive(Debug)]
pub(crate) struct Recorders {
    capacity: usize,
    ranks: Mutex<BTreeMap<Rank, Arc<Recorder>>>,
}

impl Recorders {
    /// Recorders of `capacity` events each (0: none recorded).
    pub(crate) fn new(capacity: usize) -> Self {
        Recorders {
            capacity,
            ranks: Mutex::new(BTreeMap::new()),
        }
    }

    /// The recorder of `rank`, made if it has none yet.
    pub(crate) fn of(&self, rank: Rank) -> Arc<Recorder> {
        let mut ranks = self.ranks.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            ranks
                .entry(rank)
                .or_insert_with(|| Arc::new(Recorder::new(self.capacity))),
        )
    }

    /// What `rank`'s recorder holds, if this process has one for it.
    pub(crate) fn log(&self, rank: Rank) -> Option<RankLog> {
        let recorder = {
            let ranks = self.ranks.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(ranks.get(&rank)?)
        };
        let (events, dropped) = recorder.read();
        Some(RankLog {
            rank,
            dropped,
            events,
        })
    }

    /// What every rank's recorder of this process holds, in rank order.
    pub(crate) fn logs(&self) -> Vec<RankLog> {
        let ranks: Vec<Rank> = {
            let ranks = self.ranks.lock().unwrap_or_else(|p| p.into_inner());
            ranks.keys().copied().collect()
        };
        ranks.into_iter().filter_map(|r| self.log(r)).collect()
    }
}

/// What one rank's recorder held when it was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankLog {
    /// The rank.
    pub rank: Rank,
    /// How many older events made room for those kept.
    pub dropped: u64,
    /// Its events, oldest first.
    pub events: Vec<Event>,
}

/// A dump: every rank's recorder, as far as they answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dump {
    /// The job's id.
    pub job_id: String,
    /// What asked for it, and where: `FlightRecorder::dump in this process`,
    /// `SIGUSR2 in rank 2's process`.
    pub why: String,
    /// When, in microseconds since the Unix epoch.
    pub at_us: u64,
    /// The ranks' recorders, in rank order.
    pub ranks: Vec<RankLog>,
    /// The ranks whose recorders did not come: their process did not answer in time, or
    /// the rank is in the master's process and recorded nothing (a worker records its
    /// calls in barrier mode; one reached through a transport, its link's connections in
    /// any mode).
    pub missing: Vec<Rank>,
}

/// Where a dump was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The JSON lines: a header line, then one event a line.
    pub jsonl: PathBuf,
    /// The same events in the Chrome trace format.
    pub trace: PathBuf,
}

impl std::fmt::Display for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} and {}", self.jsonl.display(), self.trace.display())
    }
}

impl Dump {
    /// The event `what` as one object of the JSON lines: `{"rank":…,"at_us":…,"event":…}`.
    fn line(rank: Rank, event: &Event) -> serde_json::Value {
        use serde_json::json;
        let mut line = json!({"rank": rank, "at_us": event.at_us});
        let fields = match &event.what {
            What::Compute { iteration } => json!({"event": "compute", "iteration": iteration}),
            What::Call {
                group,
                epoch,
                kind,
                len,
            } => json!({"event": "call", "group": group.to_string(), "epoch": epoch,
                        "kind": kind.to_string(), "len": len}),
            What::Ended {
                group,
                epoch,
                error,
            } => json!({"event": "ended", "group": group.to_string(), "epoch": epoch,
                        "error": error}),
            What::Messages {
                iteration,
                sent,
                received,
            } => json!({"event": "messages", "iteration": iteration, "sent": sent,
                        "received": received}),
            What::Saved { iteration } => json!({"event": "saved", "iteration": iteration}),
            What::Connected { attempt } => json!({"event": "connected", "attempt": attempt}),
            What::MasterLost { reason } => json!({"event": "master_lost", "reason": reason}),
            What::PeerLost { peer, reason } => {
                json!({"event": "peer_lost", "peer": peer, "reason": reason})
            }
        };
        if let (Some(line), serde_json::Value::Object(fields)) = (line.as_object_mut(), fields) {
            line.extend(fields);
        }
        line
    }

    /// The dump as JSON lines: a header (`job`, `why`, `at_us`, `ranks`, `missing`, each
    /// rank's `dropped`), then each rank's events in rank order, oldest first.
    pub fn to_json_lines(&self) -> String {
        let dropped: BTreeMap<String, u64> = self
            .ranks
            .iter()
            .map(|r| (r.rank.to_string(), r.dropped))
            .collect();
        let header = serde_json::json!({
            "job": self.job_id,
            "why": self.why,
            "at_us": self.at_us,
            "ranks": self.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(),
            "missing": self.missing,
            "dropped": dropped,
        });
        let mut out = header.to_string();
        out.push('\n');
        for log in &self.ranks {
            for event in &log.events {
                out.push_str(&Self::line(log.rank, event).to_string());
                out.push('\n');
            }
        }
        out
    }

    /// The dump in the Chrome trace format: each rank a track (`tid`) of process 0, each
    /// call a complete slice from its call to its end (a call not ended runs to the dump),
    /// every other event an instant.
    pub fn to_chrome_trace(&self) -> String {
        use serde_json::json;
        let mut events = Vec::new();
        for log in &self.ranks {
            let tid = log.rank;
            events.push(
                json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                               "args": {"name": format!("rank {tid}")}}),
            );
            let mut open: BTreeMap<(GroupId, Epoch), (u64, String)> = BTreeMap::new();
            for event in &log.events {
                match &event.what {
                    What::Call {
                        group, epoch, kind, ..
                    } => {
                        open.insert((*group, *epoch), (event.at_us, kind.to_string()));
                    }
                    What::Ended {
                        group,
                        epoch,
                        error,
                    } => {
                        if let Some((from, name)) = open.remove(&(*group, *epoch)) {
                            events.push(json!({"name": name, "ph": "X", "pid": 0, "tid": tid,
                                "ts": from, "dur": event.at_us.saturating_sub(from),
                                "args": {"epoch": epoch, "group": group.to_string(),
                                         "error": error}}));
                        }
                    }
                    _ => {
                        let line = Self::line(tid, event);
                        let name = line["event"].as_str().unwrap_or("event").to_owned();
                        events.push(json!({"name": name, "ph": "i", "s": "t", "pid": 0,
                                           "tid": tid, "ts": event.at_us, "args": line}));
                    }
                }
            }
            for ((group, epoch), (from, name)) in open {
                events.push(
                    json!({"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": from,
                    "dur": self.at_us.saturating_sub(from),
                    "args": {"epoch": epoch, "group": group.to_string(),
                             "error": "not ended when the dump was taken"}}),
                );
            }
        }
        json!({"traceEvents": events, "displayTimeUnit": "ms"}).to_string()
    }

    /// Writes the dump to `dir` as `superstep-flight-<job>-<time>.jsonl` and
    /// `….trace.json`, each written whole to a temporary file first and renamed, so that
    /// a file of that name is never partial.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<Written> {
        std::fs::create_dir_all(dir)?;
        let job: String = self
            .job_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let stem = format!("superstep-flight-{job}-{}", self.at_us);
        let jsonl = dir.join(format!("{stem}.jsonl"));
        let trace = dir.join(format!("{stem}.trace.json"));
        for (path, text) in [
            (&jsonl, self.to_json_lines()),
            (&trace, self.to_chrome_trace()),
        ] {
            let mut file = tempfile::NamedTempFile::new_in(dir)?;
            file.write_all(text.as_bytes())?;
            file.persist(path).map_err(|e| e.error)?;
        }
        Ok(Written { jsonl, trace })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::CollectiveKind;

    #[test]
    fn a_full_ring_drops_its_oldest_and_counts_them() {
        let recorders = Recorders::new(3);
        let r = recorders.of(2);
        for iteration in 1..=5 {
            r.record(What::Compute { iteration });
        }
        let log = recorders.log(2).expect("rank 2 has one");
        let kept: Vec<_> = log.events.iter().map(|e| e.what.clone()).collect();
        assert_eq!(
            kept,
            (3..=5)
                .map(|iteration| What::Compute { iteration })
                .collect::<Vec<_>>()
        );
        assert_eq!(log.dropped, 2);
        assert!(recorders.log(1).is_none());
        // The same rank, the same recorder: a replaced worker goes on with its history.
        recorders.of(2).record(What::Saved { iteration: 5 });
        assert_eq!(recorders.log(2).map(|l| l.events.len()), Some(3));
        let off = Recorders::new(0);
        off.of(0).record(What::Compute { iteration: 1 });
        assert_eq!(off.log(0).map(|l| l.events.len()), Some(0));
    }

    #[test]
    fn a_dump_reads_as_json_lines_and_as_a_chrome_trace_with_each_call_a_slice() {
        let kind = SyncKind::Collective(CollectiveKind::AllReduce(None));
        let at = |at_us, what| Event { at_us, what };
        let dump = Dump {
            job_id: "job/1".into(),
            why: "asked".into(),
            at_us: 1_000,
            ranks: vec![RankLog {
                rank: 1,
                dropped: 0,
                events: vec![
                    at(10, What::Compute { iteration: 3 }),
                    at(
                        20,
                        What::Call {
                            group: GroupId::ALL,
                            epoch: 4,
                            kind,
                            len: Some(8),
                        },
                    ),
                    at(
                        50,
                        What::Ended {
                            group: GroupId::ALL,
                            epoch: 4,
                            error: None,
                        },
                    ),
                    at(
                        60,
                        What::Call {
                            group: GroupId::ALL,
                            epoch: 5,
                            kind: SyncKind::Barrier,
                            len: None,
                        },
                    ),
                ],
            }],
            missing: vec![0],
        };
        let lines: Vec<serde_json::Value> = dump
            .to_json_lines()
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0]["missing"], serde_json::json!([0]));
        assert_eq!(lines[2]["event"], "call");
        assert_eq!(lines[2]["kind"], "all_reduce_with");
        assert_eq!(lines[2]["rank"], 1);
        let trace: serde_json::Value =
            serde_json::from_str(&dump.to_chrome_trace()).expect("the trace is JSON");
        let slices: Vec<_> = trace["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["ts"].as_u64(),
                    e["dur"].as_u64(),
                )
            })
            .collect();
        assert_eq!(
            slices,
            vec![
                ("all_reduce_with".to_owned(), Some(20), Some(30)),
                // Not ended: runs to the dump.
                ("barrier()".to_owned(), Some(60), Some(940)),
            ]
        );
        let dir = tempfile::tempdir().expect("a temp dir");
        let written = dump.write_to(dir.path()).expect("written");
        assert!(written
            .jsonl
            .to_string_lossy()
            .contains("superstep-flight-job_1-1000"));
        assert_eq!(
            std::fs::read_to_string(&written.jsonl).unwrap(),
            dump.to_json_lines()
        );
        assert!(written.trace.exists());
    }
}
