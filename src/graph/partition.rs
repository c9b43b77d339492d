//! Which rank owns a vertex, and what one rank holds of the graph: its vertices' ids,
//! their edges packed by vertex, and where a vertex id stands among them.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::VertexId;
use crate::error::GraphError;
use crate::ids::Rank;

/// How vertices are shared among the ranks: each vertex id to one rank, the same in every
/// process. A message to a vertex goes to the rank that owns it.
#[derive(Clone, Default)]
pub enum Partitioner {
    /// Even ranges of ids, in rank order: rank `r` of `n` owns ids
    /// `N × r / n .. N × (r + 1) / n`, where `N` is the vertex count
    /// (`GraphBuilder::vertices`) or one more than the largest id of the graph. Vertices
    /// whose ids are close stay together — the best when neighbours have close ids, as in a
    /// web graph ordered by address.
    #[default]
    Ranges,
    /// By a hash of the id (the same on every platform): even shares whatever the ids.
    Hash,
    /// The user's own: the rank of `workers` that owns a vertex id, given as a whole
    /// number. A rank outside the job is a [`GraphError::NoSuchVertex`] for that vertex.
    Custom(Arc<dyn Fn(u64, usize) -> Rank + Send + Sync>),
}

impl Partitioner {
    /// The user's own partitioner: `owner(id, workers)` is the rank that owns vertex `id`.
    pub fn custom(owner: impl Fn(u64, usize) -> Rank + Send + Sync + 'static) -> Self {
        Partitioner::Custom(Arc::new(owner))
    }
}

impl fmt::Debug for Partitioner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partitioner::Ranges => f.write_str("Ranges"),
            Partitioner::Hash => f.write_str("Hash"),
            Partitioner::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// A partitioner made for one job: the vertex count known, the workers counted.
#[derive(Clone)]
pub(crate) struct Owners {
    way: Partitioner,
    workers: usize,
    /// The ids are `0..vertices` (for ranges: their span).
    vertices: u64,
    /// Whether `vertices` bounds the ids (given by the user), or only spans them.
    bounded: bool,
    /// For ranges: where each rank's range starts, and the end (`workers + 1` bounds).
    bounds: Vec<u64>,
    /// For ranges: ranks per id, to find an id's rank with a product, not a division.
    scale: f64,
}

impl Owners {
    pub(crate) fn new(way: Partitioner, workers: usize, vertices: u64, bounded: bool) -> Self {
        let workers = workers.max(1);
        let share = |r: usize| (u128::from(vertices) * r as u128 / workers as u128) as u64;
        Owners {
            way,
            workers,
            vertices,
            bounded,
            bounds: (0..=workers).map(share).collect(),
            scale: workers as f64 / vertices.max(1) as f64,
        }
    }

    /// The rank that owns `id`: for ranges, inlined where a message is sent (a call per
    /// message was a sixth of PageRank's time across processes).
    #[inline(always)]
    pub(crate) fn of(&self, id: u64) -> Result<Rank, GraphError> {
        if matches!(self.way, Partitioner::Ranges) && (!self.bounded || id < self.vertices) {
            return Ok(self.in_ranges(id));
        }
        self.of_any(id)
    }

    /// [`of`](Self::of) for any partitioner, and for an id out of bounds.
    #[inline(never)]
    fn of_any(&self, id: u64) -> Result<Rank, GraphError> {
        if self.bounded && id >= self.vertices {
            return Err(self.no_such(
                id,
                format!(
                    "the graph's vertices are 0 to {}",
                    self.vertices.saturating_sub(1)
                ),
            ));
        }
        match &self.way {
            Partitioner::Ranges => Ok(self.in_ranges(id)),
            Partitioner::Hash => Ok((mix(id) % self.workers as u64) as Rank),
            Partitioner::Custom(owner) => {
                let rank = owner(id, self.workers);
                if rank >= self.workers {
                    return Err(self.no_such(
                        id,
                        format!(
                            "the partitioner gave it rank {rank}, but the job has {} worker(s)",
                            self.workers
                        ),
                    ));
                }
                Ok(rank)
            }
        }
    }

    /// The rank whose range holds `id` (the last rank's, past the span): a guess from the
    /// scale, put right against the bounds.
    #[inline]
    fn in_ranges(&self, id: u64) -> Rank {
        let last = self.workers - 1;
        let mut rank = ((id as f64 * self.scale) as usize).min(last);
        while rank > 0 && self.bounds[rank] > id {
            rank -= 1;
        }
        while rank < last && self.bounds[rank + 1] <= id {
            rank += 1;
        }
        rank
    }

    fn no_such(&self, id: u64, why: String) -> GraphError {
        GraphError::NoSuchVertex {
            vertex: id.to_string(),
            why,
        }
    }

