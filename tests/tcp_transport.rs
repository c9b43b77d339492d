//! The TCP transport, with each rank's job in a thread of its own: the same results as in
//! memory, and bad input that leaves the master running and the job finishing.

mod common;
#[path = "../examples/support/lr.rs"]
mod lr;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use common::{summing_master, FnWorker};
use superstep::dev::{Envelope, Report, ToMaster, ToWorker};
use superstep::prelude::*;
use superstep::transport::tcp::PROTOCOL_VERSION;
use superstep::transport::{
    LinkSpec, MasterLink, TcpSettings, TcpTransport, Transport, TransportError, WorkerLink,
};
use superstep::JobOutcome;

use common::{tcp_master as master_transport_with, tcp_settings as settings};

/// Rank 0 on a free loopback port: its transport, and the address workers dial.
fn master_transport<M, W>(world: usize, job: &str) -> (TcpTransport<M, W>, String) {
    master_transport_with(world, job, |_| {})
}

type LrOutcome = Result<JobOutcome<lr::Model>, JobError>;

fn lr_job(
    data: &Arc<lr::Dataset>,
    workers: usize,
) -> superstep::JobBuilder<lr::Model, lr::Gradient> {
    lr::job(data, workers, 0.7).iterations(8)
}

#[test]
fn a_job_over_tcp_equals_the_same_job_in_memory_bit_for_bit() {
    let data = Arc::new(lr::Dataset::generate(4_000, 5, 11));
    let workers = 3;
    let in_memory = lr_job(&data, workers).run().unwrap();
    let (master, addr) = master_transport(workers, "lr-bits");
    let mut ranks: Vec<JoinHandle<LrOutcome>> = Vec::new();
    let d = Arc::clone(&data);
    ranks.push(thread::spawn(move || {
        lr_job(&d, workers).transport(master).run()
    }));
    for rank in 1..workers {
        let d = Arc::clone(&data);
        let t = TcpTransport::new(settings(rank, workers, &addr, "lr-bits")).unwrap();
        ranks.push(thread::spawn(move || {
            lr_job(&d, workers).transport(t).run()
        }));
    }
    let outcomes: Vec<JobOutcome<lr::Model>> = ranks
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    let bits = |m: &lr::Model| m.weights.iter().map(|w| w.to_bits()).collect::<Vec<_>>();
    for (rank, outcome) in outcomes.iter().enumerate() {
        assert_eq!(
            bits(&outcome.result),
            bits(&in_memory.result),
            "rank {rank}"
        );
        assert_eq!(outcome.iterations, 8);
    }
    assert_eq!(
        outcomes[0].report.iterations.len(),
        8,
        "rank 0 runs the master"
    );
}

#[test]
fn results_combined_as_they_arrive_over_tcp_give_the_in_memory_model() {
    let data = Arc::new(lr::Dataset::generate(3_000, 4, 17));
    let workers = 4;
    let in_memory = lr_job(&data, workers).run().unwrap();
    let (master, addr) = master_transport(workers, "lr-combine");
    let d = Arc::clone(&data);
    let mut ranks: Vec<JoinHandle<LrOutcome>> = vec![thread::spawn(move || {
        lr_job(&d, workers)
            .combine(lr::Gradient::add)
            .transport(master)
            .run()
    })];
    for rank in 1..workers {
        let d = Arc::clone(&data);
        let t = TcpTransport::new(settings(rank, workers, &addr, "lr-combine")).unwrap();
        ranks.push(thread::spawn(move || {
            lr_job(&d, workers)
                .combine(lr::Gradient::add)
                .transport(t)
                .run()
        }));
    }
    let outcomes: Vec<JobOutcome<lr::Model>> = ranks
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    let bits = |m: &lr::Model| m.weights.iter().map(|w| w.to_bits()).collect::<Vec<_>>();
    for outcome in &outcomes {
        assert_eq!(bits(&outcome.result), bits(&in_memory.result));
    }
    assert!(outcomes[0]
        .report
        .iterations
        .iter()
        .all(|i| i.results_held <= workers));
}

/// Sends `bytes` on a fresh connection to `addr`, and returns what came back before the
/// master closed the connection. Panics if the master keeps it open (for 10 s).
fn poke(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let mut back = Vec::new();
    match stream.read_to_end(&mut back) {
        Ok(_) => back,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => back,
        Err(e) => panic!("the master kept the connection open: {e}"),
    }
}

fn refusal(back: &[u8]) -> String {
    superstep::dev::decode_stream(back, 1 << 20)
        .into_iter()
        .filter_map(Result::ok)
        .find(|m| m.starts_with("Refused"))
        .unwrap_or_else(|| format!("no refusal in {back:?}"))
}

