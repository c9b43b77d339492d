//! What a cluster job says while it waits, and when it gives up: a waiting master names the
//! ranks it waits for and the peers it refused, and fails at its connect timeout naming
//! them; a waiting worker says what it tries to reach and why it fails (a name that does
//! not resolve, said as such); refused connections are logged once per kind per interval,
//! not once each. Logs are captured by a subscriber of this test binary; each test reads
//! the lines of its own job (every line of the master's node carries its job id).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::{lines_with, logs, summing_master, tcp_master, tcp_settings, FnWorker};
use superstep::prelude::*;
use superstep::transport::tcp::PROTOCOL_VERSION;
use superstep::transport::{TcpSettings, TcpTransport, TransportError};
use superstep::Waiting;

fn summing(workers: usize) -> superstep::JobBuilder<u64, u64> {
    Job::builder(summing_master(), |rank| FnWorker {
        f: move |_: &mut WorkerContext<u64, u64>| Ok(rank as u64 + 1),
    })
    .workers(workers)
    .iterations(3)
}

#[test]
fn a_worker_whose_master_name_does_not_resolve_says_so_while_it_waits_and_then_fails_naming_it() {
    logs();
    let mut s = tcp_settings(1, 2, "no-such-host.invalid:29400", "unresolved");
    s.connect_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = summing(2)
        .transport(TcpTransport::new(s).unwrap())
        .run()
        .unwrap_err();
    let took = started.elapsed();
    let said = |e: &str| {
        e.contains("the name no-such-host.invalid does not resolve")
            || e.contains("resolving the name no-such-host.invalid timed out")
    };
    match &err {
        JobError::MasterLost { reason } => {
            assert!(said(reason), "{reason}");
            assert!(reason.contains("within 2s"), "{reason}");
        }
        other => panic!("expected the master lost, got {other}"),
    }
    assert!(took < Duration::from_secs(8), "took {took:?}");
    let waiting = lines_with(&["job=unresolved", "still trying to reach the master"]);
    assert!(
        waiting.iter().any(|l| said(l)),
        "it said why while it waited: {waiting:#?}"
    );
}

/// torchrun's `MASTER_PORT` may be its agent's store, not rank 0's listener: a worker that
/// cannot reach the master says which variables its address came from.
#[test]
fn a_worker_that_cannot_reach_the_master_names_the_variables_its_address_came_from() {
    logs();
    // A port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let vars = [
        ("RANK", "1".to_string()),
        ("WORLD_SIZE", "2".to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("SUPERSTEP_JOB_ID", "wrong-port".to_string()),
        ("SUPERSTEP_CONNECT_TIMEOUT", "1".to_string()),
    ];
    let env = superstep::transport::ClusterEnv::from_vars(|name| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap()
    .expect("a cluster environment");
    let settings = TcpSettings::from_cluster(&env).unwrap();
    let err = summing(2)
        .transport(TcpTransport::new(settings).unwrap())
        .run()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "127.0.0.1:{port} (check MASTER_ADDR and MASTER_PORT)"
        )),
        "{text}"
    );
}

#[test]
fn an_address_that_is_not_host_and_port_is_refused_before_anything_connects() {
    for (addr, says) in [
        ("http://node01:29400", "drop the scheme"),
        ("node01:99999", "port 99999, outside 1..=65535"),
        ("node01", "no port"),
    ] {
        let err = TcpTransport::<u64, u64>::new(TcpSettings::new(1, 2, addr)).unwrap_err();
        assert!(matches!(err, TransportError::Env(_)), "{addr}: {err}");
        let err = err.to_string();
        assert!(err.contains(addr) && err.contains(says), "{addr}: {err}");
    }
}

