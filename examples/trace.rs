//! A picture of a job: a run recorded as a Chrome / Perfetto trace from superstep's
//! `tracing` spans, with `tracing-chrome`.
//!
//! ```text
//! cargo run --example trace                    # writes superstep-trace.json
//! cargo run --example trace -- /tmp/run.json
//! ```
//!
//! Open the file in <https://ui.perfetto.dev> (or `chrome://tracing`): each rank is a
//! track (its thread, `superstep-traced-worker-N`) with a `compute` span per iteration
//! and, inside it, the `sync` span of its `barrier()` — how long it waited for the
//! others. Rank 2 computes five times as long, so every other rank's `sync` waits for
//! it: the straggler is seen at a glance. The job's thread holds the `job` span and an
//! `iteration` span per iteration, and the master's `master_compute`.

#[path = "support/trace.rs"]
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let out = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("superstep-trace.json"), PathBuf::from);
    match trace::record(&out, 4, 5) {
        Ok(outcome) => {
            println!(
                "{} iterations of 4 ranks traced to {} (rank {} is the straggler)",
                outcome.iterations,
                out.display(),
                trace::STRAGGLER
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}
