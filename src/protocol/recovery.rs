//! What a job does when a worker fails: the failure policies.

use serde::{Deserialize, Serialize};

use crate::error::{CauseKind, JobError, Phase};
use crate::ids::{Attempt, Rank};

/// What a job does when one of its workers fails — its code returns an error or panics
/// during start-up or an iteration, or it is lost (its process killed, its heartbeats gone).
///
/// A failure of the master, of a combiner, of configuration or in the end of the job
/// (`post_application`) always fails the job: there is nothing to replace. So does a
/// mistake in the program ([`Cause::is_mistake`](crate::Cause::is_mistake): ranks that made
/// different sync calls or collectives, a call outside compute or barrier mode, a message
/// to a rank the job does not have): another attempt would make it again.
///
/// In a settings document a policy is named as its variant (in either case), with its
/// field where it has one; in the environment (`SUPERSTEP_FAILURE_POLICY`, read by
/// [`JobConfig::with_env`](crate::JobConfig::with_env)) and through [`str::parse`] as
/// `fail`, `continue_without`, `restart_worker:N` or `restart_all:N`:
///
/// ```
/// # use superstep::{FailurePolicy, JobConfig};
/// let config: JobConfig = serde_json::from_str(
///     r#"{"failure_policy": {"restart_worker": {"max_restarts": 3}}}"#,
/// )?;
/// assert_eq!(config.failure_policy, FailurePolicy::RestartWorker { max_restarts: 3 });
/// let config: JobConfig = serde_json::from_str(r#"{"failure_policy": "fail"}"#)?;
/// assert_eq!(config.failure_policy, FailurePolicy::Fail);
/// assert_eq!("restart_all:2".parse(), Ok(FailurePolicy::RestartAll { max_attempts: 2 }));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailurePolicy {
    /// Fail the job with the worker's failure. The default.
    #[default]
    #[serde(alias = "fail")]
    Fail,
    /// Replace the worker (Guagua's worker fail-over): a new one of the same rank runs its
    /// start-up again (`init` reloads its shard) and redoes the current iteration with the
    /// current master result. At most `max_restarts` replacements over the job; the next
    /// failure fails it.
    ///
    /// In barrier mode — and so in a job with messages — ranks wait for each other inside
    /// an iteration, and what a rank computes depends on what the others sent it, so no
    /// rank can redo an iteration alone: a replacement takes every rank back to the last
    /// checkpoint with it (every worker starts again, with the state it saved there), as
    /// Pregel and Giraph recover, and as [`RestartAll`](Self::RestartAll) does. Each such
    /// recovery counts as one replacement.
    #[serde(alias = "restart_worker")]
    RestartWorker {
        /// The most replacements for each start of the master's process (one started
        /// again by its launcher counts anew).
        max_restarts: u32,
    },
    /// Go on without the worker for the rest of the job, as long as the workers left are
    /// at least the quorum, `ceil(min_workers_ratio × workers)`; below it, fail the job.
    #[serde(alias = "continue_without")]
    ContinueWithout,
    /// Restart every worker as a new attempt (Spark's barrier stages): the master resumes
    /// from its last checkpoint (or from the start without one), messages of the old
    /// attempt are fenced off as stale. At most `max_attempts` attempts for each start of
    /// the master's process (one started again by its launcher counts anew: the
    /// launcher's restarts bound those).
    ///
    /// Across processes each live process replaces its own worker — a new one from the
    /// factory, whose `init` runs again — when the master's node tells it to; a dead
    /// process is started again by its launcher or scheduler (`superstep-launch
    /// --restarts`, torchrun's, Slurm's `--requeue`, a Kubernetes Indexed Job) and joins
    /// the new attempt. A master's process started again restarts every worker the same
    /// way.
    #[serde(alias = "restart_all")]
    RestartAll {
        /// The most attempts, the first one included.
        max_attempts: u32,
    },
}

