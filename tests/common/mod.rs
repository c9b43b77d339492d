//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::io::Write;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use superstep::prelude::*;
#[cfg(feature = "tcp")]
use superstep::JobOutcome;

/// A worker whose compute is a closure.
pub struct FnWorker<F> {
    pub f: F,
}

impl<F> WorkerComputable for FnWorker<F>
where
    F: FnMut(&mut WorkerContext<u64, u64>) -> Result<u64, BoxError> + Send + 'static,
{
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        (self.f)(ctx)
    }
}

/// A master whose compute is a closure.
pub struct FnMaster<F> {
    pub f: F,
}

impl<F> MasterComputable for FnMaster<F>
where
    F: FnMut(&mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> + Send + 'static,
{
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        (self.f)(ctx)
    }
}

/// A master that keeps the running total of everything the workers return.
pub struct SummingMaster;

impl MasterComputable for SummingMaster {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        let total = ctx.last_master_result().copied().unwrap_or(0)
            + ctx.worker_results().iter().sum::<u64>();
        Ok(Step::Continue(total))
    }
}

pub fn summing_master() -> SummingMaster {
    SummingMaster
}

/// Long enough that no passing test comes near it: a regression that made ranks wait out
/// the sync timeout shows as a timeout error instead of the expected one.
pub const PATIENT: std::time::Duration = std::time::Duration::from_secs(30);

/// A job in barrier mode of `workers` boxed workers summed by the master, with a patient
/// sync timeout and no iteration timeout to speak of.
pub fn barrier_job<F>(workers: usize, iterations: u64, make: F) -> JobBuilder<u64, u64>
where
    F: Fn(usize) -> FnWorker<WorkerFn> + Send + Sync + 'static,
{
    Job::builder(summing_master(), make)
        .workers(workers)
        .iterations(iterations)
        .barrier_mode(true)
        .sync_timeout(PATIENT)
        .iteration_timeout(std::time::Duration::from_secs(3600))
}

/// A boxed worker compute, for workers chosen at run time.
pub type WorkerFn = Box<dyn FnMut(&mut WorkerContext<u64, u64>) -> Result<u64, BoxError> + Send>;

/// Sums its shard every iteration; the shard is loaded in `init`.
pub struct SumWorker {
    pub numbers: Arc<Vec<u64>>,
    pub range: Range<usize>,
    pub shard: Vec<u64>,
}

impl WorkerComputable for SumWorker {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn init(&mut self, _ctx: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
        self.shard = self.numbers[self.range.clone()].to_vec();
        Ok(())
    }

    fn compute(&mut self, _ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(self.shard.iter().sum())
    }
}

/// `rows` split into `workers` contiguous ranges of unequal sizes (rank r gets a share
/// proportional to r + 1) with one empty range (rank 1) when there are two workers or more.
pub fn unequal_shards(rows: usize, workers: usize) -> Vec<Range<usize>> {
    if workers == 1 {
        return std::iter::once(0..rows).collect();
    }
    let weights: Vec<usize> = (0..workers)
        .map(|r| if r == 1 { 0 } else { r + 1 })
        .collect();
    let total: usize = weights.iter().sum();
    let mut start = 0;
    let mut ranges = Vec::new();
    for (r, w) in weights.iter().enumerate() {
        let end = if r == workers - 1 {
            rows
        } else {
            start + rows * w / total
        };
        ranges.push(start..end);
        start = end;
    }
    ranges
}

/// A shared, ordered log of what happened.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }

    pub fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Settings of rank `rank` of a loopback job over TCP, with a secret and timeouts short
/// enough for tests.
#[cfg(feature = "tcp")]
pub fn tcp_settings(
    rank: usize,
    world: usize,
    master: &str,
    job: &str,
) -> superstep::transport::TcpSettings {
    let mut s = superstep::transport::TcpSettings::new(rank, world, master);
    s.job_id = job.into();
    s.secret = Some(b"s3cret".to_vec());
    // Short, for the tests of peers that never finish theirs; long enough that a loaded
    // machine does not give up on a worker's.
    s.handshake_timeout = std::time::Duration::from_secs(2);
    s.heartbeat_interval = std::time::Duration::from_millis(50);
    s.heartbeat_timeout = std::time::Duration::from_secs(5);
    s.connect_timeout = std::time::Duration::from_secs(20);
    s
}

/// Rank 0's transport on a free loopback port, its settings adjusted by `adjust`, and the
/// address workers dial.
#[cfg(feature = "tcp")]
pub fn tcp_master<M, W>(
    world: usize,
    job: &str,
    adjust: impl FnOnce(&mut superstep::transport::TcpSettings),
) -> (superstep::transport::TcpTransport<M, W>, String) {
    let mut s = tcp_settings(0, world, "127.0.0.1:0", job);
    s.bind = Some("127.0.0.1:0".parse().unwrap());
    adjust(&mut s);
    let transport = superstep::transport::TcpTransport::new(s).unwrap();
    let addr = transport.local_addr().unwrap().to_string();
    (transport, addr)
}

