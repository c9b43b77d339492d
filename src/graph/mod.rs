//! Graph jobs as Pregel, Giraph and GraphX users write them: a vertex program computes on
//! one vertex at a time — its value, its edges, the messages sent to it in the superstep
//! before — sends messages to vertex ids, and votes to halt.
//!
//! ```
//! use superstep::graph::{Context, GraphJob, Messages, Vertex, VertexProgram, GraphInfo};
//! use superstep::BoxError;
//!
//! /// Connected components: each vertex ends with the least id of its component.
//! struct Components;
//!
//! impl VertexProgram for Components {
//!     type Id = u32;
//!     type Value = u32;
//!     type Edge = ();
//!     type Message = u32;
//!     type Aggregate = ();
//!
//!     fn initial(&self, id: u32, _: &GraphInfo) -> u32 {
//!         id
//!     }
//!
//!     fn compute(
//!         &self,
//!         vertex: &mut Vertex<'_, Self>,
//!         messages: Messages<'_, Self>,
//!         ctx: &mut Context<'_, Self>,
//!     ) -> Result<(), BoxError> {
//!         let least = messages.copied().min().unwrap_or(u32::MAX);
//!         if ctx.superstep() == 0 || least < *vertex.value() {
//!             *vertex.value_mut() = least.min(*vertex.value());
//!             ctx.send_to_neighbours(vertex, *vertex.value())?;
//!         }
//!         vertex.vote_to_halt();
//!         Ok(())
//!     }
//! }
//!
//! // Two components: 0 - 1 - 2 and 3 - 4, each edge both ways.
//! let edges = [(0, 1), (1, 2), (3, 4)];
//! let outcome = GraphJob::builder(Components)
//!     .edges(move |add| {
//!         for (u, v) in edges {
//!             add(u, v, ());
//!             add(v, u, ());
//!         }
//!     })
//!     .combine(|least, label| *least = (*least).min(label))
//!     .job()
//!     .workers(2)
//!     .run()?;
//! assert_eq!(outcome.result.values(), &[(0, 0), (1, 0), (2, 0), (3, 3), (4, 3)]);
//! # Ok::<(), superstep::JobError>(())
//! ```
//!
//! **The superstep.** Superstep 0 computes every vertex with no messages. In each
//! superstep after it, a vertex is computed when it has not voted to halt, or when a
//! message came to it (which wakes it: it must vote again to stay halted). The job ends
//! when every vertex has voted to halt and no message is on its way, when the program's
//! [`master_compute`](VertexProgram::master_compute) halts it, or after
//! [`max_supersteps`](GraphBuilder::max_supersteps); each vertex's value is then in the
//! job's result ([`GraphResult::values`], in id order).
//!
//! **Messages** go to the rank that owns their vertex ([`Partitioner`]: even id ranges by
//! default, a hash, or the user's own), worker to worker, never through the master, as
//! the rank-level messages do ([`WorkerContext::send`](crate::WorkerContext::send), which
//! this layer runs on). With a combiner ([`GraphBuilder::combine`]) a vertex is sent at
//! most one message per superstep: those to one vertex are folded where they are sent —
//! in one process as they are sent, to another process before they leave it — and again as
//! they arrive. A message to a vertex no partition owns fails the superstep naming it
//! ([`GraphError::NoSuchVertex`]).
//!
//! **Aggregators** ([`GraphBuilder::aggregate`]): a value each vertex may add to
//! ([`Context::aggregate`]), folded over every vertex of a superstep and read by every
//! vertex in the next ([`Context::aggregated`]), as Giraph's; the program's
//! `master_compute` sees it between the two, and may change it or halt the job.
//!
//! **Checkpoints** hold every vertex's value and halt vote, and the messages on their way,
//! without code of the program's (with `JobBuilder::checkpoint`); with an edge list read
//! from files, the edges too, which a resumed worker does not read again.
//!
//! **Output.** Every vertex's value is in the job's result ([`GraphResult::values`]), or
//! written, a line a vertex, to the workers' parts of a staging directory
//! ([`GraphBuilder::write_values`], with the `pipeline` feature) that a `FileMerge` or an
//! `AtomicCommit` merges or commits all or nothing.
//!
//! **Input.** A graph is its edges: from a function every worker calls
//! ([`GraphBuilder::edges`]), or edge-list files ([`GraphBuilder::edge_list`]) that each
//! worker reads a shard of, sending each edge to the rank that owns its source. Its
//! vertices are every id an edge names (its source or its target), or, with
//! [`GraphBuilder::vertices`], every id below a count.