/// `fail`, `continue_without`, `restart_worker:N` or `restart_all:N` (`-` for `_`, in
/// any case); the error says which forms there are.
impl std::str::FromStr for FailurePolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let forms = "must be fail, continue_without, restart_worker:N or restart_all:N";
        let text = text.trim().to_ascii_lowercase().replace('-', "_");
        let (name, count) = match text.split_once(':') {
            Some((name, count)) => {
                let count = count.trim().parse::<u32>().map_err(|_| {
                    format!("{forms} (N a whole number; `{}` is not)", count.trim())
                })?;
                (name.trim().to_string(), Some(count))
            }
            None => (text, None),
        };
        match (name.as_str(), count) {
            ("fail", None) => Ok(FailurePolicy::Fail),
            ("continue_without", None) => Ok(FailurePolicy::ContinueWithout),
            ("restart_worker", Some(max_restarts)) => {
                Ok(FailurePolicy::RestartWorker { max_restarts })
            }
            ("restart_all", Some(max_attempts)) => Ok(FailurePolicy::RestartAll { max_attempts }),
            _ => Err(forms.to_string()),
        }
    }
}

/// What to do about one failure, as [`Recovery::on_failure`] decides it.
#[derive(Debug, Clone, PartialEq)]
pub enum Recover {
    /// Fail the job with this error.
    Fail(JobError),
    /// Replace the worker of this rank ([`Gate::rejoin`](super::Gate::rejoin)).
    RestartWorker(Rank),
    /// Go on without the worker of this rank ([`Gate::lose`](super::Gate::lose)).
    LeaveOut(Rank),
    /// Restart every worker as this new attempt ([`Gate::restart`](super::Gate::restart)),
    /// the master from its last checkpoint.
    RestartAll(Attempt),
}

/// Applies a [`FailurePolicy`]: counts restarts and attempts, and knows which ranks are
/// being replaced or were left for good.
///
/// Call order: [`new`](Recovery::new) with the attempt the job starts in. For each
/// failure, [`on_failure`](Recovery::on_failure), and carry out what it answers at once —
/// before the next message of any worker: `Fail` ends the job; `RestartWorker(r)` replaces
/// rank `r` (the gate's `rejoin`), and [`rejoined`](Recovery::rejoined) once the new worker
/// of `r` speaks for it (a local one at once; another process's once the old connection
/// ended); `LeaveOut(r)` goes on without `r` (the gate's `lose`); `RestartAll(a)` starts
/// every worker again in attempt `a` (the gate's `restart`). `None` means the failure is
/// one already being recovered from: nothing to do. Call
/// [`all_registered`](Recovery::all_registered) when every worker of an attempt
/// registered. A failure while the job ends is not the policy's to recover from:
/// [`recoverable`](Recovery::recoverable) says only whose it is.
#[derive(Debug, Clone)]
pub struct Recovery {
    policy: FailurePolicy,
    workers: usize,
    quorum: usize,
    attempt: Attempt,
    /// The attempt this process started in: `RestartAll`'s attempts are counted from it.
    first: Attempt,
    restarts: u32,
    replacing: Vec<bool>,
    lost: Vec<bool>,
    /// Barrier mode: a replacement restarts every rank.
    gang: bool,
}

impl Recovery {
    /// A recovery for `workers` workers in `attempt`, going on without a worker only while
    /// `quorum` remain.
    pub fn new(policy: FailurePolicy, workers: usize, quorum: usize, attempt: Attempt) -> Self {
        Recovery {
            policy,
            workers,
            quorum,
            attempt,
            first: attempt,
            restarts: 0,
            replacing: vec![false; workers],
            lost: vec![false; workers],
            gang: false,
        }
    }

    /// The same recovery for a job whose ranks wait for each other inside an iteration
    /// (`barrier_mode`): under `RestartWorker`, a replacement then restarts every rank
    /// from the last checkpoint ([`Recover::RestartAll`]), and counts as one replacement.
    pub fn barrier_mode(mut self, on: bool) -> Self {
        self.gang = on;
        self
    }

