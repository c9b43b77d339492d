//! The flight recorder: a wait that times out names what the master's node last heard from
//! each rank it waited on — across processes, in the error every process prints —, and a
//! dump, asked for with `FlightRecorder::dump` or with the dump signal to any process of a
//! job, writes every rank's last events (their calls with kind and length, their ends, the
//! iterations computed) to JSON lines and a Chrome trace in `flight_dir`.
//!
//! The processes are this test binary itself, running its ignored `child_process` test,
//! started by `superstep-launch`.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use superstep::collective::ReduceOp;
use superstep::prelude::*;
use superstep::transport::ClusterEnv;
use superstep::{FlightRecorder, Heard, JobError, SyncKind};

const BEHAVIOUR: &str = "SUPERSTEP_TEST_BEHAVIOUR";
const PIDS: &str = "SUPERSTEP_TEST_PIDS";
/// Rank 2 stalls in its compute of iteration 3, past the sync timeout.
const STALL: &str = "stall";
/// Every rank runs slowly enough for the test to signal it while it runs.
const SLOW: &str = "slow";
const CHILD: [&str; 6] = [
    "child_process",
    "--exact",
    "--ignored",
    "--nocapture",
    "--test-threads",
    "1",
];

/// Each iteration: an `all_reduce` of the rank, then a barrier; the result the sum.
struct Ranks {
    behaviour: String,
    /// Where to write this process's pid once its job runs (its dump signal taken).
    pids: Option<std::path::PathBuf>,
}

impl WorkerComputable for Ranks {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        let (rank, iteration) = (ctx.rank(), ctx.iteration());
        if let Some(dir) = self.pids.take() {
            std::fs::write(
                dir.join(format!("rank{rank}.pid")),
                std::process::id().to_string(),
            )?;
        }
        let mut value = Floats::from(vec![rank as f64; 3]);
        ctx.all_reduce(&mut value, ReduceOp::Sum)?;
        match self.behaviour.as_str() {
            STALL if rank == 2 && iteration == 3 => std::thread::sleep(Duration::from_secs(30)),
            SLOW => std::thread::sleep(Duration::from_millis(100)),
            _ => {}
        }
        ctx.barrier()?;
        Ok(value[0] as u64)
    }
}

fn job(behaviour: &str, workers: usize, iterations: u64) -> superstep::JobBuilder<u64, u64> {
    let behaviour = behaviour.to_owned();
    let pids = std::env::var_os(PIDS).map(std::path::PathBuf::from);
    // Each round's result: the sum of the workers'.
    let sum = common::FnMaster {
        f: |ctx: &mut MasterContext<u64, u64>| {
            Ok(Step::Continue(ctx.worker_results().iter().sum()))
        },
    };
    Job::builder(sum, move |_| Ranks {
        behaviour: behaviour.clone(),
        pids: pids.clone(),
    })
    .job_id("flight")
    .workers(workers)
    .iterations(iterations)
    .barrier_mode(true)
    .sync_timeout(Duration::from_secs(2))
}

/// The missing rank's last words, as the error carries them: its result of iteration 2,
/// then — the last it said — its `all_reduce` of iteration 3.
fn assert_names_rank_2s_last_call(error: &JobError) {
    let JobError::Sync(SyncError::TimedOut { missing, heard, .. }) = error else {
        panic!("not a sync timeout: {error}");
    };
    assert_eq!(missing, &[2]);
    assert_eq!(heard.len(), 1, "{error}");
    assert_eq!(heard[0].rank, 2);
    let words: Vec<Heard> = heard[0].words.iter().map(|(h, _)| *h).collect();
    assert!(
        words.contains(&Heard::Result { iteration: 2 }),
        "rank 2's result of iteration 2 among its last words: {error}"
    );
    match heard[0].last() {
        Some((
            Heard::Call {
                at:
                    superstep::CallAt {
                        iteration: 3,
                        call: 1,
                        ..
                    },
                kind: SyncKind::Collective(_),
                ..
            },
            ago,
        )) => assert!(ago >= Duration::from_secs(2), "{ago:?}"),
        other => panic!("rank 2's last word is not its all_reduce of iteration 3: {other:?}"),
    }
}

#[test]
fn a_sync_timeout_in_memory_names_the_missing_ranks_last_calls() {
    let error = job(STALL, 4, 5).run().expect_err("rank 2 stalls");
    assert_names_rank_2s_last_call(&error);
    let text = error.to_string();
    println!("{text}");
    assert!(
        text.contains("last heard by the master's node: rank 2: ")
            && text.contains("result of iteration 2")
            && text.contains("all_reduce(sum) (call 1 of iteration 3)"),
        "{text}"
    );
}

