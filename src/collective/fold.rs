//! The workers' results of an iteration folded among the workers, for the master's
//! combine ([`Aggregation::Tree`](crate::ids::Aggregation::Tree) and
//! [`Ring`](crate::ids::Aggregation::Ring)): a `reduce` collective run by the runtime
//! after each rank's compute, ending at the rank that hands the fold to the master.
//!
//! Along the ring (the chain of ranks 0, 1, …, the last) each rank folds what the rank
//! before sent — the fold of every lower rank — before its own result, as the master
//! folds: the same bits; the last rank sends the fold on to rank 0, which in a cluster job
//! runs beside the master. An element-wise fold (`JobBuilder::combine_by`) travels in
//! chunks, so the ring is a pipeline and each link carries the value once. The tree
//! groups ranks as a binomial tree does, towards rank 0.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::buffers::{decode_as_is, encode_as_is, Elements};
use super::chunk_of;
use crate::compute::WorkerContext;
use crate::error::SyncError;
use crate::ids::{Algorithm, CollectiveKind, FoldRoute, ReduceOp};
use crate::payload::{Element, Floats};
use crate::protocol::{Buffer, Carried, Share};

/// A worker's part in folding the iteration's results among the workers: given its
/// context, its result and the iteration's route, what it sends the master.
pub(crate) type FoldAmong<M, W> = Arc<
    dyn Fn(&mut WorkerContext<M, W>, W, FoldRoute) -> Result<Share<W>, SyncError> + Send + Sync,
>;

fn algorithm(route: FoldRoute) -> Algorithm {
    match route {
        FoldRoute::Tree => Algorithm::Tree,
        FoldRoute::Star | FoldRoute::Ring => Algorithm::Chain,
    }
}

/// One whole value, sent at most once: a `reduce` sends a rank's fold as its last step,
/// so it is moved out then, not copied.
struct Once<T, F> {
    value: RefCell<Option<T>>,
    fold: F,
}

impl<T, F: Fn(&mut T, T)> Buffer for Once<T, F> {
    type Part = Vec<T>;

    fn len(&self) -> usize {
        1
    }

    fn part(&self, _: Range<usize>) -> Vec<T> {
        // Taken once; a second call (no plan makes one) sends an empty part, which the
        // receiver refuses as a part of another length.
        self.value.borrow_mut().take().into_iter().collect()
    }

    fn part_len(part: &Vec<T>) -> usize {
        part.len()
    }

    fn put(&mut self, _: Range<usize>, part: Vec<T>) {
        if let Some(got) = part.into_iter().next() {
            *self.value.get_mut() = Some(got);
        }
    }

    fn fold(&mut self, _: Range<usize>, part: Vec<T>, part_first: bool) {
        let (Some(got), Some(own)) = (part.into_iter().next(), self.value.get_mut()) else {
            return;
        };
        if part_first {
            let mine = std::mem::replace(own, got);
            (self.fold)(own, mine);
        } else {
            (self.fold)(own, got);
        }
    }
}

impl<T: Serialize + DeserializeOwned, F: Fn(&mut T, T)> Carried for Once<T, F> {
    fn what() -> String {
        format!("its value of type {}", std::any::type_name::<T>())
    }

    fn encode(part: Vec<T>) -> Result<Bytes, String> {
        encode_as_is(&part)
    }

    fn decode(bytes: Bytes) -> Result<Vec<T>, String> {
        decode_as_is(&bytes)
    }
}

impl<M, W: 'static> WorkerContext<M, W> {
    /// This rank's part in folding every rank's `result` by `fold` along `route`: the
    /// fold at the rank it ends at, nothing elsewhere.
    pub(crate) fn fold_whole(
        &mut self,
        result: W,
        route: FoldRoute,
        fold: impl Fn(&mut W, W),
    ) -> Result<Share<W>, SyncError>
    where
        W: Serialize + DeserializeOwned + Send,
    {
        let Some(root) = route.root() else {
            return Ok(Share::Own(result));
        };
        let kind = CollectiveKind::Reduce { root, op: None };
        let buffer = Once {
            value: RefCell::new(Some(result)),
            fold,
        };
        let done = self.collective(kind, algorithm(route), 1, buffer)?;
        Ok(match done.value.into_inner() {
            Some(value) if self.rank == root => Share::Fold(value),
            _ => Share::Passed,
        })
    }
}

impl<M, T: Element> WorkerContext<M, Floats<T>> {
    /// As [`fold_whole`](Self::fold_whole), element by element with `op`, in chunks.
    pub(crate) fn fold_elements(
        &mut self,
        mut result: Floats<T>,
        route: FoldRoute,
        op: ReduceOp,
    ) -> Result<Share<Floats<T>>, SyncError> {
        let Some(root) = route.root() else {
            return Ok(Share::Own(result));
        };
        let kind = CollectiveKind::Reduce { root, op: Some(op) };
        let buffer = Elements::new(&mut result.0[..], op);
        self.collective(kind, algorithm(route), chunk_of::<T>(), buffer)?;
        Ok(if self.rank == root {
            Share::Fold(result)
        } else {
            Share::Passed
        })
    }
}
