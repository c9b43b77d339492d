//! A global allocator that counts allocations, and a job with trivial compute to count
//! them in: how many heap allocations a round makes, per worker.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use superstep::prelude::*;
use superstep::transport::MemoryTransport;

#[path = "trivial.rs"]
mod trivial;
use trivial::{Echo, Fold};

/// The system allocator, counting every allocation (and reallocation).
pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

/// Allocations so far, in every thread.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// The allocations of an in-memory job of `workers` workers and `iterations` iterations
/// with trivial compute, start to end (wire check off: it encodes, on purpose). Inline,
/// as `Placement::Auto` runs trivial compute in its steady state: under `Auto` a compute
/// held up by a busy machine past the inline threshold moves to the pool for a while, and
/// the hand-offs' allocations would count as the round's.
pub fn job_allocations(workers: usize, iterations: u64) -> u64 {
    let before = allocations();
    Job::builder(Fold, |rank| Echo(rank as u64))
        .workers(workers)
        .iterations(iterations)
        .placement(Placement::Inline)
        .transport(MemoryTransport::new().wire_check(false))
        .run()
        .expect("the job runs");
    allocations() - before
}

/// Heap allocations per worker per round in the steady state: the difference between a
/// job of `long` iterations and one of `short`, over the rounds and workers between.
pub fn per_worker_round(workers: usize, short: u64, long: u64) -> f64 {
    let a = job_allocations(workers, short);
    let b = job_allocations(workers, long);
    (b.saturating_sub(a)) as f64 / ((long - short) as f64 * workers as f64)
}
