//! What the master's node last heard from each rank — its registration, its results, its
//! calls, its end — kept a few words deep, so that a wait for ranks that fails names what
//! each of them was last doing ([`LastHeard`]).

use std::time::Instant;

use crate::error::{Heard, JobError, LastHeard, SyncError};
use crate::ids::{Iteration, Rank};

/// How many of a rank's last words are kept, besides its last result.
const WORDS: usize = 4;

/// How many of the ranks a wait was for are named with what was last heard from them: a
/// failure's error goes to every waiting rank, and stays small.
pub(crate) const NAMED: usize = 16;

/// By rank, its last result and its last [`WORDS`] other words (a ring), each with when it
/// came and its place in the order the node heard them. Results, a word of every rank
/// every round, are kept apart and cheaply: a few stores.
pub(super) struct Hearing {
    /// By rank: the iteration of its last result, when it came and its place (`None`:
    /// none yet).
    results: Vec<Option<(Iteration, Instant, u64)>>,
    words: Vec<Words>,
    /// The next word's place in the order heard.
    next: u64,
}

#[derive(Clone, Copy, Default)]
struct Words {
    words: [Option<(Heard, Instant, u64)>; WORDS],
    /// Where the next word goes.
    at: u8,
}

impl Hearing {
    pub(super) fn new(workers: usize) -> Self {
        Hearing {
            results: vec![None; workers],
            words: vec![Words::default(); workers],
            next: 0,
        }
    }

    /// `rank` sent its result of `iteration` at `now` (a rank outside the job is not
    /// kept).
    pub(super) fn result(&mut self, rank: Rank, iteration: Iteration, now: Instant) {
        if let Some(slot) = self.results.get_mut(rank) {
            *slot = Some((iteration, now, self.next));
            self.next += 1;
        }
    }

    /// `rank` said `heard` at `now` (a rank outside the job is not kept).
    pub(super) fn hear(&mut self, rank: Rank, heard: Heard, now: Instant) {
        if let Heard::Result { iteration } = heard {
            return self.result(rank, iteration, now);
        }
        if let Some(words) = self.words.get_mut(rank) {
            let at = usize::from(words.at) % WORDS;
            words.words[at] = Some((heard, now, self.next));
            words.at = ((at + 1) % WORDS) as u8;
            self.next += 1;
        }
    }

    /// What was last heard from `rank`, in the order heard, each with how long before
    /// `now`: its last words and its last result, the last [`WORDS`] of them.
    pub(super) fn of(&self, rank: Rank, now: Instant) -> LastHeard {
        let mut heard: Vec<(Heard, Instant, u64)> = Vec::new();
        if let Some(kept) = self.words.get(rank) {
            heard.extend(kept.words.iter().flatten().copied());
        }
        if let Some(&Some((iteration, at, place))) = self.results.get(rank) {
            heard.push((Heard::Result { iteration }, at, place));
        }
        heard.sort_by_key(|&(_, _, place)| place);
        let skip = heard.len().saturating_sub(WORDS);
        let words = heard
            .into_iter()
            .skip(skip)
            .map(|(heard, at, _)| (heard, now.saturating_duration_since(at)))
            .collect();
        LastHeard { rank, words }
    }

    /// `error`, a wait for ranks that failed, with what was last heard from each rank it
    /// waited on (unless it says so already); any other error as it is.
    pub(super) fn name(&self, now: Instant, mut error: JobError) -> JobError {
        match &mut error {
            JobError::WorkersTimedOut { missing, heard, .. } => self.fill(now, missing, heard),
            JobError::Sync(sync) => self.name_in(now, sync),
            _ => {}
        }
        error
    }

    /// [`name`](Self::name) of a sync call's error.
    pub(super) fn name_sync(&self, now: Instant, mut error: SyncError) -> SyncError {
        self.name_in(now, &mut error);
        error
    }

    fn name_in(&self, now: Instant, error: &mut SyncError) {
        match error {
            SyncError::TimedOut { missing, heard, .. } => self.fill(now, missing, heard),
            SyncError::CollectiveTimedOut {
                waiting_on, heard, ..
            } => self.fill(now, waiting_on, heard),
            _ => {}
        }
    }

    /// What was last heard from each of `ranks` (the first [`NAMED`]), into `heard` unless
    /// it holds some.
    fn fill(&self, now: Instant, ranks: &[Rank], heard: &mut Vec<LastHeard>) {
        if heard.is_empty() {
            let named = ranks.iter().take(NAMED);
            *heard = named.map(|&rank| self.of(rank, now)).collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::Waiting;
    use crate::ids::{Algorithm, CallAt, CollectiveCall, CollectiveKind, SyncKind};

    #[test]
    fn a_timeout_names_each_missing_ranks_last_words_oldest_first_and_no_more_than_kept() {
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_secs(s);
        let call = |epoch: u64| Heard::Call {
            at: CallAt::of(epoch + 1, epoch, epoch),
            kind: SyncKind::Barrier,
            epoch,
        };
        let mut hearing = Hearing::new(3);
        hearing.hear(1, Heard::Registered, t0);
        // A call each iteration, then the result: only the last result is kept.
        for i in 1..=4u64 {
            hearing.hear(1, call(i - 1), secs(i));
            hearing.hear(1, Heard::Result { iteration: i }, secs(i));
        }
        hearing.hear(1, call(4), secs(5));
        // Outside the job: not kept, no panic.
        hearing.hear(7, Heard::Done, t0);
        let now = t0 + Duration::from_secs(8);
        let error = JobError::WorkersTimedOut {
            during: Waiting::Iteration(5),
            missing: vec![1, 2],
            waited: Duration::from_secs(3),
            refused: Vec::new(),
            heard: Vec::new(),
        };
        let JobError::WorkersTimedOut { heard, .. } = hearing.name(now, error) else {
            unreachable!()
        };
        assert_eq!(heard.len(), 2);
        let words: Vec<_> = heard[0]
            .words
            .iter()
            .map(|(h, ago)| (*h, ago.as_secs()))
            .collect();
        assert_eq!(
            words,
            vec![
                (call(2), 5),
                (call(3), 4),
                (Heard::Result { iteration: 4 }, 4),
                (call(4), 3),
            ],
            "the last four, in the order heard: of one instant, the call before the result"
        );
        assert_eq!(heard[0].last_call(), Some(call(4)));
        assert_eq!(
            heard[1],
            LastHeard {
                rank: 2,
                words: Vec::new()
            }
        );
        // A rank's collective that waited on a peer: the peer's last words.
        let silent = JobError::Sync(SyncError::CollectiveTimedOut {
            rank: 0,
            call: Box::new(CollectiveCall {
                seq: 4,
                at: CallAt::of(5, 4, 4),
                kind: CollectiveKind::Barrier,
                len: 1,
                algorithm: Algorithm::Doubling,
                chunk: 1,
            }),
            waiting_on: vec![1],
            waited: Duration::from_secs(1),
            heard: Vec::new(),
        });
        let JobError::Sync(SyncError::CollectiveTimedOut { heard, .. }) = hearing.name(now, silent)
        else {
            unreachable!()
        };
        assert_eq!(heard.len(), 1);
        assert_eq!(heard[0].last_call(), Some(call(4)));
        // Other errors pass as they are.
        let other = JobError::MasterTimedOut {
            during: Waiting::Shutdown,
            waited: Duration::ZERO,
        };
        assert_eq!(hearing.name(now, other.clone()), other);
    }
}