/// Runs a job of `world` ranks over loopback TCP, each rank in a thread of its own with
/// its own transport (as separate processes would have), and returns every rank's outcome
/// in rank order. `run` builds and runs rank `r`'s job on the transport it is given.
#[cfg(feature = "tcp")]
pub fn over_tcp<M, W, F>(world: usize, job: &str, run: F) -> Vec<Result<JobOutcome<M>, JobError>>
where
    M: superstep::Payload,
    W: superstep::Payload,
    F: Fn(usize, superstep::transport::TcpTransport<M, W>) -> Result<JobOutcome<M>, JobError>
        + Send
        + Sync
        + 'static,
{
    over_tcp_with(world, job, |_| {}, run)
}

/// Runs the job `make` builds in memory, then every rank of it on its own TCP transport
/// ([`over_tcp`], job name `name`), and asserts that every rank ends with the in-memory
/// result.
#[cfg(feature = "tcp")]
pub fn same_over_tcp(
    workers: usize,
    name: &str,
    make: impl Fn() -> JobBuilder<u64, u64> + Send + Sync + 'static,
) {
    let in_memory = make().run().unwrap();
    let outcomes = over_tcp(workers, name, move |_, transport| {
        make().transport(transport).run()
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome.result, in_memory.result, "rank {rank}");
    }
}

/// [`over_tcp`], every rank's settings adjusted by `adjust`.
#[cfg(feature = "tcp")]
pub fn over_tcp_with<M, W, F>(
    world: usize,
    job: &str,
    adjust: impl Fn(&mut superstep::transport::TcpSettings),
    run: F,
) -> Vec<Result<JobOutcome<M>, JobError>>
where
    M: superstep::Payload,
    W: superstep::Payload,
    F: Fn(usize, superstep::transport::TcpTransport<M, W>) -> Result<JobOutcome<M>, JobError>
        + Send
        + Sync
        + 'static,
{
    let run = Arc::new(run);
    let (master, addr) = tcp_master::<M, W>(world, job, &adjust);
    let mut transports = vec![master];
    for rank in 1..world {
        let mut s = tcp_settings(rank, world, &addr, job);
        adjust(&mut s);
        transports.push(superstep::transport::TcpTransport::new(s).unwrap());
    }
    let ranks: Vec<_> = transports
        .into_iter()
        .enumerate()
        .map(|(rank, t)| {
            let run = Arc::clone(&run);
            std::thread::spawn(move || run(rank, t))
        })
        .collect();
    ranks.into_iter().map(|r| r.join().unwrap()).collect()
}

/// A process of rank `rank` of a `world`-rank job over TCP that only connects — with the
/// job's `fingerprint`, so the master's node takes it for one of its workers — and does
/// nothing unless told: its transport (the connection lives as long as it does), its link
/// to the master, and what the master's node tells it. Returns once it is connected.
#[cfg(feature = "tcp")]
#[allow(clippy::type_complexity)]
pub fn tcp_link(
    rank: usize,
    world: usize,
    addr: &str,
    job: &str,
    fingerprint: superstep::transport::Fingerprint,
) -> (
    superstep::transport::TcpTransport<u64, u64>,
    Box<dyn superstep::transport::WorkerLink<u64>>,
    std::sync::mpsc::Receiver<superstep::dev::ToWorker<u64>>,
) {
    use superstep::transport::{LinkSpec, Transport};
    let mut t =
        superstep::transport::TcpTransport::<u64, u64>::new(tcp_settings(rank, world, addr, job))
            .unwrap();
    t.prepare(&LinkSpec {
        job_id: job.into(),
        workers: world,
        fingerprint,
        peers: false,
    })
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let link = t
        .connect_worker(
            rank,
            Box::new(move |m| {
                let _ = tx.lock().unwrap().send(m);
            }),
        )
        .unwrap();
    let first = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("connected within 10 s");
    assert!(
        matches!(first, superstep::dev::ToWorker::Connected { .. }),
        "{first:?}"
    );
    (t, link, rx)
}

/// For a process of a multi-process test: warnings (a lost master, a corrupt checkpoint,
/// a dump written) on stderr, which the launcher prefixes with the rank.
pub fn child_logs() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter("warn")
        .with_ansi(false)
        .try_init();
}

/// Every line logged in this test binary, at INFO and above (a subscriber of the test
/// binary, installed by the first call).
pub fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buf);
        tracing_subscriber::fmt()
            .with_writer(move || Capture(Arc::clone(&sink)))
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
        buf
    })
}

pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The captured lines that contain every one of `parts`.
pub fn lines_with(parts: &[&str]) -> Vec<String> {
    let all = String::from_utf8_lossy(&logs().lock().unwrap()).to_string();
    all.lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .map(String::from)
        .collect()
}

/// The main example, built beside the test by `cargo test` (target/<profile>/examples).
pub fn example() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let example = dir.join("examples").join("logistic_regression");
    assert!(
        example.exists(),
        "{} is built by cargo test",
        example.display()
    );
    example
}