fn worker_job(
    transport: TcpTransport<u64, u64>,
    compute_ms: u64,
) -> JoinHandle<Result<JobOutcome<u64>, JobError>> {
    thread::spawn(move || {
        Job::builder(summing_master(), move |rank| FnWorker {
            f: move |_: &mut WorkerContext<u64, u64>| {
                thread::sleep(Duration::from_millis(compute_ms));
                Ok(rank as u64 + 1)
            },
        })
        .workers(2)
        .iterations(10)
        .transport(transport)
        .run()
    })
}

#[test]
fn bad_input_is_refused_with_a_reason_and_the_job_goes_on() {
    let job = "bad-input";
    let (master, addr) = master_transport::<u64, u64>(2, job);
    let socket: SocketAddr = addr.parse().unwrap();
    let (registered_tx, registered) = mpsc::channel();
    let master = thread::spawn(move || {
        Job::builder(summing_master(), |rank| FnWorker {
            f: move |_: &mut WorkerContext<u64, u64>| {
                thread::sleep(Duration::from_millis(30));
                Ok(rank as u64 + 1)
            },
        })
        .workers(2)
        .iterations(10)
        .transport(master)
        .on_event(move |e| {
            if matches!(e, JobEvent::Registered { .. }) {
                let _ = registered_tx.send(());
            }
        })
        .run()
    });

    // Bytes that are no frame, a truncated frame, a 4 GiB length prefix, a frame of
    // another protocol version: each gets the connection refused with the reason.
    let [v0, v1] = PROTOCOL_VERSION.to_be_bytes();
    let garbage = refusal(&poke(socket, &[0, 0, 0, 5, v0, v1, 0xc1, 0xc1, 0xc1]));
    assert!(garbage.contains("could not decode"), "{garbage}");
    // A truncated frame: the master waits for the rest until the handshake timeout, then
    // hangs up (poke returns only once the master closed the connection).
    assert_eq!(
        poke(socket, &[0, 0, 0, 100, v0, v1, 0x92]),
        Vec::<u8>::new()
    );
    let huge = refusal(&poke(socket, &[0xff, 0xff, 0xff, 0xff, v0, v1, 2]));
    assert!(
        huge.contains("a frame of 4294967295 bytes, over the limit of"),
        "{huge}"
    );
    let version = refusal(&poke(socket, &[0, 0, 0, 3, 0, 99, 0xc0]));
    assert!(
        version.contains("protocol version 99, this side version"),
        "{version}"
    );
    // A connection that says nothing is dropped after the handshake timeout.
    assert_eq!(poke(socket, &[]), Vec::<u8>::new());

    // A worker with the wrong secret, or of another job, is refused and told why.
    let mut wrong_secret = settings(1, 2, &addr, job);
    wrong_secret.secret = Some(b"guess".to_vec());
    let err = worker_job(TcpTransport::new(wrong_secret).unwrap(), 0)
        .join()
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("wrong secret"), "{err}");
    // One with none set is told it is missing, not that it is wrong.
    let mut no_secret = settings(1, 2, &addr, job);
    no_secret.secret = None;
    let err = worker_job(TcpTransport::new(no_secret).unwrap(), 0)
        .join()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the secret is missing: the connecting process has none set"),
        "{err}"
    );
    assert!(!err.contains("wrong secret"), "{err}");
    let err = worker_job(
        TcpTransport::new(settings(1, 2, &addr, "another-job")).unwrap(),
        0,
    )
    .join()
    .unwrap()
    .unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "another job: the connecting process runs job \"another-job\", the one it reached job {job:?}"
        )),
        "{err}"
    );

    // The real worker joins; a second worker of the same rank is refused.
    let real = worker_job(TcpTransport::new(settings(1, 2, &addr, job)).unwrap(), 30);
    registered
        .recv_timeout(Duration::from_secs(30))
        .expect("every worker registered");
    let err = worker_job(TcpTransport::new(settings(1, 2, &addr, job)).unwrap(), 0)
        .join()
        .unwrap()
        .unwrap_err();
    assert!(
        err.to_string().contains("rank 1 is already connected"),
        "{err}"
    );

    let outcome = master.join().unwrap().unwrap();
    assert_eq!(*outcome.result, 10 * (1 + 2));
    assert_eq!(
        *real.join().unwrap().unwrap().result,
        30,
        "the worker learns the final result"
    );
}

#[test]
fn a_slow_worker_is_told_apart_from_a_dead_one() {
    // Heartbeats flow while compute runs, so a compute longer than the failure detector's
    // timeout is not mistaken for a lost worker.
    let (master, addr) = master_transport_with::<u64, u64>(2, "slow", |s| {
        s.heartbeat_timeout = Duration::from_millis(400)
    });
    let mut w = settings(1, 2, &addr, "slow");
    w.heartbeat_timeout = Duration::from_millis(400);
    let worker = worker_job(TcpTransport::new(w).unwrap(), 0);
    let outcome = Job::builder(summing_master(), |rank| FnWorker {
        f: move |ctx: &mut WorkerContext<u64, u64>| {
            if ctx.iteration() == 2 {
                thread::sleep(Duration::from_millis(1200));
            }
            Ok(rank as u64 + 1)
        },
    })
    .workers(2)
    .iterations(10)
    .transport(master)
    .run()
    .unwrap();
    assert_eq!(*outcome.result, 10 * 3);
    worker.join().unwrap().unwrap();
}