#[test]
fn a_master_waiting_for_workers_names_them_and_the_peers_it_refused_then_fails_at_its_connect_timeout(
) {
    logs();
    let job = "waiting";
    let (master, addr) =
        tcp_master::<u64, u64>(3, job, |s| s.connect_timeout = Duration::from_secs(3));
    let started = Instant::now();
    // A start-up timeout long enough not to end the job first, short enough that its
    // wait would be said meanwhile (every quarter of it) if it named unconnected ranks.
    let m = thread::spawn(move || {
        summing(3)
            .startup_timeout(Duration::from_secs(4))
            .transport(master)
            .run()
    });
    // Rank 1 comes with a wrong secret: told so at once, it ends; rank 2 never comes.
    let mut wrong = tcp_settings(1, 3, &addr, job);
    wrong.secret = Some(b"guess".to_vec());
    let err = summing(3)
        .transport(TcpTransport::new(wrong).unwrap())
        .run()
        .unwrap_err();
    assert!(err.to_string().contains("wrong secret"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once"
    );
    let err = m.join().unwrap().unwrap_err();
    let took = started.elapsed();
    match &err {
        JobError::WorkersTimedOut {
            during: Waiting::Connection,
            missing,
            refused,
            ..
        } => {
            assert_eq!(missing, &vec![1, 2]);
            assert_eq!(refused.len(), 1, "{err}");
            assert!(
                refused[0].starts_with("rank 1 from 127.0.0.1:")
                    && refused[0].contains("wrong secret"),
                "{err}"
            );
        }
        other => panic!("expected a connection timeout, got {other}"),
    }
    assert!(err.to_string().contains("; refused: rank 1 from"), "{err}");
    // At its connect timeout, and then at once: nothing waits for ranks never connected.
    assert!(took < Duration::from_secs(6), "took {took:?}");
    let waiting = lines_with(&[
        "job=waiting",
        "WARN",
        "waiting for worker(s) [1, 2] to connect",
    ]);
    assert!(
        waiting.iter().any(|l| l.contains("wrong secret")),
        "the wait named the refused peer: {waiting:#?}"
    );
    // One wait, one timeout: ranks that never connected are the connect wait's (3 s),
    // never also start-up's (4 s).
    let all = lines_with(&["job=waiting", "waiting "]);
    assert!(!all.is_empty());
    assert!(all.iter().all(|l| !l.contains("of 4s")), "{all:#?}");
}

#[test]
fn a_start_up_timeout_names_the_peers_refused_that_claimed_a_missing_rank() {
    logs();
    let job = "startup";
    let (master, addr) = tcp_master::<u64, u64>(2, job, |_| {});
    let m = thread::spawn(move || {
        summing(2)
            .startup_timeout(Duration::from_millis(1500))
            .transport(master)
            .run()
    });
    let mut wrong = tcp_settings(1, 2, &addr, job);
    wrong.secret = Some(b"guess".to_vec());
    let _ = summing(2)
        .startup_timeout(Duration::from_millis(1500))
        .transport(TcpTransport::new(wrong).unwrap())
        .run()
        .unwrap_err();
    match m.join().unwrap().unwrap_err() {
        JobError::WorkersTimedOut {
            during: Waiting::Registration,
            missing,
            refused,
            ..
        } => {
            assert_eq!(missing, vec![1]);
            assert!(
                refused.len() == 1 && refused[0].contains("wrong secret"),
                "{refused:?}"
            );
        }
        other => panic!("expected a start-up timeout, got {other}"),
    }
}

/// Sends `bytes` on a fresh connection and waits for the master to close it.
fn poke(addr: &str, bytes: &[u8]) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let _ = stream.read_to_end(&mut Vec::new());
}

#[test]
fn refused_connections_are_logged_once_per_kind_per_interval_and_the_job_goes_on() {
    logs();
    let job = "flood";
    let (master, addr) = tcp_master::<u64, u64>(2, job, |_| {});
    let m = thread::spawn(move || summing(2).transport(master).run());
    let [v0, v1] = PROTOCOL_VERSION.to_be_bytes();
    for i in 0..400 {
        match i % 3 {
            0 => poke(&addr, &[0, 0, 0, 5, v0, v1, 0xc1, 0xc1, 0xc1]),
            1 => poke(&addr, &[0xff, 0xff, 0xff, 0xff, v0, v1, 2]),
            _ => poke(&addr, &[0, 0, 0, 3, 0, 99, 0xc0]),
        }
    }
    let worker = TcpTransport::new(tcp_settings(1, 2, &addr, job)).unwrap();
    summing(2).transport(worker).run().unwrap();
    assert_eq!(*m.join().unwrap().unwrap().result, 3 * (1 + 2));
    let refused: Vec<String> = lines_with(&["job=flood"])
        .into_iter()
        .filter(|l| l.contains("refused a connection") || l.contains("more connection(s)"))
        .collect();
    assert!(
        !refused.is_empty() && refused.len() <= 6,
        "400 refusals, each kind logged once (and summed up once per interval): {refused:#?}"
    );
}

#[test]
fn a_connection_closed_in_its_handshake_is_said_to_be_closed_not_unreadable() {
    logs();
    let job = "closing";
    let (master, addr) = tcp_master::<u64, u64>(2, job, |_| {});
    let m = thread::spawn(move || summing(2).transport(master).run());
    let [v0, v1] = PROTOCOL_VERSION.to_be_bytes();
    // Half a frame, then the end of the stream.
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(&[0, 0, 0, 100, v0, v1, 0x92]).unwrap();
    half.shutdown(std::net::Shutdown::Write).unwrap();
    let _ = half.read_to_end(&mut Vec::new());
    // Nothing at all.
    let mut nothing = TcpStream::connect(&addr).unwrap();
    nothing.shutdown(std::net::Shutdown::Write).unwrap();
    let _ = nothing.read_to_end(&mut Vec::new());
    let worker = TcpTransport::new(tcp_settings(1, 2, &addr, job)).unwrap();
    summing(2).transport(worker).run().unwrap();
    m.join().unwrap().unwrap();
    let noted = lines_with(&["job=closing", "refused a connection"]);
    assert!(
        noted
            .iter()
            .any(|l| l.contains("closed the connection in the middle of a frame")),
        "{noted:#?}"
    );
    assert!(
        noted.iter().all(|l| !l.contains("unreadable")),
        "{noted:#?}"
    );
}