    /// How many ranks share the vertices.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// The first id of `rank`'s range (ranges).
    #[inline]
    pub(crate) fn start(&self, rank: Rank) -> u64 {
        self.bounds[rank]
    }

    /// The ids `rank` owns among `0..vertices`, when they are one range (ranges).
    pub(crate) fn range(&self, rank: Rank) -> Option<std::ops::Range<u64>> {
        matches!(self.way, Partitioner::Ranges).then(|| self.bounds[rank]..self.bounds[rank + 1])
    }
}

/// A 64-bit mix of an id (splitmix64's finalizer): neighbouring ids to unrelated ranks.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Where each id of a list stands.
type Index<I> = HashMap<I, u32, foldhash::fast::FixedState>;

/// The ids of one rank's vertices, in increasing order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound(
    serialize = "I: Serialize",
    deserialize = "I: serde::de::DeserializeOwned"
))]
pub(crate) enum Ids<I> {
    /// Every id of `start..start + len`.
    Span { start: u64, len: usize },
    /// These, with where each stands (made again after a restore).
    List {
        ids: Vec<I>,
        #[serde(skip, default)]
        at: Index<I>,
    },
}

/// What one rank holds of the graph: its vertices, each one's edges packed in order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound(
    serialize = "I: Serialize, E: Serialize",
    deserialize = "I: serde::de::DeserializeOwned, E: serde::de::DeserializeOwned"
))]
pub(crate) struct Partition<I, E> {
    pub(crate) ids: Ids<I>,
    /// Vertex `i`'s edges are `offsets[i]..offsets[i + 1]` of `targets` and `values`.
    pub(crate) offsets: Vec<usize>,
    pub(crate) targets: Vec<I>,
    pub(crate) values: Vec<E>,
}

/// An edge's end as a partition is built from it: `(source, target, Some(value))` is an
/// edge of `source`'s; `(id, _, None)` says that vertex `id` exists (an edge's target).
pub(crate) type Item<I, E> = (I, I, Option<E>);

/// Gives its argument each item of a partition, the same items each time.
pub(crate) type Items<'a, I, E> = &'a dyn Fn(&mut Runs<'_, I, E>);

/// How many items go to a partition's builder at a time.
const RUN: usize = 4096;

/// Items gathered into runs, each handed on whole: the builder places a run in a tight
/// loop, which keeps many of its scattered writes in flight at once (a call per item
/// would keep one).
pub(crate) struct Runs<'a, I, E> {
    run: Vec<Item<I, E>>,
    to: &'a mut Place<'a, I, E>,
}

/// What takes a run of items, emptying it.
type Place<'a, I, E> = dyn FnMut(&mut Vec<Item<I, E>>) + 'a;

impl<'a, I, E> Runs<'a, I, E> {
    fn new(to: &'a mut Place<'a, I, E>) -> Self {
        Runs {
            run: Vec::with_capacity(RUN),
            to,
        }
    }

    /// Adds an item.
    #[inline]
    pub(crate) fn push(&mut self, item: Item<I, E>) {
        self.run.push(item);
        if self.run.len() == RUN {
            (self.to)(&mut self.run);
            self.run.clear();
        }
    }

    /// Hands on what is left.
    fn finish(mut self) {
        if !self.run.is_empty() {
            (self.to)(&mut self.run);
        }
    }
}

/// Hands every item of `items` to `each`, a run at a time.
fn each_run<'a, I, E>(items: Items<'_, I, E>, each: &'a mut Place<'a, I, E>) {
    let mut runs = Runs::new(each);
    items(&mut runs);
    runs.finish();
}

impl<I: VertexId, E: Clone> Partition<I, E> {
    /// How many vertices it holds.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The id of its `i`-th vertex.
    #[inline]
    pub(crate) fn id(&self, i: usize) -> I {
        match &self.ids {
            Ids::Span { start, .. } => I::from_u64(start + i as u64).unwrap_or_else(|| {
                unreachable!("a span's ids were checked to fit the id type when it was made")
            }),
            Ids::List { ids, .. } => ids[i],
        }
    }

    /// Where vertex `id` stands, if this partition holds it.
    #[inline]
    pub(crate) fn locate(&self, id: I) -> Option<usize> {
        match &self.ids {
            Ids::Span { start, len } => {
                let i = id.to_u64().checked_sub(*start)?;
                (i < *len as u64).then_some(i as usize)
            }
            Ids::List { at, .. } => at.get(&id).map(|&i| i as usize),
        }
    }

    /// Makes the index of a list of ids again (after a restore).
    pub(crate) fn index(&mut self) {
        if let Ids::List { ids, at } = &mut self.ids {
            *at = ids
                .iter()
                .enumerate()
                .map(|(i, &id)| (id, i as u32))
                .collect();
        }
    }