#[test]
fn binding_beyond_loopback_needs_a_secret_and_the_world_size_must_match() {
    let mut s = TcpSettings::new(0, 2, "0.0.0.0:0");
    s.bind = Some("0.0.0.0:0".parse().unwrap());
    let err = TcpTransport::<u64, u64>::new(s.clone()).unwrap_err();
    assert!(matches!(err, TransportError::Insecure { .. }), "{err}");
    s.secret = Some(b"k".to_vec());
    TcpTransport::<u64, u64>::new(s).expect("with a secret it may");

    // The worker count is the world size's; another one is a setting's error.
    let (master, _) = master_transport::<u64, u64>(2, "size");
    let err = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(0),
    })
    .workers(3)
    .transport(master)
    .run()
    .unwrap_err();
    match &err {
        JobError::Config(e) => {
            assert_eq!((e.setting.as_str(), e.value.as_str()), ("workers", "3"));
            assert!(e.requirement.contains("world size, 2"), "{err}");
        }
        other => panic!("expected a configuration error, got {other}"),
    }
    let (master, _) = master_transport::<u64, u64>(2, "size");
    let job = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(0),
    })
    .transport(master)
    .build()
    .unwrap();
    assert_eq!(job.config().workers, 2, "left unset, it is the world size");
}

#[test]
fn a_result_too_large_for_a_frame_fails_the_job_at_once_naming_it() {
    struct Big;
    impl WorkerComputable for Big {
        type MasterResult = u64;
        type WorkerResult = Vec<u64>;
        fn compute(
            &mut self,
            ctx: &mut WorkerContext<u64, Vec<u64>>,
        ) -> Result<Vec<u64>, BoxError> {
            // 9 bytes each on the wire: about 900 KB, over the 128 KiB frame limit.
            let len = if ctx.rank() == 1 { 100_000 } else { 1 };
            Ok(vec![u64::MAX; len])
        }
    }
    struct Count;
    impl MasterComputable for Count {
        type MasterResult = u64;
        type WorkerResult = Vec<u64>;
        fn compute(
            &mut self,
            ctx: &mut MasterContext<u64, Vec<u64>>,
        ) -> Result<Step<u64>, BoxError> {
            Ok(Step::Continue(ctx.worker_results().len() as u64))
        }
    }
    let frame_limit = |s: &mut TcpSettings| s.max_frame = 128 << 10;
    let (master, addr) = master_transport_with::<u64, Vec<u64>>(2, "big", frame_limit);
    let mut w = settings(1, 2, &addr, "big");
    frame_limit(&mut w);
    let worker = TcpTransport::new(w).unwrap();
    let job = |t: TcpTransport<u64, Vec<u64>>| {
        thread::spawn(move || {
            Job::builder(Count, |_| Big)
                .workers(2)
                .iteration_timeout(Duration::from_secs(3600))
                .transport(t)
                .run()
        })
    };
    let (master, worker) = (job(master), job(worker));
    let err = master.join().unwrap().unwrap_err();
    assert!(
        err.to_string()
            .contains("worker 1 could not send its result of iteration 1"),
        "{err}"
    );
    assert!(worker.join().unwrap().is_err());
}

/// A transport used directly, without a job: the transport, its link, and what reaches it.
type Bare<L, T> = (TcpTransport<u64, u64>, Box<L>, mpsc::Receiver<T>);

/// A transport of the two-rank job "reconnect", prepared, and an inbox that collects.
fn prepared<T: Send + 'static>(s: TcpSettings) -> Bare<dyn Fn(T) + Send + Sync, T> {
    let mut t = TcpTransport::<u64, u64>::new(s).unwrap();
    t.prepare(&LinkSpec::new("reconnect", 2)).unwrap();
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let inbox = Box::new(move |msg| {
        let _ = tx.lock().unwrap().send(msg);
    });
    (t, inbox, rx)
}

/// A master's node of attempt `attempt` listening on `bind`, its messages collected.
fn bare_master(bind: &str, attempt: u32) -> Bare<dyn MasterLink<u64>, ToMaster<u64>> {
    let mut s = settings(0, 2, "127.0.0.1:0", "reconnect");
    s.bind = Some(bind.parse().unwrap());
    let (mut t, inbox, rx) = prepared::<ToMaster<u64>>(s);
    let link = t
        .bind_master(
            attempt,
            Box::new(move |env: Envelope<ToMaster<u64>>| inbox(env.msg)),
        )
        .unwrap();
    (t, link, rx)
}