mod input;
mod partition;
mod run;
mod slots;

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::coordinator::Input;
use crate::error::BoxError;
use crate::ids::Iteration;
use crate::job::{Job, JobBuilder};
use crate::payload::Payload;

pub use crate::error::GraphError;
pub use input::EdgeValue;
pub use partition::Partitioner;
pub use run::GraphPart;

use input::Source;

/// A vertex id type: `u32` (half the memory per edge) or `u64`.
pub trait VertexId:
    Copy
    + Ord
    + Hash
    + fmt::Debug
    + fmt::Display
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + Unpin
    + 'static
    + sealed::Sealed
{
    /// The id as a whole number.
    fn to_u64(self) -> u64;
    /// The id of a whole number, if it fits.
    fn from_u64(id: u64) -> Option<Self>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

impl VertexId for u32 {
    #[inline]
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
    #[inline]
    fn from_u64(id: u64) -> Option<Self> {
        u32::try_from(id).ok()
    }
}

impl VertexId for u64 {
    #[inline]
    fn to_u64(self) -> u64 {
        self
    }
    #[inline]
    fn from_u64(id: u64) -> Option<Self> {
        Some(id)
    }
}

/// The whole graph's size, as every vertex sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphInfo {
    /// Vertices in all partitions.
    pub vertices: u64,
    /// Edges in all partitions.
    pub edges: u64,
}

/// A vertex program: what one vertex computes in a superstep (Giraph's `Computation`).
/// One instance serves every worker of a process, from several threads at once.
pub trait VertexProgram: Send + Sync + Sized + 'static {
    /// The vertices' id type: `u32` or `u64`.
    type Id: VertexId;
    /// A vertex's value: what the job computes, and ends with.
    type Value: Payload + Clone;
    /// An edge's value (`()` for none; a number for a weight).
    type Edge: Payload + Clone;
    /// What vertices send each other.
    type Message: Serialize + DeserializeOwned + Send + Sync + Clone + 'static;
    /// What vertices aggregate in a superstep (`()` for nothing; see
    /// [`GraphBuilder::aggregate`]); its `Default` is what vertices read when none
    /// aggregated.
    type Aggregate: Payload + Clone + Default;

    /// The value vertex `id` starts with, before superstep 0.
    fn initial(&self, id: Self::Id, graph: &GraphInfo) -> Self::Value;

    /// Computes one vertex in one superstep: reads the messages sent to it in the one
    /// before, changes its value, sends messages, and may vote to halt. An `Err` fails the
    /// worker's compute, naming its rank and the superstep.
    fn compute(
        &self,
        vertex: &mut Vertex<'_, Self>,
        messages: Messages<'_, Self>,
        ctx: &mut Context<'_, Self>,
    ) -> Result<(), BoxError>;

    /// Runs once a superstep, in the master, after every vertex computed and before the
    /// next superstep (Giraph's `MasterCompute`, which runs before a superstep: halting
    /// here after superstep 2 is halting there before superstep 3): reads and may change
    /// what was aggregated, which every vertex reads in the next superstep, and may halt
    /// the job. The default does nothing.
    fn master_compute(&self, master: &mut MasterStep<'_, Self>) -> Result<(), BoxError> {
        let _ = master;
        Ok(())
    }
}

/// One vertex as its compute sees it.
pub struct Vertex<'a, P: VertexProgram> {
    pub(crate) id: P::Id,
    pub(crate) value: &'a mut P::Value,
    pub(crate) targets: &'a [P::Id],
    pub(crate) edges: &'a [P::Edge],
    pub(crate) halt: bool,
}

