//! Dumps of the flight recorders (`superstep::flight`): what asks for one — the
//! [`FlightRecorder`] handle, the job's dump signal — and, in the master's process, the
//! dump under way: this process's ranks read at once, the others asked over their links
//! (`ToWorker::Record`), every answer or the wait's end written to one pair of files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::signals::REPEATS;
use crate::flight::{Dump, RankLog, Recorders, Written};
use crate::ids::Rank;
use crate::protocol::PreemptSignal;

/// How long a dump waits for the recorders of other processes' ranks: those that did not
/// answer by then are named as missing.
pub(crate) const DUMP_WAIT: Duration = Duration::from_secs(2);

/// Why a dump asked for with [`FlightRecorder::dump`] was not written here.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DumpError {
    /// No running job took the request within the time given (none runs with this
    /// handle, or its master's process did not get to it).
    #[error("no running job wrote a dump of its flight recorders within {0:?}")]
    TimedOut(Duration),
    /// This process runs no master: the request went to the master's process, which
    /// writes the dump on its host and logs where.
    #[error("this process runs no master: the master's process writes the dump, and logs where")]
    Elsewhere,
    /// The job ended before it wrote a dump.
    #[error("the job ended before it wrote a dump of its flight recorders")]
    JobEnded,
    /// The files could not be written.
    #[error("the dump of the flight recorders could not be written to {dir}: {error}")]
    Write {
        /// The directory ([`JobConfig::flight_dir`](crate::JobConfig::flight_dir)).
        dir: String,
        /// Why.
        error: String,
    },
}

crate::error::debug_as_sentence!(DumpError);

pub(crate) type Reply = mpsc::Sender<Result<Written, DumpError>>;

/// Asks a running job for a dump of every rank's flight recorder
/// ([`JobBuilder::flight_recorder`](crate::JobBuilder::flight_recorder)), as its dump
/// signal does ([`JobConfig::dump_signal`](crate::JobConfig::dump_signal)). Clones share
/// the same job.
///
/// ```no_run
/// # use superstep::{FlightRecorder, Job};
/// # fn job() -> Job<u64, u64> { unimplemented!() }
/// let recorder = FlightRecorder::new();
/// // … a job built with `.flight_recorder(recorder.clone())` runs on another thread …
/// let written = recorder.dump(std::time::Duration::from_secs(10))?;
/// println!("see {}", written.jsonl.display());
/// # Ok::<(), superstep::DumpError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct FlightRecorder {
    /// Each request's answer, and until when it is awaited.
    asks: Arc<Mutex<Vec<(Instant, Reply)>>>,
}

impl FlightRecorder {
    /// A handle that has asked for nothing yet.
    pub fn new() -> Self {
        FlightRecorder::default()
    }

    /// Asks the running job for a dump and waits at most `within` for it: where the
    /// files were written. The job goes on. Noticed within the job's timeout tick (at
    /// most 100 ms); the master's process waits up to 2 s for other processes' ranks, and
    /// names those that did not answer in the dump.
    pub fn dump(&self, within: Duration) -> Result<Written, DumpError> {
        let (reply, answer) = mpsc::channel();
        let until = Instant::now() + within;
        self.asks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((until, reply));
        match answer.recv_timeout(within) {
            Ok(written) => written,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(DumpError::TimedOut(within)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(DumpError::JobEnded),
        }
    }

    /// The requests made since the last look and still awaited (one given up on asks
    /// for nothing).
    fn take(&self) -> Vec<Reply> {
        let asks = std::mem::take(&mut *self.asks.lock().unwrap_or_else(|p| p.into_inner()));
        let now = Instant::now();
        asks.into_iter()
            .filter(|(until, _)| *until > now)
            .map(|(_, reply)| reply)
            .collect()
    }
}

/// What asks this process for a dump: its handle, its signal.
pub(crate) struct DumpWatch {
    handle: Option<FlightRecorder>,
    signal: Option<(PreemptSignal, Taken)>,
    /// Where: `rank 0's process`.
    process: String,
}

/// A job's own registration of its dump signal: each signal that came since the last look
/// is seen by every job that took it (a signal-hook iterator's pending signals: no thread,
/// no unsafe code). Once registered, the signal no longer does its default.
#[cfg(unix)]
type Taken = signal_hook::iterator::Signals;
#[cfg(not(unix))]
type Taken = ();

#[cfg(unix)]
fn take(signal: PreemptSignal) -> std::io::Result<Taken> {
    signal_hook::iterator::Signals::new([signal.number()])
}

#[cfg(not(unix))]
fn take(_: PreemptSignal) -> std::io::Result<Taken> {
    Err(std::io::Error::other("signals are taken on Unix only"))
}

/// Whether `taken`'s signal came since the last look.
#[cfg(unix)]
fn came(taken: &mut Taken) -> bool {
    taken.pending().count() > 0
}

#[cfg(not(unix))]
fn came(_: &mut Taken) -> bool {
    false
}

impl DumpWatch {
    /// The watch of a job starting now in `process`, with `handle` and its settings'
    /// dump signal; one that is the job's preempt signal is the preemption's alone.
    pub(crate) fn start(
        handle: Option<FlightRecorder>,
        (signal, preempt): (Option<PreemptSignal>, Option<PreemptSignal>),
        process: String,
    ) -> Self {
        let signal = signal.filter(|&s| {
            let free = Some(s) != preempt;
            if !free {
                tracing::warn!(signal = %s, "the dump signal is the preempt signal: it stops the job and dumps nothing (set dump_signal to another)");
            }
            free
        });
        let signal = signal.and_then(|s| match take(s) {
            Ok(taken) => Some((s, taken)),
            Err(error) => {
                tracing::warn!(signal = %s, %error, "could not take the dump signal: it dumps nothing");
                None
            }
        });
        DumpWatch {
            handle,
            signal,
            process,
        }
    }

