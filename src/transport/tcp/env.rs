//! Where a process learns its part of a cluster job: environment variables, as set by
//! `superstep-launch`, by hand, by Slurm, or by a Kubernetes Indexed Job.
//!
//! | what | read from, first found |
//! |---|---|
//! | this process's rank | `SUPERSTEP_RANK`, `SLURM_PROCID`, `JOB_COMPLETION_INDEX` |
//! | the world size (workers) | `SUPERSTEP_WORLD_SIZE`, `SLURM_NTASKS` |
//! | the master's address (`host:port`) | `SUPERSTEP_MASTER_ADDR` |
//! | the job id | `SUPERSTEP_JOB_ID`, `SLURM_JOB_ID`; default `superstep` |
//! | the shared secret | `SUPERSTEP_SECRET` (optional on loopback, required otherwise) |
//! | where rank 0 listens | `SUPERSTEP_BIND`; default `127.0.0.1` and the master address's port |
//! | how many times this process was started again | `SUPERSTEP_RESTART_COUNT`; default 0 |
//! | how long a worker tries to reach a lost master again, in seconds | `SUPERSTEP_RECONNECT_TIMEOUT`; default 0 (never) |
//!
//! **Ranks**: process rank `r` runs worker `r`; process rank 0 also runs the master (and the
//! barrier). So a scheduler that starts N identical tasks gets N workers, and the master's
//! address is that of the task with rank 0.

use std::time::Duration;

use crate::protocol::Rank;
use crate::transport::TransportError;

/// A process's part of a cluster job, from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterEnv {
    /// This process's rank: it runs worker `rank`, and the master if `rank == 0`.
    pub rank: Rank,
    /// The number of processes, which is the number of workers.
    pub world_size: usize,
    /// The master's address, `host:port`.
    pub master_addr: String,
    /// The job's id: peers of another job are refused.
    pub job_id: String,
    /// The shared secret, if any.
    pub secret: Option<Vec<u8>>,
    /// Where rank 0 listens, if not `127.0.0.1` and the master address's port.
    pub bind: Option<String>,
    /// How many times this rank's process was started again after it died
    /// (`SUPERSTEP_RESTART_COUNT`, which `superstep-launch --restarts` sets): 0 for the first.
    /// A process started again connects with its rank and takes the place of the one
    /// that died, when the job's failure policy replaces workers.
    pub restart_count: u32,
    /// How long a worker that lost the master tries to reach it again
    /// (`SUPERSTEP_RECONNECT_TIMEOUT`, in seconds; `superstep-launch --restarts` sets it),
    /// if set: a master process started again in the place of one that died resumes the
    /// job from its newest checkpoint, and the workers that reach it carry on.
    pub reconnect_timeout: Option<Duration>,
}

impl ClusterEnv {
    /// Reads this process's environment. `Ok(None)` when no rank variable is set: the
    /// process is not part of a cluster job.
    pub fn from_env() -> Result<Option<Self>, TransportError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `get` (for tests and for embedding).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, TransportError> {
        let first = |names: &[&'static str]| -> Option<(&'static str, String)> {
            names.iter().find_map(|&n| get(n).map(|v| (n, v)))
        };
        let Some((rank_var, rank)) =
            first(&["SUPERSTEP_RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX"])
        else {
            return Ok(None);
        };
        let rank: Rank = parse(rank_var, &rank)?;
        let (size_var, size) = first(&["SUPERSTEP_WORLD_SIZE", "SLURM_NTASKS"]).ok_or_else(|| {
            TransportError::Env(format!(
                "{rank_var} is set but the world size is not: set SUPERSTEP_WORLD_SIZE (or SLURM_NTASKS)"
            ))
        })?;
        let world_size: usize = parse(size_var, &size)?;
        if world_size == 0 || rank >= world_size {
            return Err(TransportError::Env(format!(
                "rank {rank} ({rank_var}) is outside 0..{world_size} ({size_var})"
            )));
        }
        let master_addr = get("SUPERSTEP_MASTER_ADDR").ok_or_else(|| {
            TransportError::Env(
                "SUPERSTEP_MASTER_ADDR is not set: give every process the host:port of rank 0"
                    .into(),
            )
        })?;
        if !master_addr.contains(':') {
            return Err(TransportError::Env(format!(
                "SUPERSTEP_MASTER_ADDR = {master_addr:?} is not host:port"
            )));
        }
        Ok(Some(ClusterEnv {
            rank,
            world_size,
            master_addr,
            job_id: first(&["SUPERSTEP_JOB_ID", "SLURM_JOB_ID"])
                .map(|(_, v)| v)
                .unwrap_or_else(|| "superstep".into()),
            secret: get("SUPERSTEP_SECRET")
                .filter(|s| !s.is_empty())
                .map(String::into_bytes),
            bind: get("SUPERSTEP_BIND"),
            restart_count: match get("SUPERSTEP_RESTART_COUNT") {
                Some(count) => parse("SUPERSTEP_RESTART_COUNT", &count)?,
                None => 0,
            },
            reconnect_timeout: match get("SUPERSTEP_RECONNECT_TIMEOUT") {
                Some(secs) => Some(seconds("SUPERSTEP_RECONNECT_TIMEOUT", &secs)?),
                None => None,
            },
        }))
    }
}

