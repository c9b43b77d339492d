//! What the master's node last heard from the ranks a failed wait was for: a timeout names
//! not only whom it waited on but what each of them was last doing, as the node saw it.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{CallAt, Epoch, Iteration, Rank, SyncKind};

/// One thing the master's node heard from a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Heard {
    /// It registered: start-up (`pre_application`, `init`) done.
    Registered,
    /// Its result of this iteration: its compute returned.
    Result {
        /// The iteration.
        iteration: Iteration,
    },
    /// A sync call or a collective its compute made.
    Call {
        /// Where it stands: its iteration, its number among the iteration's calls (of its
        /// group), as the sync calls' errors name it.
        at: CallAt,
        /// Which call.
        kind: SyncKind,
        /// Its number among its group's calls of the attempt, from 0
        /// ([`WorkerContext::sync_epoch`](crate::WorkerContext::sync_epoch)).
        epoch: Epoch,
    },
    /// It ran `post_application` and stopped.
    Done,
    /// It failed.
    Failed,
    /// Its connection was lost (as the transport saw it: closed, or silent past the
    /// failure detector's limit).
    Lost,
}

impl fmt::Display for Heard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Heard::Registered => f.write_str("registered"),
            Heard::Result { iteration } => write!(f, "result of iteration {iteration}"),
            Heard::Call { at, kind, .. } => write!(f, "{kind} ({at})"),
            Heard::Done => f.write_str("done"),
            Heard::Failed => f.write_str("failed"),
            Heard::Lost => f.write_str("its connection lost"),
        }
    }
}

/// What the master's node last heard from one rank a failed wait was for: its last words,
/// oldest first, each with how long before the failure it came. Empty: nothing was heard
/// from the rank in its attempt (it never registered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastHeard {
    /// The rank.
    pub rank: Rank,
    /// Its last words, oldest first: what, and how long before the failure.
    pub words: Vec<(Heard, Duration)>,
}

impl LastHeard {
    /// The last thing heard from the rank, and how long before the failure.
    pub fn last(&self) -> Option<(Heard, Duration)> {
        self.words.last().copied()
    }

    /// The last call heard from the rank, if any of its last words is one.
    pub fn last_call(&self) -> Option<Heard> {
        self.words
            .iter()
            .rev()
            .map(|(heard, _)| *heard)
            .find(|heard| matches!(heard, Heard::Call { .. }))
    }
}

impl fmt::Display for LastHeard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}: ", self.rank)?;
        if self.words.is_empty() {
            return f.write_str("nothing heard");
        }
        for (at, (heard, ago)) in self.words.iter().enumerate() {
            if at > 0 {
                f.write_str(", then ")?;
            }
            // Milliseconds are what a person reads of a wait.
            let ago = Duration::from_millis(ago.as_millis().try_into().unwrap_or(u64::MAX));
            write!(f, "{heard} {ago:?} before")?;
        }
        Ok(())
    }
}

/// `; last heard (…): rank 2: …; rank 3: …`, or nothing when there is nothing to say.
pub(super) fn heard_note(heard: &[LastHeard]) -> String {
    if heard.is_empty() {
        return String::new();
    }
    let ranks: Vec<String> = heard.iter().map(ToString::to_string).collect();
    format!("; last heard by the master's node: {}", ranks.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::CollectiveKind;

    #[test]
    fn a_ranks_last_words_read_oldest_first_with_how_long_before() {
        let heard = LastHeard {
            rank: 2,
            words: vec![
                (Heard::Result { iteration: 4 }, Duration::from_millis(2_100)),
                (
                    Heard::Call {
                        at: CallAt::of(5, 8, 9),
                        kind: SyncKind::Collective(CollectiveKind::AllGather),
                        epoch: 9,
                    },
                    Duration::from_micros(1_999_700),
                ),
            ],
        };
        assert_eq!(
            heard.to_string(),
            "rank 2: result of iteration 4 2.1s before, then all_gather() (call 2 of iteration 5) 1.999s before"
        );
        assert_eq!(
            heard
                .last_call()
                .map(|h| matches!(h, Heard::Call { epoch: 9, .. })),
            Some(true)
        );
        let none = LastHeard {
            rank: 3,
            words: Vec::new(),
        };
        assert_eq!(
            heard_note(&[none]),
            "; last heard by the master's node: rank 3: nothing heard"
        );
        assert_eq!(heard_note(&[]), "");
    }
}
