//! Vertex programs (`superstep::graph`) as a Giraph or GraphX user relies on them: the
//! same values whatever the partitioner, the workers or the input's form; a halted vertex
//! computed again only when a message wakes it; aggregators read a superstep later;
//! checkpoints that hold the vertices without code of the program's; and errors that name
//! the vertex, the file and the line.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use superstep::checkpoint::MemoryCheckpointStore;
use superstep::coordinator::Input;
use superstep::graph::{
    Context, Ended, GraphError, GraphInfo, GraphJob, Messages, Partitioner, Vertex, VertexProgram,
};
use superstep::transport::MemoryTransport;
use superstep::{BoxError, FailurePolicy};

/// Label propagation: each vertex ends with the least id of its component.
struct Components;

impl VertexProgram for Components {
    type Id = u64;
    type Value = u64;
    type Edge = ();
    type Message = u64;
    type Aggregate = ();

    fn initial(&self, id: u64, _: &GraphInfo) -> u64 {
        id
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        heard: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        let least = heard.copied().min().unwrap_or(u64::MAX);
        if ctx.superstep() == 0 || least < *vertex.value() {
            vertex.set_value(least.min(*vertex.value()));
            ctx.send_to_neighbours(vertex, *vertex.value())?;
        }
        vertex.vote_to_halt();
        Ok(())
    }
}

/// A graph of sparse ids: rings of different sizes, ids spread out, one isolated pair.
fn edges() -> Vec<(u64, u64)> {
    let mut edges = Vec::new();
    for (ring, len) in [(0u64, 7u64), (1, 3), (2, 12)] {
        let id = |i: u64| 1_000 * ring + 17 * i + 5;
        for i in 0..len {
            edges.push((id(i), id((i + 1) % len)));
        }
    }
    edges.push((900_000, 900_001));
    edges
}

/// Each vertex's component, computed by following edges in one thread.
fn expected() -> Vec<(u64, u64)> {
    let mut label = std::collections::BTreeMap::new();
    for (u, v) in edges() {
        label.insert(u, u);
        label.insert(v, v);
    }
    loop {
        let mut changed = false;
        for (u, v) in edges() {
            let least = label[&u].min(label[&v]);
            for w in [u, v] {
                if label[&w] != least {
                    label.insert(w, least);
                    changed = true;
                }
            }
        }
        if !changed {
            return label.into_iter().collect();
        }
    }
}

fn both_ways(add: &mut dyn FnMut(u64, u64, ())) {
    for (u, v) in edges() {
        add(u, v, ());
        add(v, u, ());
    }
}

#[test]
fn components_are_the_same_whatever_the_partitioner_the_workers_and_the_combiner() {
    let want = expected();
    for partitioner in [
        Partitioner::Ranges,
        Partitioner::Hash,
        Partitioner::custom(|id, workers| (id as usize / 1_000) % workers),
    ] {
        for workers in [1, 3, 4] {
            for combine in [false, true] {
                let mut graph = GraphJob::builder(Components)
                    .edges(both_ways)
                    .partitioner(partitioner.clone());
                if combine {
                    graph = graph.combine(|least, label| *least = (*least).min(label));
                }
                let outcome = graph.job().workers(workers).run().unwrap();
                let what = format!("{partitioner:?}, {workers} workers, combining {combine}");
                assert_eq!(outcome.result.values(), &want[..], "{what}");
                assert_eq!(outcome.result.ended, Some(Ended::Halted), "{what}");
                assert_eq!(outcome.result.graph.vertices, want.len() as u64, "{what}");
                assert_eq!(
                    outcome.result.graph.edges,
                    2 * edges().len() as u64,
                    "{what}"
                );
                assert_eq!(outcome.result.value(900_001), Some(&900_000));
            }
        }
    }
}

/// Every vertex tells its mirror in the other half of the ids 1 in superstep 0; in
/// superstep 1 vertex 0 alone tells its mirror 100; each vertex ends with the sum of what
/// it heard.
struct Burst {
    half: u32,
}

impl VertexProgram for Burst {
    type Id = u32;
    type Value = u64;
    type Edge = ();
    type Message = u64;
    type Aggregate = ();

