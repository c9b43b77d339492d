//! Calls a rank made one after the other that no rank awaits the master's node's word on,
//! said in one word ([`ToMaster::Sync`] with `calls` above 1).

#[cfg(any(feature = "tcp", feature = "sim"))]
use std::time::Duration;

#[cfg(any(feature = "tcp", feature = "sim"))]
use crate::ids::{Attempt, Epoch, GroupId, Rank, SyncKind};

#[cfg(any(feature = "tcp", feature = "sim"))]
use super::ToMaster;

/// The longest calls are held back with nothing else sent (over TCP, on the lane to the
/// master's node, whose writer then sends them): long enough for a run of small
/// collectives to go in one word, and far below the sync timeouts under which a
/// collective's call is held at all (100 ms and longer: `SOON_WITHIN` in `collective`), so
/// that the master's node hears of a call in time.
#[cfg(any(feature = "tcp", feature = "sim"))]
pub(crate) const HOLD: Duration = Duration::from_millis(2);

/// The most calls one word says: what the master's node takes of a rank's word in one go.
/// A word that says more (or none) is not one a worker sends.
pub(crate) const MAX_CALLS: u32 = 1024;

/// Calls a rank made one after the other, none awaited (`Notice::Soon`): of one attempt,
/// kind, message and group, epochs `epoch..epoch + calls`. Nothing in it is the job's
/// payload, so it is held back without the worker's types (over TCP, on the lane to the
/// master's node), and the calls that come while it is held join it: the master's node
/// takes one word for them, not one a call.
#[cfg(any(feature = "tcp", feature = "sim"))]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallRun {
    attempt: Attempt,
    epoch: Epoch,
    calls: u32,
    kind: SyncKind,
    message: Vec<u8>,
    group: GroupId,
    ranks: Vec<Rank>,
}

#[cfg(any(feature = "tcp", feature = "sim"))]
impl CallRun {
    /// `word`'s calls, if no rank awaits the node's word on them; else `word` back.
    pub(crate) fn of<W>(word: ToMaster<W>) -> Result<CallRun, ToMaster<W>> {
        match word {
            ToMaster::Sync {
                attempt,
                epoch,
                calls,
                kind,
                message,
                awaits: false,
                group,
                ranks,
            } => Ok(CallRun {
                attempt,
                epoch,
                calls,
                kind,
                message,
                group,
                ranks,
            }),
            word => Err(word),
        }
    }

    /// Takes `next` into the run if its calls are the run's next — the same attempt,
    /// kind, message and group, from the epoch after the run's last, not the rank's first
    /// among its group (which says the group's ranks) — and the run stays within
    /// [`MAX_CALLS`]; else hands it back.
    pub(crate) fn join(&mut self, next: CallRun) -> Result<(), CallRun> {
        let calls = self
            .calls
            .checked_add(next.calls)
            .filter(|&calls| calls <= MAX_CALLS);
        let follows = next.attempt == self.attempt
            && next.group == self.group
            && next.kind == self.kind
            && next.ranks.is_empty()
            && self.epoch.checked_add(u64::from(self.calls)) == Some(next.epoch)
            && next.message == self.message;
        match calls {
            Some(calls) if follows => {
                self.calls = calls;
                Ok(())
            }
            _ => Err(next),
        }
    }

    /// How many calls it says.
    pub(crate) fn calls(&self) -> u32 {
        self.calls
    }

    /// At most how many bytes its word's frame takes, whatever the encoding of its fixed
    /// fields (a few dozen bytes): a link that holds the calls checks it against its
    /// largest frame first, so that a word too large fails its call, not its flush.
    pub(crate) fn most_bytes(&self) -> usize {
        320 + self.message.len() + 9 * self.ranks.len()
    }

    /// The word that says the run's calls.
    pub(crate) fn word<W>(self) -> ToMaster<W> {
        ToMaster::Sync {
            attempt: self.attempt,
            epoch: self.epoch,
            calls: self.calls,
            kind: self.kind,
            message: self.message,
            awaits: false,
            group: self.group,
            ranks: self.ranks,
        }
    }
}

#[cfg(all(test, any(feature = "tcp", feature = "sim")))]
mod tests {
    use super::*;
    use crate::ids::{CollectiveKind, ReduceOp};

    fn call(epoch: Epoch, message: &[u8], awaits: bool) -> ToMaster<u32> {
        ToMaster::Sync {
            attempt: 0,
            epoch,
            calls: 1,
            kind: SyncKind::Collective(CollectiveKind::AllReduce(Some(ReduceOp::Sum))),
            message: message.to_vec(),
            awaits,
            group: GroupId::ALL,
            ranks: Vec::new(),
        }
    }

    fn run(epoch: Epoch, message: &[u8]) -> CallRun {
        CallRun::of(call(epoch, message, false)).expect("a call no rank awaits")
    }

    #[test]
    fn calls_one_after_the_other_of_one_shape_are_one_word_that_says_how_many() {
        let mut held = run(7, b"shape");
        for epoch in 8..12 {
            held.join(run(epoch, b"shape"))
                .expect("the run's next call");
        }
        let ToMaster::<u32>::Sync { epoch, calls, .. } = held.word() else {
            panic!("a call's word");
        };
        assert_eq!((epoch, calls), (7, 5));
    }

    #[test]
    fn a_call_that_is_not_the_runs_next_starts_a_run_of_its_own() {
        let mut held = run(7, b"shape");
        assert!(held.join(run(9, b"shape")).is_err(), "an epoch skipped");
        assert!(held.join(run(7, b"shape")).is_err(), "the same epoch again");
        assert!(held.join(run(8, b"other")).is_err(), "another shape");
        let mut among = run(8, b"shape");
        among.group = GroupId::of(&[0, 1]);
        assert!(held.join(among).is_err(), "another group");
        let mut first = run(8, b"shape");
        first.ranks = vec![0, 1];
        assert!(
            held.join(first).is_err(),
            "a first call, which says its ranks"
        );
        let mut later = run(8, b"shape");
        later.attempt = 1;
        assert!(held.join(later).is_err(), "another attempt");
        assert_eq!(held.calls(), 1);
        assert!(
            CallRun::of(call(8, b"shape", true)).is_err(),
            "a call awaited goes as it is"
        );
    }

    #[test]
    fn a_run_says_at_most_max_calls() {
        let mut held = run(0, b"");
        for epoch in 1..u64::from(MAX_CALLS) {
            held.join(run(epoch, b"")).expect("within the most");
        }
        assert_eq!(held.calls(), MAX_CALLS);
        assert!(held.join(run(u64::from(MAX_CALLS), b"")).is_err());
    }
}
