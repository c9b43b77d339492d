//! `superstep-launch`: starts N local processes of a job binary as one cluster job.
//!
//! ```text
//! superstep-launch --nproc 4 -- target/release/examples/logistic_regression --rows 200000
//! ```
//!
//! Each process gets `SUPERSTEP_RANK` (0..N), `SUPERSTEP_WORLD_SIZE` (N),
//! `SUPERSTEP_MASTER_ADDR` (127.0.0.1 and a free port), a fresh `SUPERSTEP_SECRET`, this
//! launch's own `SUPERSTEP_RUN_ID` (a process of another launch is refused), how many
//! restarts are left (`SUPERSTEP_RESTARTS_LEFT`: with none, a job that would wait for a
//! new process of a dead one fails at once instead, naming `--restarts`), and
//! `SUPERSTEP_JOB_ID` only if `--job-id` is given (the program's own name for its job
//! counts otherwise); rank 0 runs the master. Every line a process prints is prefixed with
//! its rank. The processes run in a process group of their own: a signal at the launcher
//! (Ctrl-C's SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) is forwarded to every process as
//! that signal, once — a job's preempt signal (SIGTERM by default) stops it at its next
//! checkpoint —; a second one kills them. The job's dump signal (`SUPERSTEP_DUMP_SIGNAL`,
//! SIGUSR2 by default) is forwarded every time and ends nothing: each asks for a dump of
//! the flight recorders. The launcher exits with the master's (rank 0's)
//! exit code — 128 + the signal if it died of one; 75 when the job was preempted — once
//! every process has ended (those still running a grace period after the master are
//! killed).
//!
//! With `--restarts K`, a process that dies — killed, or exiting with a failure — is
//! started again with the same rank and `SUPERSTEP_RESTART_COUNT` one higher, at most K
//! times over the job, and every process gets `SUPERSTEP_RECONNECT_TIMEOUT`
//! (`--reconnect-secs`, unless set already):
//!
//! - a worker process (rank 1 and up) started again connects with its rank and takes the
//!   dead one's place when the job's failure policy replaces workers
//!   (`FailurePolicy::RestartWorker`); under another policy the master refuses it or
//!   ignores it, and it ends with the job;
//! - the master's process (rank 0) started again resumes the job from its newest
//!   checkpoint as a new attempt; the workers, which lost it, reach it again within the
//!   reconnect timeout and carry on. Only a master killed by a signal is started again:
//!   one that exited on its own ended its job (its workers were told when it failed).
//!
//! A process that exits with 75 (`superstep::EXIT_PREEMPTED`: its job stopped for a
//! preemption) is never started again: the job is to be run again as a whole, and resumes
//! from the checkpoint it took on its way out.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
use superstep::PreemptSignal;

/// The exit code of a process whose job was preempted (`superstep::EXIT_PREEMPTED`).
const PREEMPTED: i32 = superstep::EXIT_PREEMPTED as i32;

/// Start N local processes of a superstep job binary as one cluster job.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// How many processes (= workers); rank 0 also runs the master.
    #[arg(long, default_value_t = 2)]
    nproc: usize,
    /// The master's port on 127.0.0.1 (default: a free one).
    #[arg(long)]
    port: Option<u16>,
    /// The job id (SUPERSTEP_JOB_ID), for a program that does not name its job; one that
    /// does must name it the same.
    #[arg(long)]
    job_id: Option<String>,
    /// How many times in all a dead process is started again (the master's included,
    /// which resumes from its newest checkpoint).
    #[arg(long, default_value_t = 0)]
    restarts: u32,
    /// With --restarts: how long (seconds) a worker that lost the master tries to reach
    /// it again, started again, before it gives up (SUPERSTEP_RECONNECT_TIMEOUT).
    #[arg(long, default_value_t = 60.0)]
    reconnect_secs: f64,
    /// How long the other processes may run on after the master ended.
    #[arg(long, default_value_t = 10)]
    grace_secs: u64,
    /// The job binary and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn secret() -> String {
    let mut bytes = [0u8; 16];
    // Without randomness the secret is still unique per launch (the clock and this
    // process's id); it only guards loopback here.
    if getrandom::fill(&mut bytes).is_err() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = (now ^ u128::from(std::process::id()) << 64).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Copies a child's output lines to ours, prefixed with its rank. Bytes that are not