    fn initial(&self, _: u32, _: &GraphInfo) -> u64 {
        0
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        heard: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        *vertex.value_mut() += heard.sum::<u64>();
        let mirror = (vertex.id() + self.half) % (2 * self.half);
        match ctx.superstep() {
            0 => ctx.send(mirror, 1)?,
            1 if vertex.id() == 0 => ctx.send(mirror, 100)?,
            _ => {}
        }
        vertex.vote_to_halt();
        Ok(())
    }
}

#[test]
fn a_few_messages_after_many_all_arrive_in_one_process_as_encoded() {
    let half = 1_000;
    for check in [false, true] {
        let outcome = GraphJob::builder(Burst { half })
            .vertices(u64::from(2 * half))
            .job()
            .workers(2)
            // Handed over as they are (as release builds do), or encoded on the way.
            .transport(MemoryTransport::new().wire_check(check))
            .run()
            .unwrap();
        let values = outcome.result.values();
        assert_eq!(values.len(), 2 * half as usize);
        for &(id, value) in values {
            let want = if id == half { 101 } else { 1 };
            assert_eq!(value, want, "vertex {id}, wire check {check}");
        }
    }
}

/// Counts how often each vertex computes: vertex 0 tells vertex 1 something in every
/// superstep up to the fifth; every other vertex votes to halt at once.
struct Wakes {
    fail_once: Arc<AtomicBool>,
}

impl VertexProgram for Wakes {
    type Id = u32;
    type Value = u32;
    type Edge = ();
    type Message = u32;
    /// How many vertices computed in a superstep.
    type Aggregate = u64;

    fn initial(&self, _: u32, _: &GraphInfo) -> u32 {
        0
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        messages: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        if ctx.superstep() == 4 && self.fail_once.swap(false, Ordering::SeqCst) {
            return Err("a worker lost in superstep 4".into());
        }
        *vertex.value_mut() += 1;
        ctx.aggregate(1)?;
        // What was aggregated is what computed in the superstep before.
        if ctx.superstep() > 0 {
            let before = match ctx.superstep() {
                1 => 5,
                2..=6 => 2,
                _ => 1,
            };
            if *ctx.aggregated() != before {
                return Err(format!(
                    "superstep {} read {} computes of the one before",
                    ctx.superstep(),
                    ctx.aggregated()
                )
                .into());
            }
        }
        if vertex.id() == 1 && ctx.superstep() > 0 && messages.len() != 1 {
            return Err("vertex 1 computed without its message".into());
        }
        if vertex.id() == 0 && ctx.superstep() < 5 {
            ctx.send(1, 7)?;
        } else if vertex.id() != 0 {
            vertex.vote_to_halt();
        }
        Ok(())
    }
}

#[test]
fn a_halted_vertex_computes_again_only_when_a_message_wakes_it_and_aggregates_are_read_a_superstep_later(
) {
    let outcome = GraphJob::builder(Wakes {
        fail_once: Arc::new(AtomicBool::new(false)),
    })
    .vertices(5)
    .aggregate(|sum, n| *sum += n)
    .max_supersteps(8)
    .job()
    .workers(2)
    .run()
    .unwrap();
    // Vertex 0 never halts: the job runs to its most supersteps.
    let result = &outcome.result;
    assert_eq!(result.values(), &[(0, 8), (1, 6), (2, 1), (3, 1), (4, 1)]);
    assert_eq!(result.ended, Some(Ended::MaxSupersteps));
    assert_eq!(result.supersteps, 8);
    assert_eq!(
        result.aggregated, 1,
        "only vertex 0 computed in the last superstep"
    );
}

