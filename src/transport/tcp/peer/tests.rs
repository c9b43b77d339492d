use std::io::{Read, Write};
use std::sync::mpsc as std_mpsc;

use super::*;
use crate::ids::{Algorithm, CollectiveCall, CollectiveKind, ReduceOp};
use crate::transport::tcp::wire::PeerBytes;
use crate::transport::{LinkSpec, Transport};

const SECRET: &[u8] = b"s3cret";

/// Rank 1 of 2's transport, prepared for a job whose workers reach each other; its
/// mesh, and what reaches its worker from peers.
fn rank_1() -> (
    super::super::TcpTransport<u64, u64>,
    Arc<Mesh>,
    std_mpsc::Receiver<PeerEvent>,
) {
    rank_1_polling(TcpSettings::new(1, 2, "127.0.0.1:1").peer_poll)
}

/// [`rank_1`], its compute looking for `peer_poll` after each look.
fn rank_1_polling(
    peer_poll: Duration,
) -> (
    super::super::TcpTransport<u64, u64>,
    Arc<Mesh>,
    std_mpsc::Receiver<PeerEvent>,
) {
    let mut s = TcpSettings::new(1, 2, "127.0.0.1:1");
    s.peer_poll = peer_poll;
    s.job_id = "j".into();
    s.secret = Some(SECRET.to_vec());
    s.heartbeat_interval = Duration::from_millis(50);
    let mut t = super::super::TcpTransport::<u64, u64>::new(s).unwrap();
    let mut spec = LinkSpec::new("j", 2);
    spec.peers = true;
    t.prepare(&spec).unwrap();
    let link = t.peers(1).unwrap().expect("a mesh");
    let (tx, rx) = std_mpsc::channel();
    let tx = Mutex::new(tx);
    link.join(1, Box::new(move |event| drop(lock(&tx).send(event))));
    let mesh = t.mesh.clone().unwrap();
    (t, mesh, rx)
}

fn write(stream: &mut std::net::TcpStream, msg: &Wire<(), ()>) {
    stream
        .write_all(&wire::encode(msg, 1 << 20).unwrap())
        .unwrap();
}

fn read(stream: &mut std::net::TcpStream) -> Handshake {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).unwrap();
    let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut frame).unwrap();
    wire::decode(&frame).unwrap()
}

/// Says hello as rank 0 of `job` in `attempt`, meaning to reach rank 1, and proves
/// `secret`: what the peer answers last.
fn greet(
    mesh: &Mesh,
    job: &str,
    attempt: Attempt,
    secret: &[u8],
) -> (std::net::TcpStream, Handshake) {
    greet_rank(mesh, 1, job, attempt, secret)
}

/// As [`greet`], meaning to reach rank `to`.
fn greet_rank(
    mesh: &Mesh,
    to: Rank,
    job: &str,
    attempt: Attempt,
    secret: &[u8],
) -> (std::net::TcpStream, Handshake) {
    let mut stream = std::net::TcpStream::connect(mesh.local).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let fingerprint = Fingerprint::default();
    write(
        &mut stream,
        &Wire::PeerHello {
            job_id: job.into(),
            rank: 0,
            to,
            fingerprint: fingerprint.clone(),
            attempt,
        },
    );
    let nonce = match read(&mut stream) {
        Wire::Challenge { nonce } => nonce,
        other => return (stream, other),
    };
    // No secret (an empty one here): an empty proof, as a peer without one sends.
    let secret = (!secret.is_empty()).then_some(secret);
    let mac = proof_to_send(secret, &nonce, job, 0, &fingerprint);
    write(&mut stream, &Wire::Proof { mac });
    let answer = read(&mut stream);
    (stream, answer)
}

/// Call `seq` of the job: a summing `all_reduce` of `len` elements, on the ring.
fn sum_call(seq: u64, len: u64) -> CollectiveCall {
    CollectiveCall {
        seq,
        at: Default::default(),
        kind: CollectiveKind::AllReduce(Some(ReduceOp::Sum)),
        len,
        algorithm: Algorithm::Ring,
        chunk: 8,
    }
}

