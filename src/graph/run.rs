//! A vertex program run as a rank-level job: each worker computes its partition's vertices
//! and sends their messages through its mailbox; the master folds the supersteps' counts
//! and aggregates, and ends the job.

use std::cell::RefCell;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::input::{read_shard, Source};
use super::partition::{Owners, Partition, Runs};
use super::slots::Slots;
use super::{
    Context, Ended, Fold, GraphInfo, GraphResult, Incoming, MasterStep, Messages, Partitioner,
    Vertex, VertexId, VertexProgram,
};
use crate::collective::ReduceOp;
use crate::compute::{MasterComputable, MasterContext, Step, WorkerComputable, WorkerContext};
use crate::error::{BoxError, GraphError};
use crate::ids::Rank;
use crate::messages::{all_to_all, mailbox};
use crate::payload::Floats;

/// What every worker and the master of one graph job share: the program and the graph's
/// settings.
pub(crate) struct Shared<P: VertexProgram> {
    pub(crate) program: Arc<P>,
    pub(crate) source: Option<Source<P::Id, P::Edge>>,
    pub(crate) vertices: Option<u64>,
    pub(crate) partitioner: Partitioner,
    pub(crate) combine: Option<Arc<dyn Folds<P::Message>>>,
    pub(crate) aggregate: Option<Fold<P::Aggregate>>,
    pub(crate) max_supersteps: u64,
    pub(crate) keep_values: bool,
    pub(crate) output: Option<Output<P>>,
}

/// Where and how a graph job writes its vertices' values (`GraphBuilder::write_values`).
pub(crate) struct Output<P: VertexProgram> {
    /// Where a rank's part goes.
    pub(crate) part: Arc<dyn Fn(Rank) -> std::path::PathBuf + Send + Sync>,
    pub(crate) line: Arc<LineFn<P>>,
}

/// How a vertex's value is written: its line.
type LineFn<P> =
    dyn Fn(<P as VertexProgram>::Id, &<P as VertexProgram>::Value) -> String + Send + Sync;

impl<P: VertexProgram> Shared<P> {
    /// Whether the job takes an iteration after its last superstep to hand in its values.
    fn collects(&self) -> bool {
        self.keep_values || self.output.is_some()
    }
}

type Result_<P> = GraphResult<
    <P as VertexProgram>::Id,
    <P as VertexProgram>::Value,
    <P as VertexProgram>::Aggregate,
>;
type Part<P> = GraphPart<
    <P as VertexProgram>::Id,
    <P as VertexProgram>::Value,
    <P as VertexProgram>::Aggregate,
>;
type Ctx<P> = WorkerContext<Result_<P>, Part<P>>;
/// A function that calls its argument with each edge.
type Generator<P> = dyn Fn(
        &mut dyn FnMut(
            <P as VertexProgram>::Id,
            <P as VertexProgram>::Id,
            <P as VertexProgram>::Edge,
        ),
    ) + Send
    + Sync;
/// A fold of two values into one, borrowed.
type FoldFn<T> = dyn Fn(&mut T, T) + Send + Sync;

/// How many sends to a rank's own vertices wait to be folded in at once.
const RUN: usize = 4096;

/// A combiner's fold, with the loop that applies it to a run of messages compiled in:
/// one call per run, not per message, and a tight loop that keeps many of its scattered
/// reads in flight.
pub(crate) trait Folds<M>: Send + Sync {
    /// Folds each `(vertex, message)` of `run` into `slots`, by vertex, emptying it.
    fn fold_run(&self, slots: &mut Slots<M>, run: &mut Vec<(u32, M)>);
}

/// [`Folds`] by a closure.
pub(crate) struct ByFold<F>(pub(crate) Arc<F>);

impl<M: Clone, F: Fn(&mut M, M) + Send + Sync> Folds<M> for ByFold<F> {
    fn fold_run(&self, slots: &mut Slots<M>, run: &mut Vec<(u32, M)>) {
        for (i, message) in run.drain(..) {
            slots.fold(i as usize, message, &*self.0);
        }
    }
}

