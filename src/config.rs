//! Job settings as the environment overrides them, and what a job's process takes from
//! where it runs: its cores, its threads' names. The settings themselves are declared in
//! the protocol (`protocol/settings.rs`), the one place the nodes read them from.

use crate::error::ConfigError;
use crate::protocol::{parse_duration, JobConfig, Placement, PreemptSignal};

/// How a variable's value sets its setting, or why it does not.
type SetFrom = fn(&mut JobConfig, &str) -> Result<(), String>;

/// Every variable [`JobConfig::with_env`] reads, once: its name and how its value sets
/// its setting (the type's docs list them for users).
const JOB_VARS: [(&str, SetFrom); 20] = [
    ("SUPERSTEP_WORKERS", |c, v| number(v).map(|x| c.workers = x)),
    ("SUPERSTEP_ITERATIONS", |c, v| {
        number(v).map(|x| c.iterations = x)
    }),
    ("SUPERSTEP_PLACEMENT", |c, v| {
        c.placement = match v.trim().to_ascii_lowercase().as_str() {
            "auto" => Placement::Auto,
            "inline" => Placement::Inline,
            "pool" => Placement::Pool,
            _ => return Err("must be auto, inline or pool".into()),
        };
        Ok(())
    }),
    ("SUPERSTEP_COMPUTE_THREADS", |c, v| {
        number(v).map(|x| c.compute_threads = Some(x))
    }),
    ("SUPERSTEP_STARTUP_TIMEOUT", |c, v| {
        parse_duration(v).map(|x| c.startup_timeout = x)
    }),
    ("SUPERSTEP_ITERATION_TIMEOUT", |c, v| {
        parse_duration(v).map(|x| c.iteration_timeout = x)
    }),
    ("SUPERSTEP_SHUTDOWN_TIMEOUT", |c, v| {
        parse_duration(v).map(|x| c.shutdown_timeout = x)
    }),
    ("SUPERSTEP_SYNC_TIMEOUT", |c, v| {
        parse_duration(v).map(|x| c.sync_timeout = x)
    }),
    ("SUPERSTEP_FAILURE_GRACE", |c, v| {
        parse_duration(v).map(|x| c.failure_grace = x)
    }),
    ("SUPERSTEP_AGGREGATION", |c, v| {
        v.trim().parse().map(|x| c.aggregation = x)
    }),
    ("SUPERSTEP_FAILURE_POLICY", |c, v| {
        v.parse().map(|x| c.failure_policy = x)
    }),
    ("SUPERSTEP_PROGRESS_INTERVAL", |c, v| {
        parse_duration(v).map(|x| c.progress_interval = x)
    }),
    ("SUPERSTEP_CHECKPOINT_SLOW", |c, v| {
        parse_duration(v).map(|x| c.checkpoint_slow = x)
    }),
    ("SUPERSTEP_RESHARD_ON_RESUME", |c, v| {
        c.reshard_on_resume = match v.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => return Err("must be true or false".into()),
        };
        Ok(())
    }),
    ("SUPERSTEP_CHECKPOINT_REPLICAS", |c, v| {
        c.checkpoint_replicas = match v.trim() {
            auto if auto.eq_ignore_ascii_case("auto") => None,
            n => Some(
                n.parse()
                    .map_err(|_| "must be `auto` or a whole number".to_string())?,
            ),
        };
        Ok(())
    }),
    ("SUPERSTEP_PREEMPT_SIGNAL", |c, v| {
        PreemptSignal::from_setting(v).map(|x| c.preempt_signal = x)
    }),
    ("SUPERSTEP_PREEMPT_GRACE", |c, v| {
        parse_duration(v).map(|x| c.preempt_grace = x)
    }),
    ("SUPERSTEP_FLIGHT_EVENTS", |c, v| {
        number(v).map(|x| c.flight_events = x)
    }),
    ("SUPERSTEP_FLIGHT_DIR", |c, v| {
        // Empty: the default (not the current directory).
        c.flight_dir = Some(std::path::PathBuf::from(v)).filter(|_| !v.trim().is_empty());
        Ok(())
    }),
    ("SUPERSTEP_DUMP_SIGNAL", |c, v| {
        PreemptSignal::from_setting(v).map(|x| c.dump_signal = x)
    }),
];

