//! A process whose job differs from the master's — another world size, other settings
//! every process must share, other result types — is refused at its handshake, naming the
//! field and both values: the worker ends at once with `JobError::Mismatch`, and the job
//! fails at once everywhere (never a wrong answer, never a start-up timeout) — or, under a
//! policy that replaces workers, only that process is turned away and a right one takes
//! the rank.

mod common;

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::{summing_master, tcp_master, tcp_settings, FnWorker};
use superstep::prelude::*;
use superstep::transport::TcpTransport;
use superstep::{FailurePolicy, JobOutcome, Payload};

/// Well under any timeout that would otherwise end such a job (the connect timeout is 20 s
/// in these tests, start-up and shutdown 30 min and 1 min by default).
const PROMPTLY: Duration = Duration::from_secs(5);

type Outcome<M> = Result<JobOutcome<M>, JobError>;

fn summing(iterations: u64) -> superstep::JobBuilder<u64, u64> {
    Job::builder(summing_master(), |rank| FnWorker {
        f: move |_: &mut WorkerContext<u64, u64>| Ok(rank as u64 + 1),
    })
    .iterations(iterations)
}

/// Runs `job` on its own thread with `transport`, and times it.
fn spawn<M: Payload, W: Payload>(
    job: superstep::JobBuilder<M, W>,
    transport: TcpTransport<M, W>,
) -> JoinHandle<(Outcome<M>, Duration)> {
    thread::spawn(move || {
        let started = Instant::now();
        let outcome = job.transport(transport).run();
        (outcome, started.elapsed())
    })
}

fn worker<M, W>(rank: usize, world: usize, addr: &str, job: &str) -> TcpTransport<M, W> {
    TcpTransport::new(tcp_settings(rank, world, addr, job)).unwrap()
}

fn assert_mismatch<M>(
    who: &str,
    (outcome, took): (Outcome<M>, Duration),
    rank: usize,
    field: &str,
    master: &str,
    worker: &str,
) {
    match outcome {
        Err(JobError::Mismatch {
            rank: r,
            field: f,
            master: m,
            worker: w,
        }) => {
            assert_eq!((r, f.as_str()), (rank, field), "{who}");
            assert!(m.contains(master) && w.contains(worker), "{who}: {m} / {w}");
        }
        Err(other) => panic!("{who}: expected a mismatch, got {other}"),
        Ok(_) => panic!("{who}: the job completed"),
    }
    assert!(took < PROMPTLY, "{who} took {took:?}");
}

#[test]
fn a_process_started_with_another_world_size_is_refused_and_the_job_fails_at_once_everywhere() {
    let (master, addr) = tcp_master::<u64, u64>(3, "world", |_| {});
    let m = spawn(summing(5), master);
    // Rank 1's process is connected (here, its link only).
    let fingerprint = summing(5).workers(3).build().unwrap().fingerprint();
    let (_one, one, told) = common::tcp_link(1, 3, &addr, "world", fingerprint);
    // Rank 2's process was told the world has 4 processes: it would shard by 4.
    let two = spawn(summing(5), worker(2, 4, &addr, "world"));
    let two = two.join().unwrap();
    let err = two.0.as_ref().map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("`workers` is 4 there and 3 in the master's"),
        "{err}"
    );
    assert_mismatch("rank 2", two, 2, "workers", "3", "4");
    // Rank 1's process hears the job's failure at once.
    let told = told
        .recv_timeout(PROMPTLY)
        .expect("rank 1 was told within 5 s");
    match told {
        superstep::dev::ToWorker::Abort { error, .. } => assert_mismatch(
            "rank 1",
            (Err::<JobOutcome<u64>, _>(error), Duration::ZERO),
            2,
            "workers",
            "3",
            "4",
        ),
        other => panic!("rank 1 was told {other:?}"),
    }
    one.send(superstep::dev::ToMaster::Done {
        attempt: 0,
        awaits_word: false,
        rows: Default::default(),
        attachments: Vec::new(),
    })
    .unwrap();
    assert_mismatch("the master", m.join().unwrap(), 2, "workers", "3", "4");
}