    /// Whether a failure restarts every worker: under `RestartAll`, and under
    /// `RestartWorker` in barrier mode.
    pub fn restarts_all(&self) -> bool {
        restarts_all(self.policy, self.gang)
    }

    /// The rank a failure is a worker's recoverable failure of, if it is one.
    pub fn recoverable(error: &JobError) -> Option<Rank> {
        match error {
            JobError::Worker {
                rank, phase, cause, ..
            } => match phase {
                // A mistake in the program (ranks that made different collectives, say):
                // every attempt would make it again.
                _ if cause.is_mistake() => None,
                Phase::PreApplication
                | Phase::Init
                | Phase::PreIteration
                | Phase::Compute
                | Phase::PostIteration => Some(*rank),
                // The fold among the workers: its error is the collective's — a peer
                // lost, or silent — which another attempt may not meet; a panic is the
                // user's fold's, which would panic again.
                Phase::Combine if cause.kind() == CauseKind::Error => Some(*rank),
                // A factory or a `Drop` that panics is the code's, not the worker's
                // process's or its data's: a replacement would fail the same way.
                Phase::Create
                | Phase::PostApplication
                | Phase::Combine
                | Phase::Checkpoint
                | Phase::Drop => None,
            },
            // A process of the rank that runs another job: under a policy that replaces
            // workers, another process of the rank may come.
            JobError::WorkerLost { rank, .. } | JobError::Mismatch { rank, .. } => Some(*rank),
            _ => None,
        }
    }

    /// Decides what to do about `error`. A second report of a rank already being
    /// replaced, or already left, is no new failure: it is answered `None`.
    pub fn on_failure(&mut self, error: JobError) -> Option<Recover> {
        let Some(rank) = Self::recoverable(&error).filter(|&r| r < self.workers) else {
            return Some(Recover::Fail(error));
        };
        if self.replacing[rank] || self.lost[rank] {
            return None;
        }
        Some(match self.policy {
            FailurePolicy::Fail => Recover::Fail(error),
            FailurePolicy::RestartWorker { max_restarts } => {
                if self.restarts >= max_restarts {
                    return Some(Recover::Fail(error));
                }
                if self.gang {
                    let Some(next) = self.next_attempt() else {
                        return Some(Recover::Fail(error));
                    };
                    self.restarts += 1;
                    self.restarted(next);
                    return Some(Recover::RestartAll(next));
                }
                self.restarts += 1;
                self.replacing[rank] = true;
                Recover::RestartWorker(rank)
            }
            FailurePolicy::ContinueWithout => {
                let left = self.lost.iter().filter(|&&l| !l).count() - 1;
                if left < self.quorum {
                    return Some(Recover::Fail(error));
                }
                self.lost[rank] = true;
                Recover::LeaveOut(rank)
            }
            FailurePolicy::RestartAll { .. } => {
                let Some(next) = self.next_attempt() else {
                    return Some(Recover::Fail(error));
                };
                self.restarted(next);
                Recover::RestartAll(next)
            }
        })
    }

    /// The attempt a gang restart goes on in, if this process may run another: its
    /// attempts are counted from its first ([`attempts_per_process`]), and never pass the
    /// last [`Attempt`].
    fn next_attempt(&self) -> Option<Attempt> {
        let ran = self.attempt.saturating_sub(self.first).saturating_add(1);
        if ran >= attempts_per_process(self.policy, self.gang) {
            return None;
        }
        self.attempt.checked_add(1)
    }

    /// The replacement of `rank` registered: a failure of it is a new failure again.
    pub fn rejoined(&mut self, rank: Rank) {
        if let Some(r) = self.replacing.get_mut(rank) {
            *r = false;
        }
    }

