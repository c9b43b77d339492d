//! A subscriber that records INFO and above (a service's usual setting) costs a worker's
//! round nothing for the DEBUG spans it does not record: no span is cloned per worker per
//! round to be the parent of a `compute` span nobody records. (Each clone, and its drop,
//! is a round trip through a registry: it made a worker's round a third dearer.) When
//! DEBUG spans are recorded, `tests/spans.rs` checks that each `compute` is its
//! iteration's child.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{summing_master, FnWorker};
use superstep::prelude::*;
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Records nothing; counts the spans made and cloned at INFO and above.
#[derive(Default)]
struct Counting {
    made: AtomicU64,
    cloned: AtomicU64,
}

impl Subscriber for Counting {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::INFO)
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.made.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn clone_span(&self, id: &Id) -> Id {
        self.cloned.fetch_add(1, Ordering::Relaxed);
        id.clone()
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn a_workers_round_clones_no_span_for_debug_spans_nobody_records() {
    let counting = Arc::new(Counting::default());
    tracing::subscriber::set_global_default(Arc::clone(&counting)).unwrap();
    const WORKERS: usize = 16;
    const ITERATIONS: u64 = 50;
    for placement in [Placement::Inline, Placement::Auto, Placement::Pool] {
        let before = counting.cloned.load(Ordering::Relaxed);
        Job::builder(summing_master(), |_| FnWorker {
            f: |_: &mut WorkerContext<u64, u64>| Ok(1),
        })
        .workers(WORKERS)
        .iterations(ITERATIONS)
        .placement(placement)
        .run()
        .unwrap();
        let cloned = counting.cloned.load(Ordering::Relaxed) - before;
        // What a round clones, it clones once for all its workers (the iteration's span
        // handed to a rescuer, say), not once for each.
        assert!(
            cloned < WORKERS as u64 * ITERATIONS / 4,
            "{placement:?}: {cloned} spans cloned in {ITERATIONS} rounds of {WORKERS} workers"
        );
    }
    assert!(
        counting.made.load(Ordering::Relaxed) >= ITERATIONS,
        "the subscriber sees the INFO spans (each iteration's)"
    );
}
