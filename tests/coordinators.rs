//! Job coordinators: byte-range shards cover every line once; the pipeline's merged output
//! equals the sequential transform; malformed rows are skipped and named, or fail the job;
//! a failed, timed-out or cancelled job leaves no output and no staging; an atomic commit
//! interrupted at any step leaves the old version or the new one; a composite's order and
//! error fan-out.

#[path = "../examples/support/pipeline.rs"]
mod pipeline;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use superstep::coordinator::{
    split_lines, AtomicCommit, CommitStep, Composite, Coordinator, FileMerge, MalformedRows,
    MergeFormat, Staging, WorkerReport,
};
use superstep::prelude::*;
use superstep::{Cancel, FailurePolicy, Hook};

fn read_lines(path: &Path) -> Vec<pipeline::Line> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The lines of a text as a reader of whole lines sees them: split on LF, without a
/// trailing CR, the last one kept even without a newline.
fn expected_lines(bytes: &[u8], header: bool) -> Vec<Vec<u8>> {
    let mut lines: Vec<Vec<u8>> = bytes
        .split_inclusive(|&b| b == b'\n')
        .map(|l| {
            let l = l.strip_suffix(b"\n").unwrap_or(l);
            l.strip_suffix(b"\r").unwrap_or(l).to_vec()
        })
        .collect();
    if header && !lines.is_empty() {
        lines.remove(0);
    }
    lines
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("SUPERSTEP_PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn byte_range_shards_cover_every_line_exactly_once(
        // Short lines, long lines, CRLF, multi-byte UTF-8, empty lines, no final newline.
        pieces in prop::collection::vec(
            prop_oneof![
                Just("a".to_string()), Just("é".to_string()), Just("日本".to_string()),
                Just("\n".to_string()), Just("\r\n".to_string()), Just(",".to_string()),
                "[a-z]{20,80}",
            ],
            0..120,
        ),
        workers in 1usize..20,
        header in any::<bool>(),
    ) {
        let text: String = pieces.concat();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        std::fs::write(&path, &text).unwrap();
        let ranges = split_lines(&path, header, workers).unwrap();
        prop_assert_eq!(ranges.len(), workers);
        // Contiguous, in order, to the end of the file.
        for pair in ranges.windows(2) {
            prop_assert_eq!(pair[0].end, pair[1].start);
        }
        prop_assert_eq!(ranges.last().unwrap().end, text.len() as u64);
        let mut seen = Vec::new();
        for range in &ranges {
            let mut reader = range.open().unwrap();
            let mut line = Vec::new();
            while reader.next_line(&mut line).unwrap().is_some() {
                seen.push(line.clone());
            }
        }
        prop_assert_eq!(seen, expected_lines(text.as_bytes(), header));
    }
}

/// Records the hooks it ran, and fails the ones it is told to.
struct Recorder {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    fail: Vec<Hook>,
}

impl Recorder {
    fn new(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Self {
        Recorder {
            name,
            log: Arc::clone(log),
            fail: Vec::new(),
        }
    }

    fn failing(mut self, hook: Hook) -> Self {
        self.fail.push(hook);
        self
    }

    fn run(&self, hook: Hook, detail: String) -> Result<(), BoxError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} {hook}{detail}", self.name));
        if self.fail.contains(&hook) {
            return Err(format!("{} fails in {hook}", self.name).into());
        }
        Ok(())
    }
}

impl Coordinator for Recorder {
    fn on_start(&mut self) -> Result<(), BoxError> {
        self.run(Hook::OnStart, String::new())
    }

    fn on_finish(&mut self, reports: &[WorkerReport]) -> Result<(), BoxError> {
        let ranks: Vec<usize> = reports.iter().map(|r| r.rank).collect();
        self.run(Hook::OnFinish, format!(" {ranks:?}"))
    }

    fn on_error(&mut self, error: &JobError) -> Result<(), BoxError> {
        self.run(Hook::OnError, format!(": {error}"))
    }
}

