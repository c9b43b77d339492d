//! A job's metrics served to Prometheus: the `metrics` feature reports through the
//! `metrics` facade, and `metrics-exporter-prometheus` serves what it records.
//!
//! ```text
//! cargo run --features metrics --example metrics               # serves on 127.0.0.1:9000
//! cargo run --features metrics --example metrics -- 127.0.0.1:9100 --keep
//! curl -s 127.0.0.1:9000/metrics | grep superstep_
//! ```
//!
//! It runs a job of 4 workers for 50 iterations, prints what a scrape of its endpoint
//! gives, and with `--keep` goes on serving until interrupted.

#[path = "support/metrics.rs"]
mod served;

use std::net::SocketAddr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr: SocketAddr = match args.iter().find(|a| !a.starts_with("--")) {
        Some(addr) => match addr.parse() {
            Ok(addr) => addr,
            Err(e) => {
                eprintln!("{addr:?} is not an address such as 127.0.0.1:9000: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => SocketAddr::from(([127, 0, 0, 1], 9000)),
    };
    if addr.port() == 0 {
        eprintln!(
            "give the endpoint a port of its own (127.0.0.1:9000, say): a scraper must know it"
        );
        return ExitCode::FAILURE;
    }
    if let Err(e) = served::serve(addr) {
        eprintln!("cannot serve metrics on {addr}: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = served::job("served", 4, 50).run() {
        eprintln!("job failed: {e}");
        return ExitCode::FAILURE;
    }
    match served::scrape(addr) {
        Ok(page) => {
            for line in page.lines().filter(|l| l.starts_with("superstep_")) {
                println!("{line}");
            }
        }
        Err(e) => eprintln!("cannot scrape {addr}: {e}"),
    }
    if args.iter().any(|a| a == "--keep") {
        println!("serving http://{addr}/metrics until interrupted");
        loop {
            std::thread::park();
        }
    }
    ExitCode::SUCCESS
}
