//! Progress without code: an INFO line per completed iteration — its number, its time and
//! its slowest worker — at most one per `progress_interval`, each saying how many
//! iterations went by unsaid since the line before.

use std::time::{Duration, Instant};

use crate::protocol::IterationReport;

/// When the last line was logged, and what completed since.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    last_line: Option<Instant>,
    /// Iterations completed since the last line, and their time.
    unsaid: u64,
    unsaid_time: Duration,
}

impl Progress {
    /// Logs `report` if it is the first or `interval` has passed since the last line;
    /// counts it otherwise.
    pub(crate) fn completed(&mut self, now: Instant, interval: Duration, report: &IterationReport) {
        let due = self
            .last_line
            .is_none_or(|at| now.saturating_duration_since(at) >= interval);
        if !due {
            self.unsaid += 1;
            self.unsaid_time += report.elapsed;
            return;
        }
        let (iteration, elapsed) = (report.iteration, report.elapsed);
        let slowest = match report.slowest {
            Some((rank, time)) => format!("slowest worker {rank} ({time:.1?})"),
            None => "no worker result".to_string(),
        };
        let since = match self.unsaid {
            0 => String::new(),
            n => format!(
                "; {n} more since the last line, {:.1?} each on average",
                self.unsaid_time / u32::try_from(n).unwrap_or(u32::MAX)
            ),
        };
        let slowest_rank = report.slowest.map(|(rank, _)| rank);
        tracing::info!(
            iteration,
            ?elapsed,
            slowest_rank,
            "iteration {iteration} completed in {elapsed:.1?}, {slowest}{since}"
        );
        self.last_line = Some(now);
        self.unsaid = 0;
        self.unsaid_time = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(iteration: u64, ms: u64) -> IterationReport {
        IterationReport {
            iteration,
            elapsed: Duration::from_millis(ms),
            master_elapsed: Duration::ZERO,
            slowest: Some((1, Duration::from_millis(ms))),
            results_held: 2,
            left_out: Vec::new(),
            aggregation: crate::ids::FoldRoute::Star,
            messages: Default::default(),
        }
    }

    #[test]
    fn the_first_iteration_is_said_then_one_line_per_interval_counting_the_rest() {
        let t0 = Instant::now();
        let mut p = Progress::default();
        let interval = Duration::from_secs(1);
        p.completed(t0, interval, &report(1, 10));
        assert_eq!(p.last_line, Some(t0));
        for i in 2..=4 {
            p.completed(
                t0 + Duration::from_millis(100 * i),
                interval,
                &report(i, 20),
            );
        }
        assert_eq!((p.unsaid, p.unsaid_time), (3, Duration::from_millis(60)));
        let t1 = t0 + Duration::from_secs(1);
        p.completed(t1, interval, &report(5, 10));
        assert_eq!((p.last_line, p.unsaid), (Some(t1), 0));
        // Zero: every iteration.
        p.completed(t1, Duration::ZERO, &report(6, 10));
        assert_eq!(p.unsaid, 0);
    }
}