    /// A dump asked for since the last look: what asked and where, and who waits for
    /// its files.
    pub(crate) fn poll(&mut self) -> Option<(String, Vec<Reply>)> {
        let replies = self
            .handle
            .as_ref()
            .map(FlightRecorder::take)
            .unwrap_or_default();
        let signalled = self
            .signal
            .as_mut()
            .and_then(|(signal, taken)| came(taken).then_some(*signal));
        let what = match (signalled, replies.is_empty()) {
            (Some(signal), _) => signal.to_string(),
            (None, false) => "FlightRecorder::dump".to_owned(),
            (None, true) => return None,
        };
        Some((format!("{what} in {}", self.process), replies))
    }
}

/// The master's process's dumps: the one under way, if any.
pub(crate) struct Dumps {
    recorders: Arc<Recorders>,
    job_id: String,
    dir: PathBuf,
    pending: Option<Pending>,
    /// The last dump written, and when: a request within [`REPEATS`] of it is answered
    /// with it (a launcher forwards one signal to every process, each of which asks).
    last: Option<(Instant, Result<Written, DumpError>)>,
}

struct Pending {
    why: String,
    workers: usize,
    until: Instant,
    logs: BTreeMap<Rank, RankLog>,
    waiting: BTreeSet<Rank>,
    replies: Vec<Reply>,
}

impl Dumps {
    pub(crate) fn new(recorders: Arc<Recorders>, job_id: &str, dir: Option<PathBuf>) -> Self {
        Dumps {
            recorders,
            job_id: job_id.to_owned(),
            dir: dir.unwrap_or_else(std::env::temp_dir),
            pending: None,
            last: None,
        }
    }

    /// A dump asked for by `why` at `now`, of `workers` ranks, those for which `here` says
    /// so read in this process: returns the ranks to ask over their links. A dump under
    /// way takes the request with it.
    pub(crate) fn begin(
        &mut self,
        now: Instant,
        (why, replies): (String, Vec<Reply>),
        workers: usize,
        here: impl Fn(Rank) -> bool,
    ) -> Vec<Rank> {
        // A signal's copies (a launcher's to every process) within a second of a dump are
        // the same request; a handle's request always gets a dump of its own.
        if let Some((at, written)) = self.last.as_ref().filter(|_| replies.is_empty()) {
            if now.saturating_duration_since(*at) < REPEATS {
                tracing::debug!(why, "a dump was written just now: the same request");
                for reply in replies {
                    let _ = reply.send(written.clone());
                }
                return Vec::new();
            }
        }
        tracing::info!(why, "writing a dump of the flight recorders");
        if let Some(pending) = &mut self.pending {
            pending.replies.extend(replies);
            return Vec::new();
        }
        let logs: BTreeMap<Rank, RankLog> = self
            .recorders
            .logs()
            .into_iter()
            .filter(|log| here(log.rank))
            .map(|log| (log.rank, log))
            .collect();
        let waiting: BTreeSet<Rank> = (0..workers).filter(|&r| !here(r)).collect();
        let ask = waiting.iter().copied().collect();
        self.pending = Some(Pending {
            why,
            workers,
            until: now + DUMP_WAIT,
            logs,
            waiting,
            replies,
        });
        ask
    }

    /// Rank `from`'s process answered at `now` with its recorder, encoded: the dump is
    /// written once it was the last awaited.
    pub(crate) fn recorded(&mut self, now: Instant, from: Rank, log: &[u8]) {
        let Some(pending) = &mut self.pending else {
            return;
        };
        match crate::codec::from_slice::<RankLog>(log) {
            Ok(log) if log.rank == from => {
                pending.waiting.remove(&from);
                pending.logs.insert(from, log);
            }
            Ok(log) => {
                tracing::warn!(
                    from,
                    claimed = log.rank,
                    "a flight recorder came for another rank; left out"
                )
            }
            Err(error) => {
                tracing::warn!(from, %error, "a rank's flight recorder could not be read; left out")
            }
        }
        self.settle(now);
    }