#[test]
fn a_job_resumed_from_a_checkpoint_keeps_each_vertex_s_value_halt_vote_and_messages() {
    let fault_free = GraphJob::builder(Wakes {
        fail_once: Arc::new(AtomicBool::new(false)),
    })
    .vertices(5)
    .aggregate(|sum, n| *sum += n)
    .max_supersteps(8)
    .job()
    .workers(2)
    .run()
    .unwrap();
    for combine in [false, true] {
        let mut graph = GraphJob::builder(Wakes {
            fail_once: Arc::new(AtomicBool::new(true)),
        })
        .vertices(5)
        .aggregate(|sum, n| *sum += n)
        .max_supersteps(8);
        if combine {
            // Vertex 0's message to vertex 1, in its own partition, waits in the worker.
            graph = graph.combine(|into, m| *into += m);
        }
        let recovered = graph
            .job()
            .workers(2)
            .checkpoint(MemoryCheckpointStore::new(), 2)
            .failure_policy(FailurePolicy::RestartAll { max_attempts: 2 })
            .run()
            .unwrap();
        assert_eq!(
            recovered.result.values(),
            fault_free.result.values(),
            "combining {combine}"
        );
        assert_eq!(
            recovered.report.recovered, 1,
            "the failure in superstep 4 was recovered from"
        );
    }
}

/// Sends to a vertex past the graph's.
struct Astray;

impl VertexProgram for Astray {
    type Id = u64;
    type Value = ();
    type Edge = ();
    type Message = ();
    type Aggregate = ();

    fn initial(&self, _: u64, _: &GraphInfo) {}

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        _: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        if vertex.id() == 2 {
            ctx.send(12, ())?;
        }
        Ok(())
    }
}

#[test]
fn a_message_to_a_vertex_no_partition_owns_fails_the_job_naming_it() {
    let err = GraphJob::builder(Astray)
        .vertices(10)
        .job()
        .workers(3)
        .run()
        .unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains(
            "no partition owns vertex 12: a message was sent to it, but the graph's vertices are 0 to 9"
        ),
        "{said}"
    );
    // Ids below the span that no edge names: the rank that would own one says so.
    let err = GraphJob::builder(Astray)
        .edges(|add| add(2, 20, ()))
        .job()
        .workers(2)
        .run()
        .unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains("message(s) to vertex 12, which rank 1's partition does not hold"),
        "{said}"
    );
    // Past the ids the edges name, with a combiner: encoded on the way (the wire check),
    // messages to another rank's range are folded where they are sent, but not this one.
    for check in [true, false] {
        let err = GraphJob::builder(Astray)
            .edges(|add| add(2, 5, ()))
            .combine(|_, _| {})
            .job()
            .workers(2)
            .transport(MemoryTransport::new().wire_check(check))
            .run()
            .unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("message(s) to vertex 12, which rank 1's partition does not hold"),
            "wire check {check}: {said}"
        );
    }
}

#[test]
fn an_aggregate_without_an_aggregator_fails_rather_than_being_lost() {
    let err = GraphJob::builder(Wakes {
        fail_once: Arc::new(AtomicBool::new(false)),
    })
    .vertices(3)
    .job()
    .workers(1)
    .run()
    .unwrap_err();
    assert!(
        err.to_string().contains("the job declares no aggregator"),
        "{err}"
    );
}

fn edge_file(dir: &std::path::Path, name: &str, lines: &[String]) -> std::path::PathBuf {
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).unwrap();
    writeln!(file, "# source target").unwrap();
    for line in lines {
        writeln!(file, "{line}").unwrap();
    }
    path
}

#[test]
fn an_edge_list_in_one_file_or_several_gives_what_generated_edges_give() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = edges()
        .iter()
        .flat_map(|&(u, v)| [format!("{u}\t{v}"), format!("{v} {u}")])
        .collect();
    let one = edge_file(dir.path(), "all.txt", &lines);
    let (a, b) = lines.split_at(lines.len() / 3);
    let several = vec![
        edge_file(dir.path(), "a.txt", a),
        edge_file(dir.path(), "b.txt", b),
    ];
    for input in [
        Input::Lines {
            path: one,
            header: false,
        },
        Input::Files(several),
    ] {
        for workers in [1, 3] {
            let outcome = GraphJob::builder(Components)
                .edge_list(input.clone())
                .combine(|least, label| *least = (*least).min(label))
                .job()
                .workers(workers)
                .run()
                .unwrap();
            assert_eq!(
                outcome.result.values(),
                &expected()[..],
                "{input:?}, {workers} workers"
            );
        }
    }
}

