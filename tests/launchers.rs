//! The README's recipes for Slurm, torchrun and Kubernetes, with the main example as
//! shipped: each process gets the variables that launcher sets (and those the recipe
//! exports), on this host, and the job ends with the sequential answer. A scheduler's own
//! id (Slurm's `SLURM_JOB_ID`, torchrun's `TORCHELASTIC_RUN_ID`) names the run and never
//! fights the name the program gives its job (`.job_id("logistic-regression")`).
//!
//! The recipes' `SUPERSTEP_BIND=0.0.0.0` is left out: these tests listen on loopback only.

mod common;

use common::example;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The variables of a cluster job this process may have inherited, removed so that each
/// test sets only its launcher's.
const INHERITED: [&str; 14] = [
    "SUPERSTEP_RANK",
    "SUPERSTEP_WORLD_SIZE",
    "SUPERSTEP_MASTER_ADDR",
    "SUPERSTEP_MASTER_PORT",
    "SUPERSTEP_JOB_ID",
    "SUPERSTEP_RUN_ID",
    "SUPERSTEP_RESTART_COUNT",
    "SUPERSTEP_RESTARTS_LEFT",
    "SLURM_PROCID",
    "SLURM_JOB_ID",
    "SLURM_NTASKS",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
];

/// Kills the processes still running when dropped: a failed assertion leaves none behind.
struct Processes(Vec<Child>);