#[test]
fn a_process_started_with_other_parameters_is_refused_naming_the_parameter() {
    #[derive(serde::Serialize)]
    struct Args {
        seed: u64,
        rate: f64,
    }
    let (master, addr) = tcp_master::<u64, u64>(2, "params", |_| {});
    let m = spawn(summing(5).params(&Args { seed: 7, rate: 0.5 }), master);
    let one = spawn(
        summing(5).params(&Args { seed: 8, rate: 0.5 }),
        worker(1, 2, &addr, "params"),
    );
    let one = one.join().unwrap();
    let err = one.0.as_ref().map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("`params.seed` is 8 there and 7 in the master's"),
        "{err}"
    );
    assert_mismatch("rank 1", one, 1, "params.seed", "7", "8");
    assert_mismatch("the master", m.join().unwrap(), 1, "params.seed", "7", "8");
}

#[test]
fn a_process_that_connects_after_another_failed_the_job_hears_why_at_once() {
    let (master, addr) = tcp_master::<u64, u64>(3, "late", |_| {});
    let m = spawn(summing(5), master);
    // Rank 1's process is made, and connects only once the job failed: rank 2's process,
    // told the world has 4 processes, is refused first and fails the job at once.
    let late = worker(1, 3, &addr, "late");
    let two = spawn(summing(5), worker(2, 4, &addr, "late"));
    assert_mismatch("rank 2", two.join().unwrap(), 2, "workers", "3", "4");
    // It hears the job's failure from the master, which waits a moment for ranks that
    // may still connect — not "connection refused" after its connect timeout (20 s).
    let one = spawn(summing(5), late);
    assert_mismatch("rank 1", one.join().unwrap(), 2, "workers", "3", "4");
    assert_mismatch("the master", m.join().unwrap(), 2, "workers", "3", "4");
}

#[test]
fn a_process_with_other_settings_is_refused_naming_the_setting() {
    let (master, addr) = tcp_master::<u64, u64>(2, "settings", |_| {});
    let m = spawn(summing(5), master);
    let one = spawn(summing(6), worker(1, 2, &addr, "settings"));
    assert_mismatch("rank 1", one.join().unwrap(), 1, "iterations", "5", "6");
    assert_mismatch("the master", m.join().unwrap(), 1, "iterations", "5", "6");

    let (master, addr) = tcp_master::<u64, u64>(2, "barrier-mode", |_| {});
    let m = spawn(summing(5), master);
    let one = spawn(
        summing(5).barrier_mode(true),
        worker(1, 2, &addr, "barrier-mode"),
    );
    assert_mismatch(
        "rank 1",
        one.join().unwrap(),
        1,
        "barrier_mode",
        "off",
        "on",
    );
    assert_mismatch(
        "the master",
        m.join().unwrap(),
        1,
        "barrier_mode",
        "off",
        "on",
    );
}

#[test]
fn a_process_with_other_result_types_is_refused_naming_the_type() {
    let (master, addr) = tcp_master::<u64, u64>(2, "types", |_| {});
    let m = spawn(summing(3), master);
    struct Narrow;
    impl WorkerComputable for Narrow {
        type MasterResult = u64;
        type WorkerResult = u32;
        fn compute(&mut self, _: &mut WorkerContext<u64, u32>) -> Result<u32, BoxError> {
            Ok(1)
        }
    }
    struct NarrowMaster;
    impl MasterComputable for NarrowMaster {
        type MasterResult = u64;
        type WorkerResult = u32;
        fn compute(&mut self, _: &mut MasterContext<u64, u32>) -> Result<Step<u64>, BoxError> {
            Ok(Step::Continue(0))
        }
    }
    let narrow = Job::builder(NarrowMaster, |_| Narrow).iterations(3);
    let one = spawn(narrow, worker::<u64, u32>(1, 2, &addr, "types"));
    assert_mismatch(
        "rank 1",
        one.join().unwrap(),
        1,
        "worker result type",
        "u64",
        "u32",
    );
    assert_mismatch(
        "the master",
        m.join().unwrap(),
        1,
        "worker result type",
        "u64",
        "u32",
    );
}

#[test]
fn under_restart_worker_a_process_that_differs_is_refused_without_a_restart_and_a_right_one_takes_its_rank(
) {
    let policy = FailurePolicy::RestartWorker { max_restarts: 1 };
    let (master, addr) = tcp_master::<u64, u64>(2, "replace", |_| {});
    let m = spawn(summing(5).failure_policy(policy), master);
    // Refused again and again, a wrong process is no restart of the rank: one restart
    // allowed, three refusals, and the job still waits for a right process.
    for _ in 0..3 {
        let wrong = spawn(
            summing(6).failure_policy(policy),
            worker(1, 2, &addr, "replace"),
        );
        assert_mismatch(
            "the wrong rank 1",
            wrong.join().unwrap(),
            1,
            "iterations",
            "5",
            "6",
        );
    }
    let right = spawn(
        summing(5).failure_policy(policy),
        worker(1, 2, &addr, "replace"),
    );
    let (outcome, _) = m.join().unwrap();
    let outcome = outcome.unwrap();
    assert_eq!(*outcome.result, 5 * (1 + 2));
    assert_eq!(*right.join().unwrap().0.unwrap().result, 5 * (1 + 2));
    assert!(
        outcome.report.recoveries.is_empty(),
        "{:?}",
        outcome.report.recoveries
    );
    assert_eq!(outcome.report.recovered, 0);
}

