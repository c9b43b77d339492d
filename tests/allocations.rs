//! The in-memory round allocates nothing per worker in its steady state, and two things
//! per round: a job of 64 workers allocates per round what one of 1 does (counted by a
//! global allocator; one test in this binary, so nothing else counts).

#[path = "../benches/support/counting.rs"]
mod counting;

#[global_allocator]
static HEAP: counting::Counting = counting::Counting;

#[test]
fn a_round_allocates_nothing_per_worker() {
    let one = counting::per_worker_round(1, 20, 120);
    let many = counting::per_worker_round(64, 20, 120) * 64.0;
    // Per round: what one worker's job allocates, give or take a timer of the event loop.
    assert!(
        many <= one + 2.0,
        "a round of 64 workers makes {many:.1} allocations against {one:.1} with 1 worker: it allocates per worker"
    );
    // And that is two: the master's result (shared with every worker) and the node's
    // yield to its event loop between rounds. The results in rank order and their ranks
    // go in the buffers of the rounds before.
    assert!(
        one <= 2.5,
        "a round makes {one:.1} allocations: more than the master's result and the yield"
    );
}