/// A piece of `call`'s step `step` in attempt 0, its bytes `body`, as a peer writes it.
fn wire_piece(call: CollectiveCall, step: u32, body: &'static [u8]) -> Wire<(), ()> {
    Wire::Peer {
        attempt: 0,
        call,
        step,
        chunk: 0,
        body: PeerBytes::Held(bytes::Bytes::from_static(body)),
    }
}

fn refusal(answer: Handshake) -> Refusal {
    match answer {
        Wire::Refused { refusal } => refusal,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_peer_of_another_job_attempt_or_secret_is_refused_saying_why() {
    let (_t, mesh, _events) = rank_1();
    let (_, answer) = greet(&mesh, "another", 0, SECRET);
    assert_eq!(
        refusal(answer),
        Refusal::WrongJob {
            asked: "another".into(),
            ours: "j".into()
        }
    );
    let (_, answer) = greet(&mesh, "j", 0, b"wrong");
    assert_eq!(refusal(answer), Refusal::WrongSecret);
    // A peer with no secret (an empty proof) is told it is missing, as the master's port
    // tells it.
    let (_, answer) = greet(&mesh, "j", 0, b"");
    assert_eq!(
        refusal(answer),
        Refusal::NoSecret {
            worker_has_none: true
        }
    );
    let (_, answer) = greet(&mesh, "j", 3, SECRET);
    assert_eq!(
        refusal(answer),
        Refusal::OtherAttempt { ours: 0, theirs: 3 }
    );
    assert_eq!(
        refusal(greet(&mesh, "j", 3, SECRET).1).to_string(),
        "it runs attempt 3 of the job, this worker attempt 0"
    );
    // An address that reached another worker than the one meant.
    let (_, answer) = greet_rank(&mesh, 5, "j", 0, SECRET);
    assert_eq!(
        refusal(answer).to_string(),
        "it meant to reach rank 5, and reached rank 1"
    );
}

#[test]
fn a_proven_peer_pieces_reach_the_worker_and_its_loss_before_its_goodbye_is_named() {
    let (_t, mesh, events) = rank_1();
    let (mut stream, answer) = greet(&mesh, "j", 0, SECRET);
    assert!(matches!(answer, Wire::Welcome { attempt: 0 }), "{answer:?}");
    let call = sum_call(4, 3);
    write(&mut stream, &wire_piece(call, 1, &[1, 2, 3]));
    let Ok(PeerEvent::Message(m)) = events.recv_timeout(Duration::from_secs(10)) else {
        panic!("no piece");
    };
    assert_eq!((m.from, m.call, m.step, m.chunk), (0, call, 1, 0));
    assert!(matches!(m.body, PeerBody::Encoded(ref b) if b[..] == [1, 2, 3]));
    // A second connection of the same rank is refused while the first stands.
    assert_eq!(
        refusal(greet(&mesh, "j", 0, SECRET).1),
        Refusal::RankTaken { rank: 0 }
    );
    drop(stream);
    match events.recv_timeout(Duration::from_secs(10)) {
        Ok(PeerEvent::Lost {
            rank: 0,
            attempt: 0,
            reason,
        }) => {
            assert!(reason.contains("closed before its goodbye"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_peer_lost_while_this_workers_compute_goes_on_looking_is_named_at_once() {
    // Each look keeps the window open for a second: this thread is a compute making one
    // call after another, which never stops looking, however long it is off its core.
    let (_t, mesh, events) = rank_1_polling(Duration::from_secs(1));
    let (mut stream, answer) = greet(&mesh, "j", 0, SECRET);
    assert!(matches!(answer, Wire::Welcome { attempt: 0 }), "{answer:?}");
    // The I/O thread watches the connection once this end's first heartbeat comes (its
    // lane starts as the reader does). The compute looks before the piece comes, so that
    // the piece, waking the I/O thread, finds it looking: the I/O thread leaves the
    // connection to it.
    assert!(matches!(read(&mut stream), Wire::Heartbeat));
    mesh.read_now();
    let look_for = |what: &str, want: &dyn Fn(&PeerEvent) -> bool| {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < until, "no {what} in 10 s");
            mesh.read_now();
            if let Ok(event) = events.try_recv() {
                assert!(want(&event), "{what}: {event:?}");
                return;
            }
            std::thread::yield_now();
        }
    };
    write(&mut stream, &wire_piece(sum_call(1, 1), 0, &[7]));
    look_for("piece", &|e| matches!(e, PeerEvent::Message(_)));
    // The peer is gone while the compute still looks: its loss is told now, not once
    // the compute stops.
    drop(stream);
    look_for(
        "loss",
        &|e| matches!(e, PeerEvent::Lost { rank: 0, reason, .. } if reason.contains("closed before its goodbye")),
    );
}

#[test]
fn a_peer_that_says_goodbye_is_no_loss() {
    let (_t, mesh, events) = rank_1();
    let (mut stream, _) = greet(&mesh, "j", 0, SECRET);
    write(&mut stream, &Wire::PeerBye);
    drop(stream);
    nothing_reaches(&events, "a goodbye reached the worker as a loss");
}

#[test]
fn a_worker_whose_job_ends_says_goodbye_on_the_connections_it_accepted_too() {
    let (_t, mesh, _events) = rank_1();
    let (mut stream, answer) = greet(&mesh, "j", 0, SECRET);
    assert!(matches!(answer, Wire::Welcome { .. }), "{answer:?}");
    // The accepting end's lane is in place once its first heartbeat comes.
    assert!(matches!(read(&mut stream), Wire::Heartbeat));
    mesh.close();
    loop {
        match read(&mut stream) {
            Wire::Heartbeat => continue,
            Wire::PeerBye => break,
            other => panic!("{other:?}"),
        }
    }
}

/// A piece of call `seq` for a peer, in `attempt`.
fn piece(attempt: Attempt, seq: u64) -> PeerMessage {
    PeerMessage {
        attempt,
        from: 1,
        call: sum_call(seq, 1),
        step: 0,
        chunk: 0,
        body: PeerBody::Encoded(bytes::Bytes::from_static(&[7])),
    }
}

/// Rank 0, as a test listens for it: takes a connection, answers its hello (the
/// attempt it says) with a challenge and its proof with a welcome, and reads the frame
/// that follows.
fn accept_as_rank_0(listener: &std::net::TcpListener) -> (std::net::TcpStream, Attempt, Handshake) {
    let (mut stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let Wire::PeerHello { attempt, .. } = read(&mut stream) else {
        panic!("no hello");
    };
    write(&mut stream, &Wire::Challenge { nonce: [0; 32] });
    assert!(matches!(read(&mut stream), Wire::Proof { .. }));
    write(&mut stream, &Wire::Welcome { attempt });
    let next = loop {
        match read(&mut stream) {
            Wire::Heartbeat => continue,
            other => break other,
        }
    };
    (stream, attempt, next)
}

/// Waits for rank 0's loss to reach the worker: the attempt it names.
fn rank_0_lost(events: &std_mpsc::Receiver<PeerEvent>) -> Attempt {
    match events.recv_timeout(Duration::from_secs(10)) {
        Ok(PeerEvent::Lost {
            rank: 0, attempt, ..
        }) => attempt,
        other => panic!("{other:?}"),
    }
}

/// Reads a connection this worker opened until its goodbye.
fn until_goodbye(stream: &mut std::net::TcpStream) {
    loop {
        match read(stream) {
            Wire::Heartbeat => continue,
            Wire::PeerBye => return,
            other => panic!("{other:?}"),
        }
    }
}

/// Asserts nothing reaches the worker from its peers within half a second.
fn nothing_reaches(events: &std_mpsc::Receiver<PeerEvent>, otherwise: &str) {
    match events.recv_timeout(Duration::from_millis(500)) {
        Err(std_mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("{otherwise}: {other:?}"),
    }
}

#[test]
fn a_connection_of_an_earlier_attempt_is_left_and_its_loss_reaches_no_worker_of_the_new_one() {
    let (_t, mesh, events) = rank_1();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    mesh.learn(vec![Some(listener.local_addr().unwrap().to_string()), None]);
    mesh.send(0, piece(0, 1)).unwrap();
    let (mut old, attempt, first) = accept_as_rank_0(&listener);
    assert_eq!(attempt, 0);
    assert!(matches!(first, Wire::Peer { attempt: 0, .. }), "{first:?}");
    // A gang restart: this worker's process joins attempt 1, while rank 0's process of
    // attempt 0 dies — its connection closes without a goodbye, found after the restart.
    mesh.joined(1);
    // The old connection is left with a goodbye.
    until_goodbye(&mut old);
    drop(old);
    nothing_reaches(
        &events,
        "the old attempt's connection's loss reached the worker",
    );
    // The next piece goes on a connection of the new attempt.
    mesh.send(0, piece(1, 1)).unwrap();
    let (_new, attempt, first) = accept_as_rank_0(&listener);
    assert_eq!(attempt, 1);
    assert!(matches!(first, Wire::Peer { attempt: 1, .. }), "{first:?}");
}

#[test]
fn a_loss_names_the_attempt_its_connection_was_made_in() {
    let (_t, mesh, events) = rank_1();
    let (stream, answer) = greet(&mesh, "j", 0, SECRET);
    assert!(matches!(answer, Wire::Welcome { attempt: 0 }), "{answer:?}");
    mesh.joined(1);
    drop(stream);
    assert_eq!(rank_0_lost(&events), 0);
}

#[test]
fn a_master_reached_again_in_the_same_attempt_leaves_the_old_connections_too() {
    let (_t, mesh, _events) = rank_1();
    mesh.joined(0);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    mesh.learn(vec![Some(listener.local_addr().unwrap().to_string()), None]);
    mesh.send(0, piece(0, 1)).unwrap();
    let (mut old, _, _) = accept_as_rank_0(&listener);
    // A master started again without a newer checkpoint runs the same attempt.
    mesh.joined(0);
    until_goodbye(&mut old);
    mesh.send(0, piece(0, 1)).unwrap();
    let (_new, attempt, _) = accept_as_rank_0(&listener);
    assert_eq!(attempt, 0);
}

#[test]
fn a_connection_to_this_worker_from_before_the_master_reached_it_again_is_lost_quietly() {
    let (_t, mesh, events) = rank_1();
    mesh.joined(0);
    let (old, answer) = greet(&mesh, "j", 0, SECRET);
    assert!(matches!(answer, Wire::Welcome { attempt: 0 }), "{answer:?}");
    // The master started again, in the same attempt; rank 0's process died with it.
    mesh.joined(0);
    drop(old);
    nothing_reaches(
        &events,
        "a connection from before the master reached this worker again was said lost",
    );
    // A connection made since is said lost.
    let (new, answer) = greet(&mesh, "j", 0, SECRET);
    assert!(matches!(answer, Wire::Welcome { attempt: 0 }), "{answer:?}");
    drop(new);
    assert_eq!(rank_0_lost(&events), 0);
}

#[test]
fn a_workers_listener_never_takes_the_masters_port_though_the_system_hands_it_out() {
    // The port a launcher found free for the master, let go of, and handed by the system
    // to this worker's first bind: stood for by a listener the test holds.
    let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let master_port = first.local_addr().unwrap().port();
    let mut first = Some(first);
    let mut binds = 0;
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let listener = listen_avoiding(addr, Some(master_port), |addr| {
        binds += 1;
        match first.take() {
            Some(listener) => Ok(listener),
            None => std::net::TcpListener::bind(addr),
        }
    })
    .unwrap();
    assert_eq!(binds, 2, "bound again once");
    assert_ne!(listener.local_addr().unwrap().port(), master_port);
    // A port asked for is taken as it is, and another port of the system's at once.
    let asked = listen_avoiding(addr, Some(1), std::net::TcpListener::bind).unwrap();
    assert_ne!(asked.local_addr().unwrap().port(), 0);
    let mut same = std::net::TcpListener::bind("127.0.0.1:0").ok();
    let port = same.as_ref().unwrap().local_addr().unwrap().port();
    let fixed: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let kept = listen_avoiding(fixed, Some(port), |_| Ok(same.take().unwrap())).unwrap();
    assert_eq!(kept.local_addr().unwrap().port(), port);
}