/// UTF-8 are shown replaced; the pipe is read to its end either way.
fn forward(
    rank: usize,
    from: impl std::io::Read + Send + 'static,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut from = BufReader::new(from);
        let mut line = Vec::new();
        while from.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            if to_stderr {
                let _ = writeln!(std::io::stderr().lock(), "[{rank}] {text}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "[{rank}] {text}");
            }
            line.clear();
        }
    })
}

fn signal_all(children: &[Child], signal: Signal) {
    for child in children {
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.nproc == 0 {
        eprintln!("superstep-launch: --nproc must be at least 1");
        return ExitCode::from(2);
    }
    let port = match args.port.map(Ok).unwrap_or_else(free_port) {
        Ok(port) => port,
        Err(e) => {
            eprintln!("superstep-launch: no free port on 127.0.0.1: {e}");
            return ExitCode::from(2);
        }
    };
    if !(args.reconnect_secs.is_finite() && args.reconnect_secs >= 0.0) {
        eprintln!("superstep-launch: --reconnect-secs must be 0 or more");
        return ExitCode::from(2);
    }
    // This launch's id (what keeps a process of another launch out), and its secret.
    let run_id = format!("superstep-launch-{}", &secret()[..12]);
    let secret = secret();
    let (program, program_args) = args.command.split_first().expect("clap requires a command");
    // Workers wait for a master started again only when one may be.
    let reconnect = (args.restarts > 0
        && std::env::var_os("SUPERSTEP_RECONNECT_TIMEOUT").is_none())
    .then(|| args.reconnect_secs.to_string());
    let start = |rank: usize, restart_count: u32, restarts_left: u32| {
        let mut command = Command::new(program);
        if let Some(secs) = &reconnect {
            command.env("SUPERSTEP_RECONNECT_TIMEOUT", secs);
        }
        if let Some(job_id) = &args.job_id {
            command.env("SUPERSTEP_JOB_ID", job_id);
        }
        let mut child = command
            .args(program_args)
            .env("SUPERSTEP_RANK", rank.to_string())
            .env("SUPERSTEP_WORLD_SIZE", args.nproc.to_string())
            .env("SUPERSTEP_MASTER_ADDR", format!("127.0.0.1:{port}"))
            .env("SUPERSTEP_RUN_ID", &run_id)
            .env("SUPERSTEP_SECRET", &secret)
            .env("SUPERSTEP_RESTART_COUNT", restart_count.to_string())
            .env("SUPERSTEP_RESTARTS_LEFT", restarts_left.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Their own group: a terminal's Ctrl-C reaches the launcher alone, which
            // forwards it once.
            .process_group(0)
            .spawn()?;
        let pipes = [
            forward(rank, child.stdout.take().expect("piped"), false),
            forward(rank, child.stderr.take().expect("piped"), true),
        ];
        Ok::<_, std::io::Error>((child, pipes))
    };
    let mut children = Vec::new();
    let mut pipes = Vec::new();
    for rank in 0..args.nproc {
        match start(rank, 0, args.restarts) {
            Ok((child, forwarding)) => {
                pipes.extend(forwarding);
                children.push(child);
            }
            Err(e) => {
                eprintln!("superstep-launch: cannot start {program}: {e}");
                signal_all(&children, Signal::SIGKILL);
                return ExitCode::from(2);
            }
        }
    }

    let interrupts = Arc::new(AtomicUsize::new(0));
    // The first signal that came, as its number (0: none).
    let first_signal = Arc::new(AtomicI32::new(0));
    let count = Arc::clone(&interrupts);
    let first = Arc::clone(&first_signal);
    // Shared with the forwarder: a process started again replaces its rank's pid, and one
    // that ended (reaped, so its pid may be reused) is not signalled.
    let pids: Arc<Mutex<Vec<Option<i32>>>> = Arc::new(Mutex::new(
        children.iter().map(|c| Some(c.id() as i32)).collect(),
    ));
    let signalled = Arc::clone(&pids);
    // The job's dump signal asks for a dump and nothing more: forwarded every time it
    // comes, never the interrupt that ends the run (unless it is the preempt signal too).
    let setting = |var: &str, default| match std::env::var(var) {
        Ok(value) => PreemptSignal::from_setting(&value).unwrap_or(default),
        Err(_) => default,
    };
    let dump = setting("SUPERSTEP_DUMP_SIGNAL", Some(PreemptSignal::Usr2))
        .filter(|&s| Some(s) != setting("SUPERSTEP_PREEMPT_SIGNAL", Some(PreemptSignal::Term)))
        .map(PreemptSignal::number);
    match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                for number in signals.forever() {
                    let pids = signalled.lock().unwrap_or_else(|e| e.into_inner());
                    if Some(number) == dump {
                        let signal = Signal::try_from(number).unwrap_or(Signal::SIGUSR2);
                        for pid in pids.iter().flatten() {
                            let _ = kill(Pid::from_raw(*pid), signal);
                        }
                        continue;
                    }
                    // The first signal goes to every process as it came; the next ones
                    // kill them.
                    let signal = if count.fetch_add(1, Ordering::SeqCst) == 0 {
                        first.store(number, Ordering::SeqCst);
                        Signal::try_from(number).unwrap_or(Signal::SIGINT)
                    } else {
                        Signal::SIGKILL
                    };
                    for pid in pids.iter().flatten() {
                        let _ = kill(Pid::from_raw(*pid), signal);
                    }
                }
            });
        }
        Err(e) => eprintln!("superstep-launch: cannot take signals, which are not forwarded: {e}"),
    }

    // Wait for the master, starting dead processes again while restarts are left.
    let mut restarts_left = args.restarts;
    let mut restart_counts = vec![0u32; args.nproc];
    let mut ended = vec![false; args.nproc];
    let master = 'wait: loop {
        // The master last: a worker's death seen in the same pass is said before the
        // master's end (which that death may have caused) ends the wait.
        for rank in (0..args.nproc).rev() {
            if ended[rank] {
                continue;
            }
            let status = match children[rank].try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(e) if rank == 0 => break 'wait Err(e),
                Err(_) => continue,
            };
            // Under the lock the interrupt handler takes: a process started here is either
            // signalled by an interrupt, or not started after one.
            let mut pids = pids.lock().unwrap_or_else(|e| e.into_inner());
            pids[rank] = None;
            ended[rank] = true;
            // A master that exited on its own ended its job (a failed job's workers were
            // told): only one that died — killed by a signal — is started again.
            let master_exited = rank == 0 && status.signal().is_none();
            let interrupted = interrupts.load(Ordering::SeqCst) > 0;
            // Stopped for a preemption: the job is run again as a whole, not this process.
            let preempted = status.code() == Some(PREEMPTED);
            if preempted && rank != 0 {
                eprintln!("superstep-launch: rank {rank} stopped for a preemption");
            }
            let interrupted = interrupted || preempted;
            if !(status.success() || master_exited || interrupted) && restarts_left == 0 {
                // The job hears it too (SUPERSTEP_RESTARTS_LEFT): it waits for no new process.
                eprintln!(
                    "superstep-launch: rank {rank} exited with {status}; it is not started again: no restarts left (--restarts {})",
                    args.restarts
                );
            }
            if status.success() || master_exited || restarts_left == 0 || interrupted {
                if rank == 0 {
                    break 'wait Ok(status);
                }
                continue;
            }
            match start(rank, restart_counts[rank] + 1, restarts_left - 1) {
                Ok((child, forwarding)) => {
                    restarts_left -= 1;
                    restart_counts[rank] += 1;
                    eprintln!(
                        "superstep-launch: rank {rank} exited with {status}; starting it again ({restarts_left} restarts left)"
                    );
                    pipes.extend(forwarding);
                    pids[rank] = Some(child.id() as i32);
                    ended[rank] = false;
                    children[rank] = child;
                }
                Err(e) => {
                    eprintln!("superstep-launch: cannot start rank {rank} again: {e}");
                    if rank == 0 {
                        break 'wait Ok(status);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let code = match master {
        Ok(status) => status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1),
        Err(e) => {
            eprintln!("superstep-launch: lost the master process: {e}");
            1
        }
    };
    let deadline = Instant::now() + Duration::from_secs(args.grace_secs);
    for (rank, child) in children.iter_mut().enumerate().skip(1) {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("superstep-launch: rank {rank} exited with {status}");
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    eprintln!("superstep-launch: rank {rank} still runs after the master ended; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
    for pipe in pipes {
        let _ = pipe.join();
    }
    if first_signal.load(Ordering::SeqCst) == SIGINT && code == 0 {
        return ExitCode::from(130);
    }
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