/// A duration in seconds, fractions allowed.
fn seconds(var: &str, value: &str) -> Result<Duration, TransportError> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| {
            TransportError::Env(format!(
                "{var} = {value:?} is not a number of seconds (0 or more)"
            ))
        })
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

    #[test]
    fn no_rank_means_no_cluster() {
        assert_eq!(env(&[("SUPERSTEP_WORLD_SIZE", "4")]).unwrap(), None);
    }

    #[test]
    fn superstep_slurm_and_kubernetes_variables_are_understood() {
        let own = env(&[
            ("SUPERSTEP_RANK", "2"),
            ("SUPERSTEP_WORLD_SIZE", "4"),
            ("SUPERSTEP_MASTER_ADDR", "10.0.0.1:29400"),
            ("SUPERSTEP_JOB_ID", "lr"),
            ("SUPERSTEP_SECRET", "s3"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (own.rank, own.world_size, own.job_id.as_str()),
            (2, 4, "lr")
        );
        assert_eq!(own.secret.as_deref(), Some(&b"s3"[..]));
        assert_eq!(own.restart_count, 0);
        assert_eq!(own.reconnect_timeout, None);
        let slurm = env(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_ID", "4711"),
            ("SUPERSTEP_MASTER_ADDR", "node01:29400"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (slurm.rank, slurm.world_size, slurm.job_id.as_str()),
            (3, 8, "4711")
        );
        assert_eq!(slurm.restart_count, 0);
        let k8s = env(&[
            ("JOB_COMPLETION_INDEX", "0"),
            ("SUPERSTEP_WORLD_SIZE", "4"),
            ("SUPERSTEP_MASTER_ADDR", "lr-0.lr:29400"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((k8s.rank, k8s.job_id.as_str()), (0, "superstep"));
    }

    #[test]
    fn an_incomplete_or_wrong_environment_is_named() {
        let err = env(&[("SUPERSTEP_RANK", "1")]).unwrap_err();
        assert!(err.to_string().contains("SUPERSTEP_WORLD_SIZE"), "{err}");
        let err = env(&[("SUPERSTEP_RANK", "4"), ("SUPERSTEP_WORLD_SIZE", "4")]).unwrap_err();
        assert!(err.to_string().contains("outside 0..4"), "{err}");
        let err = env(&[("SUPERSTEP_RANK", "x"), ("SUPERSTEP_WORLD_SIZE", "4")]).unwrap_err();
        assert!(err.to_string().contains("is not a number"), "{err}");
        let err = env(&[("SUPERSTEP_RANK", "0"), ("SUPERSTEP_WORLD_SIZE", "4")]).unwrap_err();
        assert!(err.to_string().contains("SUPERSTEP_MASTER_ADDR"), "{err}");
        let base = [
            ("SUPERSTEP_RANK", "1"),
            ("SUPERSTEP_WORLD_SIZE", "4"),
            ("SUPERSTEP_MASTER_ADDR", "127.0.0.1:1"),
        ];
        let err = env(&[&base[..], &[("SUPERSTEP_RECONNECT_TIMEOUT", "-1")]].concat()).unwrap_err();
        assert!(
            err.to_string()
                .contains("SUPERSTEP_RECONNECT_TIMEOUT = \"-1\" is not a number of seconds"),
            "{err}"
        );
        let restarted = env(&[
            &base[..],
            &[
                ("SUPERSTEP_RECONNECT_TIMEOUT", "2.5"),
                ("SUPERSTEP_RESTART_COUNT", "3"),
            ],
        ]
        .concat())
        .unwrap()
        .unwrap();
        assert_eq!(
            restarted.reconnect_timeout,
            Some(Duration::from_millis(2500))
        );
        assert_eq!(restarted.restart_count, 3);
    }
}
