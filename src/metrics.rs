//! A job's numbers through the [`metrics`](https://docs.rs/metrics) facade (the `metrics`
//! feature): the recorder the program installed — a Prometheus exporter, StatsD, … —
//! gets them; without one each costs a check. `examples/metrics.rs` serves them to
//! Prometheus.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `superstep_iterations_total` | counter | `job` | iterations completed |
//! | `superstep_iteration_seconds` | histogram | `job` | an iteration, from its broadcast to the master's result |
//! | `superstep_master_seconds` | histogram | `job` | the master's part of it: its interceptors and compute |
//! | `superstep_slowest_worker_seconds` | histogram | `job` | the slowest worker's time in it |
//! | `superstep_slowest_rank` | gauge | `job` | that worker's rank, in the last iteration |
//! | `superstep_results_held` | gauge | `job` | the most worker results the master held at once, in the last iteration |
//! | `superstep_messages_dropped_total` | counter | `job`, `reason` (`stale`, `duplicate`, `unknown_rank`) | results the master's barrier dropped |
//! | `superstep_recoveries_total` | counter | `job`, `action` (`restart_worker`, `leave_out`, `restart_all`) | worker failures the job recovered from |
//! | `superstep_bytes_sent_total`, `superstep_bytes_received_total` | counter | — | bytes of frames this process wrote and read over TCP |
//! | `superstep_worker_messages_total` | counter | `job`, `stage` (`sent`, `delivered`) | the workers' messages between supersteps: sent by their computes, and left the senders after combining |
//! | `superstep_worker_message_bytes_total` | counter | `job` | the bytes of those messages that crossed between processes, encoded |
//! | `superstep_worker_message_rounds` | gauge | `job` | the rounds of the exchange the last iteration's messages took: 1, more where a batch was larger than a frame |
//!
//! The master's process reports the job's metrics; every process its bytes.

use metrics::{Counter, Gauge, Histogram};

use crate::protocol::{Drops, IterationReport, JobEvent, Recover};

/// The job's metrics, registered once with its id as the `job` label.
pub(crate) struct JobMetrics {
    job: String,
    iterations: Counter,
    iteration: Histogram,
    master: Histogram,
    slowest: Histogram,
    slowest_rank: Gauge,
    held: Gauge,
    stale: Counter,
    duplicate: Counter,
    unknown_rank: Counter,
    messages_sent: Counter,
    messages_delivered: Counter,
    message_bytes: Counter,
    message_rounds: Gauge,
    /// The drops counted so far: each iteration adds what is new.
    counted: Drops,
}

impl std::fmt::Debug for JobMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobMetrics")
            .field("job", &self.job)
            .finish()
    }
}

impl JobMetrics {
    pub(crate) fn new(job: &str) -> Self {
        describe();
        let dropped = |reason: &'static str| metrics::counter!("superstep_messages_dropped_total", "job" => job.to_string(), "reason" => reason);
        JobMetrics {
            job: job.to_string(),
            iterations: metrics::counter!("superstep_iterations_total", "job" => job.to_string()),
            iteration: metrics::histogram!("superstep_iteration_seconds", "job" => job.to_string()),
            master: metrics::histogram!("superstep_master_seconds", "job" => job.to_string()),
            slowest: metrics::histogram!("superstep_slowest_worker_seconds", "job" => job.to_string()),
            slowest_rank: metrics::gauge!("superstep_slowest_rank", "job" => job.to_string()),
            held: metrics::gauge!("superstep_results_held", "job" => job.to_string()),
            stale: dropped("stale"),
            duplicate: dropped("duplicate"),
            unknown_rank: dropped("unknown_rank"),
            messages_sent: metrics::counter!("superstep_worker_messages_total", "job" => job.to_string(), "stage" => "sent"),
            messages_delivered: metrics::counter!("superstep_worker_messages_total", "job" => job.to_string(), "stage" => "delivered"),
            message_bytes: metrics::counter!("superstep_worker_message_bytes_total", "job" => job.to_string()),
            message_rounds: metrics::gauge!("superstep_worker_message_rounds", "job" => job.to_string()),
            counted: Drops::default(),
        }
    }