impl<P: VertexProgram> Vertex<'_, P> {
    /// Its id.
    pub fn id(&self) -> P::Id {
        self.id
    }

    /// Its value.
    pub fn value(&self) -> &P::Value {
        self.value
    }

    /// Its value, to change.
    pub fn value_mut(&mut self) -> &mut P::Value {
        self.value
    }

    /// Sets its value.
    pub fn set_value(&mut self, value: P::Value) {
        *self.value = value;
    }

    /// The targets of its edges, in the order the input gave them.
    pub fn targets(&self) -> &[P::Id] {
        self.targets
    }

    /// Its edges' values, in the order of [`targets`](Self::targets).
    pub fn edge_values(&self) -> &[P::Edge] {
        self.edges
    }

    /// Its edges: each one's target and value.
    pub fn edges(&self) -> impl ExactSizeIterator<Item = (P::Id, &P::Edge)> + '_ {
        self.targets.iter().copied().zip(self.edges)
    }

    /// How many edges it has.
    pub fn degree(&self) -> usize {
        self.targets.len()
    }

    /// Votes to halt: it is not computed again until a message comes to it.
    pub fn vote_to_halt(&mut self) {
        self.halt = true;
    }

    /// Whether it voted to halt in this compute.
    pub fn voted_to_halt(&self) -> bool {
        self.halt
    }
}

/// The messages sent to one vertex in the superstep before: in the order of their
/// senders' ranks, then of their sends; with a combiner, at most one.
pub struct Messages<'a, P: VertexProgram> {
    pub(crate) inner: Incoming<'a, P::Id, P::Message>,
}

pub(crate) enum Incoming<'a, I, M> {
    One(Option<&'a M>),
    Run(std::slice::Iter<'a, (I, M)>),
}

impl<'a, P: VertexProgram> Iterator for Messages<'a, P> {
    type Item = &'a P::Message;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.inner {
            Incoming::One(one) => one.take(),
            Incoming::Run(run) => run.next().map(|(_, m)| m),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.inner {
            Incoming::One(one) => usize::from(one.is_some()),
            Incoming::Run(run) => run.len(),
        };
        (n, Some(n))
    }
}

impl<P: VertexProgram> ExactSizeIterator for Messages<'_, P> {}

/// What a vertex's compute can do beyond its vertex: send messages, aggregate, and know
/// the superstep and the graph.
pub struct Context<'a, P: VertexProgram> {
    pub(crate) superstep: u64,
    pub(crate) graph: GraphInfo,
    pub(crate) aggregated: &'a P::Aggregate,
    pub(crate) post: run::Post<'a, P>,
}

impl<P: VertexProgram> Context<'_, P> {
    /// The superstep, from 0.
    pub fn superstep(&self) -> u64 {
        self.superstep
    }

    /// The whole graph's size.
    pub fn graph(&self) -> &GraphInfo {
        &self.graph
    }

    /// Sends `message` to vertex `to`, which reads it in the next superstep. Fails for a
    /// vertex no partition owns ([`GraphError::NoSuchVertex`]); returned with `?`, that
    /// fails the superstep.
    #[inline]
    pub fn send(&mut self, to: P::Id, message: P::Message) -> Result<(), GraphError> {
        self.post.send(to, message)
    }

    /// Sends `message` along each of `vertex`'s edges, to its targets.
    pub fn send_to_neighbours(
        &mut self,
        vertex: &Vertex<'_, P>,
        message: P::Message,
    ) -> Result<(), GraphError> {
        for &to in vertex.targets {
            self.post.send(to, message.clone())?;
        }
        Ok(())
    }

    /// Adds `value` to this superstep's aggregate, by the job's aggregator
    /// ([`GraphBuilder::aggregate`]; [`GraphError::NoAggregator`] without one).
    pub fn aggregate(&mut self, value: P::Aggregate) -> Result<(), GraphError> {
        self.post.aggregate(value)
    }

    /// What every vertex aggregated in the superstep before (after the program's
    /// `master_compute`); the `Default` in superstep 0.
    pub fn aggregated(&self) -> &P::Aggregate {
        self.aggregated
    }
}

/// What the program's [`master_compute`](VertexProgram::master_compute) sees of a
/// superstep that ended.
pub struct MasterStep<'a, P: VertexProgram> {
    pub(crate) superstep: u64,
    pub(crate) aggregated: &'a mut P::Aggregate,
    pub(crate) active: u64,
    pub(crate) messages: u64,
    pub(crate) graph: GraphInfo,
    pub(crate) halt: bool,
}

