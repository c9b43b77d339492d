//! A job's preempt signal ([`JobConfig::preempt_signal`](crate::JobConfig::preempt_signal)),
//! for the whole process: its actions are registered the first time a job asks for the
//! signal, and kept. While a job that stops on it runs, the first signal asks it to stop
//! (each such job sees it on its next tick), copies of it within [`REPEATS`] after are
//! taken as the same notice (a scheduler, a launcher and a process group often deliver one
//! notice twice), and a later one does what the signal does by default; with no such job
//! running, the default — whatever the signal did before the first job took it. (A program
//! that ignores or handles the signal itself sets `preempt_signal` to `None`, and may ask
//! the job to stop from its handler with [`Preempt::request`](crate::Preempt::request).)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::Preempt;
use crate::protocol::PreemptSignal;

/// What asks a running job to stop for a preemption in this process: its handle, its
/// signal. Each is said once.
pub(crate) struct PreemptWatch {
    handle: Option<Preempt>,
    signal: Option<SignalWatch>,
    /// Where: `rank 0's process`.
    process: String,
    said: bool,
}

impl PreemptWatch {
    /// The watch of a job starting now in `process`, with `handle` and `signal` (its
    /// settings').
    pub(crate) fn start(
        handle: Option<Preempt>,
        signal: Option<PreemptSignal>,
        process: String,
    ) -> Self {
        PreemptWatch {
            handle,
            signal: signal.and_then(SignalWatch::start),
            process,
            said: false,
        }
    }

    /// What asked the job to stop and where (`SIGTERM in rank 2's process`), the first
    /// time it is seen.
    pub(crate) fn poll(&mut self) -> Option<String> {
        let fired = self.signal.as_mut().and_then(|s| s.look(Instant::now()));
        if self.said {
            return None;
        }
        let what = match fired {
            Some(signal) => signal.to_string(),
            None if self.handle.as_ref().is_some_and(Preempt::is_requested) => {
                "Preempt::request".to_string()
            }
            None => return None,
        };
        self.said = true;
        Some(format!("{what} in {}", self.process))
    }
}

/// How long after a signal a copy of it is taken as the same notice: a later one does the
/// signal's default.
pub(crate) const REPEATS: Duration = Duration::from_secs(1);

/// One signal's state, for the process.
struct Slot {
    /// Whether its actions are registered.
    installed: OnceLock<bool>,
    /// How many running jobs stop on the signal (changed under its lock, with `armed`).
    active: Mutex<usize>,
    /// Set: the signal does its default (its first action reads it). So while no job runs,
    /// and from [`REPEATS`] after it asked the jobs that run to stop.
    armed: Arc<AtomicBool>,
    /// Set when the signal came while jobs ran: every running job stops.
    hit: Arc<AtomicBool>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            installed: OnceLock::new(),
            active: Mutex::new(0),
            armed: Arc::new(AtomicBool::new(true)),
            hit: Arc::new(AtomicBool::new(false)),
        }
    }
}

fn slot(signal: PreemptSignal) -> &'static Slot {
    static SLOTS: OnceLock<[Slot; 5]> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| std::array::from_fn(|_| Slot::new()));
    &slots[match signal {
        PreemptSignal::Term => 0,
        PreemptSignal::Int => 1,
        PreemptSignal::Hup => 2,
        PreemptSignal::Usr1 => 3,
        PreemptSignal::Usr2 => 4,
    }]
}

/// A running job's watch of its preempt signal: dropped when the job ends.
pub(crate) struct SignalWatch {
    slot: &'static Slot,
    signal: PreemptSignal,
    /// When this watch first saw the signal.
    seen: Option<Instant>,
}

impl SignalWatch {
    /// Watches `signal` for a job that starts now: `None` where its actions could not be
    /// registered (said once, at WARN).
    pub(crate) fn start(signal: PreemptSignal) -> Option<SignalWatch> {
        let slot = slot(signal);
        if !*slot.installed.get_or_init(|| install(signal, slot)) {
            return None;
        }
        let mut active = slot.active.lock().unwrap_or_else(|e| e.into_inner());
        if *active == 0 {
            slot.hit.store(false, Ordering::SeqCst);
            slot.armed.store(false, Ordering::SeqCst);
        }
        *active += 1;
        Some(SignalWatch {
            slot,
            signal,
            seen: None,
        })
    }

    /// The signal, if it came while the job ran (looked at `now`): from [`REPEATS`] after
    /// it was first seen, the next one does the signal's default.
    pub(crate) fn look(&mut self, now: Instant) -> Option<PreemptSignal> {
        if !self.slot.hit.load(Ordering::SeqCst) {
            return None;
        }
        let seen = *self.seen.get_or_insert(now);
        if now.saturating_duration_since(seen) >= REPEATS {
            self.slot.armed.store(true, Ordering::SeqCst);
        }
        Some(self.signal)
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        let mut active = self.slot.active.lock().unwrap_or_else(|e| e.into_inner());
        *active -= 1;
        if *active == 0 {
            // No job stops on it: the signal does its default again.
            self.slot.armed.store(true, Ordering::SeqCst);
        }
    }
}

/// Registers the signal's two actions, in order: the default where `armed`, then `hit`
/// set. Returns whether they were.
#[cfg(unix)]
fn install(signal: PreemptSignal, slot: &Slot) -> bool {
    use signal_hook::flag;
    let number = signal.number();
    let registered = flag::register_conditional_default(number, Arc::clone(&slot.armed))
        .and_then(|_| flag::register(number, Arc::clone(&slot.hit)));
    match registered {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(%signal, %error, "could not take {signal}: a job does not stop on it");
            false
        }
    }
}

#[cfg(not(unix))]
fn install(_: PreemptSignal, _: &Slot) -> bool {
    false
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_watch_sees_its_signal_only_while_a_job_runs_and_a_later_one_does_the_default() {
        // SIGHUP: no other test of this binary takes it (every job takes SIGTERM and SIGUSR2).
        let slot = slot(PreemptSignal::Hup);
        let mut watch = SignalWatch::start(PreemptSignal::Hup).expect("registered");
        let t = Instant::now();
        assert_eq!(watch.look(t), None);
        assert!(
            !slot.armed.load(Ordering::SeqCst),
            "a job runs: the default is off"
        );
        signal_hook::low_level::raise(signal_hook::consts::SIGHUP).unwrap();
        assert_eq!(watch.look(t), Some(PreemptSignal::Hup));
        // A copy of the notice (a launcher's, a process group's) is the same notice.
        signal_hook::low_level::raise(signal_hook::consts::SIGHUP).unwrap();
        assert_eq!(watch.look(t + REPEATS / 2), Some(PreemptSignal::Hup));
        assert!(
            !slot.armed.load(Ordering::SeqCst),
            "a copy does not end the process"
        );
        watch.look(t + REPEATS);
        assert!(
            slot.armed.load(Ordering::SeqCst),
            "a later signal does the default"
        );
        drop(watch);
        assert!(
            slot.armed.load(Ordering::SeqCst),
            "no job runs: the default"
        );
        let mut again = SignalWatch::start(PreemptSignal::Hup).expect("registered");
        assert_eq!(again.look(t), None, "a new job does not see an old signal");
    }
}
