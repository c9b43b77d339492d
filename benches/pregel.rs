//! Connected components of the generated graph (1,000,000 vertices, 10,000,000 edges) with
//! Pregel's messages, 2 workers in memory, beside the same algorithm written by hand with
//! rayon on 2 threads (`examples/support/components.rs`): from the graph to its labels,
//! each. The target: the job at least as fast as the hand-written one.
//!
//! ```text
//! cargo bench --bench pregel
//! ```

#[path = "../examples/support/components.rs"]
mod components;
#[path = "../examples/support/graph.rs"]
mod graph;

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};

fn connected_components(c: &mut Criterion) {
    let graph = graph::graph(1_000_000, 10_000_000, 7);
    let want = components::expected(&graph::components(&graph));
    let mut group = c.benchmark_group("connected_components_1m_10m");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(60));
    group.bench_function("messages_2_workers", |b| {
        b.iter(|| {
            let outcome = components::job(Arc::clone(&graph))
                .workers(2)
                .run()
                .expect("the job runs");
            assert_eq!(outcome.result.digest, want.digest);
        })
    });
    group.bench_function("rayon_2_threads", |b| {
        b.iter(|| {
            let (labels, _) = components::with_rayon(&graph, 2);
            assert_eq!(components::expected(&labels), want);
        })
    });
    group.finish();
}

criterion_group!(benches, connected_components);
criterion_main!(benches);