impl<P: VertexProgram> MasterStep<'_, P> {
    /// The superstep that ended, from 0.
    pub fn superstep(&self) -> u64 {
        self.superstep
    }

    /// What every vertex aggregated in it; what is left here, every vertex reads in the
    /// next.
    pub fn aggregated(&mut self) -> &mut P::Aggregate {
        self.aggregated
    }

    /// Vertices that did not vote to halt in it.
    pub fn active_vertices(&self) -> u64 {
        self.active
    }

    /// Messages sent in it, to be read in the next (before combining).
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// The whole graph's size.
    pub fn graph(&self) -> &GraphInfo {
        &self.graph
    }

    /// Ends the job after this superstep (Giraph's `haltComputation`).
    pub fn halt(&mut self) {
        self.halt = true;
    }
}

/// Why a graph job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ended {
    /// Every vertex voted to halt and no message was on its way.
    Halted,
    /// The program's `master_compute` halted it.
    ByMaster,
    /// It ran [`max_supersteps`](GraphBuilder::max_supersteps).
    MaxSupersteps,
}

/// What a graph job ends with (its job's master result): every vertex's value, and the
/// last superstep's numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(
    serialize = "I: Serialize, V: Serialize, A: Serialize",
    deserialize = "I: DeserializeOwned, V: DeserializeOwned, A: DeserializeOwned"
))]
pub struct GraphResult<I, V, A> {
    /// Supersteps run.
    pub supersteps: u64,
    /// What the last superstep aggregated (after `master_compute`).
    pub aggregated: A,
    /// Vertices that did not vote to halt in the last superstep.
    pub active: u64,
    /// Messages sent in the last superstep.
    pub messages: u64,
    /// The whole graph's size.
    pub graph: GraphInfo,
    /// Why it ended; `None` while it runs.
    pub ended: Option<Ended>,
    /// The workers hand in their values in the next iteration.
    pub(crate) collect: bool,
    values: Vec<(I, V)>,
}

impl<I: VertexId, V, A> GraphResult<I, V, A> {
    /// Every vertex's value, in id order, in the master's process. Empty while the job
    /// runs, with [`GraphBuilder::keep_values`] off, and in the workers' copy (the
    /// outcome of a process without the master, and what worker interceptors see): the
    /// values stay in the master's process (their size is the graph's), the rest of the
    /// result goes to every worker.
    pub fn values(&self) -> &[(I, V)] {
        &self.values
    }

    /// Vertex `id`'s value.
    pub fn value(&self, id: I) -> Option<&V> {
        let at = self.values.binary_search_by_key(&id, |(i, _)| *i).ok()?;
        Some(&self.values[at].1)
    }

    /// The result as the job's processes without the master get it: all but the values.
    fn without_values(&self) -> Self
    where
        A: Clone,
    {
        GraphResult {
            supersteps: self.supersteps,
            aggregated: self.aggregated.clone(),
            active: self.active,
            messages: self.messages,
            graph: self.graph,
            ended: self.ended,
            collect: self.collect,
            values: Vec::new(),
        }
    }
}

/// The types a graph job runs as: its master result and its workers' results.
pub type GraphJobBuilder<P> = JobBuilder<
    GraphResult<
        <P as VertexProgram>::Id,
        <P as VertexProgram>::Value,
        <P as VertexProgram>::Aggregate,
    >,
    GraphPart<
        <P as VertexProgram>::Id,
        <P as VertexProgram>::Value,
        <P as VertexProgram>::Aggregate,
    >,
>;

/// A fold of two values into one.
type Fold<T> = Arc<dyn Fn(&mut T, T) + Send + Sync>;

/// Makes a graph job: [`GraphJob::builder`].
#[derive(Debug)]
pub struct GraphJob;

impl GraphJob {
    /// A job that runs `program` on every vertex of a graph; give it its edges
    /// ([`edges`](GraphBuilder::edges) or [`edge_list`](GraphBuilder::edge_list)).
    pub fn builder<P: VertexProgram>(program: P) -> GraphBuilder<P> {
        GraphBuilder {
            program: Arc::new(program),
            source: None,
            vertices: None,
            partitioner: Partitioner::default(),
            combine: None,
            aggregate: None,
            max_supersteps: 10_000,
            keep_values: true,
            output: None,
        }
    }
}

/// A graph job's own settings, before the job's ([`job`](Self::job)).
pub struct GraphBuilder<P: VertexProgram> {
    program: Arc<P>,
    source: Option<Source<P::Id, P::Edge>>,
    vertices: Option<u64>,
    partitioner: Partitioner,
    combine: Option<Combining<P>>,
    aggregate: Option<Fold<P::Aggregate>>,
    max_supersteps: u64,
    keep_values: bool,
    output: Option<run::Output<P>>,
}

