//! Where a process learns its part of a cluster job: [`ClusterEnv`].

use std::time::Duration;

use crate::ids::Rank;
use crate::transport::TransportError;

/// A process's part of a cluster job, read from its environment variables, as set by
/// `superstep-launch`, by hand, or by the launcher the job runs under — torchrun, Open MPI's
/// `mpirun`, an MPICH / Intel MPI (PMI) launcher, Slurm's `srun`, or a Kubernetes Indexed
/// Job.
///
/// | what | read from, first found |
/// |---|---|
/// | this process's rank | `SUPERSTEP_RANK`, `RANK` (torchrun), `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`, `JOB_COMPLETION_INDEX` (Kubernetes) |
/// | the world size (workers) | `SUPERSTEP_WORLD_SIZE`, else the rank's launcher's: `WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_STEP_NUM_TASKS` (which `srun` sets) or `SLURM_NTASKS` (a Kubernetes Indexed Job has none: set `SUPERSTEP_WORLD_SIZE`) |
/// | the master's address | `SUPERSTEP_MASTER_ADDR` (`host:port`), else `MASTER_ADDR` (torchrun's) and `SUPERSTEP_MASTER_PORT` or `MASTER_PORT` |
/// | the job id: the program's name for its job, which its checkpoints keep | `SUPERSTEP_JOB_ID`; default the job's own ([`JobBuilder::job_id`](crate::JobBuilder::job_id)) |
/// | the run id: this run of the job, as its scheduler or launcher names it | `SUPERSTEP_RUN_ID`, else `SLURM_JOB_ID` (Slurm), `TORCHELASTIC_RUN_ID` (torchrun); default none |
/// | how many more processes the launcher starts in the place of ones that die | `SUPERSTEP_RESTARTS_LEFT` (which `superstep-launch` sets); `srun` and `mpirun` start none within a run |
/// | the shared secret | `SUPERSTEP_SECRET` (optional on loopback, required otherwise) |
/// | where rank 0 listens | `SUPERSTEP_BIND`; default `127.0.0.1` and the master address's port |
/// | how many times this process was started again | `SUPERSTEP_RESTART_COUNT`, else `TORCHELASTIC_RESTART_COUNT` + `SLURM_RESTART_COUNT` (those set); default 0 |
/// | how long a worker tries to reach the master at start-up, and the master waits for every rank to connect | `SUPERSTEP_CONNECT_TIMEOUT`; default 60 s |
/// | how long a worker tries to reach a lost master again | `SUPERSTEP_RECONNECT_TIMEOUT`; default 0 (never) |
/// | the port a worker listens on for its peers (barrier mode) | `SUPERSTEP_PEER_PORT`; default one the system picks |
/// | how long a compute waiting in a collective polls its peers' connections itself before it sleeps | `SUPERSTEP_PEER_POLL`; default 200 µs (`0`: never) |
/// | how often a side with nothing to send sends a heartbeat | `SUPERSTEP_HEARTBEAT_INTERVAL`; default 1 s |
/// | how long a side may hear nothing before its peer is lost | `SUPERSTEP_HEARTBEAT_TIMEOUT`; default 30 s |
/// | how long a new connection's handshake may take | `SUPERSTEP_HANDSHAKE_TIMEOUT`; default 5 s |
/// | the largest frame, in bytes | `SUPERSTEP_MAX_FRAME`; default 268435456 (256 MiB) |
///
/// Durations are written `30s`, `1m 30s`, `250ms`, or as a number of seconds (`2.5`).
///
/// The world size is taken from the same launcher as the rank (torchrun's `WORLD_SIZE`
/// with its `RANK`, not the `SLURM_NTASKS` of the allocation torchrun runs in).
///
/// **When a process is part of a cluster job.** When any of `SUPERSTEP_RANK`,
/// `SUPERSTEP_WORLD_SIZE`, `SUPERSTEP_MASTER_ADDR` or `MASTER_ADDR` is set, the process is
/// part of one, and the rank, the world size and the master's address must all be known:
/// a partial environment is an error naming what is missing, never a job run in memory
/// in every process. A launcher's own variables alone (an `srun` or `mpirun` of several
/// processes with no master address) are an error too; only a single process (world size
/// 1, or none known) without a master address runs in memory.
///
/// **Ranks**: process rank `r` runs worker `r`; process rank 0 also runs the master (and the
/// barrier). So a scheduler that starts N identical tasks gets N workers, and the master's
/// address is that of the task with rank 0.
///
/// Every value is checked before anything connects: numbers are numbers, the rank is below
/// the world size, and the master's address is `host:port` with a port in 1–65535 and no
/// scheme (`http://…`) or path; an error names the variable and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterEnv {
    /// This process's rank: it runs worker `rank`, and the master if `rank == 0`.
    pub rank: Rank,
    /// The number of processes, which is the number of workers.
    pub world_size: usize,
    /// The master's address, `host:port`.
    pub master_addr: String,
    /// The job's id (`SUPERSTEP_JOB_ID`), or [`TcpSettings::DEFAULT_JOB_ID`](super::TcpSettings::DEFAULT_JOB_ID)
    /// when unset (the job's own then counts): peers of another job are refused.
    pub job_id: String,
    /// The id of this run of the job, as its scheduler or launcher names it
    /// (`SUPERSTEP_RUN_ID`, else Slurm's `SLURM_JOB_ID` or torchrun's
    /// `TORCHELASTIC_RUN_ID`): processes of another run are refused. Never in conflict
    /// with the job id, which names the job whatever run it is in.
    pub run_id: Option<String>,
    /// How many more processes the launcher starts in the place of ones that die
    /// (`SUPERSTEP_RESTARTS_LEFT`, which `superstep-launch` sets), if it says.
    pub restarts_left: Option<u32>,
    /// The shared secret, if any.
    pub secret: Option<Vec<u8>>,
    /// Where rank 0 listens, if not `127.0.0.1` and the master address's port.
    pub bind: Option<String>,
    /// How many times this rank's process was started again after it died: 0 for the
    /// first. `SUPERSTEP_RESTART_COUNT` (which `superstep-launch --restarts` sets), else
    /// the sum of torchrun's `TORCHELASTIC_RESTART_COUNT` and Slurm's
    /// `SLURM_RESTART_COUNT` (a job requeued with `--requeue`). A master's process
    /// started again resumes the job from its newest checkpoint as a new attempt; a
    /// worker's connects with its rank and takes the place of the one that died, when the
    /// job's failure policy replaces workers.
    pub restart_count: u32,
    /// How long a worker tries to reach the master at start-up, and the master's node
    /// waits for every rank to connect (`SUPERSTEP_CONNECT_TIMEOUT`, in seconds), if set.
    pub connect_timeout: Option<Duration>,
    /// How long a worker that lost the master tries to reach it again
    /// (`SUPERSTEP_RECONNECT_TIMEOUT`, in seconds; `superstep-launch --restarts` sets it),
    /// if set: a master process started again in the place of one that died resumes the
    /// job from its newest checkpoint, and the workers that reach it carry on.
    pub reconnect_timeout: Option<Duration>,
    /// How often a side with nothing to send sends a heartbeat
    /// (`SUPERSTEP_HEARTBEAT_INTERVAL`), if set.
    pub heartbeat_interval: Option<Duration>,
    /// How long a side may hear nothing before its peer is lost
    /// (`SUPERSTEP_HEARTBEAT_TIMEOUT`), if set.
    pub heartbeat_timeout: Option<Duration>,
    /// How long a new connection's handshake may take (`SUPERSTEP_HANDSHAKE_TIMEOUT`), if
    /// set.
    pub handshake_timeout: Option<Duration>,
    /// The largest frame, in bytes (`SUPERSTEP_MAX_FRAME`), if set.
    pub max_frame: Option<usize>,
    /// The port a worker listens on for its peers (`SUPERSTEP_PEER_PORT`), if set.
    pub peer_port: Option<u16>,
    /// How long a compute waiting in a collective polls its peers' connections itself
    /// (`SUPERSTEP_PEER_POLL`), if set.
    pub peer_poll: Option<Duration>,
    /// The variables the master's address came from (`SUPERSTEP_MASTER_ADDR`, or
    /// `MASTER_ADDR and MASTER_PORT`, …): what an error reaching the master says to check.
    pub master_addr_from: &'static str,
    /// Which launcher's variables gave the rank: `superstep`, `torchrun`, `Open MPI`,
    /// `PMI`, `Slurm` or `Kubernetes`.
    pub launcher: &'static str,
}