/// Worker 1's transport, reconnecting for `reconnect`; what the master's node tells it is
/// collected.
fn bare_worker(addr: &str, reconnect: Duration) -> Bare<dyn WorkerLink<u64>, ToWorker<u64>> {
    let mut s = settings(1, 2, addr, "reconnect");
    s.reconnect_timeout = reconnect;
    s.heartbeat_timeout = Duration::from_millis(500);
    let (mut t, inbox, rx) = prepared::<ToWorker<u64>>(s);
    let link = t.connect_worker(1, inbox).unwrap();
    (t, link, rx)
}

fn next<T>(rx: &mpsc::Receiver<T>) -> T {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a message within 10 s")
}

#[test]
fn a_worker_connected_over_loopback_is_on_the_masters_host() {
    let (master, link, from_worker) = bare_master("127.0.0.1:0", 0);
    let addr = master.local_addr().unwrap().to_string();
    assert_eq!(link.on_another_host(1), None, "not connected: not known");
    let (_worker, worker_link, to_worker) = bare_worker(&addr, Duration::from_secs(5));
    assert_eq!(next(&to_worker), ToWorker::Connected { attempt: 0 });
    worker_link
        .send(ToMaster::Registered { attempt: 0 })
        .unwrap();
    assert_eq!(next(&from_worker), ToMaster::Registered { attempt: 0 });
    assert_eq!(link.on_another_host(1), Some(false));
}

#[test]
fn a_worker_reaches_a_master_started_again_learns_its_attempt_and_nothing_old_reaches_it() {
    let (first, _link, from_worker) = bare_master("127.0.0.1:0", 0);
    let addr = first.local_addr().unwrap().to_string();
    let (_worker, link, to_worker) = bare_worker(&addr, Duration::from_secs(20));
    assert_eq!(next(&to_worker), ToWorker::Connected { attempt: 0 });
    link.send(ToMaster::Registered { attempt: 0 }).unwrap();
    assert_eq!(next(&from_worker), ToMaster::Registered { attempt: 0 });

    // The master's node goes away; the worker goes on sending for a moment.
    drop(first);
    let old = |iteration| {
        ToMaster::Result(Report {
            attempt: 0,
            iteration,
            result: superstep::dev::Share::Own(7),
            halt_vote: false,
            mail: Default::default(),
            saved: None,
            calls: 0,
            group_calls: None,
            elapsed: Duration::ZERO,
        })
    };
    link.send(old(1)).unwrap();
    thread::sleep(Duration::from_millis(100));
    link.send(old(2)).unwrap();

    // A new master's node on the same address, as a process started again would bind it.
    let (_second, _link, from_worker) = bare_master(&addr, 3);
    // The worker hears that its link reaches for the master again, then that it did.
    match next(&to_worker) {
        ToWorker::Reconnecting { reason } => assert!(reason.contains("closed"), "{reason}"),
        other => panic!("expected word of the reconnect, got {other:?}"),
    }
    assert_eq!(next(&to_worker), ToWorker::Connected { attempt: 3 });
    link.send(ToMaster::Registered { attempt: 3 }).unwrap();
    assert_eq!(
        next(&from_worker),
        ToMaster::Registered { attempt: 3 },
        "what was queued for the master that went away does not reach the new one"
    );
}

#[test]
fn a_worker_gives_up_on_a_lost_master_after_its_reconnect_timeout_naming_it() {
    for reconnect in [Duration::ZERO, Duration::from_millis(300)] {
        let (master, _link, _from_worker) = bare_master("127.0.0.1:0", 2);
        let addr = master.local_addr().unwrap().to_string();
        let (_worker, _link, to_worker) = bare_worker(&addr, reconnect);
        assert_eq!(next(&to_worker), ToWorker::Connected { attempt: 2 });
        drop(master);
        // A reconnect that raced the node's shutdown may have been welcomed once more;
        // each try is said (`Reconnecting`) when reconnecting is on.
        let mut told = next(&to_worker);
        let mut reconnecting = false;
        while matches!(
            told,
            ToWorker::Connected { attempt: 2 } | ToWorker::Reconnecting { .. }
        ) {
            reconnecting |= matches!(told, ToWorker::Reconnecting { .. });
            told = next(&to_worker);
        }
        assert_eq!(reconnecting, !reconnect.is_zero());
        match told {
            ToWorker::Abort {
                attempt: 2,
                error: JobError::MasterLost { reason },
            } => {
                assert!(reason.contains("closed"), "{reason}");
                assert_eq!(
                    reason.contains("not reached again within 300ms"),
                    !reconnect.is_zero(),
                    "{reason}"
                );
            }
            other => panic!("expected the master lost, got {other:?}"),
        }
    }
}

#[path = "../examples/support/pipeline.rs"]
mod pipeline;