fn log_of(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[test]
fn a_composite_starts_in_order_finishes_in_reverse_and_runs_every_on_error() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut composite = Composite::new()
        .with(Recorder::new("input", &log))
        .with(Recorder::new("output", &log).failing(Hook::OnError))
        .with(Recorder::new("audit", &log));
    composite.on_start().unwrap();
    composite.on_finish(&[WorkerReport::default()]).unwrap();
    assert_eq!(
        log_of(&log),
        vec![
            "input on_start",
            "output on_start",
            "audit on_start",
            "audit on_finish [0]",
            "output on_finish [0]",
            "input on_finish [0]",
        ]
    );
    let error = composite
        .on_error(&JobError::Cancelled)
        .unwrap_err()
        .to_string();
    assert_eq!(error, "output fails in on_error");
    assert_eq!(
        log_of(&log),
        vec![
            "audit on_error: the job was cancelled",
            "output on_error: the job was cancelled",
            "input on_error: the job was cancelled",
        ],
        "every on_error runs, even after one failed"
    );

    // A failed on_start stops the ones after it from starting.
    let mut composite = Composite::new()
        .with(Recorder::new("first", &log).failing(Hook::OnStart))
        .with(Recorder::new("second", &log));
    assert!(composite.on_start().is_err());
    assert_eq!(log_of(&log), vec!["first on_start"]);
}

struct Files {
    _dir: tempfile::TempDir,
    input: PathBuf,
    output: PathBuf,
}

fn files(rows: u64, bad_every: Option<u64>) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sales.csv");
    pipeline::generate(&input, rows, bad_every).unwrap();
    let output = dir.path().join("sales.jsonl");
    Files {
        input,
        output,
        _dir: dir,
    }
}

#[test]
fn the_pipeline_merges_every_workers_part_into_the_sequential_output() {
    let f = files(5_000, None);
    let expected = pipeline::sequential(&f.input);
    for workers in [1, 3, 7] {
        let merge = FileMerge::new(&f.output, MergeFormat::Lines);
        let staging = merge.staging().clone();
        let outcome = pipeline::job(&f.input, staging.clone(), workers, 700, MalformedRows::Fail)
            .coordinator(merge)
            .run()
            .unwrap();
        assert_eq!(read_lines(&f.output), expected, "{workers} workers");
        let rows = &outcome.report.rows;
        assert_eq!((rows.read, rows.written, rows.rejected), (5_000, 5_000, 0));
        assert_eq!(outcome.report.workers.len(), workers);
        let per_worker: u64 = outcome.report.workers.iter().map(|w| w.rows.written).sum();
        assert_eq!(per_worker, 5_000);
        assert!(!staging.dir().exists(), "the staging directory is removed");
    }
}

