//! A job whose metrics a Prometheus exporter serves (`examples/metrics.rs`,
//! `tests/metrics.rs`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use superstep::prelude::*;

/// Serves every metric of this process at `http://{addr}/metrics`, from a thread of its
/// own: the process's recorder, so once per process.
pub fn serve(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;
    Ok(())
}

struct Sum;

impl MasterComputable for Sum {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        let last = ctx.last_master_result().copied().unwrap_or(0);
        Ok(Step::Continue(
            last + ctx.worker_results().iter().sum::<u64>(),
        ))
    }
}

struct Count;

impl WorkerComputable for Count {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        // Rank 1 is the slow one.
        if ctx.rank() == 1 {
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(1)
    }
}

/// A job named `job` of `workers` workers and `iterations`.
pub fn job(job: &str, workers: usize, iterations: u64) -> JobBuilder<u64, u64> {
    Job::builder(Sum, |_| Count)
        .job_id(job)
        .workers(workers)
        .iterations(iterations)
}

/// What `http://{addr}/metrics` answers.
pub fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}
