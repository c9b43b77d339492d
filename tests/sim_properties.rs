//! Property-tested simulations of a job, as a user writes them (feature `proptest`): an
//! arbitrary fault schedule against the job, checked with `try_check` inside proptest, and
//! a failing schedule shrunk to a minimal one whose run replays from one line.
#![cfg(feature = "proptest")]

use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};
use superstep::checkpoint::MemoryCheckpointStore;
use superstep::prelude::*;
use superstep::sim::{strategies, Fault, SimRun, Simulation};

struct Count;

impl WorkerComputable for Count {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(ctx.last_master_result().copied().unwrap_or(0) * 31 + ctx.rank() as u64 + 1)
    }
}

#[derive(Default)]
struct Sum {
    rounds: u64,
}

impl MasterComputable for Sum {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        self.rounds += 1;
        let sum: u64 = ctx.worker_results().iter().sum();
        Ok(Step::Continue((sum + self.rounds) % 1_000_003))
    }

    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        Ok(self.rounds.to_le_bytes().to_vec())
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), BoxError> {
        self.rounds = u64::from_le_bytes(state.try_into()?);
        Ok(())
    }
}

/// How the program builds its job.
fn job() -> JobBuilder<u64, u64> {
    Job::builder(Sum::default(), |_| Count)
        .workers(3)
        .iterations(6)
        .checkpoint(MemoryCheckpointStore::new(), 2)
}

/// The job simulated, under `policy`.
fn simulated(policy: FailurePolicy) -> Simulation<u64, u64> {
    Simulation::from_job(move || job().failure_policy(policy))
}

fn ends_with(expected: u64) -> impl Fn(&SimRun<u64>) -> Result<(), String> {
    move |run| match &run.outcome {
        Ok(o) if *o.result == expected => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_job_recovers_from_any_fault_schedule_with_the_fault_free_result(
        schedule in strategies::schedule(3, 6, 6),
        policy in strategies::recovering_policy(6),
        launched in any::<bool>(),
    ) {
        let expected = *Simulation::from_job(job).run(0).outcome.unwrap().result;
        // Its workers in the master's process (under a policy that restarts them all) or
        // each a process of its own, or launched: every rank a process of its own, the
        // launcher starting dead ones again.
        let sim = simulated(policy);
        let sim = if launched { sim.launched(12) } else { sim };
        sim.schedule(schedule)
            .try_check(0..3, ends_with(expected))
            .map_err(|failure| TestCaseError::fail(failure.to_string()))?;
    }

    #[test]
    fn any_settings_and_policy_end_or_fail_without_breaking_an_invariant(
        shape in strategies::shape(4, 8),
        policy in strategies::policy(4),
        schedule in strategies::schedule(4, 8, 4),
    ) {
        let sim = Simulation::from_job(move || {
            shape.apply(Job::builder(Sum::default(), |_| Count)).failure_policy(policy)
        })
        .schedule(schedule);
        // Settings the job cannot run with are refused as such, before any run.
        prop_assume!(sim.settings().validate().is_ok());
        // Any outcome, as long as the run ends and holds the protocol's invariants.
        sim.try_check(0..2, |_| Ok(()))
            .map_err(|failure| TestCaseError::fail(failure.to_string()))?;
    }
}

/// Under `Fail` a worker's crash (or its loss to a partition) fails the job: proptest finds
/// a schedule that breaks "ends with the fault-free result" and shrinks it to the one fault
/// that matters. The failure's replay line runs the test again with its seed, and proptest
/// runs the case it saved first: the same shrunk schedule fails again, at once.
#[test]
fn a_failing_schedule_shrinks_to_the_one_fault_that_matters_and_its_replay_finds_it_again() {
    let expected = *Simulation::from_job(job).run(0).outcome.unwrap().result;
    let dir = tempfile::tempdir().unwrap();
    let saved: &'static str = Box::leak(
        dir.path()
            .join("regressions.txt")
            .to_string_lossy()
            .into_owned()
            .into_boxed_str(),
    );
    let config = || Config {
        cases: 256,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(saved),
        )),
        ..Config::default()
    };
    let cases = std::cell::Cell::new(0u32);
    let first_failed_at = std::cell::Cell::new(None);
    let run = |runner: &mut TestRunner| {
        cases.set(0);
        first_failed_at.set(None);
        runner.run(&strategies::schedule(3, 6, 8), |schedule| {
            cases.set(cases.get() + 1);
            simulated(FailurePolicy::Fail)
                .schedule(schedule)
                .try_check(0..1, ends_with(expected))
                .map_err(|failure| {
                    if first_failed_at.get().is_none() {
                        first_failed_at.set(Some(cases.get()));
                    }
                    TestCaseError::fail(failure.to_string())
                })
        })
    };
    let (reason, minimal) = match run(&mut TestRunner::new(config())) {
        Err(TestError::Fail(reason, minimal)) => (reason, minimal),
        other => panic!("expected a failing schedule, got {other:?}"),
    };
    assert_eq!(minimal.len(), 1, "shrunk to one fault: {minimal:?}");
    // A master's crash is recovered from under any policy (it resumes from its
    // checkpoint), and so is a partition shorter than the heartbeat timeout; a worker's
    // crash, or its loss to a longer partition, is not under `Fail`.
    assert!(
        matches!(
            minimal[0],
            Fault::WorkerCrash { .. } | Fault::Partition { millis: 30.., .. }
        ),
        "{minimal:?}"
    );
    // The replay line is whole on its own line: proptest ends the message with a period.
    let message = reason.message();
    let line = message
        .lines()
        .skip_while(|l| *l != "replay with:")
        .nth(1)
        .unwrap_or_else(|| panic!("no replay line in {message}"))
        .trim();
    assert!(
        line.starts_with("SUPERSTEP_SIM_SEED=0 cargo test -p superstep ")
            && line.contains(" --test sim_properties ")
            && line.contains(",proptest"),
        "{line}"
    );
    assert!(line.ends_with(" -- --exact"), "{line}");

    // What the line runs: the test again, whose runner first runs the case it saved.
    let again = run(&mut TestRunner::new(config()));
    assert_eq!(
        first_failed_at.get(),
        Some(1),
        "the saved case runs first, and fails"
    );
    match again {
        Err(TestError::Fail(_, shrunk)) => assert_eq!(shrunk, minimal),
        other => panic!("expected the saved failure again, got {other:?}"),
    }
}