/// A worker's report of a superstep (its job's worker result): its counts and
/// aggregate, and, once the job ended, its vertices' values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(
    serialize = "I: Serialize, V: Serialize, A: Serialize",
    deserialize = "I: serde::de::DeserializeOwned, V: serde::de::DeserializeOwned, A: serde::de::DeserializeOwned"
))]
pub struct GraphPart<I, V, A> {
    active: u64,
    sent: u64,
    aggregate: Option<A>,
    graph: GraphInfo,
    values: Vec<(I, V)>,
}

/// One worker's partition and its vertices' state.
struct State<P: VertexProgram> {
    owners: Owners,
    /// The ids' span the owners were made for, and whether it bounds them.
    span: (u64, bool),
    partition: Partition<P::Id, P::Edge>,
    /// Whether the partition came from files (and so goes in checkpoints).
    read: bool,
    graph: GraphInfo,
    values: Vec<P::Value>,
    halted: Vec<bool>,
    /// With a combiner: by vertex, what this rank sent it in this superstep (read in the
    /// next), and what it reads in this one.
    pending: Slots<P::Message>,
    incoming: Slots<P::Message>,
    /// With a combiner and id ranges: by rank, the messages to its vertices this
    /// superstep, folded as they are sent, for the ranks whose range the edges reach
    /// densely (empty for the others, whose messages go to the mailbox's batch as sent).
    /// Made at the first compute; handed to the mailbox in vertex order after each.
    far: Option<Vec<Slots<P::Message>>>,
    /// Whether the vertices have their initial values.
    started: bool,
}

/// What a checkpoint holds of a worker, as it is saved.
#[derive(Serialize)]
#[serde(bound(serialize = "P::Id: Serialize, P::Edge: Serialize"))]
struct SavedRef<'a, P: VertexProgram> {
    span: (u64, bool),
    graph: GraphInfo,
    values: &'a [P::Value],
    halted: &'a [bool],
    /// With a combiner: by vertex, what this rank sent it for the next superstep (by
    /// place, not as an `Option`, which for a message of `()` would not survive its
    /// encoding).
    pending: Vec<(usize, &'a P::Message)>,
    partition: Option<&'a Partition<P::Id, P::Edge>>,
}

/// What a checkpoint holds of a worker, as it is restored.
#[derive(Deserialize)]
#[serde(bound(
    deserialize = "P::Id: serde::de::DeserializeOwned, P::Edge: serde::de::DeserializeOwned"
))]
struct Saved<P: VertexProgram> {
    span: (u64, bool),
    graph: GraphInfo,
    values: Vec<P::Value>,
    halted: Vec<bool>,
    pending: Vec<(usize, P::Message)>,
    partition: Option<Partition<P::Id, P::Edge>>,
}

/// What a worker that read an edge sends the rank that owns its source (an edge), or its
/// target (that the vertex exists).
#[derive(Serialize, Deserialize)]
enum Record<I, E> {
    Edge(I, I, E),
    Vertex(I),
}

/// A worker of a graph job.
pub(crate) struct GraphWorker<P: VertexProgram> {
    shared: Arc<Shared<P>>,
    /// The run of messages to its own vertices, kept with its capacity.
    local: Vec<(u32, P::Message)>,
    /// By rank, the run of messages to its vertices folded where they are sent.
    far_runs: Vec<Vec<(u32, P::Message)>>,
    /// The job's workers (from `init`).
    workers: usize,
    state: Option<State<P>>,
}

impl<P: VertexProgram> GraphWorker<P> {
    pub(crate) fn new(shared: Arc<Shared<P>>) -> Self {
        GraphWorker {
            shared,
            local: Vec::new(),
            far_runs: Vec::new(),
            workers: 1,
            state: None,
        }
    }