#[test]
fn a_merge_killed_midway_leaves_a_temporary_file_the_next_run_removes() {
    let f = files(1_000, None);
    let dir = f.output.parent().unwrap();
    // What a merge into the output killed before its rename leaves (its name as
    // `write_atomically` makes it), and the temporary file of another target's merge,
    // which may be under way.
    let stale = dir.join(".superstep-sales.jsonl.k3Xz9q");
    std::fs::write(&stale, vec![b'x'; 1 << 20]).unwrap();
    let other = dir.join(".superstep-other.jsonl.Ab12Cd");
    std::fs::write(&other, b"another merge").unwrap();
    let merge = FileMerge::new(&f.output, MergeFormat::Lines);
    let staging = merge.staging().clone();
    pipeline::job(&f.input, staging, 2, 700, MalformedRows::Fail)
        .coordinator(merge)
        .run()
        .unwrap();
    assert_eq!(read_lines(&f.output), pipeline::sequential(&f.input));
    assert!(
        !stale.exists(),
        "the killed merge's temporary file is removed"
    );
    assert!(other.exists(), "another target's is left alone");
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".superstep-sales"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn malformed_rows_are_skipped_and_named_or_fail_the_job_leaving_the_old_output() {
    let f = files(3_000, Some(250));
    let merge = FileMerge::new(&f.output, MergeFormat::Lines);
    let staging = merge.staging().clone();
    let outcome = pipeline::job(&f.input, staging.clone(), 4, 500, MalformedRows::Skip)
        .coordinator(merge)
        .run()
        .unwrap();
    let rows = &outcome.report.rows;
    assert_eq!((rows.read, rows.written, rows.rejected), (3_000, 2_988, 12));
    let mut lines: Vec<u64> = rows.rejects.iter().map(|r| r.line).collect();
    lines.sort();
    // Row id k is on line k + 1 (after the header).
    let expected: Vec<u64> = (1..=12).map(|i| i * 250 + 1).collect();
    assert_eq!(lines, expected);
    assert!(rows.rejects[0].file.ends_with("sales.csv"));
    assert!(rows.rejects[0]
        .reason
        .contains("2 fields where the header has 3"));
    assert_eq!(read_lines(&f.output), pipeline::sequential(&f.input));

    // Under Fail the job fails naming the row; the output of the run before stays.
    let before = std::fs::read(&f.output).unwrap();
    let merge = FileMerge::new(&f.output, MergeFormat::Lines);
    let error = pipeline::job(&f.input, staging.clone(), 4, 500, MalformedRows::Fail)
        .coordinator(merge)
        .run()
        .unwrap_err()
        .to_string();
    assert!(error.contains("malformed row at "), "{error}");
    assert!(error.contains("sales.csv:"), "{error}");
    assert_eq!(std::fs::read(&f.output).unwrap(), before);
    assert!(!staging.dir().exists());
}

/// The pipeline of `f` on 3 workers, `batch` rows per iteration into parts in `staging`;
/// worker `rank` fails in iteration `at`, after writing part of its part file.
fn fails_at(
    f: &Files,
    staging: Staging,
    batch: usize,
    rank: usize,
    at: u64,
) -> superstep::JobBuilder<u64, u64> {
    Job::builder(pipeline::Progress, move |r| {
        let mut t = pipeline::Transform::new(staging.clone(), batch);
        t.fail_at = (r == rank).then_some(at);
        t
    })
    .workers(3)
    .iterations(1_000)
    .worker_halt(true)
    .input(superstep::coordinator::Input::Lines {
        path: f.input.clone(),
        header: true,
    })
}

/// The pipeline of `f` on 3 workers merged by `merge`, audited into `log`; worker 1 fails
/// in its second iteration, after writing part of its part file.
fn rank_1_fails_at_2(
    f: &Files,
    merge: FileMerge,
    log: &Arc<Mutex<Vec<String>>>,
) -> superstep::JobBuilder<u64, u64> {
    fails_at(f, merge.staging().clone(), 300, 1, 2).coordinator(
        Composite::new()
            .with(Recorder::new("audit", log))
            .with(merge),
    )
}

#[test]
fn a_failed_worker_is_never_reported_done_and_the_job_leaves_no_output() {
    let f = files(2_000, None);
    let log = Arc::new(Mutex::new(Vec::new()));
    let merge = FileMerge::new(&f.output, MergeFormat::Lines);
    let staging = merge.staging().clone();
    let error = rank_1_fails_at_2(&f, merge, &log).run().unwrap_err();
    assert_eq!(error.rank(), Some(1), "{error}");
    let log = log_of(&log);
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0], "audit on_start");
    assert!(
        log[1].starts_with("audit on_error: worker 1 failed"),
        "{log:?}"
    );
    assert!(!f.output.exists(), "nothing is merged");
    assert!(!staging.dir().exists(), "the staging directory is removed");
}

#[test]
fn a_worker_left_out_after_it_failed_is_not_reported_completed_and_nothing_is_merged() {
    let f = files(2_000, None);
    let log = Arc::new(Mutex::new(Vec::new()));
    let merge = FileMerge::new(&f.output, MergeFormat::Lines);
    let staging = merge.staging().clone();
    // The job itself goes on without rank 1, which wrote part of its part file and then
    // ran on to its end: its rows must not be committed as if it had completed.
    let error = rank_1_fails_at_2(&f, merge, &log)
        .failure_policy(FailurePolicy::ContinueWithout)
        .min_workers(0.6, Duration::from_secs(10))
        .run()
        .unwrap_err();
    assert!(
        matches!(
            error,
            JobError::Coordinator {
                hook: Hook::OnFinish,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("[0, 2] of 3"), "{error}");
    let log = log_of(&log);
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log[1].starts_with("audit on_error: "), "{log:?}");
    assert!(!f.output.exists(), "nothing is merged");
    assert!(!staging.dir().exists(), "the staging directory is removed");
}

/// A worker that takes its time, so the job can be timed out or cancelled mid-way.
struct Slow;

impl WorkerComputable for Slow {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        std::thread::sleep(Duration::from_millis(20));
        Ok(1)
    }
}

