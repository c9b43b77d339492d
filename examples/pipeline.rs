//! A multi-worker CSV → JSONL transform: a generated CSV file is split into byte ranges of
//! whole lines, each worker transforms its range a batch per iteration into a part file,
//! and a `FileMerge` coordinator merges the parts into one JSONL file — atomically, and
//! only if every worker succeeded. A progress bar follows the bytes read; the report is
//! printed at the end.
//!
//! ```text
//! cargo run --release --features pipeline --example pipeline
//! cargo run --release --features pipeline --example pipeline -- --rows 2000000 --workers 8 --bad-every 1000 --skip-malformed
//! ```

#[path = "support/pipeline.rs"]
mod pipeline;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use superstep::coordinator::{FileMerge, MalformedRows, MergeFormat};

/// CSV → JSONL on superstep.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "A generated CSV file transformed to JSONL by every worker, merged into one file"
)]
struct Args {
    /// Rows of the generated CSV file.
    #[arg(long, default_value_t = 500_000)]
    rows: u64,
    /// Workers (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Rows each worker transforms per iteration.
    #[arg(long, default_value_t = 20_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    batch: usize,
    /// Make every N-th row malformed.
    #[arg(long)]
    bad_every: Option<u64>,
    /// Skip and record malformed rows instead of failing the job.
    #[arg(long)]
    skip_malformed: bool,
    /// Where the input and the output go (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,superstep=info".into()),
        )
        // Log lines on standard error, the results on standard output.
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    let temp = tempfile::tempdir().expect("a temporary directory");
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let input = dir.join("sales.csv");
    let output = dir.join("sales.jsonl");
    let generated = Instant::now();
    let size = match pipeline::generate(&input, args.rows, args.bad_every) {
        Ok(size) => size,
        Err(e) => {
            eprintln!("cannot write {}: {e}", input.display());
            return ExitCode::FAILURE;
        }
    };
    println!(
        "generated {} ({} rows, {:.1} MiB) in {:.2?}; {workers} workers",
        input.display(),
        args.rows,
        size as f64 / (1 << 20) as f64,
        generated.elapsed()
    );

    let merge = FileMerge::new(&output, MergeFormat::Lines);
    let staging = merge.staging().clone();
    let policy = if args.skip_malformed {
        MalformedRows::Skip
    } else {
        MalformedRows::Fail
    };
    let bar = ProgressBar::new(size);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {elapsed}")
            .expect("a valid template"),
    );
    let outcome = pipeline::job(&input, staging, workers, args.batch, policy)
        .job_id("pipeline")
        .coordinator(merge)
        .master_interceptor(BarUpdate { bar: bar.clone() })
        .run();
    bar.finish_and_clear();

    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => {
            eprintln!("job failed: {error}");
            eprintln!("{} was not written", output.display());
            return ExitCode::FAILURE;
        }
    };
    let rows = &outcome.report.rows;
    println!(
        "done in {:.2?}: {} iterations; rows read {}, written {}, rejected {}",
        outcome.report.elapsed, outcome.iterations, rows.read, rows.written, rows.rejected
    );
    for worker in &outcome.report.workers {
        println!(
            "  worker {}: read {}, written {}, rejected {}",
            worker.rank, worker.rows.read, worker.rows.written, worker.rows.rejected
        );
    }
    for rejected in rows.rejects.iter().take(5) {
        println!("  rejected {rejected}");
    }
    if rows.rejected > 5 {
        println!("  … and {} more rejected rows", rows.rejected - 5);
    }
    println!("merged into {}; its first lines:", output.display());
    if let Ok(text) = std::fs::read_to_string(&output) {
        for line in text.lines().take(3) {
            println!("  {line}");
        }
    }
    if args.dir.is_none() {
        println!("(a temporary directory, removed now: pass --dir to keep the files)");
    }
    ExitCode::SUCCESS
}

/// Moves the bar to the bytes read so far (the master result) after each iteration.
struct BarUpdate {
    bar: ProgressBar,
}

impl superstep::MasterInterceptor<u64, u64> for BarUpdate {
    fn post_iteration(
        &mut self,
        ctx: &superstep::MasterContext<u64, u64>,
    ) -> Result<(), superstep::BoxError> {
        if let Some(read) = ctx.master_result() {
            self.bar.set_position(*read);
        }
        Ok(())
    }
}
