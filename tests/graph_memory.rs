//! What a graph job holds of its messages in one process, counted by a global allocator
//! that keeps the most bytes live at once (one test in this binary, so nothing else
//! counts): a worker holds one buffer of the messages it sends a superstep, not one to
//! read and another to send into.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use superstep::graph::{Context, GraphInfo, GraphJob, Messages, Vertex, VertexProgram};
use superstep::transport::MemoryTransport;
use superstep::BoxError;

/// The system allocator, counting the bytes live and the most live at once.
struct Peak;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static MOST: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    MOST.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Both live while the bytes are copied.
        grew(new_size);
        let moved = System.realloc(ptr, layout, new_size);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        moved
    }
}

#[global_allocator]
static HEAP: Peak = Peak;

/// Each vertex sends its value to its one neighbour, which sums what it hears.
struct Pass;

impl VertexProgram for Pass {
    type Id = u32;
    type Value = f64;
    type Edge = ();
    type Message = f64;
    type Aggregate = ();

    fn initial(&self, id: u32, _: &GraphInfo) -> f64 {
        f64::from(id)
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        heard: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        if ctx.superstep() == STEADY && vertex.id() == 0 {
            // From here on, the most live counts the supersteps after their buffers grew.
            MOST.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let sum: f64 = heard.sum();
        *vertex.value_mut() += sum;
        ctx.send_to_neighbours(vertex, 1.0)?;
        Ok(())
    }
}

const VERTICES: u32 = 400_000;
/// The superstep from which the buffers have grown: what is live at its start, and after.
const STEADY: u64 = 3;

/// The most bytes live from superstep [`STEADY`] of a job of two workers in one process on,
/// above those live before the job, where each vertex's one edge goes `shift` ids on: to the other worker's half
/// of the ids (`VERTICES / 2`) or to itself (0).
fn most_live(shift: u32) -> usize {
    let before = LIVE.load(Ordering::Relaxed);
    let outcome = GraphJob::builder(Pass)
        .edges(move |add| {
            for v in 0..VERTICES {
                add(v, (v + shift) % VERTICES, ());
            }
        })
        .vertices(u64::from(VERTICES))
        .combine(|sum, m| *sum += m)
        .max_supersteps(6)
        .keep_values(false)
        .job()
        .workers(2)
        // Batches handed over as they are, not encoded on the way as a check.
        .transport(MemoryTransport::new().wire_check(false))
        .run()
        .expect("the job runs");
    assert_eq!(outcome.result.supersteps, 6);
    MOST.load(Ordering::Relaxed) - before
}

#[test]
fn a_worker_holds_one_buffer_of_the_messages_it_sends() {
    let to_itself = most_live(0);
    let to_the_other = most_live(VERTICES / 2);
    // A superstep's batch of one worker as a vector grows to hold it: half the vertices'
    // messages, each a vertex id and a value.
    let batch = (VERTICES as usize / 2).next_power_of_two() * std::mem::size_of::<(u32, f64)>();
    let messages = to_the_other.saturating_sub(to_itself);
    // Each of the two workers one batch (it is sent, read by the other and sent into
    // again), and room for what else changes hands; four batches when each kept the one
    // it read beside the one it sent into.
    assert!(
        messages <= 3 * batch,
        "messages to the other worker took {messages} bytes more at most than to itself: \
         {:.1} batches of {batch} bytes, where each of two workers holds one",
        messages as f64 / batch as f64
    );
}