    /// Writes the dump under way once every rank answered or its wait ended.
    pub(crate) fn settle(&mut self, now: Instant) {
        let done = self
            .pending
            .as_ref()
            .is_some_and(|p| p.waiting.is_empty() || now >= p.until);
        if done {
            self.write(now);
        }
    }

    /// Writes the dump under way, if any, with what came: the job ends.
    pub(crate) fn settle_now(&mut self) {
        self.write(Instant::now());
    }

    fn write(&mut self, now: Instant) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let logs = pending.logs;
        let dump = Dump {
            job_id: self.job_id.clone(),
            why: pending.why,
            at_us: crate::flight::now_us(),
            missing: (0..pending.workers)
                .filter(|r| !logs.contains_key(r))
                .collect(),
            ranks: logs.into_values().collect(),
        };
        let written = dump.write_to(&self.dir).map_err(|e| DumpError::Write {
            dir: self.dir.display().to_string(),
            error: e.to_string(),
        });
        match &written {
            Ok(files) if dump.missing.is_empty() => {
                tracing::warn!(
                    ranks = dump.ranks.len(),
                    "flight recorders written to {files}"
                )
            }
            Ok(files) => tracing::warn!(
                ranks = dump.ranks.len(),
                missing = ?dump.missing,
                "flight recorders written to {files}; the missing ranks keep none (no compute in barrier mode yet), or their processes did not answer within {DUMP_WAIT:?}"
            ),
            Err(error) => tracing::warn!(%error, "no dump of the flight recorders"),
        }
        for reply in pending.replies {
            let _ = reply.send(written.clone());
        }
        self.last = Some((now, written));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight::What;

    fn files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn a_dump_waits_for_other_processes_ranks_until_its_wait_ends_and_names_those_missing() {
        let dir = tempfile::tempdir().unwrap();
        let recorders = Arc::new(Recorders::new(8));
        recorders.of(0).record(What::Compute { iteration: 1 });
        let mut dumps = Dumps::new(recorders, "job", Some(dir.path().to_owned()));
        let t = Instant::now();
        let (reply, answer) = mpsc::channel();
        let ask = dumps.begin(t, ("asked".into(), vec![reply]), 4, |r| r == 0);
        assert_eq!(ask, [1, 2, 3], "the other processes' ranks are asked");
        // A second request while it is under way: the same dump.
        let (again, second) = mpsc::channel();
        assert!(dumps
            .begin(t, ("again".into(), vec![again]), 4, |r| r == 0)
            .is_empty());
        // Rank 1 answers; rank 2's bytes are not a log, rank 3's claims another rank.
        let log = |rank| {
            let log = RankLog {
                rank,
                dropped: 0,
                events: Vec::new(),
            };
            crate::codec::to_vec(&log).unwrap()
        };
        dumps.recorded(t, 1, &log(1));
        dumps.recorded(t, 2, &[0xc1, 0xff]);
        dumps.recorded(t, 3, &log(1));
        dumps.settle(t + DUMP_WAIT / 2);
        assert_eq!(files(dir.path()), 0, "still waiting for ranks 2 and 3");
        dumps.settle(t + DUMP_WAIT);
        let written = answer.try_recv().expect("answered").expect("written");
        assert_eq!(second.try_recv().unwrap(), Ok(written.clone()));
        let text = std::fs::read_to_string(&written.jsonl).unwrap();
        let header: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(header["ranks"], serde_json::json!([0, 1]));
        assert_eq!(header["missing"], serde_json::json!([2, 3]));
        // A signal's copy within a second: that dump; a handle's request: one of its own.
        assert!(dumps
            .begin(t + DUMP_WAIT, ("copy".into(), Vec::new()), 1, |_| true)
            .is_empty());
        dumps.settle(t + DUMP_WAIT);
        assert_eq!(files(dir.path()), 2, "one dump, two files");
        let (reply, answer) = mpsc::channel();
        dumps.begin(t + DUMP_WAIT, ("handle".into(), vec![reply]), 1, |_| true);
        dumps.settle(t + DUMP_WAIT);
        assert!(answer.try_recv().unwrap().is_ok());
        assert!(files(dir.path()) >= 3, "a dump of its own");
    }

    #[test]
    fn a_dump_under_way_when_the_job_ends_is_written_with_what_came() {
        let dir = tempfile::tempdir().unwrap();
        let mut dumps = Dumps::new(
            Arc::new(Recorders::new(8)),
            "job",
            Some(dir.path().to_owned()),
        );
        let (reply, answer) = mpsc::channel();
        dumps.begin(Instant::now(), ("asked".into(), vec![reply]), 2, |_| false);
        dumps.settle_now();
        let written = answer.try_recv().unwrap().unwrap();
        assert!(written.jsonl.exists());
        // A request no one waits for any more asks for nothing.
        let handle = FlightRecorder::new();
        assert_eq!(
            handle.dump(Duration::from_millis(1)),
            Err(DumpError::TimedOut(Duration::from_millis(1)))
        );
        assert!(handle.take().is_empty());
    }
}
