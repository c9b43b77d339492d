//! A CSV → JSONL transform as a superstep job, shared by `examples/pipeline.rs` and the
//! coordinator tests: each worker reads whole lines of its byte range of the input, a batch
//! per iteration, writes JSONL to its part in the staging directory, and votes to halt when
//! its range is done; the job halts when every worker is done, and a coordinator merges or
//! commits the parts.

#![allow(dead_code)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use superstep::coordinator::{MalformedRows, RowFormat, RowSource, Shard, Staging};
use superstep::prelude::*;

/// A row of the input CSV.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Sale {
    pub id: u64,
    pub customer: String,
    pub amount: f64,
}

/// A row of the output JSONL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub id: u64,
    pub customer: String,
    pub cents: i64,
}

impl From<Sale> for Line {
    fn from(sale: Sale) -> Self {
        Line {
            id: sale.id,
            customer: sale.customer.to_uppercase(),
            cents: (sale.amount * 100.0).round() as i64,
        }
    }
}

/// Writes `rows` generated rows of CSV with a header; every `bad_every`-th row (if any) is
/// malformed. Returns the file's size.
pub fn generate(path: &Path, rows: u64, bad_every: Option<u64>) -> std::io::Result<u64> {
    let mut out = BufWriter::new(File::create(path)?);
    writeln!(out, "id,customer,amount")?;
    let names = ["ana", "bo", "chloé", "dmitri", "eun-ji", "fatima"];
    for id in 1..=rows {
        if bad_every.is_some_and(|every| id % every == 0) {
            writeln!(out, "{id},broken")?;
            continue;
        }
        let name = names[(id % names.len() as u64) as usize];
        let amount = (id * 7919 % 100_000) as f64 / 100.0;
        // Some lines end with CRLF, as files from other systems do.
        if id % 5 == 0 {
            write!(out, "{id},{name},{amount}\r\n")?;
        } else {
            writeln!(out, "{id},{name},{amount}")?;
        }
    }
    out.flush()?;
    Ok(std::fs::metadata(path)?.len())
}

/// The same transform, sequentially: the expected output.
pub fn sequential(input: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(input).unwrap();
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    reader
        .deserialize::<Sale>()
        .filter_map(Result::ok)
        .map(Line::from)
        .collect()
}

/// Sums the bytes the workers read: the master result is the bytes read so far.
pub struct Progress;

impl MasterComputable for Progress {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        let before = ctx.last_master_result().copied().unwrap_or(0);
        Ok(Step::Continue(
            before + ctx.worker_results().iter().sum::<u64>(),
        ))
    }
}

/// Transforms its shard, `batch` rows per iteration, into its part file.
pub struct Transform {
    pub staging: Staging,
    pub batch: usize,
    /// Fails (as a broken disk would) in this iteration, if set.
    pub fail_at: Option<u64>,
    source: Option<RowSource<Sale>>,
    out: Option<BufWriter<File>>,
    done: bool,
}

impl Transform {
    pub fn new(staging: Staging, batch: usize) -> Self {
        Transform {
            staging,
            batch,
            fail_at: None,
            source: None,
            out: None,
            done: false,
        }
    }
}

impl WorkerComputable for Transform {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn init(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
        let Some(Shard::Lines(range)) = ctx.shard() else {
            return Err("the pipeline reads a line range of a CSV file".into());
        };
        let range = range.clone();
        self.source = Some(RowSource::open(
            &range,
            RowFormat::Csv,
            ctx.malformed_rows(),
        )?);
        Ok(())
    }

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        if Some(ctx.iteration()) == self.fail_at {
            return Err(format!("worker {} lost its disk", ctx.rank()).into());
        }
        if self.done {
            ctx.vote_halt();
            return Ok(0);
        }
        // The part is made in the first iteration, not in `init`: the staging directory
        // exists once the coordinator started, which may be after a worker of another
        // process ran its `init`, but is always before the first iteration.
        if self.out.is_none() {
            let part = self.staging.part(ctx.rank(), "jsonl");
            self.out = Some(BufWriter::new(File::create(part)?));
        }
        let source = self.source.as_mut().expect("opened in init");
        let out = self.out.as_mut().expect("made above");
        let before = source.offset();
        let mut written = 0;
        for _ in 0..self.batch {
            let Some(sale) = source.next() else {
                self.done = true;
                break;
            };
            serde_json::to_writer(&mut *out, &Line::from(sale?))?;
            out.write_all(b"\n")?;
            written += 1;
        }
        ctx.rows().written += written;
        let read = source.offset() - before;
        if self.done {
            out.flush()?;
            out.get_ref().sync_all()?;
            // Rows read and rejected, the rejected ones with their file and line.
            ctx.rows().add(source.counts());
            ctx.vote_halt();
        }
        Ok(read)
    }
}

/// The job: `workers` transforms of `input`, halting when all are done.
pub fn job(
    input: &Path,
    staging: Staging,
    workers: usize,
    batch: usize,
    policy: MalformedRows,
) -> superstep::JobBuilder<u64, u64> {
    Job::builder(Progress, move |_| Transform::new(staging.clone(), batch))
        .workers(workers)
        .iterations(u64::MAX / 2)
        .worker_halt(true)
        .malformed_rows(policy)
        .input(superstep::coordinator::Input::Lines {
            path: input.to_path_buf(),
            header: true,
        })
}