#[test]
fn a_pipeline_over_tcp_merges_every_process_part_and_totals_their_rows() {
    use superstep::coordinator::{FileMerge, MalformedRows, MergeFormat};
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sales.csv");
    pipeline::generate(&input, 4_000, Some(500)).unwrap();
    let output = dir.path().join("sales.jsonl");
    let workers = 3;
    let merge = FileMerge::new(&output, MergeFormat::Lines);
    let staging = merge.staging().clone();
    let (master, addr) = master_transport(workers, "pipeline");
    let job = |transport: TcpTransport<u64, u64>| {
        pipeline::job(&input, staging.clone(), workers, 300, MalformedRows::Skip)
            .job_id("pipeline")
            .transport(transport)
    };
    let ranks: Vec<TcpTransport<u64, u64>> = (1..workers)
        .map(|rank| TcpTransport::new(settings(rank, workers, &addr, "pipeline")).unwrap())
        .collect();
    let outcome = thread::scope(|s| {
        let others: Vec<_> = ranks
            .into_iter()
            .map(|t| {
                let job = job(t);
                s.spawn(move || job.run())
            })
            .collect();
        let outcome = job(master).coordinator(merge).run();
        for other in others {
            other.join().unwrap().unwrap();
        }
        outcome.unwrap()
    });
    let lines: Vec<pipeline::Line> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, pipeline::sequential(&input));
    let rows = &outcome.report.rows;
    assert_eq!((rows.read, rows.written, rows.rejected), (4_000, 3_992, 8));
    assert_eq!(outcome.report.workers.len(), workers);
    assert_eq!(rows.rejects.len(), 8, "the rejected rows cross the wire");
    assert!(!staging.dir().exists());
}

/// A coordinator that writes down which hooks ran, and for which workers.
#[derive(Clone, Default)]
struct Commits(common::Log);

impl superstep::coordinator::Coordinator for Commits {
    fn on_finish(
        &mut self,
        reports: &[superstep::coordinator::WorkerReport],
    ) -> Result<(), BoxError> {
        let ranks: Vec<usize> = reports.iter().map(|r| r.rank).collect();
        self.0.push(format!("commit {ranks:?}"));
        Ok(())
    }

    fn on_error(&mut self, error: &JobError) -> Result<(), BoxError> {
        self.0.push(format!("clean up after: {error}"));
        Ok(())
    }
}

/// A three-rank summing job, as every rank builds it.
fn summing_job(
    policy: superstep::FailurePolicy,
    commits: Commits,
) -> superstep::JobBuilder<u64, u64> {
    Job::builder(summing_master(), |rank| FnWorker {
        f: move |_: &mut WorkerContext<u64, u64>| Ok(rank as u64 + 1),
    })
    .iterations(4)
    .failure_policy(policy)
    .coordinator(commits)
}

/// A three-rank job of `job` under `RestartWorker { max_restarts: 1 }`: rank 1's process
/// runs it; rank 2's first process is `first` (given the master's address and the job's
/// fingerprint), and a process of rank 2 started again takes its place. Returns the
/// master's outcome, once every rank ended well, and what the coordinator committed.
fn rank_2_replaced(
    job: &str,
    first: impl FnOnce(&str, superstep::transport::Fingerprint),
) -> (JobOutcome<u64>, Vec<String>) {
    let policy = superstep::FailurePolicy::RestartWorker { max_restarts: 1 };
    let commits = Commits::default();
    let fingerprint = summing_job(policy, Commits::default())
        .workers(3)
        .build()
        .unwrap()
        .fingerprint();
    let (master, addr) = master_transport::<u64, u64>(3, job);
    let kept = commits.clone();
    let m = thread::spawn(move || summing_job(policy, kept).transport(master).run());
    let t = TcpTransport::new(settings(1, 3, &addr, job)).unwrap();
    let one = thread::spawn(move || summing_job(policy, Commits::default()).transport(t).run());
    first(&addr, fingerprint);
    // Started again, it takes the rank once the master's node let go of the old one.
    let mut again = settings(2, 3, &addr, job);
    again.restart_count = 1;
    let t = TcpTransport::new(again).unwrap();
    let two = thread::spawn(move || summing_job(policy, Commits::default()).transport(t).run());
    let outcome = m.join().unwrap().unwrap();
    one.join().unwrap().unwrap();
    two.join().unwrap().unwrap();
    (outcome, commits.0.entries())
}

#[test]
fn a_rank_lost_before_it_registered_is_replaced_and_the_job_completes_and_commits() {
    // Rank 2's first process connects and is gone before it registers.
    let (outcome, commits) = rank_2_replaced("lost-early", |addr, fingerprint| {
        drop(common::tcp_link(2, 3, addr, "lost-early", fingerprint))
    });
    assert_eq!(*outcome.result, 4 * (1 + 2 + 3));
    assert_eq!(commits, vec!["commit [0, 1, 2]".to_string()]);
    assert!(matches!(
        outcome.report.recoveries[0].cause,
        JobError::WorkerLost { rank: 2, .. }
    ));
}

