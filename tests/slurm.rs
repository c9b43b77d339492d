//! The README's sbatch recipe, as written, on a one-node Slurm cluster that `.ci/run`
//! starts (`.ci/slurm-up.sh`): four tasks of the main example end with the in-memory
//! result bit for bit; a task killed with SIGKILL fails the run, the recipe requeues it and
//! the job resumes from its checkpoint to the same bits; and `scancel --signal=TERM`
//! preempts it — every task exits 75, the recipe requeues it — to the same bits again.
//!
//! The recipe runs with `--nodes=1` on the command line (this cluster has one node), in a
//! directory of its own that is its `$HOME` (its checkpoints) and holds
//! `./logistic_regression`: the example, with a small data set and more iterations, so
//! that the job is still running when the test strikes. Without Slurm these tests say they
//! were skipped — but in CI (`CI` set), where `.ci/run` starts it, its absence fails them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::example;

/// The example's arguments in the recipe's jobs: small, and long enough to be struck.
const ARGS: &str = "--rows 20000 --features 4 --iterations 1500 --checkpoint-every 10";

/// Whether a Slurm cluster answers here; `false`, said on stderr, when it does not — but
/// in CI its absence fails the test.
fn slurm() -> bool {
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%t"])
        .output()
        .is_ok_and(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|state| ["idle", "mix", "alloc"].contains(&state.trim()))
        });
    if !up {
        assert!(
            std::env::var_os("CI").is_none(),
            "no Slurm cluster answers (sinfo): .ci/run starts one with .ci/slurm-up.sh"
        );
        eprintln!("skipped: no Slurm cluster answers here (start one with .ci/slurm-up.sh)");
    }
    up
}

/// The README's sbatch recipe, as written.
fn recipe() -> String {
    let readme = include_str!("../README.md");
    let from = readme
        .find("**Under Slurm, requeued when it fails**")
        .expect("the README's Slurm recipe");
    let block = &readme[from..];
    let start = block.find("```sh\n").expect("its script") + "```sh\n".len();
    let end = start + block[start..].find("```").expect("its end");
    block[start..end].to_string()
}

/// A directory for one job: the recipe, and `./logistic_regression` running the example
/// with [`ARGS`].
fn job_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("recipe.sh"), recipe()).unwrap();
    let wrapper = dir.path().join("logistic_regression");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {} {ARGS} \"$@\"\n", example().display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A job submitted, cancelled when dropped (a failed assertion leaves none running).
struct Submitted {
    id: String,
    dir: PathBuf,
}

impl Drop for Submitted {
    fn drop(&mut self) {
        let _ = Command::new("scancel").arg(&self.id).status();
    }
}