    /// Builds this rank's partition from the edges every worker generates.
    fn generate(&self, rank: Rank, workers: usize) -> Result<State<P>, BoxError> {
        let none = |_: &mut dyn FnMut(P::Id, P::Id, P::Edge)| {};
        let generate: &Generator<P> = match &self.shared.source {
            Some(Source::Generated(generate)) => &**generate,
            _ => &none,
        };
        let span = match self.shared.vertices {
            Some(n) => (n, true),
            None if matches!(self.shared.partitioner, Partitioner::Ranges) => {
                let mut most = None::<u64>;
                generate(&mut |u, v, _| {
                    let top = u.to_u64().max(v.to_u64());
                    most = Some(most.map_or(top, |m| m.max(top)));
                });
                (most.map_or(0, |m| m.saturating_add(1)), false)
            }
            None => (0, false),
        };
        let owners = Owners::new(self.shared.partitioner.clone(), workers, span.0, span.1);
        let wrong = RefCell::new(None::<GraphError>);
        let unowned = RefCell::new(None::<GraphError>);
        let range = if span.1 { owners.range(rank) } else { None };
        let owns = |id: P::Id| {
            let id = id.to_u64();
            // Ranges of a known span: a comparison, not a lookup.
            if let Some(range) = &range {
                if id < span.0 {
                    return range.contains(&id);
                }
            }
            match owners.of(id) {
                Ok(r) => r == rank,
                Err(e) => {
                    wrong.borrow_mut().get_or_insert(e);
                    false
                }
            }
        };
        let items = |add: &mut Runs<'_, P::Id, P::Edge>| {
            if span.1 && range.is_none() {
                owned_ids::<P>(&owners, span.0, rank, &unowned, add);
            }
            generate(&mut |u, v, e| {
                if owns(u) {
                    add.push((u, v, Some(e)));
                }
                // Asked of every target, so that one no partition owns is named.
                if owns(v) && !span.1 {
                    add.push((v, v, None));
                }
            })
        };
        let partition = Partition::build(range.clone(), &items)?;
        if let Some(e) = unowned.into_inner() {
            return Err(e.into());
        }
        if let Some(e) = wrong.into_inner() {
            return Err(edge_names(e).into());
        }
        Ok(State::new(owners, span, partition, false))
    }

    /// Reads this rank's shard of the edge list, sends each edge to the rank that owns
    /// its source, and builds its partition from what every rank sent it.
    fn read(
        &self,
        ctx: &mut Ctx<P>,
        parse: fn(Option<&str>) -> Result<P::Edge, String>,
    ) -> Result<State<P>, BoxError> {
        let (rank, workers) = (ctx.rank(), ctx.workers());
        let edges = read_shard::<P::Id, P::Edge>(ctx.shard(), parse);
        // Every rank takes part in the collectives below, the one that failed to read too:
        // its failure is the job's, not a wait of the others' for it.
        let (edges, failed) = match edges {
            Ok(edges) => (edges, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let span = match self.shared.vertices {
            Some(n) => (n, true),
            None => {
                let most = edges
                    .iter()
                    .map(|(u, v, _)| u.to_u64().max(v.to_u64()))
                    .max();
                let mut top = Floats::from(vec![most.map_or(0, |m| m.saturating_add(1))]);
                ctx.all_reduce(&mut top, ReduceOp::Max)?;
                (top[0], false)
            }
        };
        let owners = Owners::new(self.shared.partitioner.clone(), workers, span.0, span.1);
        let mut out: Vec<Vec<Record<P::Id, P::Edge>>> = (0..workers).map(|_| Vec::new()).collect();
        let mut wrong = None;
        for (u, v, e) in edges {
            match (owners.of(u.to_u64()), owners.of(v.to_u64())) {
                (Ok(from), Ok(to)) => {
                    // The target is a vertex too, wherever it is owned.
                    if !span.1 {
                        out[to].push(Record::Vertex(v));
                    }
                    out[from].push(Record::Edge(u, v, e));
                }
                (Err(e), _) | (_, Err(e)) => {
                    wrong.get_or_insert(e);
                }
            }
        }
        let came = all_to_all(ctx, out)?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        if let Some(e) = wrong {
            return Err(edge_names(e).into());
        }
        let range = if span.1 { owners.range(rank) } else { None };
        let wrong = RefCell::new(None::<GraphError>);
        let items = |add: &mut Runs<'_, P::Id, P::Edge>| {
            if span.1 && range.is_none() {
                owned_ids::<P>(&owners, span.0, rank, &wrong, add);
            }
            for record in came.iter().flatten() {
                match record {
                    Record::Edge(u, v, e) => add.push((*u, *v, Some(e.clone()))),
                    Record::Vertex(v) => add.push((*v, *v, None)),
                }
            }
        };
        let partition = Partition::build(range.clone(), &items)?;
        if let Some(e) = wrong.into_inner() {
            return Err(e.into());
        }
        Ok(State::new(owners, span, partition, true))
    }

    /// Writes this rank's vertices' values to its part, a line each, in id order: to a
    /// file beside it first, renamed when whole, so a part is never read half written.
    fn write(&self, output: &Output<P>, rank: Rank) -> Result<(), BoxError> {
        use std::io::Write;
        let part = (output.part)(rank);
        let mut temp = part.clone().into_os_string();
        temp.push(".tmp");
        let failed =
            |e: std::io::Error| format!("writing rank {rank}'s values to {}: {e}", part.display());
        let mut out = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&temp).map_err(failed)?,
        );
        if let Some(state) = &self.state {
            for i in 0..state.partition.len() {
                let line = (output.line)(state.partition.id(i), &state.values[i]);
                out.write_all(line.as_bytes()).map_err(failed)?;
                out.write_all(b"\n").map_err(failed)?;
            }
        }
        let file = out.into_inner().map_err(|e| failed(e.into_error()))?;
        file.sync_all().map_err(failed)?;
        std::fs::rename(&temp, &part).map_err(failed)?;
        Ok(())
    }

    /// The job's values of this rank's vertices, for the job's result.
    fn values(&self) -> Vec<(P::Id, P::Value)> {
        let Some(state) = &self.state else {
            return Vec::new();
        };
        (0..state.partition.len())
            .map(|i| (state.partition.id(i), state.values[i].clone()))
            .collect()
    }
}