#[test]
fn a_malformed_edge_line_fails_the_job_naming_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        "1 2".to_string(),
        "2 3".to_string(),
        "3 four".to_string(),
        "4 1".to_string(),
    ];
    let path = edge_file(dir.path(), "bad.txt", &lines);
    for workers in [1, 2] {
        let err = GraphJob::builder(Components)
            .edge_list(Input::Lines {
                path: path.clone(),
                header: false,
            })
            .job()
            .workers(workers)
            .run()
            .unwrap_err();
        let said = err.to_string();
        let want = format!(
            "{}, line 4: the target \"four\" is not a vertex id",
            path.display()
        );
        assert!(said.contains(&want), "{said}");
    }
    let source = GraphError::MalformedEdge {
        path: path.clone(),
        line: 4,
        why: "x".into(),
    };
    assert_eq!(source.to_string(), format!("{}, line 4: x", path.display()));
}

/// Halts by its master after the third superstep.
struct ThreeSupersteps;

impl VertexProgram for ThreeSupersteps {
    type Id = u32;
    type Value = u64;
    type Edge = ();
    type Message = ();
    type Aggregate = ();

    fn initial(&self, _: u32, _: &GraphInfo) -> u64 {
        0
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        _: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        vertex.set_value(ctx.superstep());
        Ok(())
    }

    fn master_compute(
        &self,
        master: &mut superstep::graph::MasterStep<'_, Self>,
    ) -> Result<(), BoxError> {
        if master.superstep() == 2 {
            master.halt();
        }
        Ok(())
    }
}

#[test]
fn the_program_s_master_compute_halts_the_job() {
    let outcome = GraphJob::builder(ThreeSupersteps)
        .vertices(4)
        .job()
        .workers(2)
        .run()
        .unwrap();
    assert_eq!(outcome.result.ended, Some(Ended::ByMaster));
    assert_eq!(outcome.result.values(), &[(0, 2), (1, 2), (2, 2), (3, 2)]);
    let without = GraphJob::builder(ThreeSupersteps)
        .vertices(4)
        .keep_values(false)
        .job()
        .workers(2)
        .run()
        .unwrap();
    assert!(without.result.values().is_empty());
    assert_eq!(without.iterations, 3, "no iteration to hand the values in");
}

/// Each vertex's value is the number of edges that lead to it.
struct InDegree;

impl VertexProgram for InDegree {
    type Id = u64;
    type Value = u64;
    type Edge = ();
    type Message = u64;
    /// The least id plus ten, over every vertex.
    type Aggregate = u64;

    fn initial(&self, _: u64, _: &GraphInfo) -> u64 {
        0
    }

    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        messages: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError> {
        if ctx.superstep() == 0 {
            ctx.send_to_neighbours(vertex, 1)?;
            ctx.aggregate(vertex.id().saturating_add(10))?;
        } else {
            vertex.set_value(messages.sum());
            if *ctx.aggregated() != 10 {
                return Err(
                    format!("the least id plus ten is 10, not {}", ctx.aggregated()).into(),
                );
            }
        }
        vertex.vote_to_halt();
        Ok(())
    }
}

#[test]
fn an_edge_s_target_is_a_vertex_whichever_rank_owns_it_and_the_least_aggregate_is_the_least() {
    let dir = tempfile::tempdir().unwrap();
    // A directed chain: vertex 9 is only ever a target.
    let lines: Vec<String> = (0..9).map(|v| format!("{v} {}", v + 1)).collect();
    let path = edge_file(dir.path(), "chain.txt", &lines);
    let want: Vec<(u64, u64)> = (0..10).map(|v| (v, u64::from(v > 0))).collect();
    for partitioner in [Partitioner::Ranges, Partitioner::Hash] {
        for workers in [1, 3] {
            let job = |graph: superstep::graph::GraphBuilder<InDegree>| {
                graph
                    .partitioner(partitioner.clone())
                    .combine(|sum, n| *sum += n)
                    .aggregate(|least, id| *least = (*least).min(id))
                    .job()
                    .workers(workers)
                    .run()
                    .unwrap()
            };
            let read = job(GraphJob::builder(InDegree).edge_list(Input::Files(vec![path.clone()])));
            let made = job(
                GraphJob::builder(InDegree).edges(|add| (0..9).for_each(|v| add(v, v + 1, ())))
            );
            let what = format!("{partitioner:?}, {workers} workers");
            assert_eq!(read.result.values(), &want[..], "read, {what}");
            assert_eq!(made.result.values(), &want[..], "generated, {what}");
        }
    }
}