/// A combiner as a graph job keeps it: its fold with the loops that apply it many times
/// compiled in, and how the job's mailbox folds with it.
struct Combining<P: VertexProgram> {
    folds: Arc<dyn run::Folds<P::Message>>,
    mailbox: Box<dyn FnOnce(GraphJobBuilder<P>) -> GraphJobBuilder<P> + Send + Sync>,
}

impl<P: VertexProgram> GraphBuilder<P> {
    /// The graph's edges, from `edges`: every worker calls it with a function to call for
    /// each edge `(source, target, value)`, and keeps the edges of the vertices it owns.
    /// It is called more than once (two to four times, as the partition is counted and
    /// filled): it must give the same edges every time. An undirected graph gives each
    /// edge both ways.
    pub fn edges(
        mut self,
        edges: impl Fn(&mut dyn FnMut(P::Id, P::Id, P::Edge)) + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Source::Generated(Arc::new(edges)));
        self
    }

    /// The graph's edges, from edge-list files: one edge a line, `source target
    /// [value]`, separated by spaces, tabs or a comma (the value parsed as
    /// [`P::Edge`](VertexProgram::Edge)); empty lines and lines that start with `#` or
    /// `%` are comments. Sharded as the job's input ([`Input::Files`]: whole files;
    /// [`Input::Lines`]: byte ranges of one file); each worker sends the edges it read to
    /// the ranks that own their sources. A malformed line fails the job naming its file
    /// and line ([`GraphError::MalformedEdge`]).
    pub fn edge_list(mut self, input: Input) -> Self
    where
        P::Edge: EdgeValue,
    {
        self.source = Some(Source::Files {
            input,
            parse: <P::Edge as EdgeValue>::parse,
        });
        self
    }

    /// The graph's vertices are every id of `0..vertices`, with edges or without; an
    /// edge or a message naming another is an error that names it.
    pub fn vertices(mut self, vertices: u64) -> Self {
        self.vertices = Some(vertices);
        self
    }

    /// Which rank owns which vertex (even id ranges by default).
    pub fn partitioner(mut self, partitioner: Partitioner) -> Self {
        self.partitioner = partitioner;
        self
    }

    /// Folds the messages to one vertex into one (Giraph's `MessageCombiner`), wherever
    /// they meet: a vertex then reads at most one message a superstep. The fold must be one
    /// the compute cannot tell from reading every message — commutative and associative,
    /// as a minimum or a sum (of floats: up to its last bits).
    pub fn combine(
        mut self,
        fold: impl Fn(&mut P::Message, P::Message) + Send + Sync + 'static,
    ) -> Self {
        let fold = Arc::new(fold);
        let by_key = Arc::clone(&fold);
        self.combine = Some(Combining {
            folds: Arc::new(run::ByFold(fold)),
            mailbox: Box::new(move |job: GraphJobBuilder<P>| {
                // Combined before they leave a process; a worker folds what arrives into
                // its vertices' places itself.
                job.combine_messages_with(
                    |m: &(P::Id, P::Message)| m.0,
                    move |into: &mut (P::Id, P::Message), m| by_key(&mut into.1, m.1),
                    false,
                )
            }),
        });
        self
    }

    /// Folds the values vertices [`aggregate`](Context::aggregate) in a superstep into
    /// one, from the first: in each worker, then every worker's in rank order (the
    /// aggregate's `Default` when no vertex aggregated). Commutative and associative, as a
    /// sum, a minimum or a count.
    pub fn aggregate(
        mut self,
        fold: impl Fn(&mut P::Aggregate, P::Aggregate) + Send + Sync + 'static,
    ) -> Self {
        self.aggregate = Some(Arc::new(fold));
        self
    }

    /// Ends the job after this many supersteps at most (10,000 by default), whatever
    /// its vertices' votes.
    pub fn max_supersteps(mut self, supersteps: u64) -> Self {
        self.max_supersteps = supersteps.max(1);
        self
    }

    /// Whether the job's result holds every vertex's value ([`GraphResult::values`]; on
    /// by default). Handing them in costs the job one iteration after its last superstep.
    pub fn keep_values(mut self, keep: bool) -> Self {
        self.keep_values = keep;
        self
    }

    /// Writes every vertex's value when the job ends, a line per vertex made by `line`
    /// (`"{id}\t{value}"`, say), each worker its vertices in id order to its part in
    /// `staging` (`part-00003.txt` for rank 3). Give the job the coordinator that owns
    /// the staging directory — a `FileMerge` into one file, or an `AtomicCommit` of a
    /// directory of parts — so that the parts are merged or committed all or nothing,
    /// when every worker wrote its part, and removed if the job fails. Handing the
    /// values in costs the job one iteration after its last superstep (the same one as
    /// [`keep_values`](Self::keep_values), which may be turned off).
    ///
    /// ```no_run
    /// # use superstep::graph::{GraphJob, VertexProgram};
    /// # fn job<P: VertexProgram<Id = u32, Value = f64>>(program: P) -> Result<(), superstep::JobError> {
    /// use superstep::coordinator::{FileMerge, MergeFormat};
    /// let merge = FileMerge::new("ranks.tsv", MergeFormat::Lines);
    /// GraphJob::builder(program)
    ///     .write_values(merge.staging().clone(), |id, rank| format!("{id}\t{rank}"))
    ///     .keep_values(false)
    ///     .job()
    ///     .coordinator(merge)
    ///     .run()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "pipeline")]
    pub fn write_values(
        mut self,
        staging: crate::coordinator::Staging,
        line: impl Fn(P::Id, &P::Value) -> String + Send + Sync + 'static,
    ) -> Self {
        self.output = Some(run::Output {
            part: Arc::new(move |rank| staging.part(rank, "txt")),
            line: Arc::new(line),
        });
        self
    }

    /// The job that runs the program, to set as any other (workers, checkpoints, the
    /// cluster…) and run. Its iteration count is the graph's (one set on it fails the job
    /// with [`GraphError::IterationsSet`]). A graph
    /// without edges set has no vertex but those of [`vertices`](Self::vertices).
    pub fn job(self) -> GraphJobBuilder<P> {
        let shared = Arc::new(run::Shared {
            program: self.program,
            source: self.source,
            vertices: self.vertices,
            partitioner: self.partitioner,
            combine: self.combine.as_ref().map(|c| Arc::clone(&c.folds)),
            aggregate: self.aggregate,
            max_supersteps: self.max_supersteps,
            keep_values: self.keep_values,
            output: self.output,
        });
        let master = run::GraphMaster {
            shared: Arc::clone(&shared),
        };
        let input = match &shared.source {
            Some(Source::Files { input, .. }) => Some(input.clone()),
            _ => None,
        };
        let workers = Arc::clone(&shared);
        let mut job = Job::builder(master, move |_| run::GraphWorker::new(Arc::clone(&workers)))
            // The supersteps, and one to hand the values in.
            .iterations(Iteration::from(shared.max_supersteps).saturating_add(1))
            .result_for_worker_processes(GraphResult::without_values);
        job = match self.combine {
            Some(combining) => (combining.mailbox)(job),
            None => job.messages::<(P::Id, P::Message)>(),
        };
        if let Some(input) = input {
            job = job.input(input);
        }
        job
    }
}