#[test]
fn a_dump_asked_of_a_running_job_holds_every_ranks_calls_as_json_lines_and_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = FlightRecorder::new();
    let job = job(SLOW, 4, 30).flight_recorder(recorder.clone()).config({
        let mut config = superstep::JobConfig::default();
        config.flight_dir = Some(dir.path().to_owned());
        config
    });
    let running = std::thread::spawn(move || job.run());
    std::thread::sleep(Duration::from_millis(600));
    let written = recorder.dump(Duration::from_secs(10)).expect("written");
    let outcome = running.join().unwrap().expect("the job goes on to its end");
    assert_eq!(*outcome.result, 24, "each rank adds the ranks' sum");
    assert!(written.jsonl.starts_with(dir.path()));
    let (text, lines) = read(&written.jsonl);
    assert_eq!(lines[0]["why"], "FlightRecorder::dump in this process");
    for rank in 0..4 {
        let of = |event| events(&lines, rank, event);
        assert!(of("compute") >= 2, "rank {rank}: {text}");
        assert!(of("call") >= 2 && of("ended") >= 1, "rank {rank}: {text}");
        let reduce = lines[1..]
            .iter()
            .find(|l| l["rank"] == rank && l["kind"] == "all_reduce(sum)")
            .unwrap_or_else(|| panic!("rank {rank}'s all_reduce: {text}"));
        assert_eq!(reduce["len"], 3);
    }
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&written.trace).unwrap()).unwrap();
    let slices = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "barrier()")
        .count();
    assert!(slices >= 4, "every rank's barriers are slices");
}

#[test]
fn a_dump_without_a_running_job_says_so_within_its_wait() {
    let recorder = FlightRecorder::new();
    let error = recorder.dump(Duration::from_millis(50)).unwrap_err();
    assert_eq!(
        error,
        superstep::DumpError::TimedOut(Duration::from_millis(50))
    );
}

#[test]
#[ignore = "one process of the multi-process tests, which start it"]
fn child_process() {
    let Some(env) = ClusterEnv::from_env().unwrap() else {
        return;
    };
    common::child_logs();
    let behaviour = std::env::var(BEHAVIOUR).unwrap_or_default();
    let iterations = if behaviour == SLOW { 30 } else { 5 };
    let ran = job(&behaviour, env.world_size, iterations)
        .cluster_from_env()
        .unwrap()
        .settings_from_env()
        .unwrap()
        .run();
    match ran {
        Ok(outcome) => println!("\nRESULT {}", outcome.result),
        Err(error) => {
            // The error as a program prints it, and as it is: checked by the test.
            println!("\nFAILED {error}");
            if behaviour == STALL {
                assert_names_rank_2s_last_call(&error);
                println!("\nNAMED RANK 2'S LAST CALL");
            }
            std::process::exit(3);
        }
    }
}