#[test]
fn a_worker_that_reports_its_own_loss_is_lost_once_and_replaced_once() {
    // A proven process of rank 2 says it was lost — the transport's word, not a
    // worker's — and its connection then closes: one failure, one replacement.
    let (outcome, _) = rank_2_replaced("own-loss", |addr, fingerprint| {
        let (transport, link, _) = common::tcp_link(2, 3, addr, "own-loss", fingerprint);
        link.send(ToMaster::Failed {
            attempt: 0,
            error: JobError::WorkerLost {
                rank: 2,
                reason: "lost, it says".into(),
            },
        })
        .unwrap();
        drop((link, transport));
    });
    assert_eq!(*outcome.result, 4 * (1 + 2 + 3));
    let causes: Vec<String> = outcome
        .report
        .recoveries
        .iter()
        .map(|r| r.cause.to_string())
        .collect();
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert!(causes[0].contains("only the master"), "{causes:?}");
}

/// A worker whose result is `bytes` zero bytes.
struct Bulky(usize);

impl WorkerComputable for Bulky {
    type MasterResult = u64;
    type WorkerResult = Vec<u8>;

    fn compute(&mut self, _: &mut WorkerContext<u64, Vec<u8>>) -> Result<Vec<u8>, BoxError> {
        Ok(vec![0; self.0])
    }
}

/// A master that counts the bytes its workers returned.
struct Counting;

impl MasterComputable for Counting {
    type MasterResult = u64;
    type WorkerResult = Vec<u8>;

    fn compute(&mut self, ctx: &mut MasterContext<u64, Vec<u8>>) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(
            ctx.worker_results().iter().map(|r| r.len() as u64).sum(),
        ))
    }
}

#[test]
fn a_frame_over_the_masters_limit_fails_the_job_naming_the_rank_its_size_and_the_limit() {
    // Rank 1's process takes frames of 64 MiB, the master's 1 MiB: rank 1's result of
    // 2 MiB leaves it, and cannot be read where it arrives.
    let outcomes = common::over_tcp_with(
        2,
        "frame-too-large",
        |s| s.max_frame = if s.rank == 0 { 1 << 20 } else { 64 << 20 },
        |rank, transport| {
            let bytes = if rank == 1 { 2 << 20 } else { 8 };
            Job::builder(Counting, move |_| Bulky(bytes))
                .workers(2)
                .iterations(2)
                .transport(transport)
                .run()
        },
    );
    let err = outcomes[0].as_ref().unwrap_err();
    match err {
        JobError::FrameTooLarge {
            rank: 1,
            peer,
            bytes,
            limit,
        } => {
            assert!(peer.starts_with("127.0.0.1:"), "{err}");
            assert!(*bytes > 2 << 20 && *bytes < (2 << 20) + 1024, "{err}");
            assert_eq!(*limit, 1 << 20);
        }
        other => panic!("{other}"),
    }
    assert!(
        err.to_string()
            .starts_with("worker 1's process (127.0.0.1:"),
        "{err}"
    );
    assert!(outcomes[1].is_err());
}

#[test]
fn a_worker_pointed_at_an_http_server_is_told_it_is_no_superstep_master_and_what_it_said() {
    // A server that answers every connection as a web server would.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for stream in listener.incoming().take(50) {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0; 512];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let mut s = settings(1, 2, &addr, "http");
    s.connect_timeout = Duration::from_secs(2);
    let err = summing_job(superstep::FailurePolicy::Fail, Commits::default())
        .workers(2)
        .transport(TcpTransport::new(s).unwrap())
        .run()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("{addr} is not a superstep master: it answered")),
        "{err}"
    );
    assert!(err.contains("HTTP/1.1 400 Bad Request"), "{err}");
    assert!(!err.contains("frame size too big"), "{err}");
}

