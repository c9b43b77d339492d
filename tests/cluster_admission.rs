//! Unauthenticated peers cannot keep workers out: connections that idle or trickle bytes
//! in their handshake hold at most the handshake slots, and a new connection takes the
//! slot of the oldest; a worker whose handshake is closed or reset before it authenticated
//! (a flood took its slot, its master died in start-up) tries again within its connect
//! timeout. Floods here are bounded in count and time, on 127.0.0.1.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{summing_master, tcp_master, tcp_settings, FnWorker};
use superstep::prelude::*;
use superstep::transport::TcpTransport;

fn summing() -> superstep::JobBuilder<u64, u64> {
    Job::builder(summing_master(), |rank| FnWorker {
        f: move |_: &mut WorkerContext<u64, u64>| Ok(rank as u64 + 1),
    })
    .iterations(3)
}

#[test]
fn idle_and_trickling_connections_do_not_keep_a_worker_out() {
    let job = "flooded";
    // A handshake timeout longer than the test: only taking the oldest connection's slot
    // can let the worker in.
    let (master, addr) =
        tcp_master::<u64, u64>(2, job, |s| s.handshake_timeout = Duration::from_secs(120));
    let m = thread::spawn(move || summing().transport(master).run());
    // 64 connections that say nothing, and 64 that send one byte every 100 ms: together
    // every handshake slot, twice over.
    let idle: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let trickling: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut trickling = trickling;
            // At most 30 s of trickling.
            for _ in 0..300 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                for s in &mut trickling {
                    let _ = s.write_all(&[0]);
                }
                thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // And a flood that goes on while the worker joins: 200 new idle connections.
    let flood = {
        let addr = addr.clone();
        thread::spawn(move || {
            let mut held = Vec::new();
            for _ in 0..200 {
                if let Ok(s) = TcpStream::connect(&addr) {
                    held.push(s);
                }
                thread::sleep(Duration::from_millis(5));
            }
            held
        })
    };
    let started = Instant::now();
    let worker = TcpTransport::new(tcp_settings(1, 2, &addr, job)).unwrap();
    let outcome = summing().transport(worker).run().unwrap();
    assert_eq!(*outcome.result, 3 * (1 + 2));
    assert_eq!(*m.join().unwrap().unwrap().result, 3 * (1 + 2));
    assert!(started.elapsed() < Duration::from_secs(20));
    stop.store(true, Ordering::SeqCst);
    trickle.join().unwrap();
    drop(flood.join().unwrap());
    drop(idle);
}

/// A front for the master at `to`, listening on a port of its own: it closes the first
/// `reset` connections at once (as a master dying in its start-up would), and carries the
/// bytes of the later ones both ways.
fn front(to: String, reset: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for (i, incoming) in listener.incoming().enumerate() {
            let Ok(client) = incoming else { return };
            if i < reset {
                // Read the hello, then close: the worker's handshake ends unanswered.
                let mut hello = [0u8; 16];
                let mut client = client;
                let _ = client.read(&mut hello);
                drop(client);
                continue;
            }
            let Ok(master) = TcpStream::connect(&to) else {
                return;
            };
            let pipe = |mut from: TcpStream, mut into: TcpStream| {
                thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut into);
                    let _ = into.shutdown(std::net::Shutdown::Write);
                })
            };
            pipe(client.try_clone().unwrap(), master.try_clone().unwrap());
            pipe(master, client);
        }
    });
    addr
}

#[test]
fn a_worker_whose_first_handshakes_are_closed_tries_again_and_joins() {
    let job = "reset";
    let (master, addr) = tcp_master::<u64, u64>(2, job, |_| {});
    let m = thread::spawn(move || summing().transport(master).run());
    // Reconnecting is off: the first connection is what is tried again.
    let mut s = tcp_settings(1, 2, &front(addr, 3), job);
    s.reconnect_timeout = Duration::ZERO;
    let outcome = summing()
        .transport(TcpTransport::new(s).unwrap())
        .run()
        .unwrap();
    assert_eq!(*outcome.result, 3 * (1 + 2));
    assert_eq!(*m.join().unwrap().unwrap().result, 3 * (1 + 2));
}
