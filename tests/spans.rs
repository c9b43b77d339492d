//! The spans of a job nest as its work does, across threads: the job's span holds every
//! iteration's, and each worker's `compute` is a child of its iteration's span, wherever
//! it ran (inline on the job's thread, or on a compute thread) — also when a filter
//! records `compute` by its name alone.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::{summing_master, FnWorker};
use superstep::prelude::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{reload, EnvFilter, Layer};

/// A span as it was made: its name, its fields, and its parent's name and fields.
#[derive(Debug, Clone)]
struct Made {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<(&'static str, BTreeMap<String, String>)>,
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

/// Records every span made, with its parent.
struct Recorder(Arc<Mutex<Vec<Made>>>);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let span = ctx.span(id).unwrap();
        span.extensions_mut().insert(fields.0.clone());
        let parent = span.parent().map(|p| {
            let f = p.extensions().get::<BTreeMap<String, String>>().cloned();
            (p.name(), f.unwrap_or_default())
        });
        self.0.lock().unwrap().push(Made {
            name: span.name(),
            fields: fields.0,
            parent,
        });
    }
}

/// The spans a job of 3 workers and 2 iterations makes, as `made` records them.
fn spans_of_a_job(made: &Mutex<Vec<Made>>, job_id: &str, placement: Placement) -> Vec<Made> {
    made.lock().unwrap().clear();
    Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .job_id(job_id)
    .workers(3)
    .iterations(2)
    .placement(placement)
    .run()
    .unwrap();
    made.lock().unwrap().clone()
}

#[test]
fn every_compute_span_is_a_child_of_its_iteration_s_and_every_iteration_of_the_job_s() {
    let made = Arc::new(Mutex::new(Vec::new()));
    let (filter, reload) = reload::Layer::new(EnvFilter::new("superstep=debug"));
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(Recorder(Arc::clone(&made)));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    for placement in [Placement::Inline, Placement::Pool] {
        let made = spans_of_a_job(&made, "spans", placement);
        let named = |name: &str| made.iter().filter(|m| m.name == name).collect::<Vec<_>>();

        let computes = named("compute");
        assert_eq!(computes.len(), 3 * 2, "{placement:?}: {made:#?}");
        for c in computes {
            let (parent, parent_fields) = c.parent.as_ref().expect("a parent");
            assert_eq!(*parent, "iteration", "{placement:?}: {c:?}");
            assert_eq!(parent_fields["iteration"], c.fields["iteration"], "{c:?}");
            assert!(
                c.fields.contains_key("rank") && c.fields["attempt"] == "0",
                "{c:?}"
            );
        }
        let iterations = named("iteration");
        assert_eq!(iterations.len(), 2);
        for i in &iterations {
            let (parent, fields) = i.parent.as_ref().expect("a parent");
            assert_eq!(*parent, "job", "{i:?}");
            assert_eq!(fields["job"], "spans");
        }
        assert_eq!(named("job").len(), 1);
        assert_eq!(named("init").len(), 3);
        assert_eq!(named("post_application").len(), 3);
        for m in named("init").into_iter().chain(named("post_application")) {
            assert_eq!(m.parent.as_ref().map(|p| p.0), Some("job"), "{m:?}");
        }
        let folds = named("master_compute");
        assert_eq!(folds.len(), 2);
        assert!(folds
            .iter()
            .all(|f| f.parent.as_ref().map(|p| p.0) == Some("iteration")));
    }

    // A filter that records `compute` by its name, and nothing else at DEBUG: each
    // `compute` is still its iteration's child, not a root of its own.
    reload
        .reload(EnvFilter::new("info,[compute]=debug"))
        .unwrap();
    for placement in [Placement::Inline, Placement::Auto, Placement::Pool] {
        let made = spans_of_a_job(&made, "spans by name", placement);
        let computes: Vec<_> = made.iter().filter(|m| m.name == "compute").collect();
        assert_eq!(computes.len(), 3 * 2, "{placement:?}: {made:#?}");
        for c in computes {
            let parent = c.parent.as_ref().map(|p| p.0);
            assert_eq!(parent, Some("iteration"), "{placement:?}: {c:?}");
        }
    }
}