/// Gives `add` each id of `0..vertices` that `rank` owns; an id the partitioner gives no
/// rank of the job goes in `wrong`.
fn owned_ids<P: VertexProgram>(
    owners: &Owners,
    vertices: u64,
    rank: Rank,
    wrong: &RefCell<Option<GraphError>>,
    add: &mut Runs<'_, P::Id, P::Edge>,
) {
    for id in 0..vertices {
        let Some(vertex) = P::Id::from_u64(id) else {
            return;
        };
        match owners.of(id) {
            Ok(r) if r == rank => add.push((vertex, vertex, None)),
            Ok(_) => {}
            Err(e) => {
                wrong.borrow_mut().get_or_insert(e);
            }
        }
    }
}

/// An edge's end that no partition owns, named as the edge's.
fn edge_names(e: GraphError) -> GraphError {
    said(e, "an edge names it")
}

/// A vertex a message was sent to that no partition owns, named as the message's.
#[cold]
fn sent_to(e: GraphError) -> GraphError {
    said(e, "a message was sent to it")
}

/// `e`, saying what named its vertex.
fn said(e: GraphError, what: &str) -> GraphError {
    match e {
        GraphError::NoSuchVertex { vertex, why } => GraphError::NoSuchVertex {
            vertex,
            why: format!("{what}, but {why}"),
        },
        other => other,
    }
}

impl<P: VertexProgram> State<P> {
    fn new(
        owners: Owners,
        span: (u64, bool),
        partition: Partition<P::Id, P::Edge>,
        read: bool,
    ) -> Self {
        State {
            owners,
            span,
            partition,
            read,
            graph: GraphInfo::default(),
            values: Vec::new(),
            halted: Vec::new(),
            pending: Slots::default(),
            incoming: Slots::default(),
            far: None,
            started: false,
        }
    }
}

impl<P: VertexProgram> WorkerComputable for GraphWorker<P> {
    type MasterResult = Result_<P>;
    type WorkerResult = Part<P>;

    fn init(&mut self, ctx: &mut Ctx<P>) -> Result<(), BoxError> {
        self.workers = ctx.workers();
        if !matches!(self.shared.source, Some(Source::Files { .. })) {
            self.state = Some(self.generate(ctx.rank(), ctx.workers())?);
        }
        Ok(())
    }