#[test]
fn a_process_that_never_says_it_ended_is_not_said_to_run_user_code() {
    let job = "silent-to-the-end";
    common::logs();
    let fingerprint = summing_job(superstep::FailurePolicy::Fail, Commits::default())
        .workers(3)
        .build()
        .unwrap()
        .fingerprint();
    let (master, addr) = master_transport::<u64, u64>(3, job);
    let m = thread::spawn(move || {
        summing_job(superstep::FailurePolicy::Fail, Commits::default())
            .failure_grace(Duration::from_millis(300))
            .transport(master)
            .run()
    });
    // Rank 1 fails and says it ended; rank 2's connection — anybody's with the secret —
    // says nothing, ever.
    let (_one, link, _) = common::tcp_link(1, 3, &addr, job, fingerprint.clone());
    let (_two, _silent, _) = common::tcp_link(2, 3, &addr, job, fingerprint);
    let failed = JobError::Worker {
        rank: 1,
        iteration: 0,
        phase: superstep::Phase::Init,
        cause: superstep::Cause::message_only(superstep::CauseKind::Error, "no data"),
    };
    link.send(ToMaster::Failed {
        attempt: 0,
        error: failed,
    })
    .unwrap();
    link.send(ToMaster::Done {
        attempt: 0,
        awaits_word: false,
        rows: Default::default(),
        attachments: Vec::new(),
    })
    .unwrap();
    let err = m.join().unwrap().unwrap_err();
    assert_eq!(err.rank(), Some(1), "{err}");
    let said = common::lines_with(&[job, "WARN", "worker(s) [2]"]);
    assert!(
        said.iter().any(|l| l.contains("did not say they ended")),
        "{said:?}"
    );
    assert!(
        !said.iter().any(|l| l.contains("user code")),
        "another process's rank is not known to run user code: {said:?}"
    );
}

#[test]
fn a_rank_lost_with_no_launcher_is_said_at_warn_at_once_and_while_the_master_waits() {
    let job = "no-launcher";
    common::logs();
    let policy = superstep::FailurePolicy::RestartWorker { max_restarts: 1 };
    let fingerprint = summing_job(policy, Commits::default())
        .workers(3)
        .build()
        .unwrap()
        .fingerprint();
    let (master, addr) = master_transport::<u64, u64>(3, job);
    let m = thread::spawn(move || {
        summing_job(policy, Commits::default())
            .startup_timeout(Duration::from_secs(2))
            .transport(master)
            .run()
    });
    let t = TcpTransport::new(settings(1, 3, &addr, job)).unwrap();
    let one = thread::spawn(move || summing_job(policy, Commits::default()).transport(t).run());
    // Rank 2's process connects and dies; nothing starts it again.
    drop(common::tcp_link(2, 3, &addr, job, fingerprint));
    let err = m.join().unwrap().unwrap_err();
    assert!(
        matches!(&err, JobError::WorkersTimedOut { missing, .. } if missing == &[2]),
        "{err}"
    );
    let said = common::lines_with(&[
        job,
        "WARN",
        "rank 2 lost; waiting up to",
        "for a new process of rank 2, which only a launcher or scheduler starts",
    ]);
    assert!(
        said.len() >= 2,
        "said at once and again while waiting: {said:?}"
    );
    let _ = one.join().unwrap();
}

#[test]
fn a_worker_cannot_blame_another_rank_for_its_failure() {
    let job = "blame";
    let fingerprint = summing_job(superstep::FailurePolicy::Fail, Commits::default())
        .workers(3)
        .build()
        .unwrap()
        .fingerprint();
    let (master, addr) = master_transport::<u64, u64>(3, job);
    let m = thread::spawn(move || {
        summing_job(superstep::FailurePolicy::Fail, Commits::default())
            .transport(master)
            .run()
    });
    // Ranks 1 and 2 are links of processes that connected; rank 1, authenticated, says
    // rank 2 failed.
    let (_one, link, _) = common::tcp_link(1, 3, &addr, job, fingerprint.clone());
    let (_two, two, told) = common::tcp_link(2, 3, &addr, job, fingerprint);
    let blame = JobError::Worker {
        rank: 2,
        iteration: 0,
        phase: superstep::Phase::Init,
        cause: superstep::Cause::message_only(superstep::CauseKind::Error, "not me"),
    };
    link.send(ToMaster::Failed {
        attempt: 0,
        error: blame,
    })
    .unwrap();
    // The job fails as rank 1's failure, and rank 2 is told so.
    let error = match next(&told) {
        ToWorker::Abort { error, .. } => error,
        other => panic!("rank 2 was told {other:?}"),
    };
    assert_eq!(error.rank(), Some(1), "{error}");
    for link in [&link, &two] {
        link.send(ToMaster::Done {
            attempt: 0,
            awaits_word: false,
            rows: Default::default(),
            attachments: Vec::new(),
        })
        .unwrap();
    }
    let err = m.join().unwrap().unwrap_err();
    assert_eq!(err, error, "the job's first failure, everywhere");
    assert!(
        err.to_string().starts_with("worker 1 failed in init"),
        "{err}"
    );
}

