//! The cost of a Pregel message, sent and received: two workers, each sending the other
//! 500,000 `(vertex, share)` messages a superstep — four to each of 125,000 vertices of the
//! other's range, in a scattered order — and reading what it was sent. Criterion's
//! throughput is in messages: its time per element is one message's cost.
//!
//! - `in_memory`: handed over as values (the workers share a process);
//! - `encoded`: encoded and decoded as between processes (the memory transport's wire
//!   check), combined by vertex before they leave and again as they arrive;
//! - `encoded_uncombined`: encoded, without a combiner.
//!
//! ```text
//! cargo bench --bench messages
//! ```

#[path = "support/timing.rs"]
mod timing;
#[path = "support/trivial.rs"]
#[allow(dead_code)] // its worker is the iteration benches'
mod trivial;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use superstep::prelude::*;
use superstep::transport::MemoryTransport;
use timing::{measured, WARMUP};
use trivial::Fold;

/// Messages each worker sends a superstep.
const SENT: u64 = 500_000;
/// Vertices of each worker's range; each is sent `SENT / VERTICES` messages.
const VERTICES: u64 = 125_000;

type Share = (u32, f64);

/// A worker: sends its messages, sums what it was sent.
struct Sender {
    rank: usize,
}

impl WorkerComputable for Sender {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        let told: f64 = ctx.messages::<Share>()?.iter().map(|m| m.1).sum();
        std::hint::black_box(told);
        let other = 1 - self.rank;
        let start = other as u64 * VERTICES;
        // A stride prime to the range's size visits every vertex in a scattered order.
        ctx.send_all((0..SENT).map(|i| {
            let vertex = start + (i * 7_919) % VERTICES;
            (other, (vertex as u32, 1.0))
        }))?;
        Ok(0)
    }
}

#[derive(Clone, Copy)]
enum Way {
    InMemory,
    Encoded,
    EncodedUncombined,
}

/// The measured supersteps' time.
fn supersteps(way: Way, iters: u64) -> Duration {
    let job = Job::builder(Fold, |rank| Sender { rank })
        .workers(2)
        .iterations(iters + WARMUP)
        .report_iterations((iters + WARMUP) as usize)
        .transport(MemoryTransport::new().wire_check(!matches!(way, Way::InMemory)));
    let job = match way {
        Way::EncodedUncombined => job.messages::<Share>(),
        _ => job.combine_messages(|m: &Share| m.0, |into, m| into.1 += m.1),
    };
    measured(&job.run().expect("the job runs"))
}

fn per_message(c: &mut Criterion) {
    let mut group = c.benchmark_group("messages");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(2 * SENT));
    for (name, way) in [
        ("in_memory", Way::InMemory),
        ("encoded", Way::Encoded),
        ("encoded_uncombined", Way::EncodedUncombined),
    ] {
        group.bench_with_input(BenchmarkId::new(name, 2), &way, |b, &way| {
            b.iter_custom(|iters| supersteps(way, iters))
        });
    }
    group.finish();
}

criterion_group!(benches, per_message);
criterion_main!(benches);
