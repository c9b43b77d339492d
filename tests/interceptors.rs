//! Interceptors nest like a call stack on the master and on every worker, and the timer
//! interceptor records per-iteration times.

mod common;

use common::{summing_master, FnWorker, Log};
use superstep::prelude::*;
use superstep::{IterationTimer, Side};

/// Logs every hook it sees, with its name and the side it runs on.
struct Logger {
    name: &'static str,
    log: Log,
    fail_pre_application: bool,
}

impl Logger {
    fn new(name: &'static str, log: &Log) -> Self {
        Logger {
            name,
            log: log.clone(),
            fail_pre_application: false,
        }
    }
    fn hook(&self, hook: &str, iteration: u64) {
        self.log.push(format!("{}.{hook}({iteration})", self.name));
    }
}

impl MasterInterceptor<u64, u64> for Logger {
    fn pre_application(&mut self, _: &MasterContext<u64, u64>) -> Result<(), BoxError> {
        self.hook("pre_application", 0);
        if self.fail_pre_application {
            return Err("cannot open the output".into());
        }
        Ok(())
    }
    fn pre_iteration(&mut self, ctx: &MasterContext<u64, u64>) -> Result<(), BoxError> {
        self.hook("pre_iteration", ctx.iteration());
        Ok(())
    }
    fn post_iteration(&mut self, ctx: &MasterContext<u64, u64>) -> Result<(), BoxError> {
        assert!(
            ctx.master_result().is_some(),
            "post_iteration sees the master result"
        );
        self.hook("post_iteration", ctx.iteration());
        Ok(())
    }
    fn post_application(
        &mut self,
        ctx: &MasterContext<u64, u64>,
        _: Ending<'_>,
    ) -> Result<(), BoxError> {
        self.hook("post_application", ctx.iteration());
        Ok(())
    }
}

impl WorkerInterceptor<u64, u64> for Logger {
    fn pre_application(&mut self, _: &WorkerContext<u64, u64>) -> Result<(), BoxError> {
        self.hook("pre_application", 0);
        Ok(())
    }
    fn pre_iteration(&mut self, ctx: &WorkerContext<u64, u64>) -> Result<(), BoxError> {
        self.hook("pre_iteration", ctx.iteration());
        Ok(())
    }
    fn post_iteration(&mut self, ctx: &WorkerContext<u64, u64>) -> Result<(), BoxError> {
        assert_eq!(
            ctx.worker_result(),
            Some(&7),
            "post_iteration sees the worker result"
        );
        self.hook("post_iteration", ctx.iteration());
        Ok(())
    }
    fn post_application(
        &mut self,
        ctx: &WorkerContext<u64, u64>,
        _: Ending<'_>,
    ) -> Result<(), BoxError> {
        self.hook("post_application", ctx.iteration());
        Ok(())
    }
}

fn expected_stack(compute: &str, iterations: u64) -> Vec<String> {
    let mut expected = vec![
        "a.pre_application(0)".to_string(),
        "b.pre_application(0)".to_string(),
    ];
    for i in 1..=iterations {
        expected.extend([
            format!("a.pre_iteration({i})"),
            format!("b.pre_iteration({i})"),
            format!("{compute}({i})"),
            format!("b.post_iteration({i})"),
            format!("a.post_iteration({i})"),
        ]);
    }
    expected.extend([
        format!("b.post_application({iterations})"),
        format!("a.post_application({iterations})"),
    ]);
    expected
}

#[test]
fn master_interceptors_nest_like_a_call_stack_around_the_master_compute() {
    let log = Log::default();
    let in_compute = log.clone();
    let master = common::FnMaster {
        f: move |ctx: &mut MasterContext<u64, u64>| {
            in_compute.push(format!("compute({})", ctx.iteration()));
            Ok(Step::Continue(0))
        },
    };
    Job::builder(master, |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(7),
    })
    .workers(3)
    .iterations(3)
    .master_interceptor(Logger::new("a", &log))
    .master_interceptor(Logger::new("b", &log))
    .run()
    .unwrap();
    assert_eq!(log.entries(), expected_stack("compute", 3));
}

#[test]
fn worker_interceptors_nest_like_a_call_stack_around_each_worker_compute() {
    let workers = 3;
    let logs: Vec<Log> = (0..workers).map(|_| Log::default()).collect();
    let (la, lb, lc) = (logs.clone(), logs.clone(), logs.clone());
    Job::builder(summing_master(), move |rank| {
        let log = lc[rank].clone();
        FnWorker {
            f: move |ctx: &mut WorkerContext<u64, u64>| {
                log.push(format!("compute({})", ctx.iteration()));
                Ok(7)
            },
        }
    })
    .workers(workers)
    .iterations(2)
    .worker_interceptor(move |rank| Logger::new("a", &la[rank]))
    .worker_interceptor(move |rank| Logger::new("b", &lb[rank]))
    .run()
    .unwrap();
    for log in &logs {
        assert_eq!(log.entries(), expected_stack("compute", 2));
    }
}

#[test]
fn a_failed_pre_application_unwinds_the_interceptors_that_were_entered() {
    let log = Log::default();
    let mut b = Logger::new("b", &log);
    b.fail_pre_application = true;
    let err = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(7),
    })
    .workers(2)
    .master_interceptor(Logger::new("a", &log))
    .master_interceptor(b)
    .master_interceptor(Logger::new("c", &log))
    .run()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "master failed in pre_application at iteration 0: cannot open the output"
    );
    assert_eq!(
        log.entries(),
        vec![
            "a.pre_application(0)",
            "b.pre_application(0)",
            "b.post_application(0)",
            "a.post_application(0)"
        ]
    );
}

#[test]
fn the_iteration_timer_records_every_iteration_of_every_side() {
    let timer = IterationTimer::new();
    let for_workers = timer.clone();
    Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(7),
    })
    .workers(3)
    .iterations(4)
    .master_interceptor(timer.clone())
    .worker_interceptor(move |_| for_workers.clone())
    .run()
    .unwrap();
    assert_eq!(timer.times().len(), 4 * 4);
    for side in [
        Side::Master,
        Side::Worker(0),
        Side::Worker(1),
        Side::Worker(2),
    ] {
        let iterations: Vec<u64> = timer.times_of(side).iter().map(|t| t.iteration).collect();
        assert_eq!(iterations, vec![1, 2, 3, 4], "{side:?}");
    }
}