    fn compute(&mut self, ctx: &mut Ctx<P>) -> Result<Part<P>, BoxError> {
        let last = ctx.last_master_result();
        if last.is_some_and(|r| r.collect) {
            if let Some(output) = &self.shared.output {
                self.write(output, ctx.rank())?;
            }
            let values = if self.shared.keep_values {
                self.values()
            } else {
                Vec::new()
            };
            // Handed in as this rank's result, in one frame where ranks reach the master's
            // node over the network (over TCP every rank does, its own process's too):
            // said here, with what to do, rather than as a frame refused.
            if let Some(limit) = ctx.max_piece().filter(|_| !values.is_empty()) {
                let bytes = crate::codec::encoded_len(&values);
                if bytes > limit {
                    return Err(GraphError::ValuesTooLarge {
                        rank: ctx.rank(),
                        vertices: values.len() as u64,
                        bytes: bytes as u64,
                        limit: limit as u64,
                    }
                    .into());
                }
            }
            return Ok(GraphPart {
                active: 0,
                sent: 0,
                aggregate: None,
                graph: self.state.as_ref().map(|s| s.graph).unwrap_or_default(),
                values,
            });
        }
        let aggregated = last.map(|r| r.aggregated.clone()).unwrap_or_default();
        let superstep = ctx.iteration() - 1;
        if self.state.is_none() {
            let Some(Source::Files { parse, .. }) = &self.shared.source else {
                return Err("a graph worker computes without its partition".into());
            };
            let parse = *parse;
            self.state = Some(self.read(ctx, parse)?);
        }
        let combines = self.shared.combine.is_some();
        let Some(state) = self.state.as_mut() else {
            return Err("a graph worker computes without its partition".into());
        };
        if !state.started {
            let n = state.partition.len();
            let mut totals = Floats::from(vec![n as u64, state.partition.targets.len() as u64]);
            ctx.all_reduce(&mut totals, ReduceOp::Sum)?;
            state.graph = GraphInfo {
                vertices: totals[0],
                edges: totals[1],
            };
            let program = &self.shared.program;
            state.values = (0..n)
                .map(|i| program.initial(state.partition.id(i), &state.graph))
                .collect();
            state.halted = vec![false; n];
            if combines {
                (state.pending, state.incoming) = (Slots::new(n), Slots::new(n));
            }
            state.started = true;
        }
        let rank = ctx.rank();
        if combines && state.far.is_none() {
            // Only where messages leave the process: in one process a batch is handed
            // over as it is, and its receiver folds it as cheaply as its sender would.
            state.far = Some(if ctx.peers_take_values() {
                Vec::new()
            } else {
                far_slots(&state.owners, &state.partition, rank)
            });
        }
        let mail = mailbox::<_, _, (P::Id, P::Message)>(ctx)?;
        let mut inbox = mail.take_inbox();
        let State {
            owners,
            partition,
            graph,
            values,
            halted,
            pending,
            incoming,
            far,
            ..
        } = state;
        // What came: with a combiner, folded into this rank's own; without, in id order
        // (a stable sort keeps each vertex's in its senders' order).
        let mut stray = Stray::new();
        let mut local = std::mem::take(&mut self.local);
        if let Some(folds) = &self.shared.combine {
            std::mem::swap(pending, incoming);
            for (id, message) in inbox.drain(..) {
                match partition.locate(id) {
                    Some(i) => {
                        local.push((i as u32, message));
                        if local.len() == RUN {
                            folds.fold_run(incoming, &mut local);
                        }
                    }
                    None => stray.add(id),
                }
            }
            folds.fold_run(incoming, &mut local);
            // Read: its buffer is this superstep's to send into.
            mail.give_back(std::mem::take(&mut inbox));
        } else {
            inbox.sort_by_key(|(id, _)| *id);
        }
        let mut far_runs = std::mem::take(&mut self.far_runs);
        far_runs.resize_with(far.as_ref().map_or(0, Vec::len), Vec::new);
        let post = Post::<P> {
            rank,
            owners,
            partition,
            out: mail.batches(),
            pending: combines.then_some(&mut *pending),
            combine: self.shared.combine.as_deref(),
            local,
            far: far.as_deref_mut().filter(|far| !far.is_empty()),
            far_runs,
            aggregate: self.shared.aggregate.as_deref(),
            aggregating: None,
            sent: 0,
            remote: 0,
        };
        let mut cx = Context {
            superstep,
            graph: *graph,
            aggregated: &aggregated,
            post,
        };
        let (mut active, mut at) = (0u64, 0usize);
        let program = &*self.shared.program;
        for i in 0..partition.len() {
            let id = partition.id(i);
            let messages = if combines {
                Incoming::One(incoming.get(i))
            } else {
                while inbox.get(at).is_some_and(|(to, _)| *to < id) {
                    stray.add(inbox[at].0);
                    at += 1;
                }
                let from = at;
                while inbox.get(at).is_some_and(|(to, _)| *to == id) {
                    at += 1;
                }
                Incoming::Run(inbox[from..at].iter())
            };
            let woken = match &messages {
                Incoming::One(one) => one.is_some(),
                Incoming::Run(run) => run.len() > 0,
            };
            if halted[i] && !woken {
                continue;
            }
            let edges = partition.offsets[i]..partition.offsets[i + 1];
            let mut vertex = Vertex::<P> {
                id,
                value: &mut values[i],
                targets: &partition.targets[edges.clone()],
                edges: &partition.values[edges],
                halt: false,
            };
            program.compute(&mut vertex, Messages { inner: messages }, &mut cx)?;
            halted[i] = vertex.halt;
            active += u64::from(!vertex.halt);
        }
        // Every message read: none is kept for the superstep after.
        incoming.clear();
        for (to, _) in inbox.get(at..).unwrap_or_default() {
            stray.add(*to);
        }
        if let Some(first) = stray.first {
            return Err(GraphError::NotInPartition {
                vertex: first.to_string(),
                rank,
                count: stray.count,
            }
            .into());
        }
        let mut post = cx.post;
        if let (Some(folds), Some(pending)) = (post.combine, post.pending.as_deref_mut()) {
            folds.fold_run(pending, &mut post.local);
        }
        if let (Some(folds), Some(far)) = (post.combine, post.far.as_deref_mut()) {
            // Each rank's messages, folded, into its batch in vertex order.
            for (to, slots) in far.iter_mut().enumerate() {
                folds.fold_run(slots, &mut post.far_runs[to]);
                let start = post.owners.range(to).map_or(0, |r| r.start);
                for (i, message) in slots.iter() {
                    let id = P::Id::from_u64(start + i as u64).unwrap_or_else(|| {
                        unreachable!("a far slot stands for an id of the range")
                    });
                    post.out[to].push((id, message.clone()));
                }
                slots.clear();
            }
        }
        self.local = post.local;
        self.far_runs = post.far_runs;
        let (sent, remote, aggregate) = (post.sent, post.remote, post.aggregating);
        let mail = mailbox::<_, _, (P::Id, P::Message)>(ctx)?;
        mail.count_sent(remote);
        for (to, _) in far
            .iter()
            .flatten()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
        {
            mail.mark_folded(to);
        }
        mail.give_back(inbox);
        Ok(GraphPart {
            active,
            sent,
            aggregate,
            graph: *graph,
            values: Vec::new(),
        })
    }

    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        let Some(state) = &self.state else {
            return Ok(Vec::new());
        };
        let saved = SavedRef::<P> {
            span: state.span,
            graph: state.graph,
            values: &state.values,
            halted: &state.halted,
            pending: state.pending.iter().collect(),
            partition: state.read.then_some(&state.partition),
        };
        Ok(crate::codec::to_vec(&saved)?)
    }

    fn restore_state(&mut self, bytes: &[u8]) -> Result<(), BoxError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let saved: Saved<P> = crate::codec::from_slice(bytes)?;
        let state = match (saved.partition, self.state.take()) {
            (Some(mut partition), _) => {
                partition.index();
                // The owners as the partition was read with.
                let owners = Owners::new(
                    self.shared.partitioner.clone(),
                    self.workers,
                    saved.span.0,
                    saved.span.1,
                );
                State::new(owners, saved.span, partition, true)
            }
            (None, Some(state)) => state,
            (None, None) => {
                return Err("a graph worker's checkpoint holds no edges to restore from".into())
            }
        };
        if state.partition.len() != saved.values.len() {
            return Err(format!(
                "the checkpoint holds {} vertices for this rank, but its partition has {}: \
                 was it taken with another number of workers?",
                saved.values.len(),
                state.partition.len()
            )
            .into());
        }
        let mut state = state;
        state.graph = saved.graph;
        state.values = saved.values;
        state.halted = saved.halted;
        let n = state.values.len();
        let places = if self.shared.combine.is_some() { n } else { 0 };
        (state.pending, state.incoming) = (Slots::new(places), Slots::new(places));
        for (i, message) in saved.pending {
            if i >= places {
                return Err(format!(
                    "the checkpoint holds a message for vertex {i} of this rank's {places}"
                )
                .into());
            }
            state.pending.fold(i, message, |into, m| *into = m);
        }
        state.started = true;
        self.state = Some(state);
        Ok(())
    }
}