/// A whole number, as a variable gives it.
fn number<T: std::str::FromStr>(value: &str) -> Result<T, String> {
    value
        .trim()
        .parse()
        .map_err(|_| "must be a whole number".to_string())
}

/// The variables [`JobConfig::with_env`] reads.
pub(crate) fn job_vars() -> impl Iterator<Item = &'static str> {
    JOB_VARS.iter().map(|&(var, _)| var)
}

/// Whether this process read the job-setting variables ([`JobConfig::with_env`]).
pub(crate) static JOB_VARS_READ: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

impl JobConfig {
    /// These settings, with those the environment sets overriding them (the variables are
    /// in the [type's docs](JobConfig#from-the-environment)). An unset variable leaves
    /// its setting as it is; a value that does not parse is an error naming the variable
    /// and its value.
    pub fn with_env(self) -> Result<Self, ConfigError> {
        JOB_VARS_READ.store(true, std::sync::atomic::Ordering::Relaxed);
        self.with_vars(|var| std::env::var(var).ok())
    }

    /// As [`with_env`](JobConfig::with_env), with the variables read by `get`.
    pub fn with_vars(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        for (var, set) in JOB_VARS {
            if let Some(value) = get(var) {
                set(&mut self, &value).map_err(|why| ConfigError::new(var, &value, &why))?;
            }
        }
        Ok(self)
    }
}

impl JobConfig {
    /// The number of compute-pool threads this configuration asks for.
    pub fn compute_threads(&self) -> usize {
        self.compute_threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
    }
}