#[test]
fn the_largest_id_of_its_type_is_a_vertex_like_any_other() {
    let outcome = GraphJob::builder(Components)
        .edges(|add| {
            add(u64::MAX, 3, ());
            add(3, u64::MAX, ());
        })
        .combine(|least, label| *least = (*least).min(label))
        .job()
        .workers(2)
        .run()
        .unwrap();
    assert_eq!(outcome.result.values(), &[(3, 3), (u64::MAX, 3)]);
}

#[test]
fn iterations_set_on_a_graph_job_fail_it_saying_to_set_max_supersteps() {
    let outcome = GraphJob::builder(Components)
        .edges(both_ways)
        .max_supersteps(30)
        .job()
        .iterations(5)
        .run();
    let message = outcome.unwrap_err().to_string();
    assert!(message.contains("not 5"), "{message}");
    assert!(message.contains("31: 30 supersteps"), "{message}");
    assert!(
        message.contains("GraphBuilder::max_supersteps"),
        "{message}"
    );
}

#[test]
fn a_custom_partitioner_that_gives_an_id_no_rank_fails_the_job_naming_the_vertex() {
    let dir = tempfile::tempdir().unwrap();
    let path = edge_file(
        dir.path(),
        "pair.txt",
        &["0 1".to_string(), "1 0".to_string()],
    );
    let outside = || {
        Partitioner::custom(|id, workers| {
            if id == 3 {
                workers
            } else {
                id as usize % workers
            }
        })
    };
    let read = GraphJob::builder(Components)
        .edge_list(Input::Files(vec![path]))
        .vertices(5)
        .partitioner(outside())
        .job()
        .workers(2)
        .run()
        .unwrap_err();
    let made = GraphJob::builder(Components)
        .edges(|add| add(0, 1, ()))
        .vertices(5)
        .partitioner(outside())
        .job()
        .workers(2)
        .run()
        .unwrap_err();
    for err in [read, made] {
        let said = err.to_string();
        assert!(
            said.contains("no partition owns vertex 3: the partitioner gave it rank 2, but the job has 2 worker(s)"),
            "{said}"
        );
    }
}

#[cfg(feature = "pipeline")]
#[test]
fn every_vertex_s_value_is_written_and_merged_into_one_file_when_the_job_ends() {
    use superstep::coordinator::{FileMerge, MergeFormat};
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("components.tsv");
    let merge = FileMerge::new(&target, MergeFormat::Lines);
    let outcome = GraphJob::builder(Components)
        .edges(both_ways)
        .combine(|least, label| *least = (*least).min(label))
        .write_values(merge.staging().clone(), |id, label| {
            format!("{id}\t{label}")
        })
        .keep_values(false)
        .job()
        .workers(3)
        .coordinator(merge)
        .run()
        .unwrap();
    assert!(outcome.result.values().is_empty(), "kept only in the file");
    let want: String = expected()
        .iter()
        .map(|(id, label)| format!("{id}\t{label}\n"))
        .collect();
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        want,
        "ranges: in id order"
    );
    assert!(
        !dir.path().join("components.tsv.parts").exists(),
        "the staging directory is removed"
    );
}

/// Five components, vertex i in the one of i % 5, with chords inside each: `n` vertices,
/// `2 n` edges in an edge list, each way; and each vertex's component.
#[cfg(feature = "tcp")]
fn five_components(dir: &std::path::Path, n: u64) -> (std::path::PathBuf, Vec<(u64, u64)>) {
    let lines: Vec<String> = (0..n)
        .flat_map(|i| {
            let chord = (i + 5 * (i * 7_919 % 1_000)) % n;
            [(i, (i + 5) % n), (i, chord)]
        })
        .flat_map(|(u, v)| [format!("{u} {v}"), format!("{v} {u}")])
        .collect();
    let path = edge_file(dir, "edges.txt", &lines);
    (path, (0..n).map(|i| (i, i % 5)).collect())
}