/// By rank, a place for a message per vertex of its range, for the ranks whose range this
/// partition's edges reach densely — with at least half as many edges as the range has
/// vertices (and 64 Ki more) — so that the places cost no more than the messages would;
/// empty for the others, and for all without id ranges.
fn far_slots<I: VertexId, E: Clone, M: Clone>(
    owners: &Owners,
    partition: &Partition<I, E>,
    rank: Rank,
) -> Vec<Slots<M>> {
    let workers = owners.workers();
    if owners.range(rank).is_none() || workers < 2 {
        return Vec::new();
    }
    let mut edges = vec![0u64; workers];
    for target in &partition.targets {
        if let Ok(to) = owners.of(target.to_u64()) {
            edges[to] += 1;
        }
    }
    (0..workers)
        .map(|to| {
            let len = owners.range(to).map_or(0, |r| r.end - r.start);
            let dense = to != rank && len <= 2 * edges[to] + (1 << 16) && len < u64::from(u32::MAX);
            Slots::new(if dense { len as usize } else { 0 })
        })
        .collect()
}

/// Messages to vertices a partition does not hold: how many, and the first.
struct Stray<I> {
    first: Option<I>,
    count: u64,
}

impl<I> Stray<I> {
    fn new() -> Self {
        Stray {
            first: None,
            count: 0,
        }
    }