#[test]
fn a_master_started_again_after_its_job_ended_ends_at_once_with_the_final_result() {
    let store = superstep::checkpoint::MemoryCheckpointStore::new();
    let job = |store: &superstep::checkpoint::MemoryCheckpointStore| {
        Job::builder(summing_master(), |rank| FnWorker {
            f: move |_: &mut WorkerContext<u64, u64>| Ok(rank as u64 + 1),
        })
        .iterations(4)
        .job_id("ended")
        .checkpoint(store.clone(), 3)
    };
    // The job ran to its end, and its master saved the last iteration too.
    let ended = job(&store).workers(2).run().unwrap();
    assert_eq!(ended.report.checkpoints, vec![3, 4]);
    // Its master's process is started again; its workers have long exited.
    let (master, _) = master_transport_with::<u64, u64>(2, "ended", |s| s.restart_count = 1);
    let started = std::time::Instant::now();
    let outcome = job(&store).transport(master).run().unwrap();
    assert_eq!(outcome.result, ended.result);
    assert_eq!(outcome.report.resumed_from(), Some(4));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "it waited {:?} for workers",
        started.elapsed()
    );
}

#[test]
fn a_settings_document_that_leaves_workers_out_takes_the_cluster_s_world_size() {
    let job = |doc: &str| {
        let transport =
            TcpTransport::<u64, u64>::new(common::tcp_settings(1, 3, "127.0.0.1:1", "doc"))
                .unwrap();
        let config: superstep::JobConfig = serde_json::from_str(doc).unwrap();
        Job::builder(summing_master(), |_| FnWorker {
            f: |_: &mut WorkerContext<u64, u64>| Ok(1),
        })
        .transport(transport)
        .config(config)
        .build()
    };
    assert_eq!(job(r#"{"iterations": 2}"#).unwrap().config().workers, 3);
    assert_eq!(job(r#"{"workers": 3}"#).unwrap().config().workers, 3);
    let err = job(r#"{"workers": 2}"#).unwrap_err();
    assert_eq!(err.setting, "workers", "{err}");
}

/// One job id: the builder's reaches the TCP handshake (a worker of a job named otherwise
/// is refused as another job's), and a transport that names another id than the builder's
/// is refused when the job is built, naming both.
#[test]
fn the_builders_job_id_is_the_one_the_tcp_transport_uses() {
    use superstep::transport::TcpSettings;
    let unnamed = TcpSettings::DEFAULT_JOB_ID;
    let job = |id: &str, transport: TcpTransport<u64, u64>| {
        Job::builder(summing_master(), |rank| FnWorker {
            f: move |_: &mut WorkerContext<u64, u64>| Ok(rank as u64 + 1),
        })
        .workers(2)
        .iterations(2)
        .job_id(id)
        .transport(transport)
    };
    let (master, addr) = master_transport_with::<u64, u64>(2, unnamed, |_| {});
    let m = thread::spawn(move || job("cc", master).run());
    let err = job(
        "dd",
        TcpTransport::new(settings(1, 2, &addr, unnamed)).unwrap(),
    )
    .run()
    .unwrap_err();
    assert!(err.to_string().contains("another job: "), "{err}");
    let worker = job(
        "cc",
        TcpTransport::new(settings(1, 2, &addr, unnamed)).unwrap(),
    )
    .run();
    assert_eq!(*m.join().unwrap().unwrap().result, 6);
    assert_eq!(*worker.unwrap().result, 6);

    // Named twice, differently: refused before anything connects.
    let (named, _) = master_transport_with::<u64, u64>(2, "ee", |_| {});
    let err = job("cc", named).build().unwrap_err();
    assert_eq!(err.setting, "job_id");
    assert!(
        err.requirement.contains("the transport's job id `ee`"),
        "{err}"
    );
    // Named by the transport alone (the environment's SUPERSTEP_JOB_ID): the job takes it.
    let (named, _) = master_transport_with::<u64, u64>(2, "ee", |_| {});
    let built = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .workers(2)
    .transport(named)
    .build()
    .unwrap();
    assert_eq!(built.config().job_id, "ee");
}

/// The final result the worker processes get is what `result_for_worker_processes` makes
/// of the master's, which the master's process keeps; a panic in it fails the job on
/// every rank, and does not leave it waiting.
#[test]
fn worker_processes_get_the_result_made_for_them_and_a_panic_making_it_fails_the_job() {
    for panics in [false, true] {
        let outcomes = common::over_tcp(3, "for-workers", move |_, transport| {
            Job::builder(summing_master(), |rank| FnWorker {
                f: move |_: &mut WorkerContext<u64, u64>| Ok(rank as u64 + 1),
            })
            .iterations(2)
            .result_for_worker_processes(move |sum: &u64| {
                assert!(!panics, "no result for the workers");
                sum + 1_000
            })
            .transport(transport)
            .run()
        });
        if !panics {
            // 1 + 2 + 3 in each of 2 iterations.
            let results: Vec<u64> = outcomes.into_iter().map(|o| *o.unwrap().result).collect();
            assert_eq!(results, [12, 1_012, 1_012]);
            continue;
        }
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let error = outcome
                .err()
                .unwrap_or_else(|| panic!("rank {rank} completed"));
            let message = error.to_string();
            assert!(
                message.contains("no result for the workers"),
                "rank {rank}: {message}"
            );
        }
    }
}