    /// Records what `event` tells, if it is an iteration completed or a recovery; `drops`
    /// are the master's node's drops so far.
    pub(crate) fn record(&mut self, event: &JobEvent, drops: Drops) {
        match event {
            JobEvent::IterationCompleted(report) => self.iteration(report, drops),
            JobEvent::Recovering(recovered) => self.recovered(&recovered.action),
            _ => {}
        }
    }

    /// An iteration completed; `drops` are the barrier's drops so far.
    fn iteration(&mut self, report: &IterationReport, drops: Drops) {
        self.iterations.increment(1);
        self.iteration.record(report.elapsed.as_secs_f64());
        self.master.record(report.master_elapsed.as_secs_f64());
        if let Some((rank, elapsed)) = report.slowest {
            self.slowest.record(elapsed.as_secs_f64());
            self.slowest_rank.set(rank as f64);
        }
        self.held.set(report.results_held as f64);
        self.messages_sent.increment(report.messages.sent);
        self.messages_delivered.increment(report.messages.delivered);
        self.message_bytes.increment(report.messages.bytes);
        self.message_rounds.set(report.messages.rounds as f64);
        let new = |now: u64, before: u64| now.saturating_sub(before);
        self.stale.increment(new(drops.stale, self.counted.stale));
        self.duplicate
            .increment(new(drops.duplicate, self.counted.duplicate));
        self.unknown_rank
            .increment(new(drops.unknown_rank, self.counted.unknown_rank));
        self.counted = drops;
    }

    /// The job recovered from a worker's failure.
    fn recovered(&self, action: &Recover) {
        let action = match action {
            Recover::RestartWorker(_) => "restart_worker",
            Recover::LeaveOut(_) => "leave_out",
            Recover::RestartAll(_) => "restart_all",
            Recover::Fail(_) => return,
        };
        metrics::counter!("superstep_recoveries_total", "job" => self.job.clone(), "action" => action)
            .increment(1);
    }
}

/// A frame of `bytes` went out over TCP.
#[cfg(feature = "tcp")]
pub(crate) fn sent(bytes: usize) {
    metrics::counter!("superstep_bytes_sent_total").increment(bytes as u64);
}

/// A frame of `bytes` came in over TCP.
#[cfg(feature = "tcp")]
pub(crate) fn received(bytes: usize) {
    metrics::counter!("superstep_bytes_received_total").increment(bytes as u64);
}

/// Says what each metric is and its unit, for exporters that show it (Prometheus's HELP).
fn describe() {
    use metrics::Unit;
    metrics::describe_counter!("superstep_iterations_total", "iterations completed");
    metrics::describe_histogram!(
        "superstep_iteration_seconds",
        Unit::Seconds,
        "an iteration, from its broadcast to the master's result"
    );
    metrics::describe_histogram!(
        "superstep_master_seconds",
        Unit::Seconds,
        "the master's part of an iteration: its interceptors and compute"
    );
    metrics::describe_histogram!(
        "superstep_slowest_worker_seconds",
        Unit::Seconds,
        "the slowest worker's time in an iteration"
    );
    metrics::describe_gauge!(
        "superstep_slowest_rank",
        "the slowest worker's rank in the last iteration"
    );
    metrics::describe_gauge!(
        "superstep_results_held",
        "the most worker results the master held at once in the last iteration"
    );
    metrics::describe_counter!(
        "superstep_messages_dropped_total",
        "results the master's barrier dropped: stale, duplicate, from an unknown rank"
    );
    metrics::describe_counter!(
        "superstep_recoveries_total",
        "worker failures the job recovered from, by what it did"
    );
    metrics::describe_counter!(
        "superstep_worker_messages_total",
        "the workers' messages between supersteps: sent by their computes, and left the senders after combining"
    );
    metrics::describe_counter!(
        "superstep_worker_message_bytes_total",
        Unit::Bytes,
        "the bytes of the workers' messages that crossed between processes, encoded"
    );
    metrics::describe_counter!(
        "superstep_bytes_sent_total",
        Unit::Bytes,
        "bytes of frames this process wrote over TCP"
    );
    metrics::describe_counter!(
        "superstep_bytes_received_total",
        Unit::Bytes,
        "bytes of frames this process read over TCP"
    );
}