    fn add(&mut self, id: I) {
        self.first.get_or_insert(id);
        self.count += 1;
    }
}

/// Where a superstep's sends go: to this rank's own vertices' next messages (with a
/// combiner), or to the mailbox's batch for the rank that owns the vertex.
pub(crate) struct Post<'a, P: VertexProgram> {
    rank: Rank,
    owners: &'a Owners,
    partition: &'a Partition<P::Id, P::Edge>,
    out: &'a mut [Vec<(P::Id, P::Message)>],
    pending: Option<&'a mut Slots<P::Message>>,
    combine: Option<&'a dyn Folds<P::Message>>,
    /// Sends to this rank's own vertices, by place, waiting to be folded in.
    local: Vec<(u32, P::Message)>,
    /// By rank, the messages to its vertices folded as they are sent (see `State::far`).
    far: Option<&'a mut [Slots<P::Message>]>,
    /// Sends to other ranks' vertices, by rank, by place, waiting to be folded in.
    far_runs: Vec<Vec<(u32, P::Message)>>,
    aggregate: Option<&'a FoldFn<P::Aggregate>>,
    /// What this rank's vertices aggregated, from the first value; `None` before it.
    aggregating: Option<P::Aggregate>,
    sent: u64,
    remote: u64,
}

impl<P: VertexProgram> Post<'_, P> {
    #[inline]
    pub(crate) fn send(&mut self, to: P::Id, message: P::Message) -> Result<(), GraphError> {
        let here = self.partition.locate(to);
        if let (Some(i), Some(pending), Some(folds)) =
            (here, self.pending.as_deref_mut(), self.combine)
        {
            self.local.push((i as u32, message));
            if self.local.len() == RUN {
                folds.fold_run(pending, &mut self.local);
            }
            self.sent += 1;
            return Ok(());
        }
        let owner = match here {
            Some(_) => self.rank,
            None => self.owners.of(to.to_u64()).map_err(sent_to)?,
        };
        if let (Some(far), Some(folds)) = (self.far.as_deref_mut(), self.combine) {
            let slots = &mut far[owner];
            // An id past the range's span (the last rank's, when the span is only the ids
            // the edges name) goes as it is, for its receiver to name.
            let i = to.to_u64().wrapping_sub(self.owners.start(owner));
            if i < slots.len() as u64 {
                let run = &mut self.far_runs[owner];
                run.push((i as u32, message));
                if run.len() == RUN {
                    folds.fold_run(slots, run);
                }
                self.sent += 1;
                self.remote += 1;
                return Ok(());
            }
        }
        self.out[owner].push((to, message));
        self.sent += 1;
        self.remote += 1;
        Ok(())
    }

    pub(crate) fn aggregate(&mut self, value: P::Aggregate) -> Result<(), GraphError> {
        let fold = self.aggregate.ok_or(GraphError::NoAggregator)?;
        match &mut self.aggregating {
            Some(into) => fold(into, value),
            none => *none = Some(value),
        }
        Ok(())
    }
}