/// A launcher's variables: its rank and its world size — the first of these set; the
/// first says processes were launched (Slurm's step size, which `srun` sets, where an
/// `sbatch` script alone has only its allocation's).
struct Launcher {
    name: &'static str,
    rank: &'static str,
    world_size: &'static [&'static str],
}

/// In the order they are looked for: ours first, then launchers that may run inside
/// another (torchrun or `mpirun` inside a Slurm allocation), then schedulers.
const LAUNCHERS: [Launcher; 6] = [
    Launcher {
        name: "superstep",
        rank: "SUPERSTEP_RANK",
        world_size: &["SUPERSTEP_WORLD_SIZE"],
    },
    Launcher {
        name: "torchrun",
        rank: "RANK",
        world_size: &["WORLD_SIZE"],
    },
    Launcher {
        name: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        world_size: &["OMPI_COMM_WORLD_SIZE"],
    },
    Launcher {
        name: "PMI",
        rank: "PMI_RANK",
        world_size: &["PMI_SIZE"],
    },
    Launcher {
        name: "Slurm",
        rank: "SLURM_PROCID",
        world_size: &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"],
    },
    Launcher {
        name: "Kubernetes",
        rank: "JOB_COMPLETION_INDEX",
        world_size: &[],
    },
];

/// Variables that say a process is meant to be part of a cluster job.
const INTENT: [&str; 4] = [
    "SUPERSTEP_RANK",
    "SUPERSTEP_WORLD_SIZE",
    "SUPERSTEP_MASTER_ADDR",
    "MASTER_ADDR",
];