impl<P: VertexProgram> fmt::Debug for Vertex<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vertex")
            .field("id", &self.id)
            .field("degree", &self.targets.len())
            .field("halt", &self.halt)
            .finish_non_exhaustive()
    }
}

impl<P: VertexProgram> fmt::Debug for Messages<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Messages")
            .field("len", &self.len())
            .finish()
    }
}

impl<P: VertexProgram> fmt::Debug for Context<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("superstep", &self.superstep)
            .field("graph", &self.graph)
            .finish_non_exhaustive()
    }
}

impl<P: VertexProgram> fmt::Debug for MasterStep<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterStep")
            .field("superstep", &self.superstep)
            .field("active", &self.active)
            .field("messages", &self.messages)
            .field("halt", &self.halt)
            .finish_non_exhaustive()
    }
}

impl<P: VertexProgram> fmt::Debug for GraphBuilder<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphBuilder")
            .field("program", &std::any::type_name::<P>())
            .field("vertices", &self.vertices)
            .field("partitioner", &self.partitioner)
            .field("combines", &self.combine.is_some())
            .field("aggregates", &self.aggregate.is_some())
            .field("max_supersteps", &self.max_supersteps)
            .field("keep_values", &self.keep_values)
            .field("writes_values", &self.output.is_some())
            .finish_non_exhaustive()
    }
}