    /// Every worker registered (start-up of an attempt ended): replacements made during
    /// it are up, and a failure of theirs is a new failure again.
    pub fn all_registered(&mut self) {
        self.replacing.iter_mut().for_each(|r| *r = false);
    }

    /// Every worker starts over as `attempt` (a gang restart, or a restarted master).
    pub fn restarted(&mut self, attempt: Attempt) {
        self.attempt = attempt;
        self.replacing.iter_mut().for_each(|r| *r = false);
        self.lost.iter_mut().for_each(|l| *l = false);
    }

    /// The policy.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The number of workers.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The current attempt.
    pub fn attempt(&self) -> Attempt {
        self.attempt
    }

    /// How many workers were replaced so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }
}

/// Whether a failure of a worker under `policy` restarts every worker: under
/// `RestartAll`, and under `RestartWorker` in barrier mode (`barrier_mode`), where no rank
/// can redo an iteration alone.
pub(crate) fn restarts_all(policy: FailurePolicy, barrier_mode: bool) -> bool {
    match policy {
        FailurePolicy::RestartAll { .. } => true,
        FailurePolicy::RestartWorker { .. } => barrier_mode,
        FailurePolicy::Fail | FailurePolicy::ContinueWithout => false,
    }
}

/// The most attempts one master's process runs, whatever its policy says: room for 65,536
/// processes' attempts in an [`Attempt`].
const MOST_ATTEMPTS_PER_PROCESS: u32 = 1 << 16;

/// The most attempts one master's process runs under `policy`: `max_attempts` under
/// `RestartAll`, one more than `max_restarts` under `RestartWorker` in barrier mode (each
/// replacement a new attempt), one otherwise — and never more than 65,536.
pub(crate) fn attempts_per_process(policy: FailurePolicy, barrier_mode: bool) -> u32 {
    let most = match policy {
        FailurePolicy::RestartAll { max_attempts } => max_attempts.max(1),
        FailurePolicy::RestartWorker { max_restarts } if barrier_mode => {
            max_restarts.saturating_add(1)
        }
        _ => 1,
    };
    most.min(MOST_ATTEMPTS_PER_PROCESS)
}