/// The variables of superstep's own that [`ClusterEnv::from_env`] reads.
pub(crate) const CLUSTER_VARS: [&str; 18] = [
    "SUPERSTEP_RANK",
    "SUPERSTEP_WORLD_SIZE",
    "SUPERSTEP_MASTER_ADDR",
    "SUPERSTEP_MASTER_PORT",
    "SUPERSTEP_BIND",
    "SUPERSTEP_JOB_ID",
    "SUPERSTEP_RUN_ID",
    "SUPERSTEP_SECRET",
    "SUPERSTEP_RESTART_COUNT",
    "SUPERSTEP_RESTARTS_LEFT",
    "SUPERSTEP_CONNECT_TIMEOUT",
    "SUPERSTEP_RECONNECT_TIMEOUT",
    "SUPERSTEP_HEARTBEAT_INTERVAL",
    "SUPERSTEP_HEARTBEAT_TIMEOUT",
    "SUPERSTEP_HANDSHAKE_TIMEOUT",
    "SUPERSTEP_MAX_FRAME",
    "SUPERSTEP_PEER_PORT",
    "SUPERSTEP_PEER_POLL",
];

/// Whether this process read the cluster's variables ([`ClusterEnv::from_env`]).
pub(crate) static CLUSTER_VARS_READ: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The variables that name this run of the job, the first set counting.
const RUN_IDS: [&str; 3] = ["SUPERSTEP_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"];

/// The restart counts launchers give, added when several are set.
const RESTART_COUNTS: [&str; 2] = ["TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"];

