//! The in-memory round allocates nothing per worker in its steady state: what it
//! allocates is per round, so a job of 64 workers allocates per round about what one of 1
//! does (counted by a global allocator; one test in this binary, so nothing else counts).

#[path = "../benches/support/counting.rs"]
mod counting;

#[global_allocator]
static HEAP: counting::Counting = counting::Counting;

#[test]
fn a_round_allocates_nothing_per_worker() {
    let one = counting::per_worker_round(1, 20, 120);
    let many = counting::per_worker_round(64, 20, 120) * 64.0;
    // Per round: what one worker's job allocates (its results in rank order, its report,
    // the master's result), give or take a timer of the event loop.
    assert!(
        many <= one + 2.0,
        "a round of 64 workers makes {many:.1} allocations against {one:.1} with 1 worker: it allocates per worker"
    );
}