/// The attempt a master's node starts in: 0 in the first process; in one started again in
/// the place of one that died (for the `restarted`-th time), `restarted` times the most
/// attempts one process runs (`per_process`), and past the newest checkpoint's. The
/// process before ran its attempts from its own start — `restarted - 1` times as many —
/// up to fewer than `per_process` more, gang restarts its checkpoints may not have seen
/// included: every attempt of a process is past every attempt of the processes before
/// it, so the pieces and messages of an attempt the workers ran before are stale to the
/// new one, never taken for its own.
pub(crate) fn start_attempt(
    restarted: u32,
    checkpoint: Option<Attempt>,
    per_process: u32,
) -> Attempt {
    if restarted == 0 {
        return 0;
    }
    let past = checkpoint.map_or(0, |c| c.saturating_add(1));
    restarted.saturating_mul(per_process.max(1)).max(past)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_started_again_runs_an_attempt_past_every_earlier_one() {
        assert_eq!(start_attempt(0, None, 3), 0);
        assert_eq!(
            start_attempt(0, Some(4), 3),
            0,
            "a first process starts at 0"
        );
        // Restarts with checkpoints no newer each time: strictly increasing, and past
        // the checkpoint's attempt.
        let mut before = 0;
        for (restarted, checkpoint) in [(1, None), (2, Some(1)), (3, Some(1)), (4, Some(3))] {
            let attempt = start_attempt(restarted, checkpoint, 1);
            assert!(
                attempt > before,
                "restart {restarted}: {attempt} after {before}"
            );
            assert!(checkpoint.is_none_or(|c| attempt > c));
            before = attempt;
        }
    }

    #[test]
    fn a_master_started_again_runs_no_attempt_its_process_before_ran_in_a_gang_restart() {
        // Each process of the master runs up to three attempts under `RestartAll
        // { max_attempts: 3 }`, the gang restarts after its newest checkpoint recorded by
        // none: the next process starts past all of them, whatever checkpoint it finds.
        let policy = FailurePolicy::RestartAll { max_attempts: 3 };
        let per_process = attempts_per_process(policy, false);
        let mut ran = Vec::new();
        let mut checkpoint = None;
        for restarted in 0..4 {
            let first = start_attempt(restarted, checkpoint, per_process);
            let mut r = Recovery::new(policy, 2, 2, first);
            let mut attempts = vec![first];
            while let Some(Recover::RestartAll(a)) = r.on_failure(crashed(0)) {
                attempts.push(a);
            }
            assert_eq!(attempts.len(), 3, "process {restarted}: {attempts:?}");
            assert!(
                attempts.iter().all(|a| ran.iter().all(|b| a > b)),
                "process {restarted} runs {attempts:?} after {ran:?}"
            );
            // Its checkpoint, if any, is of its first attempt: the gang restarts after it
            // are recorded nowhere.
            checkpoint = Some(first);
            ran.extend(attempts);
        }
        // In barrier mode `RestartWorker` restarts every rank as a new attempt too.
        let gang = FailurePolicy::RestartWorker { max_restarts: 2 };
        assert_eq!(attempts_per_process(gang, true), 3);
        assert_eq!(attempts_per_process(gang, false), 1);
        assert_eq!(attempts_per_process(FailurePolicy::Fail, true), 1);
        // "Unlimited" attempts: a process runs 65,536 at most, and the last attempt
        // fails the job rather than wrapping to 0.
        let unlimited = FailurePolicy::RestartAll {
            max_attempts: u32::MAX,
        };
        assert_eq!(attempts_per_process(unlimited, false), 1 << 16);
        let last = start_attempt(u32::MAX, None, 1 << 16);
        assert_eq!(last, Attempt::MAX);
        let mut r = Recovery::new(unlimited, 2, 2, last);
        assert!(matches!(r.on_failure(crashed(0)), Some(Recover::Fail(_))));
    }
    use crate::error::Cause;

    fn crashed(rank: Rank) -> JobError {
        JobError::WorkerLost {
            rank,
            reason: "killed".into(),
        }
    }

    #[test]
    fn restarts_are_counted_over_the_job_and_a_repeated_report_is_no_new_failure() {
        let mut r = Recovery::new(FailurePolicy::RestartWorker { max_restarts: 2 }, 3, 3, 0);
        assert_eq!(r.on_failure(crashed(1)), Some(Recover::RestartWorker(1)));
        assert_eq!(r.on_failure(crashed(1)), None, "already being replaced");
        r.rejoined(1);
        assert_eq!(r.on_failure(crashed(1)), Some(Recover::RestartWorker(1)));
        assert!(matches!(r.on_failure(crashed(2)), Some(Recover::Fail(_))));
        assert_eq!(r.restarts(), 2);
    }

    #[test]
    fn in_barrier_mode_a_replacement_restarts_every_worker_and_counts_as_one() {
        let policy = FailurePolicy::RestartWorker { max_restarts: 2 };
        let mut r = Recovery::new(policy, 3, 3, 0).barrier_mode(true);
        assert!(r.restarts_all());
        assert_eq!(r.on_failure(crashed(1)), Some(Recover::RestartAll(1)));
        // The same rank again, in the new attempt: a new failure.
        assert_eq!(r.on_failure(crashed(1)), Some(Recover::RestartAll(2)));
        assert!(matches!(r.on_failure(crashed(0)), Some(Recover::Fail(_))));
        assert_eq!(r.restarts(), 2);
        assert!(!Recovery::new(policy, 3, 3, 0).restarts_all());
    }

    #[test]
    fn going_on_without_a_worker_stops_at_the_quorum() {
        let mut r = Recovery::new(FailurePolicy::ContinueWithout, 4, 3, 0);
        assert_eq!(r.on_failure(crashed(0)), Some(Recover::LeaveOut(0)));
        assert_eq!(r.on_failure(crashed(0)), None);
        assert!(matches!(r.on_failure(crashed(2)), Some(Recover::Fail(_))));
    }

    #[test]
    fn a_gang_restart_is_a_new_attempt_up_to_the_most_attempts() {
        let mut r = Recovery::new(FailurePolicy::RestartAll { max_attempts: 3 }, 2, 2, 0);
        assert_eq!(r.on_failure(crashed(0)), Some(Recover::RestartAll(1)));
        assert_eq!(r.on_failure(crashed(1)), Some(Recover::RestartAll(2)));
        assert!(matches!(r.on_failure(crashed(1)), Some(Recover::Fail(_))));
    }

    #[test]
    fn failures_of_the_master_and_at_the_end_are_never_recovered() {
        let mut r = Recovery::new(FailurePolicy::RestartWorker { max_restarts: 9 }, 2, 2, 0);
        let master = JobError::Master {
            iteration: 1,
            phase: Phase::Compute,
            cause: Cause::from_error("x".into()),
        };
        assert!(matches!(r.on_failure(master), Some(Recover::Fail(_))));
        let late = JobError::Worker {
            rank: 0,
            iteration: 3,
            phase: Phase::PostApplication,
            cause: Cause::from_error("x".into()),
        };
        assert!(matches!(r.on_failure(late), Some(Recover::Fail(_))));
    }

    /// A compute that returned `error`, wrapped as a user's error type would wrap it.
    fn returned(error: crate::error::SyncError) -> JobError {
        #[derive(Debug, thiserror::Error)]
        #[error("step failed")]
        struct Wrapped(#[source] crate::error::SyncError);
        JobError::Worker {
            rank: 1,
            iteration: 2,
            phase: Phase::Compute,
            cause: Cause::from_error(Box::new(Wrapped(error))),
        }
    }

    #[test]
    fn a_mistake_in_the_program_fails_at_once_under_every_policy_and_a_fault_does_not() {
        use crate::error::SyncError;
        use crate::ids::{CallAt, CollectiveKind, ReduceOp, SyncKind};
        let call = crate::protocol::CallShape::call(
            None,
            0,
            CallAt::default(),
            CollectiveKind::AllReduce(Some(ReduceOp::Sum)),
        );
        let mismatch = SyncError::CollectiveMismatch {
            rank: 0,
            call: Box::new(call),
            peer: 1,
            peer_call: Box::new(call),
        };
        let lost = SyncError::PeerLost {
            rank: 1,
            peer: 0,
            reason: "closed".into(),
        };
        let policies = [
            FailurePolicy::RestartWorker { max_restarts: 9 },
            FailurePolicy::RestartAll { max_attempts: 9 },
            FailurePolicy::ContinueWithout,
        ];
        for policy in policies {
            for mistake in [mismatch.clone(), SyncError::NotEnabled(SyncKind::Barrier)] {
                let mut r = Recovery::new(policy, 3, 1, 0);
                assert!(
                    matches!(
                        r.on_failure(returned(mistake.clone())),
                        Some(Recover::Fail(_))
                    ),
                    "{policy:?}: {mistake}"
                );
            }
            let mut r = Recovery::new(policy, 3, 1, 0);
            assert!(
                !matches!(r.on_failure(returned(lost.clone())), Some(Recover::Fail(_))),
                "{policy:?}: a lost peer is a fault"
            );
        }
        // The mark crosses a network with the message.
        let JobError::Worker { cause, .. } = returned(mismatch) else {
            unreachable!()
        };
        let carried: Cause =
            crate::codec::from_slice(&crate::codec::to_vec(&cause).unwrap()).unwrap();
        assert!(carried.is_mistake());
    }
}