/// Runs `superstep-launch --nproc n` over this binary's child test in `behaviour`, with
/// `dir` its pids' and dumps' directory; each of `signals` goes to the process of its rank
/// (`n`: the launcher) as long after every rank wrote its pid as it says. The launcher (and
/// every child with it) is interrupted if it runs past a deadline.
fn launch(
    n: usize,
    behaviour: &str,
    dir: &std::path::Path,
    signals: &[(usize, nix::sys::signal::Signal, Duration)],
) -> Output {
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_superstep-launch"))
        .args(["--nproc", &n.to_string(), "--grace-secs", "3", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(CHILD)
        .env(BEHAVIOUR, behaviour)
        .env(PIDS, dir)
        .env("SUPERSTEP_FLIGHT_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let pid_of = |rank: usize| std::fs::read_to_string(dir.join(format!("rank{rank}.pid"))).ok();
    let mut running: Option<Instant> = None;
    let mut next = signals.iter();
    let mut signal = next.next();
    while launcher.try_wait().unwrap().is_none() {
        if let Some(&(target, sig, after)) = signal {
            if running.is_none() && (0..n).all(|r| pid_of(r).is_some()) {
                running = Some(Instant::now());
            }
            if running.is_some_and(|at| at.elapsed() >= after) {
                let pid: i32 = match target {
                    launcher_ if launcher_ == n => launcher.id() as i32,
                    rank => pid_of(rank).unwrap().trim().parse().unwrap(),
                };
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
                signal = next.next();
            }
        }
        if Instant::now() > deadline {
            let pid = nix::unistd::Pid::from_raw(launcher.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            std::thread::sleep(Duration::from_secs(5));
            let _ = launcher.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    launcher.wait_with_output().unwrap()
}

#[test]
fn a_sync_timeout_across_four_processes_prints_the_missing_ranks_last_calls_in_every_process() {
    let dir = tempfile::tempdir().unwrap();
    let out = launch(4, STALL, dir.path(), &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    // Every process ends with the master's error, rank 2's last words in it (rank 2's
    // process itself is held in its compute, and ends when the job's grace runs out).
    for rank in [0, 1, 3] {
        let named = stdout.lines().any(|l| {
            l.starts_with(&format!("[{rank}]"))
                && l.contains("FAILED")
                && l.contains("last heard by the master's node: rank 2: ")
                && l.contains("all_reduce(sum) (call 1 of iteration 3)")
        });
        assert!(
            named,
            "rank {rank} printed rank 2's last call:\n{stdout}\n{stderr}"
        );
        let checked = stdout
            .lines()
            .any(|l| l.starts_with(&format!("[{rank}]")) && l.contains("NAMED RANK 2'S LAST CALL"));
        assert!(
            checked,
            "rank {rank}'s error carries it as data:\n{stdout}\n{stderr}"
        );
    }
}

/// How many of `rank`'s events in a dump's `lines` are `event`s.
fn events(lines: &[serde_json::Value], rank: usize, event: &str) -> usize {
    lines[1..]
        .iter()
        .filter(|l| l["rank"] == rank && l["event"] == event)
        .count()
}

/// A dump's JSON lines — its text, and each line read —, its header checked: every one
/// of the 4 ranks' recorders came.
fn read(jsonl: &std::path::Path) -> (String, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(jsonl).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let header = &lines[0];
    assert_eq!(header["ranks"], serde_json::json!([0, 1, 2, 3]), "{header}");
    assert_eq!(header["missing"], serde_json::json!([]), "{header}");
    (text, lines)
}

/// The dumps `launch` left in `dir`, each as its lines; asserts each holds every rank's
/// calls from its own process.
fn dumps_in(dir: &std::path::Path) -> Vec<Vec<serde_json::Value>> {
    let dumps: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    let mut all = Vec::new();
    for dump in dumps {
        let (text, lines) = read(&dump);
        for rank in 0..4 {
            let of = |event| events(&lines, rank, event);
            assert!(
                of("call") >= 2,
                "rank {rank}'s calls, from its own process: {text}"
            );
            assert!(
                of("connected") >= 1,
                "rank {rank}'s link to the master: {text}"
            );
        }
        all.push(lines);
    }
    all
}

#[test]
fn the_dump_signal_to_a_worker_process_writes_every_ranks_recorder_on_the_masters_host() {
    let dir = tempfile::tempdir().unwrap();
    let usr2 = nix::sys::signal::Signal::SIGUSR2;
    let out = launch(
        4,
        SLOW,
        dir.path(),
        &[(2, usr2, Duration::from_millis(500))],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the job goes on:\n{stdout}\n{stderr}");
    assert!(stdout.contains("RESULT 24"), "{stdout}");
    let dumps = dumps_in(dir.path());
    assert_eq!(dumps.len(), 1, "one dump:\n{stderr}");
    assert_eq!(
        dumps[0][0]["why"], "SIGUSR2 in rank 2's process",
        "{}",
        dumps[0][0]
    );
    assert!(
        stderr.contains("flight recorders written to"),
        "the master's process says where: {stderr}"
    );
}

#[test]
fn the_dump_signal_to_the_launcher_reaches_every_process_each_time_and_ends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let usr2 = nix::sys::signal::Signal::SIGUSR2;
    // Two notices, more than a second apart: each forwarded to every process, each one
    // dump — and the second no interrupt that kills the run.
    let notices = [
        (4, usr2, Duration::from_millis(300)),
        (4, usr2, Duration::from_millis(1_600)),
    ];
    let out = launch(4, SLOW, dir.path(), &notices);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the job goes on:\n{stdout}\n{stderr}");
    assert_eq!(stdout.matches("RESULT 24").count(), 4, "{stdout}");
    let dumps = dumps_in(dir.path());
    assert_eq!(dumps.len(), 2, "one dump a notice:\n{stderr}");
}