impl Processes {
    /// Waits for every process to end (within two minutes); whether each succeeded, and
    /// its standard output and error, in rank order.
    fn ended(mut self) -> Vec<(bool, String)> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.0.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
            assert!(Instant::now() < deadline, "the processes did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::mem::take(&mut self.0)
            .into_iter()
            .map(|child| {
                let out = child.wait_with_output().unwrap();
                let text = format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                (out.status.success(), text)
            })
            .collect()
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `world` processes of the main example, process `r` with the variables `vars(r)`
/// gives, and the example's arguments `args`; their output, in rank order, once all ended
/// (each must succeed within two minutes).
fn run(world: usize, vars: impl Fn(usize) -> Vec<(String, String)>, args: &[&str]) -> Vec<String> {
    let checkpoints = tempfile::tempdir().unwrap();
    let dir = checkpoints.path().to_str().unwrap().to_string();
    let mut processes = Processes(Vec::new());
    for rank in 0..world {
        let mut command = Command::new(example());
        for var in INHERITED {
            command.env_remove(var);
        }
        command
            .envs(vars(rank))
            .args(["--rows", "20000", "--features", "4", "--iterations", "5"])
            .args(["--checkpoint-dir", &dir])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        processes.0.push(command.spawn().unwrap());
    }
    let mut outputs = Vec::new();
    for (success, text) in processes.ended() {
        assert!(success, "rank {}: {text}", outputs.len());
        outputs.push(text);
    }
    outputs
}

/// Rank 0 checked the result against the sequential run; every other rank did its part.
fn assert_sequential_answer(outputs: &[String]) {
    assert!(
        outputs[0].contains("OK: equal to the sequential implementation within 1e-9"),
        "{}",
        outputs[0]
    );
    for (rank, out) in outputs.iter().enumerate().skip(1) {
        assert!(
            out.contains(&format!("worker {rank} done: 5 iterations")),
            "{out}"
        );
    }
}

fn vars(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// `sbatch --ntasks=3` running `srun ./logistic_regression …`: srun's variables, Slurm's
/// job id among them, and what the recipe exports.
#[test]
fn under_slurms_variables_the_main_example_ends_with_the_sequential_answer() {
    let addr = format!("127.0.0.1:{}", free_port());
    let outputs = run(
        3,
        |rank| {
            vars(&[
                ("SLURM_JOB_ID", "4242".into()),
                ("SLURM_JOB_NAME", "lr".into()),
                ("SLURM_JOB_NODELIST", "localhost".into()),
                ("SLURM_NNODES", "1".into()),
                ("SLURM_NTASKS", "3".into()),
                ("SLURM_STEP_ID", "0".into()),
                ("SLURM_STEP_NUM_TASKS", "3".into()),
                ("SLURM_PROCID", rank.to_string()),
                ("SLURM_LOCALID", rank.to_string()),
                ("SLURM_NODEID", "0".into()),
                ("SUPERSTEP_MASTER_ADDR", addr.clone()),
                ("SUPERSTEP_SECRET", "8d3f0c1e5a7b9d2f".into()),
            ])
        },
        &[],
    );
    assert_sequential_answer(&outputs);
}

/// `torchrun --nnodes 1 --nproc-per-node 3 --rdzv-id lr-run …`: torchrun's variables
/// (its agent's own store on `MASTER_PORT`), and the recipe's `SUPERSTEP_MASTER_PORT`.
#[test]
fn under_torchruns_variables_the_main_example_ends_with_the_sequential_answer() {
    let (agent, ours) = (free_port(), free_port());
    let outputs = run(
        3,
        |rank| {
            vars(&[
                ("RANK", rank.to_string()),
                ("LOCAL_RANK", rank.to_string()),
                ("GROUP_RANK", "0".into()),
                ("WORLD_SIZE", "3".into()),
                ("LOCAL_WORLD_SIZE", "3".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", agent.to_string()),
                ("TORCHELASTIC_RUN_ID", "lr-run".into()),
                ("TORCHELASTIC_RESTART_COUNT", "0".into()),
                ("TORCHELASTIC_MAX_RESTARTS", "3".into()),
                ("SUPERSTEP_MASTER_PORT", ours.to_string()),
                ("SUPERSTEP_SECRET", "change-me".into()),
            ])
        },
        &[],
    );
    assert_sequential_answer(&outputs);
}

/// The README's Kubernetes Indexed Job: each pod's `JOB_COMPLETION_INDEX`, the variables
/// its manifest sets, the run id from the Job's uid, and `--replace-workers 3`.
#[test]
fn under_a_kubernetes_indexed_jobs_variables_the_main_example_ends_with_the_sequential_answer() {
    let addr = format!("127.0.0.1:{}", free_port());
    let outputs = run(
        3,
        |rank| {
            vars(&[
                ("JOB_COMPLETION_INDEX", rank.to_string()),
                ("SUPERSTEP_WORLD_SIZE", "3".into()),
                ("SUPERSTEP_MASTER_ADDR", addr.clone()),
                (
                    "SUPERSTEP_RUN_ID",
                    "0b9c3a4e-5d7f-4e2a-9b1c-7d6e5f4a3b2c".into(),
                ),
                ("SUPERSTEP_RECONNECT_TIMEOUT", "120".into()),
                ("SUPERSTEP_RESTART_COUNT", "0".into()),
                ("SUPERSTEP_SECRET", "from-a-kubernetes-secret".into()),
            ])
        },
        &["--replace-workers", "3"],
    );
    assert_sequential_answer(&outputs);
}

/// A process of another run (here: another Slurm job's, on the same master address) is
/// refused, naming both runs' ids.
#[test]
fn a_process_of_another_run_is_refused_naming_both_run_ids() {
    let addr = format!("127.0.0.1:{}", free_port());
    let checkpoints = tempfile::tempdir().unwrap();
    let dir = checkpoints.path().to_str().unwrap().to_string();
    let mut processes = Processes(Vec::new());
    for (rank, job) in [(0, "4242"), (1, "4243")] {
        let mut command = Command::new(example());
        for var in INHERITED {
            command.env_remove(var);
        }
        command
            .envs([
                ("SLURM_JOB_ID", job),
                ("SLURM_STEP_NUM_TASKS", "2"),
                ("SLURM_PROCID", &rank.to_string()),
                ("SUPERSTEP_MASTER_ADDR", &addr),
                ("SUPERSTEP_CONNECT_TIMEOUT", "20"),
            ])
            .args(["--rows", "2000", "--features", "2", "--iterations", "3"])
            .args(["--checkpoint-dir", &dir])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        processes.0.push(command.spawn().unwrap());
    }
    let worker = processes.0.remove(1).wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&worker.stderr);
    assert!(!worker.status.success(), "{said}");
    assert!(
        said.contains("`run id` is 4243 there and 4242 in the master's"),
        "{said}"
    );
}

/// Two processes started with other parameters (`--seed`): the worker's is refused at its
/// handshake naming the parameter, both end failed, and the master's says so at ERROR —
/// with no warning of a wait for the refused process on top.
#[test]
fn a_process_refused_for_other_parameters_fails_the_job_without_waits_said_at_warn() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut processes = Processes(Vec::new());
    for (rank, seed) in [(0, "7"), (1, "8")] {
        let mut command = Command::new(example());
        for var in INHERITED {
            command.env_remove(var);
        }
        command
            .env("SUPERSTEP_RANK", rank.to_string())
            .env("SUPERSTEP_WORLD_SIZE", "2")
            .env("SUPERSTEP_MASTER_ADDR", &addr)
            .env("SUPERSTEP_SECRET", "change-me")
            .args(["--rows", "2000", "--features", "4", "--iterations", "5"])
            .args(["--seed", seed])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        processes.0.push(command.spawn().unwrap());
    }
    let mut outputs = Vec::new();
    for (success, output) in processes.ended() {
        assert!(!success, "rank {} succeeded: {output}", outputs.len());
        // The example's log lines and its failure are on its standard error.
        outputs.push(output);
    }
    let refusal = "`params.seed` is 8 there and 7 in the master's";
    for (rank, output) in outputs.iter().enumerate() {
        assert!(output.contains(refusal), "rank {rank}: {output}");
        let warnings: Vec<&str> = output
            .lines()
            .filter(|l| l.contains("WARN"))
            // The refusal itself, as the master's node turned the connection away.
            .filter(|l| !l.contains("refused a connection"))
            .collect();
        assert!(warnings.is_empty(), "rank {rank}: {warnings:#?}");
    }
}