/// Across processes whose frames are small, a graph's edges going to their owners and a
/// superstep's messages travel in several frames, and the values written are those of
/// one process.
#[cfg(all(feature = "tcp", feature = "pipeline"))]
#[test]
fn edges_and_messages_larger_than_a_frame_give_the_values_of_one_process() {
    use superstep::coordinator::{FileMerge, MergeFormat};
    let dir = tempfile::tempdir().unwrap();
    let n = 60_000;
    let (path, want) = five_components(dir.path(), n);
    let want: String = want.iter().map(|(id, c)| format!("{id}\t{c}\n")).collect();
    let workers = 3;
    for combine in [false, true] {
        let target = dir.path().join(format!("components-{combine}.tsv"));
        let path = path.clone();
        let merged = target.clone();
        let outcomes = common::over_tcp_with(
            workers,
            "graph-in-frames",
            |s| s.max_frame = 64 << 10,
            move |_, transport| {
                let merge = FileMerge::new(&merged, MergeFormat::Lines);
                let mut graph = GraphJob::builder(Components)
                    .edge_list(Input::Lines {
                        path: path.clone(),
                        header: false,
                    })
                    .partitioner(Partitioner::Hash)
                    .write_values(merge.staging().clone(), |id, c| format!("{id}\t{c}"))
                    .keep_values(false);
                if combine {
                    graph = graph.combine(|least, label| *least = (*least).min(label));
                }
                graph.job().coordinator(merge).transport(transport).run()
            },
        );
        let mut outcomes = outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|e| panic!("combining {combine}: {e}")));
        let outcome = outcomes.next().unwrap();
        let written = std::fs::read_to_string(&target).unwrap();
        let mut written: Vec<&str> = written.lines().collect();
        written.sort_by_key(|line| line.split('\t').next().unwrap().parse::<u64>().unwrap());
        assert!(written.join("\n") + "\n" == want, "combining {combine}");
        assert_eq!(outcome.result.graph.edges, 4 * n, "combining {combine}");
        let rounds = outcome.report.iterations.iter().map(|r| r.messages.rounds);
        assert!(rounds.max() > Some(1), "combining {combine}: in one frame");
        for other in outcomes {
            assert_eq!(other.result.supersteps, outcome.result.supersteps);
            assert_eq!(other.result.ended, Some(Ended::Halted));
        }
    }
}

/// A rank's values handed in for the job's result must fit one frame to the master's
/// process: more fail the job naming the rank, the sizes and what to do. The master's
/// result, values and all, goes to no other process, so it may be larger.
#[cfg(feature = "tcp")]
#[test]
fn values_over_a_frame_fail_naming_the_rank_and_the_way_out_and_stay_in_the_master_s_process() {
    let dir = tempfile::tempdir().unwrap();
    // About 5 bytes a vertex's value: 15,000 are 75 KB, over a frame of 64 KiB, 5,000 a
    // rank of three fit; 15,000 a rank of two do not.
    for (workers, n) in [(3, 15_000), (2, 30_000)] {
        let (path, want) = five_components(dir.path(), n);
        let outcomes = common::over_tcp_with(
            workers,
            "graph-values",
            |s| s.max_frame = 64 << 10,
            move |_, transport| {
                GraphJob::builder(Components)
                    .edge_list(Input::Files(vec![path.clone()]))
                    .job()
                    .transport(transport)
                    .run()
            },
        );
        if workers == 3 {
            let mut outcomes = outcomes.into_iter().map(Result::unwrap);
            assert_eq!(outcomes.next().unwrap().result.values(), &want[..]);
            for other in outcomes {
                assert!(other.result.values().is_empty());
                assert_eq!(other.result.ended, Some(Ended::Halted));
            }
            continue;
        }
        let message = match &outcomes[0] {
            Err(e) => e.to_string(),
            Ok(_) => panic!("values over a frame were handed in"),
        };
        // Whichever rank came first.
        assert!(
            message.contains("'s 15000 vertices' values are"),
            "{message}"
        );
        assert!(
            message.contains("over the 64512 bytes one frame"),
            "{message}"
        );
        assert!(message.contains("write_values"), "{message}");
    }
}