#[test]
fn a_cancelled_or_timed_out_job_runs_on_error_after_stopping_its_workers() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let cancel = Cancel::new();
    let stopper = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        stopper.cancel();
    });
    let error = Job::builder(pipeline::Progress, |_| Slow)
        .workers(2)
        .iterations(10_000)
        .coordinator(Recorder::new("c", &log))
        .cancel(cancel)
        .run()
        .unwrap_err();
    assert!(matches!(error, JobError::Cancelled), "{error}");
    assert_eq!(
        log_of(&log),
        vec!["c on_start", "c on_error: the job was cancelled"]
    );

    let error = Job::builder(pipeline::Progress, |_| Slow)
        .workers(2)
        .iterations(5)
        .iteration_timeout(Duration::from_millis(5))
        .coordinator(Recorder::new("c", &log))
        .run()
        .unwrap_err();
    assert!(matches!(error, JobError::WorkersTimedOut { .. }), "{error}");
    let log = log_of(&log);
    assert!(log[1].starts_with("c on_error: timed out"), "{log:?}");
}

#[test]
fn a_failing_on_finish_fails_the_job_and_runs_on_error() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let error = Job::builder(pipeline::Progress, |_| Slow)
        .workers(2)
        .iterations(2)
        .coordinator(Recorder::new("c", &log).failing(Hook::OnFinish))
        .run()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "coordinator failed in on_finish: c fails in on_finish"
    );
    let log = log_of(&log);
    assert_eq!(log[1], "c on_finish [0, 1]");
    assert!(
        log[2].starts_with("c on_error: coordinator failed in on_finish"),
        "{log:?}"
    );
}

/// Stages `parts` as the workers of a job would.
fn stage(staging: &Staging, version: u32, parts: usize) {
    for rank in 0..parts {
        std::fs::write(
            staging.part(rank, "jsonl"),
            format!("{{\"version\":{version},\"rank\":{rank}}}\n"),
        )
        .unwrap();
    }
}

/// Every committed file's version, through the manifest `CURRENT` names.
fn committed_versions(output: &Path) -> Option<(u64, Vec<String>)> {
    let (manifest, files) = AtomicCommit::committed(output).unwrap()?;
    let contents = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    Some((manifest.version, contents))
}

#[test]
fn a_commit_interrupted_at_any_step_leaves_the_old_version_or_the_new_one() {
    let contents = |version: u32, parts: usize| -> Vec<String> {
        (0..parts)
            .map(|rank| format!("{{\"version\":{version},\"rank\":{rank}}}\n"))
            .collect()
    };
    for step in [
        CommitStep::Staged,
        CommitStep::Manifest,
        CommitStep::Switched,
        CommitStep::Cleaned,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("table");
        let mut first = AtomicCommit::new(&output, "job");
        first.on_start().unwrap();
        stage(first.staging(), 1, 3);
        first.on_finish(&[]).unwrap();
        assert_eq!(committed_versions(&output), Some((1, contents(1, 3))));

        let mut second = AtomicCommit::new(&output, "job").crash_after(step);
        second.on_start().unwrap();
        stage(second.staging(), 2, 2);
        assert!(second.on_finish(&[]).is_err(), "{step:?}");
        let seen = committed_versions(&output);
        if step >= CommitStep::Switched {
            assert_eq!(seen, Some((2, contents(2, 2))), "{step:?}");
        } else {
            assert_eq!(seen, Some((1, contents(1, 3))), "{step:?}");
        }

        // The next job clears what the crash left and commits.
        let mut third = AtomicCommit::new(&output, "job");
        third.on_start().unwrap();
        stage(third.staging(), 3, 1);
        third.on_finish(&[]).unwrap();
        let (version, files) = committed_versions(&output).unwrap();
        assert_eq!(files, contents(3, 1), "{step:?}");
        assert_eq!(version, if step >= CommitStep::Switched { 3 } else { 2 });
        let mut names: Vec<String> = std::fs::read_dir(&output)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(
            names.len() <= 5,
            "the newest two versions, their manifests and CURRENT: {names:?}"
        );
    }
}