impl Submitted {
    /// Submits the recipe in `dir`, on one node.
    fn new(dir: &Path) -> Self {
        let out = Command::new("sbatch")
            .args(["--parsable", "--nodes=1", "--job-name=superstep-test"])
            .arg(format!("--chdir={}", dir.display()))
            .arg(format!("--output={}/slurm.out", dir.display()))
            .arg(format!("--export=ALL,HOME={}", dir.display()))
            .arg(dir.join("recipe.sh"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap()
            .to_string();
        Submitted {
            id,
            dir: dir.to_path_buf(),
        }
    }

    /// A field of `scontrol show job`: `JobState`, `Restarts`, `ExitCode`.
    fn field(&self, name: &str) -> String {
        let out = Command::new("scontrol")
            .args(["show", "job", "-o", &self.id])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_default()
            .to_string()
    }

    /// What the job's runs printed so far.
    fn output(&self) -> String {
        std::fs::read_to_string(self.dir.join("slurm.out")).unwrap_or_default()
    }

    /// Waits (at most three minutes) until `done` holds, saying what the job printed if
    /// it never does.
    fn wait_until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(180);
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "job {} never {what} (state {}): {}",
                self.id,
                self.field("JobState"),
                self.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the job ended, and gives its state and output.
    fn ended(&self) -> (String, String) {
        self.wait_until("ended", |job| {
            ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"]
                .contains(&job.field("JobState").as_str())
        });
        (self.field("JobState"), self.output())
    }

    /// Waits until the run under way wrote a checkpoint: the job is iterating.
    fn iterating(&self) {
        self.wait_until("checkpointed", |job| {
            std::fs::read_dir(job.dir.join("lr-checkpoints"))
                .is_ok_and(|entries| entries.flatten().count() > 0)
        });
    }

    /// The pid of the task of `rank` of this job's run under way.
    fn task(&self, rank: usize) -> i32 {
        let mine = format!("SLURM_JOB_ID={}", self.id);
        let theirs = format!("SLURM_PROCID={rank}");
        let example = example().display().to_string();
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .find_map(|entry| {
                let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                if !String::from_utf8_lossy(&cmdline).starts_with(&example) {
                    return None;
                }
                let environ = std::fs::read(entry.path().join("environ")).ok()?;
                let vars: Vec<String> = environ
                    .split(|&b| b == 0)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect();
                (vars.contains(&mine) && vars.contains(&theirs)).then_some(pid)
            });
        found.unwrap_or_else(|| panic!("no task of rank {rank} of job {}", self.id))
    }
}

/// The example's result in memory, four workers, with the recipe's arguments.
fn in_memory() -> String {
    let out = Command::new(example())
        .args(ARGS.split_whitespace())
        .args(["--workers", "4"])
        .env_remove("SLURM_JOB_ID")
        .env_remove("SLURM_PROCID")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bits_of(&String::from_utf8_lossy(&out.stdout)).expect("the in-memory run's bits")
}

/// The weights' bits a run printed last.
fn bits_of(output: &str) -> Option<String> {
    output
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("weights' bits: "))
        .map(str::to_string)
}

#[test]
fn the_readmes_sbatch_recipe_ends_with_the_in_memory_bits_through_a_kill_and_a_preemption() {
    if !slurm() {
        return;
    }
    let expected = in_memory();

    // Fault-free.
    let dir = job_dir();
    let job = Submitted::new(dir.path());
    let (state, out) = job.ended();
    assert_eq!(state, "COMPLETED", "{out}");
    assert_eq!(bits_of(&out).as_deref(), Some(&*expected), "{out}");
    assert!(
        out.contains("OK: equal to the sequential implementation"),
        "{out}"
    );

    // A worker's task killed with SIGKILL: the run fails, the recipe requeues it, and the
    // job resumes from its checkpoint.
    let dir = job_dir();
    let job = Submitted::new(dir.path());
    job.iterating();
    let victim = job.task(2);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (state, out) = job.ended();
    assert_eq!(state, "COMPLETED", "{out}");
    assert_eq!(job.field("Restarts"), "1", "{out}");
    assert!(
        out.contains("resuming from"),
        "the second run resumed: {out}"
    );
    assert_eq!(bits_of(&out).as_deref(), Some(&*expected), "{out}");

    // Preempted: SIGTERM to its tasks; every one exits 75, the recipe requeues the job,
    // and it resumes from the checkpoint taken on the way out.
    let dir = job_dir();
    let job = Submitted::new(dir.path());
    job.iterating();
    let scancel = Command::new("scancel")
        .args(["--signal=TERM", &job.id])
        .status()
        .unwrap();
    assert!(scancel.success());
    let (state, out) = job.ended();
    assert_eq!(state, "COMPLETED", "{out}");
    assert_eq!(job.field("Restarts"), "1", "{out}");
    let said = out
        .matches("job stopped: the job was preempted (SIGTERM in rank")
        .count();
    assert_eq!(said, 4, "every task said why it stopped: {out}");
    assert_eq!(bits_of(&out).as_deref(), Some(&*expected), "{out}");
}