#[test]
fn a_stray_process_of_a_connected_rank_is_turned_away_without_touching_the_job() {
    use superstep::dev::{Report, ToMaster, ToWorker};
    let policy = FailurePolicy::RestartWorker { max_restarts: 1 };
    let (master, addr) = tcp_master::<u64, u64>(2, "stray", |_| {});
    let m = spawn(summing(3).failure_policy(policy), master);
    let fingerprint = summing(3)
        .failure_policy(policy)
        .workers(2)
        .build()
        .unwrap()
        .fingerprint();
    // Rank 1 is connected (its link here, answering as a worker would).
    let (_t, link, told) = common::tcp_link(1, 2, &addr, "stray", fingerprint);
    // A stray process claims rank 1 with another configuration: it is turned away for
    // the rank, and nothing of it reaches the job.
    let stray = spawn(
        summing(4).failure_policy(policy),
        worker(1, 2, &addr, "stray"),
    );
    let (outcome, took) = stray.join().unwrap();
    let err = outcome.map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("rank 1 is already connected"), "{err}");
    assert!(took < PROMPTLY, "took {took:?}");
    link.send(ToMaster::Registered { attempt: 0 }).unwrap();
    loop {
        match told.recv_timeout(PROMPTLY).expect("the master's next word") {
            ToWorker::Iterate { iteration, .. } => link
                .send(ToMaster::Result(Report {
                    attempt: 0,
                    iteration,
                    result: superstep::dev::Share::Own(2),
                    halt_vote: false,
                    mail: Default::default(),
                    saved: None,
                    calls: 0,
                    group_calls: None,
                    elapsed: Duration::ZERO,
                }))
                .unwrap(),
            ToWorker::Finish { .. } => break,
            other => panic!("rank 1 was told {other:?}"),
        }
    }
    link.send(ToMaster::Done {
        attempt: 0,
        awaits_word: false,
        rows: Default::default(),
        attachments: Vec::new(),
    })
    .unwrap();
    let outcome = m.join().unwrap().0.unwrap();
    assert_eq!(*outcome.result, 3 * (1 + 2));
    assert!(
        outcome.report.recoveries.is_empty(),
        "{:?}",
        outcome.report.recoveries
    );
}

#[test]
fn a_master_of_another_wire_protocol_version_is_final_for_the_worker() {
    // A master that answers every hello in protocol version 99.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().take(5) {
            let Ok(mut stream) = stream else { return };
            let _ = stream.read(&mut [0u8; 256]);
            let _ = stream.write_all(&[0, 0, 0, 3, 0, 99, 0xc0]);
            thread::sleep(Duration::from_secs(10));
        }
    });
    let ours = superstep::transport::tcp::PROTOCOL_VERSION.to_string();
    let one = spawn(summing(3), worker(1, 2, &addr, "versions"));
    assert_mismatch(
        "rank 1",
        one.join().unwrap(),
        1,
        "wire version",
        "99",
        &ours,
    );
}

#[test]
fn a_long_parameter_is_fingerprinted_by_its_length_and_checksum() {
    #[derive(serde::Serialize)]
    struct Files {
        files: Vec<String>,
    }
    let fingerprint = |files: &[String]| {
        let files = Files {
            files: files.to_vec(),
        };
        let job = summing(5).workers(2).params(&files).build().unwrap();
        job.fingerprint().get("params.files").unwrap().to_string()
    };
    let mut files: Vec<String> = (0..5000)
        .map(|i| format!("/data/part-{i:05}.csv"))
        .collect();
    let long = fingerprint(&files);
    // A handshake stays well inside its 64 KiB: the list is told by its start, length and
    // checksum.
    assert!(long.len() < 200 && long.contains("CRC-32"), "{long}");
    files[4000] = "/data/another.csv".into();
    assert_ne!(fingerprint(&files), long);
}