#[test]
fn a_job_commits_atomically_and_a_failed_one_commits_nothing() {
    let f = files(1_500, None);
    let dir = f.input.parent().unwrap().join("table");
    let commit = AtomicCommit::new(&dir, "sales");
    let staging = commit.staging().clone();
    pipeline::job(&f.input, staging.clone(), 3, 400, MalformedRows::Fail)
        .coordinator(commit)
        .run()
        .unwrap();
    let (manifest, files) = AtomicCommit::committed(&dir).unwrap().unwrap();
    assert_eq!((manifest.version, files.len()), (1, 3));
    let lines: Vec<pipeline::Line> = files.iter().flat_map(|p| read_lines(p)).collect();
    assert_eq!(lines, pipeline::sequential(&f.input));

    let failed = fails_at(&f, staging.clone(), 400, 0, 1)
        .coordinator(AtomicCommit::new(&dir, "sales"))
        .run();
    assert!(failed.is_err());
    let (manifest, _) = AtomicCommit::committed(&dir).unwrap().unwrap();
    assert_eq!(manifest.version, 1, "the failed job committed nothing");
    assert!(!staging.dir().exists());
}

#[test]
fn a_csv_merge_keeps_a_single_header() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out.csv");
    let mut merge = FileMerge::new(&target, MergeFormat::Csv);
    merge.on_start().unwrap();
    let staging = merge.staging().clone();
    std::fs::write(staging.part(0, "csv"), "id,v\n1,a\n2,b\n").unwrap();
    std::fs::write(staging.part(1, "csv"), "").unwrap();
    std::fs::write(staging.part(2, "csv"), "id,v\n3,c").unwrap();
    merge.on_finish(&[]).unwrap();
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "id,v\n1,a\n2,b\n3,c\n"
    );
    assert!(!staging.dir().exists());

    let mut merge = FileMerge::new(&target, MergeFormat::Csv);
    merge.on_start().unwrap();
    std::fs::write(staging.part(0, "csv"), "id,v\n1,a\n").unwrap();
    std::fs::write(staging.part(1, "csv"), "id,w\n2,b\n").unwrap();
    let error = merge.on_finish(&[]).unwrap_err().to_string();
    assert!(error.contains("another header"), "{error}");
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "id,v\n1,a\n2,b\n3,c\n",
        "the target is left as it was"
    );
}

#[test]
fn only_files_named_as_parts_are_merged_and_the_target_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out.jsonl");
    std::fs::write(&target, "old\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
    let mut merge = FileMerge::new(&target, MergeFormat::Lines);
    merge.on_start().unwrap();
    let staging = merge.staging().clone();
    std::fs::write(staging.part(0, "jsonl"), "0\n").unwrap();
    std::fs::write(staging.part(1, "jsonl"), "1\n").unwrap();
    // A worker's unfinished write, and files that only look like parts.
    std::fs::write(staging.dir().join("part-00001.jsonl.tmp"), "half").unwrap();
    std::fs::write(staging.dir().join("part-.jsonl"), "x\n").unwrap();
    std::fs::write(staging.dir().join("part-00002"), "x\n").unwrap();
    merge.on_finish(&[]).unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "0\n1\n");
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o640,
        "the merged file keeps the target's permissions"
    );
}

#[test]
fn a_commit_starts_by_clearing_the_temporary_files_a_crash_left() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("table");
    std::fs::create_dir_all(&output).unwrap();
    let leftover = output.join(".superstep-AbC123");
    std::fs::write(&leftover, "half a manifest").unwrap();
    let mut commit = AtomicCommit::new(&output, "job");
    commit.on_start().unwrap();
    assert!(!leftover.exists());
    stage(commit.staging(), 1, 2);
    commit.on_finish(&[]).unwrap();
    let (manifest, files) = AtomicCommit::committed(&output).unwrap().unwrap();
    assert_eq!((manifest.version, files.len()), (1, 2));
}
