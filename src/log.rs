//! Where a job's log lines go: to the subscriber of the thread that ran the job, on every
//! thread the job starts — and, when the program installed none, to standard error.
//!
//! A library must not install a global `tracing` subscriber behind its user's back (the
//! user's own would then fail to install). But a job whose program installed none would
//! tell a person nothing — not its progress, a recovery, a resume or its first failure.
//! So a job takes the dispatcher current where it was run (`run` or `run_async`'s caller)
//! and sets it on each thread it starts, for that thread only; where there is none, it
//! sets [`Fallback`], which writes superstep's own lines at INFO and above to standard
//! error. Installing any subscriber (`tracing_subscriber::fmt().init()`, with `RUST_LOG`
//! through its `EnvFilter`) replaces the fallback for every job started afterwards;
//! `SUPERSTEP_LOG=off` silences it.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::dispatcher::{self, Dispatch};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::{Interest, NoSubscriber};
use tracing::{Event, Level, Metadata, Subscriber};

/// The variable that silences the fallback (`off`).
pub(crate) const LOG_VAR: &str = "SUPERSTEP_LOG";

/// The dispatcher the threads of a job started here log to: this thread's current one,
/// or — when the program installed no subscriber at all — the [`Fallback`] (unless
/// `SUPERSTEP_LOG=off`).
pub(crate) fn for_job() -> Dispatch {
    let current = dispatcher::get_default(Dispatch::clone);
    let silenced = std::env::var(LOG_VAR).is_ok_and(|v| v.trim().eq_ignore_ascii_case("off"));
    // (`dispatcher::has_been_set` would not tell: a job's own threads' defaults count.)
    if current.is::<NoSubscriber>() && !silenced {
        Dispatch::new(Fallback::default())
    } else {
        current
    }
}

/// Sets `dispatch` as the default of this thread, a thread the job started, for as long
/// as the thread lives (its guard is never dropped: the thread ends with the job).
pub(crate) fn adopt(dispatch: &Dispatch) {
    std::mem::forget(dispatcher::set_default(dispatch));
}

/// Starts a thread named `name` that logs where the thread that starts it does.
pub(crate) fn spawn<T: Send + 'static>(
    name: String,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    let dispatch = dispatcher::get_default(Dispatch::clone);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || dispatcher::with_default(&dispatch, work))
}

/// Writes superstep's own events at INFO and above to standard error, a line each:
/// `2026-11-28T02:13:01Z  INFO superstep::protocol::master: iteration 120 completed …`,
/// with the event's other fields after the message. Spans are not written (their fields
/// are the job's and the iteration's, which the lines name where they matter).
#[derive(Debug, Default)]
pub(crate) struct Fallback {
    spans: AtomicU64,
}

impl Fallback {
    fn wanted(metadata: &Metadata<'_>) -> bool {
        !metadata.is_span()
            && *metadata.level() <= Level::INFO
            && metadata.target().starts_with("superstep")
    }
}

impl Subscriber for Fallback {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if Self::wanted(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        Self::wanted(metadata)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Never 0, which an `Id` may not be.
        Id::from_u64(self.spans.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let metadata = event.metadata();
        let mut line = Line::default();
        event.record(&mut line);
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        let level = metadata.level();
        let text = format!(
            "{now} {level:>5} {}: {}{}\n",
            metadata.target(),
            line.message,
            line.fields
        );
        // One write per line, so that lines of several threads do not interleave; through
        // `eprint!`, which a test harness captures as it captures the test's own output.
        eprint!("{text}");
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// An event's message and its other fields, as `name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_takes_superstep_lines_at_info_and_above_only() {
        let dispatch = Dispatch::new(Fallback::default());
        dispatcher::with_default(&dispatch, || {
            assert!(tracing::enabled!(target: "superstep::runtime", Level::INFO));
            assert!(tracing::enabled!(target: "superstep", Level::WARN));
            assert!(!tracing::enabled!(target: "superstep::runtime", Level::DEBUG));
            assert!(!tracing::enabled!(target: "hyper", Level::WARN));
        });
    }

    #[test]
    fn a_line_holds_the_message_then_the_other_fields() {
        let dispatch = Dispatch::new(Capture(std::sync::Mutex::new(None)));
        dispatcher::with_default(&dispatch, || {
            tracing::info!(target: "superstep", rank = 2, cause = %"lost", "rank {} lost", 2);
        });
        let capture = dispatch.downcast_ref::<Capture>().unwrap();
        let (message, fields) = capture.0.lock().unwrap().clone().unwrap();
        assert_eq!(message, "rank 2 lost");
        assert_eq!(fields, " rank=2 cause=lost");
    }

    /// Keeps the last event's line.
    struct Capture(std::sync::Mutex<Option<(String, String)>>);

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut line = Line::default();
            event.record(&mut line);
            *self.0.lock().unwrap() = Some((line.message, line.fields));
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn a_job_run_under_a_subscriber_of_its_callers_thread_logs_there_from_its_own_threads() {
        // `for_job` on a thread with a default of its own gives that default.
        let dispatch = Dispatch::new(Capture(std::sync::Mutex::new(None)));
        dispatcher::with_default(&dispatch, || {
            let got = for_job();
            assert!(got.is::<Capture>());
            let handle = spawn("logs".into(), || {
                tracing::warn!(target: "superstep", "from the job's thread");
            })
            .unwrap();
            handle.join().unwrap();
        });
        let capture = dispatch.downcast_ref::<Capture>().unwrap();
        let (message, _) = capture.0.lock().unwrap().clone().unwrap();
        assert_eq!(message, "from the job's thread");
    }
}