impl ClusterEnv {
    /// Reads this process's environment. `Ok(None)` when the process is not part of a
    /// cluster job (see [`ClusterEnv`] for when it is); an error names what is
    /// missing or wrong.
    pub fn from_env() -> Result<Option<Self>, TransportError> {
        CLUSTER_VARS_READ.store(true, std::sync::atomic::Ordering::Relaxed);
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `get` (for tests and for embedding).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, TransportError> {
        let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let launcher = LAUNCHERS.iter().find(|l| get(l.rank).is_some());
        let rank = match launcher {
            Some(l) => Some((
                l.rank,
                parse::<Rank>(l.rank, &get(l.rank).unwrap_or_default())?,
            )),
            None => None,
        };
        let sizes = launcher.map_or(&[][..], |l| l.world_size);
        let size_var = get("SUPERSTEP_WORLD_SIZE")
            .map(|_| "SUPERSTEP_WORLD_SIZE")
            .or_else(|| sizes.iter().copied().find(|v| get(v).is_some()));
        let world = match size_var {
            Some(var) => Some((var, parse::<usize>(var, &get(var).unwrap_or_default())?)),
            None => None,
        };
        let (master, port_missing) = match master_addr(&get)? {
            Master::Found(addr, from) => (Some((addr, from)), false),
            Master::PortMissing => (None, true),
            Master::Unset => (None, false),
        };
        let intended: Vec<&str> = INTENT
            .iter()
            .copied()
            .filter(|v| get(v).is_some())
            .collect();
        if intended.is_empty() {
            // Only the variable that says processes were launched counts here.
            let launched = world.filter(|(var, _)| sizes.first() == Some(var));
            match (rank, launched) {
                // Not a cluster, or a single process of one: the job runs in memory.
                (None, _) | (Some(_), None | Some((_, 0 | 1))) => return Ok(None),
                // Several processes with no master to meet at: each would run the whole
                // job on its own.
                (Some(_), Some(_)) => return Err(incomplete(&get, &[MISSING_MASTER])),
            }
        }
        let mut missing = Vec::new();
        if rank.is_none() {
            missing.push("a rank (SUPERSTEP_RANK, or a launcher's RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, JOB_COMPLETION_INDEX)");
        }
        if world.is_none() {
            missing.push("the world size (SUPERSTEP_WORLD_SIZE, or the rank's launcher's WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS or SLURM_NTASKS)");
        }
        if port_missing {
            missing.push(MISSING_PORT);
        } else if master.is_none() {
            missing.push(MISSING_MASTER);
        }
        let (Some((rank_var, rank)), Some((size_var, world_size)), Some((master_addr, from))) =
            (rank, world, master)
        else {
            return Err(incomplete(&get, &missing));
        };
        if world_size == 0 || rank >= world_size {
            return Err(TransportError::Env(format!(
                "rank {rank} ({rank_var}) is outside 0..{world_size} ({size_var})"
            )));
        }
        let restart_count = match get("SUPERSTEP_RESTART_COUNT") {
            Some(count) => parse("SUPERSTEP_RESTART_COUNT", &count)?,
            None => RESTART_COUNTS.iter().try_fold(0u32, |sum, var| {
                Ok::<u32, TransportError>(match get(var) {
                    Some(count) => sum.saturating_add(parse(var, &count)?),
                    None => sum,
                })
            })?,
        };
        let seconds_of = |var: &str| get(var).map(|v| seconds(var, &v)).transpose();
        Ok(Some(ClusterEnv {
            rank,
            world_size,
            master_addr,
            master_addr_from: from,
            job_id: get("SUPERSTEP_JOB_ID")
                .unwrap_or_else(|| super::TcpSettings::DEFAULT_JOB_ID.into()),
            run_id: RUN_IDS.iter().find_map(|var| get(var)),
            restarts_left: get("SUPERSTEP_RESTARTS_LEFT")
                .map(|v| parse("SUPERSTEP_RESTARTS_LEFT", &v))
                .transpose()?,
            secret: get("SUPERSTEP_SECRET").map(String::into_bytes),
            bind: get("SUPERSTEP_BIND"),
            restart_count,
            connect_timeout: seconds_of("SUPERSTEP_CONNECT_TIMEOUT")?,
            reconnect_timeout: seconds_of("SUPERSTEP_RECONNECT_TIMEOUT")?,
            heartbeat_interval: seconds_of("SUPERSTEP_HEARTBEAT_INTERVAL")?,
            heartbeat_timeout: seconds_of("SUPERSTEP_HEARTBEAT_TIMEOUT")?,
            handshake_timeout: seconds_of("SUPERSTEP_HANDSHAKE_TIMEOUT")?,
            max_frame: get("SUPERSTEP_MAX_FRAME")
                .map(|v| parse("SUPERSTEP_MAX_FRAME", &v))
                .transpose()?,
            peer_port: get("SUPERSTEP_PEER_PORT")
                .map(|v| port("SUPERSTEP_PEER_PORT", &v))
                .transpose()?,
            peer_poll: seconds_of("SUPERSTEP_PEER_POLL")?,
            launcher: launcher.map_or("superstep", |l| l.name),
        }))
    }
}

/// The cluster variables that are set, for an error about those that are not.
fn set_vars(get: &impl Fn(&str) -> Option<String>) -> String {
    let mut vars: Vec<&str> = LAUNCHERS
        .iter()
        .flat_map(|l| std::iter::once(l.rank).chain(l.world_size.iter().copied()))
        .chain(INTENT)
        .chain(["MASTER_PORT", "SUPERSTEP_MASTER_PORT"])
        .collect();
    let mut seen = std::collections::HashSet::new();
    vars.retain(|v| seen.insert(*v));
    let names: Vec<String> = vars
        .into_iter()
        .filter_map(|v| get(v).map(|value| format!("{v} = {value:?}")))
        .collect();
    if names.is_empty() {
        "nothing is".into()
    } else {
        format!(
            "{} {}",
            names.join(", "),
            if names.len() == 1 { "is" } else { "are" }
        )
    }
}

/// What a partial environment lacks, said alike wherever it is found.
const MISSING_MASTER: &str = "the master's address (SUPERSTEP_MASTER_ADDR as host:port of rank 0, or MASTER_ADDR and MASTER_PORT)";
const MISSING_PORT: &str =
    "the master's port (MASTER_PORT, or SUPERSTEP_MASTER_PORT, beside MASTER_ADDR)";

/// The one error of a partial environment: what is set, and what is missing.
fn incomplete(get: &impl Fn(&str) -> Option<String>, missing: &[&str]) -> TransportError {
    TransportError::Env(format!(
        "incomplete: {} set, but {} {} missing",
        set_vars(get),
        missing.join(", and "),
        if missing.len() == 1 { "is" } else { "are" }
    ))
}

/// Where the master's address was found.
enum Master {
    /// The address, and the variables it came from.
    Found(String, &'static str),
    /// `MASTER_ADDR` without a port.
    PortMissing,
    /// Nothing names it.
    Unset,
}

/// The master's address from `SUPERSTEP_MASTER_ADDR`, or from torchrun's `MASTER_ADDR` and
/// a port: `SUPERSTEP_MASTER_PORT` if set (torchrun's agent may serve its own store on
/// `MASTER_PORT`), else `MASTER_PORT`; checked to be `host:port`.
fn master_addr(get: &impl Fn(&str) -> Option<String>) -> Result<Master, TransportError> {
    if let Some(addr) = get("SUPERSTEP_MASTER_ADDR") {
        let addr = addr.trim().to_string();
        check_addr(&addr)
            .map_err(|e| TransportError::Env(format!("SUPERSTEP_MASTER_ADDR = {addr:?} {e}")))?;
        return Ok(Master::Found(addr, "SUPERSTEP_MASTER_ADDR"));
    }
    let Some(host) = get("MASTER_ADDR") else {
        return Ok(Master::Unset);
    };
    let host = host.trim();
    let (port_var, port) = match (get("SUPERSTEP_MASTER_PORT"), get("MASTER_PORT")) {
        (Some(port), _) => ("SUPERSTEP_MASTER_PORT", port),
        (None, Some(port)) => ("MASTER_PORT", port),
        (None, None) => return Ok(Master::PortMissing),
    };
    let from = if port_var == "MASTER_PORT" {
        "MASTER_ADDR and MASTER_PORT"
    } else {
        "MASTER_ADDR and SUPERSTEP_MASTER_PORT"
    };
    let port = port.trim();
    // An IPv6 address needs brackets before its port.
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    check_addr(&addr).map_err(|e| {
        TransportError::Env(format!(
            "MASTER_ADDR = {host:?} with {port_var} = {port:?} gives {addr:?}, which {e}"
        ))
    })?;
    Ok(Master::Found(addr, from))
}

/// Checks that `addr` is `host:port` with a port in 1–65535: no scheme, no path, a host,
/// brackets around an IPv6 address. The error says what is wrong, to follow the value.
pub(crate) fn check_addr(addr: &str) -> Result<(), String> {
    check_addr_port(addr, 1).map(|_| ())
}

/// Like [`check_addr`], with ports from `lowest` (0 lets the system choose one, for a
/// listener); returns the port.
pub(crate) fn check_addr_port(addr: &str, lowest: u32) -> Result<u16, String> {
    if let Some((scheme, _)) = addr.split_once("://") {
        return Err(format!(
            "is not host:port: drop the scheme {:?}",
            format!("{scheme}://")
        ));
    }
    if addr.contains('/') {
        return Err("is not host:port: it has a path".into());
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err("is not host:port: it has no port".into());
    };
    if host.is_empty() || host == "[]" {
        return Err("is not host:port: it has no host".into());
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err("is not host:port: an IPv6 address goes in brackets, as [::1]:29400".into());
    }
    let port: u32 = port
        .parse()
        .map_err(|_| format!("is not host:port: its port {port:?} is not a number"))?;
    if port < lowest || port > u16::MAX as u32 {
        return Err(format!("has port {port}, outside {lowest}..=65535"));
    }
    Ok(port as u16)
}

/// A duration: `30s`, `1m 30s`, or a number of seconds, fractions allowed.
fn seconds(var: &str, value: &str) -> Result<Duration, TransportError> {
    crate::protocol::parse_duration(value)
        .map_err(|why| TransportError::Env(format!("{var} = {value:?} {why}")))
}

/// A port in `var`: a number from 0 (one the system picks) to 65535.
fn port(var: &str, value: &str) -> Result<u16, TransportError> {
    match value.trim().parse::<u64>() {
        Ok(n) => u16::try_from(n).map_err(|_| {
            TransportError::Env(format!(
                "{var} = {value:?} is not a port: a port is 0 to 65535"
            ))
        }),
        Err(_) => parse(var, value),
    }
}

fn parse<T: std::str::FromStr>(var: &str, value: &str) -> Result<T, TransportError> {
    value
        .trim()
        .parse()
        .map_err(|_| TransportError::Env(format!("{var} = {value:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<Option<ClusterEnv>, TransportError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ClusterEnv::from_vars(|n| map.get(n).cloned())
    }

    fn cluster(vars: &[(&str, &str)]) -> ClusterEnv {
        env(vars).unwrap().expect("a cluster environment")
    }

    fn error(vars: &[(&str, &str)]) -> String {
        env(vars).unwrap_err().to_string()
    }

    #[test]
    fn nothing_set_or_a_single_process_of_a_launcher_runs_in_memory() {
        assert_eq!(env(&[]).unwrap(), None);
        // A Slurm or MPI job of one task, or a Kubernetes pod of an Indexed Job with no
        // world size: one process, which runs the job in memory.
        assert_eq!(
            env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]).unwrap(),
            None
        );
        assert_eq!(env(&[("JOB_COMPLETION_INDEX", "3")]).unwrap(), None);
        assert_eq!(env(&[("PMI_RANK", "0")]).unwrap(), None);
    }

    #[test]
    fn superstep_variables_are_understood() {
        let own = cluster(&[
            ("SUPERSTEP_RANK", "2"),
            ("SUPERSTEP_WORLD_SIZE", "4"),
            ("SUPERSTEP_MASTER_ADDR", "10.0.0.1:29400"),
            ("SUPERSTEP_JOB_ID", "lr"),
            ("SUPERSTEP_SECRET", "s3"),
        ]);
        assert_eq!(
            (own.rank, own.world_size, own.job_id.as_str(), own.launcher),
            (2, 4, "lr", "superstep")
        );
        assert_eq!(own.master_addr, "10.0.0.1:29400");
        assert_eq!(own.secret.as_deref(), Some(&b"s3"[..]));
        assert_eq!(own.restart_count, 0);
        assert_eq!((own.reconnect_timeout, own.connect_timeout), (None, None));
    }

    /// What `torchrun --nnodes 2 --nproc-per-node 2 … job` gives the process of global
    /// rank 3 on its second start (one restart of the worker group), inside a Slurm
    /// allocation whose own task ids must not be taken for ranks.
    #[test]
    fn torchrun_variables_are_understood_over_the_slurm_allocation_they_run_in() {
        let torch = cluster(&[
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node01"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RESTART_COUNT", "1"),
            ("TORCHELASTIC_RUN_ID", "none"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "4711"),
        ]);
        assert_eq!(
            (torch.rank, torch.world_size, torch.launcher),
            (3, 4, "torchrun")
        );
        assert_eq!(torch.master_addr, "node01:29500");
        assert_eq!(torch.restart_count, 1);
        // A port of superstep's own on rank 0's host, beside the agent's store.
        let own_port = cluster(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node01"),
            ("MASTER_PORT", "29500"),
            ("SUPERSTEP_MASTER_PORT", "29401"),
        ]);
        assert_eq!(own_port.master_addr, "node01:29401");
        // The scheduler's id names the run, never the job.
        assert_eq!(torch.run_id.as_deref(), Some("4711"));
        assert_eq!(torch.job_id, "superstep");
        let v6 = cluster(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "fd00::1"),
            ("MASTER_PORT", "29500"),
        ]);
        assert_eq!(v6.master_addr, "[fd00::1]:29500");
    }

    /// `mpirun -np 4 -x SUPERSTEP_MASTER_ADDR=… job` (Open MPI) and `mpiexec -n 4` of
    /// MPICH or Intel MPI (PMI).
    #[test]
    fn open_mpi_and_pmi_variables_are_understood() {
        let ompi = cluster(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("SUPERSTEP_MASTER_ADDR", "node01:29400"),
        ]);
        assert_eq!(
            (ompi.rank, ompi.world_size, ompi.launcher),
            (1, 4, "Open MPI")
        );
        let pmi = cluster(&[
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
            ("SUPERSTEP_MASTER_ADDR", "node01:29400"),
        ]);
        assert_eq!((pmi.rank, pmi.world_size, pmi.launcher), (2, 3, "PMI"));
    }

    /// `sbatch --requeue` with `srun job`: a requeued job's processes start again with
    /// `SLURM_RESTART_COUNT` one higher.
    #[test]
    fn slurm_variables_and_its_requeue_count_are_understood() {
        let slurm = cluster(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_JOB_ID", "4711"),
            ("SLURM_RESTART_COUNT", "2"),
            ("SUPERSTEP_MASTER_ADDR", "node01:29400"),
        ]);
        assert_eq!(
            (
                slurm.rank,
                slurm.world_size,
                slurm.run_id.as_deref(),
                slurm.launcher
            ),
            (3, 8, Some("4711"), "Slurm")
        );
        assert_eq!(slurm.job_id, "superstep");
        assert_eq!(slurm.restart_count, 2);
        // Our own count wins over the launcher's.
        let own = cluster(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_RESTART_COUNT", "2"),
            ("SUPERSTEP_RESTART_COUNT", "5"),
            ("SUPERSTEP_MASTER_ADDR", "node01:29400"),
        ]);
        assert_eq!(own.restart_count, 5);
    }

    /// A Kubernetes Indexed Job: the index from the job controller, the world size and the
    /// master's address (rank 0's pod behind a headless service) from the pod spec, and the
    /// restart count from the pod's `batch.kubernetes.io/job-index-failure-count`
    /// annotation through the downward API.
    #[test]
    fn kubernetes_indexed_job_variables_are_understood() {
        let k8s = cluster(&[
            ("JOB_COMPLETION_INDEX", "2"),
            ("SUPERSTEP_WORLD_SIZE", "4"),
            ("SUPERSTEP_MASTER_ADDR", "lr-0.lr:29400"),
            ("SUPERSTEP_RESTART_COUNT", "1"),
        ]);
        assert_eq!(
            (k8s.rank, k8s.world_size, k8s.job_id.as_str(), k8s.launcher),
            (2, 4, "superstep", "Kubernetes")
        );
        assert_eq!(k8s.restart_count, 1);
    }

    #[test]
    fn a_partial_cluster_environment_names_what_is_missing() {
        let err = error(&[
            ("SUPERSTEP_MASTER_ADDR", "127.0.0.1:29400"),
            ("SUPERSTEP_WORLD_SIZE", "4"),
        ]);
        assert!(
            err.starts_with("cluster environment: incomplete: "),
            "{err}"
        );
        assert_eq!(
            err.matches("SUPERSTEP_WORLD_SIZE = \"4\"").count(),
            1,
            "{err}"
        );
        assert!(err.ends_with("is missing"), "{err}");
        assert!(
            err.contains("missing") && err.contains("a rank (SUPERSTEP_RANK"),
            "{err}"
        );
        let err = error(&[("SUPERSTEP_RANK", "1")]);
        assert!(
            err.contains("the world size") && err.contains("the master's address"),
            "{err}"
        );
        let err = error(&[("SUPERSTEP_RANK", "0"), ("SUPERSTEP_WORLD_SIZE", "4")]);
        assert!(err.contains("SUPERSTEP_MASTER_ADDR"), "{err}");
        assert!(!err.contains("the world size ("), "{err}");
        // Kubernetes gives no world size.
        let err = error(&[
            ("JOB_COMPLETION_INDEX", "1"),
            ("SUPERSTEP_MASTER_ADDR", "lr-0.lr:29400"),
        ]);
        assert!(err.contains("the world size"), "{err}");
        // Several processes of a launcher with nowhere to meet.
        let err = error(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_NTASKS", "4"),
        ]);
        assert_eq!(
            err,
            format!("cluster environment: incomplete: SLURM_PROCID = \"1\", SLURM_STEP_NUM_TASKS = \"4\", SLURM_NTASKS = \"4\" are set, but {MISSING_MASTER} is missing")
        );
        // An `sbatch` script's own process, in an allocation of 4 tasks but launched by no
        // `srun`, is one process: it runs in memory.
        assert_eq!(
            env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")]).unwrap(),
            None
        );
        let err = error(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "n1")]);
        assert_eq!(
            err,
            format!("cluster environment: incomplete: RANK = \"1\", WORLD_SIZE = \"2\", MASTER_ADDR = \"n1\" are set, but {MISSING_PORT} is missing")
        );
        // Every partial environment is said in one form.
        for partial in [
            &[("SUPERSTEP_RANK", "1")][..],
            &[("MASTER_ADDR", "n1"), ("SUPERSTEP_RANK", "1")],
            &[("RANK", "1"), ("WORLD_SIZE", "2")],
        ] {
            let err = error(partial);
            assert!(
                err.starts_with("cluster environment: incomplete: "),
                "{err}"
            );
            assert!(err.ends_with(" missing"), "{err}");
        }
    }

    #[test]
    fn the_master_address_says_which_variables_it_came_from() {
        let from = |vars: &[(&str, &str)]| env(vars).unwrap().unwrap().master_addr_from;
        let base = [("RANK", "1"), ("WORLD_SIZE", "2")];
        let with = |extra: &[(&'static str, &'static str)]| [&base[..], extra].concat();
        assert_eq!(
            from(&with(&[("MASTER_ADDR", "n1"), ("MASTER_PORT", "29500")])),
            "MASTER_ADDR and MASTER_PORT"
        );
        assert_eq!(
            from(&with(&[
                ("MASTER_ADDR", "n1"),
                ("MASTER_PORT", "29500"),
                ("SUPERSTEP_MASTER_PORT", "29501")
            ])),
            "MASTER_ADDR and SUPERSTEP_MASTER_PORT"
        );
        assert_eq!(
            from(&with(&[("SUPERSTEP_MASTER_ADDR", "n1:1")])),
            "SUPERSTEP_MASTER_ADDR"
        );
    }

    #[test]
    fn a_wrong_value_names_its_variable_and_what_is_wrong() {
        let base = [("SUPERSTEP_RANK", "1"), ("SUPERSTEP_WORLD_SIZE", "4")];
        let with = |extra: &[(&str, &str)]| error(&[&base[..], extra].concat());
        let addr = |a: &str| with(&[("SUPERSTEP_MASTER_ADDR", a)]);
        let err = addr("http://node01:1");
        assert!(
            err.contains("SUPERSTEP_MASTER_ADDR = \"http://node01:1\"")
                && err.contains("drop the scheme \"http://\""),
            "{err}"
        );
        let err = addr("node01:99999");
        assert!(err.contains("port 99999, outside 1..=65535"), "{err}");
        let err = addr("node01:0");
        assert!(err.contains("port 0, outside 1..=65535"), "{err}");
        let err = addr("node01");
        assert!(err.contains("it has no port"), "{err}");
        let err = addr("node01:http");
        assert!(err.contains("its port \"http\" is not a number"), "{err}");
        let err = addr(":29400");
        assert!(err.contains("it has no host"), "{err}");
        let err = addr("::1:29400");
        assert!(err.contains("IPv6 address goes in brackets"), "{err}");
        let err = addr("node01:29400/job");
        assert!(err.contains("it has a path"), "{err}");
        cluster(&[&base[..], &[("SUPERSTEP_MASTER_ADDR", "[::1]:29400")]].concat());
        let err = error(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "n1"),
            ("MASTER_PORT", "70000"),
        ]);
        assert!(
            err.contains("MASTER_PORT = \"70000\"") && err.contains("port 70000, outside"),
            "{err}"
        );
        let with_addr = |extra: &[(&str, &str)]| {
            with(&[&[("SUPERSTEP_MASTER_ADDR", "127.0.0.1:1")][..], extra].concat())
        };
        let err = error(&[
            ("SUPERSTEP_RANK", "4"),
            ("SUPERSTEP_WORLD_SIZE", "4"),
            ("SUPERSTEP_MASTER_ADDR", "127.0.0.1:1"),
        ]);
        assert!(err.contains("outside 0..4"), "{err}");
        let err = error(&[
            ("SUPERSTEP_RANK", "x"),
            ("SUPERSTEP_WORLD_SIZE", "4"),
            ("SUPERSTEP_MASTER_ADDR", "127.0.0.1:1"),
        ]);
        assert!(
            err.contains("SUPERSTEP_RANK = \"x\" is not a number"),
            "{err}"
        );
        // A number that is no port is told as such.
        let err = with_addr(&[("SUPERSTEP_PEER_PORT", "70000")]);
        assert!(
            err.contains("SUPERSTEP_PEER_PORT = \"70000\" is not a port: a port is 0 to 65535"),
            "{err}"
        );
        let err = with_addr(&[("SUPERSTEP_RECONNECT_TIMEOUT", "-1")]);
        assert!(
            err.contains("SUPERSTEP_RECONNECT_TIMEOUT = \"-1\" must be a number of seconds"),
            "{err}"
        );
        let err = with_addr(&[("SLURM_RESTART_COUNT", "twice")]);
        assert!(err.contains("SLURM_RESTART_COUNT"), "{err}");
        let restarted = cluster(
            &[
                &base[..],
                &[
                    ("SUPERSTEP_MASTER_ADDR", "127.0.0.1:1"),
                    ("SUPERSTEP_RECONNECT_TIMEOUT", "2.5"),
                    ("SUPERSTEP_CONNECT_TIMEOUT", "120"),
                    ("SUPERSTEP_RESTART_COUNT", "3"),
                    ("SUPERSTEP_HEARTBEAT_INTERVAL", "100ms"),
                    ("SUPERSTEP_HEARTBEAT_TIMEOUT", "1m 30s"),
                    ("SUPERSTEP_HANDSHAKE_TIMEOUT", "2s"),
                    ("SUPERSTEP_MAX_FRAME", "1048576"),
                    ("SUPERSTEP_PEER_POLL", "1ms"),
                ],
            ]
            .concat(),
        );
        let settings = crate::transport::TcpSettings::from_cluster(&restarted).unwrap();
        assert_eq!(settings.peer_poll, Duration::from_millis(1));
        let mut polling = settings.clone();
        polling.peer_poll = Duration::from_secs(2);
        let err = polling.validate().unwrap_err().to_string();
        assert!(err.contains("peer_poll 2s is over 1s"), "{err}");
        polling.peer_poll = Duration::ZERO;
        polling.validate().unwrap();
        assert_eq!(settings.heartbeat_interval, Duration::from_millis(100));
        assert_eq!(settings.heartbeat_timeout, Duration::from_secs(90));
        assert_eq!(settings.handshake_timeout, Duration::from_secs(2));
        assert_eq!(settings.max_frame, 1 << 20);
        let err = with_addr(&[("SUPERSTEP_HEARTBEAT_TIMEOUT", "a while")]);
        assert!(
            err.contains(
                "SUPERSTEP_HEARTBEAT_TIMEOUT = \"a while\" must be a duration such as \"30s\""
            ),
            "{err}"
        );
        assert_eq!(
            restarted.reconnect_timeout,
            Some(Duration::from_millis(2500))
        );
        assert_eq!(restarted.connect_timeout, Some(Duration::from_secs(120)));
        assert_eq!(restarted.restart_count, 3);
    }
}
