//! A group of the job's ranks, made once from a list of ranks: what every layer knows of
//! it (its ranks, its id). The collectives among it are `collective`'s
//! ([`WorkerContext::among`](crate::WorkerContext::among)).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::SyncError;
use crate::ids::{Epoch, GroupId, Iteration, Rank};

/// A group of the job's ranks that makes collectives among itself
/// ([`WorkerContext::among`](crate::WorkerContext::among)), as an MPI communicator made of some ranks of the world's
/// (`MPI_Comm_create_group`), or a group of `torch.distributed.new_group`.
///
/// Made once, from a list of ranks, and used in every call: every rank of the group makes
/// the same calls among it, in the same order — its calls are counted apart from the
/// job's other calls and other groups', so ranks outside the group go on with theirs.
/// The rules are every collective's, inside the group: a rank that makes another call
/// among it, returns from compute without a call the others made, or does not make it
/// within the sync timeout is named by its rank in the job; a result is returned only
/// when every rank of the group contributed to it.
///
/// Its ranks are kept in rank order (a fold's lower rank first, `all_gather`'s messages
/// and `reduce_scatter`'s segments in that order); ranks are named as in the job (a
/// broadcast's root is the root's rank). Two groups of the same ranks are the same group.
///
/// ```
/// use superstep::collective::Group;
///
/// let evens = Group::new([4, 0, 2]).unwrap();
/// assert_eq!(evens.ranks(), &[0, 2, 4]);
/// assert!(evens.contains(2) && !evens.contains(1));
/// assert!(Group::new([1, 1]).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<Rank>", into = "Vec<Rank>")]
pub struct Group {
    id: GroupId,
    ranks: Arc<[Rank]>,
}

impl Group {
    /// The group of `ranks`, in any order; at least one, none twice
    /// ([`SyncError::BadGroup`] otherwise). Whether the job has them is checked where the
    /// group is used ([`WorkerContext::among`](crate::WorkerContext::among)).
    pub fn new(ranks: impl IntoIterator<Item = Rank>) -> Result<Group, SyncError> {
        let mut ranks: Vec<Rank> = ranks.into_iter().collect();
        ranks.sort_unstable();
        if ranks.is_empty() {
            return Err(SyncError::BadGroup("it has no ranks".to_owned()));
        }
        if let Some(twice) = ranks.windows(2).find(|w| w[0] == w[1]) {
            return Err(SyncError::BadGroup(format!(
                "rank {} is in it twice",
                twice[0]
            )));
        }
        Ok(Group {
            id: GroupId::of(&ranks),
            ranks: ranks.into(),
        })
    }

    /// Its id, as its calls name it.
    pub fn id(&self) -> GroupId {
        self.id
    }

    /// Its ranks, in rank order.
    pub fn ranks(&self) -> &[Rank] {
        &self.ranks
    }

    /// How many ranks it has.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// Whether `rank` is in it.
    pub fn contains(&self, rank: Rank) -> bool {
        self.place(rank).is_some()
    }

    /// `rank`'s place in it, from 0 (its rank in the group, as MPI numbers a
    /// communicator's ranks), if it is in it.
    pub fn place(&self, rank: Rank) -> Option<usize> {
        self.ranks.binary_search(&rank).ok()
    }

    /// Its ranks, shared.
    pub(crate) fn members(&self) -> Arc<[Rank]> {
        Arc::clone(&self.ranks)
    }

    /// The error that `rank` is not in it.
    pub(crate) fn without(&self, rank: Rank) -> SyncError {
        SyncError::NotInGroup {
            rank,
            group: self.id,
            ranks: self.ranks.to_vec(),
        }
    }
}

impl TryFrom<Vec<Rank>> for Group {
    type Error = SyncError;

    fn try_from(ranks: Vec<Rank>) -> Result<Self, Self::Error> {
        Group::new(ranks)
    }
}

impl From<Group> for Vec<Rank> {
    fn from(group: Group) -> Self {
        group.ranks.to_vec()
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("id", &self.id)
            .field("ranks", &self.ranks)
            .finish()
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (ranks {:?})", self.id, self.ranks)
    }
}

/// A rank's count of its calls among a group: the epoch of its next, and of the first it
/// made in the iteration it last made one in.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GroupCount {
    pub(crate) next: Epoch,
    pub(crate) first: Epoch,
    pub(crate) iteration: Iteration,
}