/// The master of a graph job.
pub(crate) struct GraphMaster<P: VertexProgram> {
    pub(crate) shared: Arc<Shared<P>>,
}

impl<P: VertexProgram> MasterComputable for GraphMaster<P> {
    type MasterResult = Result_<P>;
    type WorkerResult = Part<P>;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<Result_<P>, Part<P>>,
    ) -> Result<Step<Result_<P>>, BoxError> {
        let supersteps = self.shared.max_supersteps;
        let want = supersteps.saturating_add(1);
        if ctx.iterations() != want {
            let set = ctx.iterations();
            return Err(GraphError::IterationsSet {
                set,
                supersteps,
                want,
            }
            .into());
        }
        if let Some(last) = ctx.last_master_result().filter(|r| r.collect).cloned() {
            // Taken from the workers' parts, not copied: a graph's values may be most of
            // the master's memory.
            let parts = ctx.worker_results_mut();
            let total: usize = parts.iter().map(|p| p.values.len()).sum();
            let mut values: Vec<(P::Id, P::Value)> = Vec::new();
            for part in parts {
                let mut part = std::mem::take(&mut part.values);
                if values.is_empty() {
                    values = part;
                    values.reserve_exact(total - values.len());
                } else {
                    values.append(&mut part);
                }
            }
            if !values.is_sorted_by_key(|(id, _)| *id) {
                values.sort_unstable_by_key(|(id, _)| *id);
            }
            return Ok(Step::Halt(GraphResult {
                collect: false,
                values,
                ..last
            }));
        }
        let parts = ctx.worker_results();
        // From the first value a vertex aggregated, in rank order: a minimum needs no
        // value to start from.
        let mut folded = None::<P::Aggregate>;
        let (mut active, mut messages) = (0, 0);
        for part in parts {
            active += part.active;
            messages += part.sent;
            if let (Some(fold), Some(value)) = (&self.shared.aggregate, &part.aggregate) {
                match &mut folded {
                    Some(into) => fold(into, value.clone()),
                    none => *none = Some(value.clone()),
                }
            }
        }
        let mut aggregated = folded.unwrap_or_default();
        let graph = parts.first().map(|p| p.graph).unwrap_or_default();
        let superstep = ctx.iteration() - 1;
        let mut step = MasterStep::<P> {
            superstep,
            aggregated: &mut aggregated,
            active,
            messages,
            graph,
            halt: false,
        };
        self.shared.program.master_compute(&mut step)?;
        let ended = if step.halt {
            Some(Ended::ByMaster)
        } else if active == 0 && messages == 0 {
            Some(Ended::Halted)
        } else if superstep + 1 >= self.shared.max_supersteps {
            Some(Ended::MaxSupersteps)
        } else {
            None
        };
        let result = GraphResult {
            supersteps: superstep + 1,
            aggregated,
            active,
            messages,
            graph,
            ended,
            collect: ended.is_some() && self.shared.collects(),
            values: Vec::new(),
        };
        Ok(match ended {
            Some(_) if !self.shared.collects() => Step::Halt(result),
            _ => Step::Continue(result),
        })
    }
}