/// The start of the names of a job's threads: `superstep-` and the job's id, or the id
/// alone when it starts with `superstep` already (the default id's threads are
/// `superstep-compute-0`, not `superstep-superstep-compute-0`).
pub(crate) fn thread_prefix(job_id: &str) -> String {
    if job_id.starts_with("superstep") {
        job_id.to_string()
    } else {
        format!("superstep-{job_id}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::protocol::FailurePolicy;

    #[test]
    fn the_failure_policy_comes_from_a_document_and_from_the_environment() {
        let config: JobConfig =
            serde_json::from_str(r#"{"failure_policy": {"RestartAll": {"max_attempts": 2}}}"#)
                .unwrap();
        assert_eq!(
            config.failure_policy,
            FailurePolicy::RestartAll { max_attempts: 2 }
        );
        let env = |value: &'static str| {
            move |var: &str| (var == "SUPERSTEP_FAILURE_POLICY").then(|| value.to_string())
        };
        for (text, policy) in [
            ("fail", FailurePolicy::Fail),
            ("Continue-Without", FailurePolicy::ContinueWithout),
            (
                "restart_worker:3",
                FailurePolicy::RestartWorker { max_restarts: 3 },
            ),
            (
                " restart_all : 4 ",
                FailurePolicy::RestartAll { max_attempts: 4 },
            ),
        ] {
            let config = JobConfig::default().with_vars(env(text)).unwrap();
            assert_eq!(config.failure_policy, policy, "{text}");
        }
        for wrong in ["restart_worker", "restart_all:x", "retry"] {
            let err = JobConfig::default().with_vars(env(wrong)).unwrap_err();
            assert_eq!(err.setting, "SUPERSTEP_FAILURE_POLICY");
            assert!(
                err.requirement
                    .starts_with("must be fail, continue_without"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_flight_recorders_settings_come_from_the_environment() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |var: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == var)
                    .map(|(_, value)| value.to_string())
            }
        };
        let config = JobConfig::default()
            .with_vars(vars(&[
                ("SUPERSTEP_FLIGHT_EVENTS", "64"),
                ("SUPERSTEP_FLIGHT_DIR", "/var/tmp/dumps"),
                ("SUPERSTEP_DUMP_SIGNAL", "SIGUSR1"),
            ]))
            .unwrap();
        assert_eq!(config.flight_events, 64);
        assert_eq!(config.flight_dir, Some("/var/tmp/dumps".into()));
        assert_eq!(config.dump_signal, Some(PreemptSignal::Usr1));
        let config = JobConfig::default()
            .with_vars(vars(&[
                ("SUPERSTEP_FLIGHT_DIR", " "),
                ("SUPERSTEP_DUMP_SIGNAL", "none"),
            ]))
            .unwrap();
        assert_eq!(config.flight_dir, None, "empty: the default");
        assert_eq!(config.dump_signal, None);
        let err = JobConfig::default()
            .with_vars(vars(&[("SUPERSTEP_DUMP_SIGNAL", "kill")]))
            .unwrap_err();
        assert_eq!(err.setting, "SUPERSTEP_DUMP_SIGNAL");
        // The same signal as the preemption's: valid, the preemption's alone.
        let same = JobConfig {
            dump_signal: Some(PreemptSignal::Term),
            ..JobConfig::default()
        };
        assert!(same.validate().is_ok());
    }

    #[test]
    fn the_environment_overrides_the_common_settings() {
        let vars = [
            ("SUPERSTEP_WORKERS", "8"),
            ("SUPERSTEP_ITERATIONS", "3"),
            ("SUPERSTEP_PLACEMENT", "Inline"),
            ("SUPERSTEP_COMPUTE_THREADS", "2"),
            ("SUPERSTEP_ITERATION_TIMEOUT", "2m"),
            ("SUPERSTEP_SYNC_TIMEOUT", "45"),
            ("SUPERSTEP_RESHARD_ON_RESUME", "True"),
            ("SUPERSTEP_CHECKPOINT_REPLICAS", "2"),
        ];
        let get = |var: &str| {
            vars.iter()
                .find(|(v, _)| *v == var)
                .map(|(_, value)| value.to_string())
        };
        let base = JobConfig {
            job_id: "from-code".into(),
            workers: 2,
            ..JobConfig::default()
        };
        let config = base.with_vars(get).unwrap();
        let expected = JobConfig {
            job_id: "from-code".into(),
            workers: 8,
            iterations: 3,
            placement: Placement::Inline,
            compute_threads: Some(2),
            iteration_timeout: Duration::from_secs(120),
            sync_timeout: Duration::from_secs(45),
            reshard_on_resume: true,
            checkpoint_replicas: Some(2),
            ..JobConfig::default()
        };
        assert_eq!(config, expected);
        let auto = JobConfig {
            checkpoint_replicas: Some(3),
            ..JobConfig::default()
        }
        .with_vars(|var| (var == "SUPERSTEP_CHECKPOINT_REPLICAS").then(|| "Auto".into()))
        .unwrap();
        assert_eq!(auto.checkpoint_replicas, None);
        let unset = JobConfig::default().with_vars(|_| None).unwrap();
        assert_eq!(unset, JobConfig::default());
    }

    #[test]
    fn a_wrong_value_in_the_environment_names_its_variable() {
        let err = JobConfig::default()
            .with_vars(|var| (var == "SUPERSTEP_ITERATIONS").then(|| "ten".to_string()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid setting `SUPERSTEP_ITERATIONS` = "ten": must be a whole number"#
        );
        let err = JobConfig::default()
            .with_vars(|var| (var == "SUPERSTEP_RESHARD_ON_RESUME").then(|| "maybe".to_string()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid setting `SUPERSTEP_RESHARD_ON_RESUME` = "maybe": must be true or false"#
        );
        let err = JobConfig::default()
            .with_vars(|var| (var == "SUPERSTEP_CHECKPOINT_REPLICAS").then(|| "-1".into()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid setting `SUPERSTEP_CHECKPOINT_REPLICAS` = "-1": must be `auto` or a whole number"#
        );
        let err = JobConfig::default()
            .with_vars(|var| (var == "SUPERSTEP_SHUTDOWN_TIMEOUT").then(|| "1 fortnight".into()))
            .unwrap_err();
        assert_eq!(err.setting, "SUPERSTEP_SHUTDOWN_TIMEOUT");
        assert!(err.requirement.starts_with("must be a duration"), "{err}");
        let err = JobConfig::default()
            .with_vars(|var| (var == "SUPERSTEP_PLACEMENT").then(|| "gpu".into()))
            .unwrap_err();
        assert_eq!(err.requirement, "must be auto, inline or pool");
    }

    #[test]
    fn every_variable_read_is_in_the_settings_docs_and_no_other() {
        let source = include_str!("protocol/settings.rs");
        let documented: Vec<&str> = source
            .lines()
            .filter_map(|line| line.strip_prefix("/// | `SUPERSTEP_"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        let read: Vec<&str> = job_vars()
            .map(|var| var.strip_prefix("SUPERSTEP_").unwrap())
            .collect();
        assert_eq!(documented, read, "the docs' table, in the order read");
    }
}
