//! Heap allocations per worker per round of an in-memory job with trivial compute, counted
//! by a global allocator (exact, where timings on a shared machine are noise). The steady
//! state makes none per worker: what a round allocates (its results in rank order, its
//! report) is per round, and shrinks per worker as workers grow.
//!
//! ```text
//! cargo bench --bench allocations
//! ```

#[path = "support/counting.rs"]
mod counting;

#[global_allocator]
static HEAP: counting::Counting = counting::Counting;

fn main() {
    // `cargo test --benches` runs benches with `--bench` absent: a quick pass then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (short, long) = if quick { (20, 40) } else { (200, 1_200) };
    println!(
        "allocations per worker per round (in memory, trivial compute, {short}→{long} iterations)"
    );
    println!("| workers | per worker per round | per round |");
    println!("|---:|---:|---:|");
    for workers in [1usize, 4, 16, 64, 256, 1024] {
        let per = counting::per_worker_round(workers, short, long);
        println!("| {workers} | {per:.3} | {:.1} |", per * workers as f64);
    }
}