    /// The partition of the vertices `items` names: `span`, when the rank's vertices are
    /// every id of a range, or the ids the items name. `items` is called twice — to
    /// count, then to fill — and must give the same items both times; each vertex's edges
    /// keep their order.
    pub(crate) fn build(
        span: Option<std::ops::Range<u64>>,
        items: Items<'_, I, E>,
    ) -> Result<Self, String> {
        let mut ids = match span {
            Some(span) => {
                if span.end > 0 && I::from_u64(span.end - 1).is_none() {
                    return Err(format!(
                        "{} vertices do not fit the program's vertex id type {}",
                        span.end,
                        std::any::type_name::<I>()
                    ));
                }
                Ids::Span {
                    start: span.start,
                    len: (span.end - span.start) as usize,
                }
            }
            None => {
                let mut ids = Vec::new();
                each_run(items, &mut |run| {
                    ids.extend(run.drain(..).map(|(id, _, _)| id))
                });
                ids.sort_unstable();
                ids.dedup();
                if ids.len() >= u32::MAX as usize {
                    return Err(format!(
                        "{} vertices in one partition: more than 2^32 - 1",
                        ids.len()
                    ));
                }
                Ids::List {
                    ids,
                    at: HashMap::default(),
                }
            }
        };
        let mut partition = Partition {
            ids: Ids::Span { start: 0, len: 0 },
            offsets: Vec::new(),
            targets: Vec::new(),
            values: Vec::new(),
        };
        std::mem::swap(&mut partition.ids, &mut ids);
        partition.index();
        let n = match &partition.ids {
            Ids::Span { len, .. } => *len,
            Ids::List { ids, .. } => ids.len(),
        };
        // Counted, summed into offsets, then filled in place: no edge is held twice.
        let mut offsets = vec![0usize; n + 1];
        let mut stray = None;
        each_run(items, &mut |run| {
            for (from, _, value) in run.drain(..) {
                if value.is_some() {
                    match partition.locate(from) {
                        Some(i) => offsets[i + 1] += 1,
                        None => stray = Some(from),
                    }
                }
            }
        });
        if let Some(from) = stray {
            return Err(format!(
                "an edge of vertex {from}, which this partition does not hold"
            ));
        }
        for i in 1..offsets.len() {
            offsets[i] += offsets[i - 1];
        }
        let edges = offsets[n];
        let mut at = offsets.clone();
        let zero = I::from_u64(0).unwrap_or_else(|| unreachable!("0 fits every id type"));
        let mut targets = vec![zero; edges];
        // Values of no size (a graph without values) take no writes: one is kept, and
        // cloned for every edge once they are placed.
        let sized = std::mem::size_of::<E>() > 0;
        let mut values: Vec<Option<E>> = Vec::new();
        if sized {
            values.resize_with(edges, || None);
        }
        let mut one = None;
        each_run(items, &mut |run| {
            for (from, to, value) in run.drain(..) {
                if let (Some(value), Some(i)) = (value, partition.locate(from)) {
                    let slot = &mut at[i];
                    if let Some(target) = targets.get_mut(*slot) {
                        *target = to;
                        if sized {
                            values[*slot] = Some(value);
                        } else if one.is_none() {
                            one = Some(value);
                        }
                    }
                    *slot += 1;
                }
            }
        });
        // Each vertex's edges filled its place, no more: the same edges both times.
        let values: Vec<E> = match one {
            Some(one) if !sized => vec![one; edges],
            _ => values.into_iter().flatten().collect(),
        };
        if at[..n] != offsets[1..] || values.len() != edges {
            return Err(
                "the graph's edges changed between two reads: give the same edges every time"
                    .to_string(),
            );
        }
        partition.offsets = offsets;
        partition.targets = targets;
        partition.values = values;
        Ok(partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_of_an_id_is_the_one_whose_range_holds_it() {
        for (vertices, workers) in [
            (10, 3),
            (7, 7),
            (3, 5),
            (1_000_003, 4),
            (u64::MAX / 3, 6),
            (0, 2),
        ] {
            let owners = Owners::new(Partitioner::Ranges, workers, vertices, false);
            let mut ids: Vec<u64> = (0..workers)
                .flat_map(|r| {
                    let range = owners.range(r).unwrap();
                    [
                        range.start,
                        range.end.saturating_sub(1),
                        range.start + (range.end - range.start) / 2,
                    ]
                })
                .collect();
            ids.extend([0, 1, vertices.saturating_sub(1)]);
            for id in ids.into_iter().filter(|&id| id < vertices) {
                let rank = owners.of(id).unwrap();
                assert!(
                    owners.range(rank).unwrap().contains(&id),
                    "{id} of {vertices} to rank {rank} of {workers}"
                );
            }
        }
    }
}
