use std::ops::Range;

use super::*;
use crate::ids::{Algorithm, CallKey, GroupId};

/// Floats summed; parts encode with the crate's encoding.
struct Sums(Vec<f64>);

impl Buffer for Sums {
    type Part = Vec<f64>;

    fn len(&self) -> usize {
        self.0.len()
    }

    fn part(&self, range: Range<usize>) -> Vec<f64> {
        self.0[range].to_vec()
    }

    fn part_len(part: &Vec<f64>) -> usize {
        part.len()
    }

    fn put(&mut self, range: Range<usize>, part: Vec<f64>) {
        self.0[range].copy_from_slice(&part);
    }

    fn fold(&mut self, range: Range<usize>, part: Vec<f64>, _: bool) {
        for (own, got) in self.0[range].iter_mut().zip(part) {
            *own += got;
        }
    }
}

impl Carried for Sums {
    fn encode(part: Vec<f64>) -> Result<Bytes, String> {
        crate::codec::to_vec(&part)
            .map(Bytes::from)
            .map_err(|e| e.to_string())
    }

    fn decode(bytes: Bytes) -> Result<Vec<f64>, String> {
        crate::codec::from_slice(&bytes).map_err(|e| e.to_string())
    }
}

const EPOCH: Epoch = 4;
const ATTEMPT: Attempt = 2;
const PATIENCE: Duration = Duration::from_secs(8);

fn sum_call(len: usize) -> CollectiveCall {
    CallShape::call(
        Some(CallShape {
            len: len as u64,
            algorithm: Algorithm::Doubling,
            chunk: 1024,
        }),
        EPOCH,
        CallAt {
            iteration: 3,
            call: 1,
            group: crate::ids::GroupId::ALL,
        },
        CollectiveKind::AllReduce(Some(crate::ids::ReduceOp::Sum)),
    )
}

fn setup(rank: Rank, workers: usize, values: bool) -> CallSetup {
    CallSetup {
        rank,
        workers,
        group: GroupId::ALL,
        members: None,
        attempt: ATTEMPT,
        epoch: EPOCH,
        at: CallAt {
            iteration: 3,
            call: 1,
            group: crate::ids::GroupId::ALL,
        },
        patience: PATIENCE,
        values,
    }
}

/// Rank `rank`'s all_reduce of `values` among `workers`, at `now`.
fn summing(
    rank: Rank,
    workers: usize,
    values: Vec<f64>,
    now: Instant,
    early: &mut Early,
) -> RankCall<Sums> {
    let call = sum_call(values.len());
    let setup = setup(rank, workers, false);
    let start = CallStart::Known(Box::new(exchange(call, &setup, Sums(values))));
    RankCall::new(setup, start, false, now, early)
}

/// Everything `call` sends now.
fn sent(call: &mut RankCall<Sums>) -> Vec<(Rank, PeerMessage)> {
    std::iter::from_fn(|| call.poll_send()).collect()
}

/// The first piece of `call` from `from`, of this attempt, holding `body`.
fn first_piece(from: Rank, call: CollectiveCall, body: PeerBody) -> PeerMessage {
    PeerMessage {
        attempt: ATTEMPT,
        from,
        call,
        step: 0,
        chunk: 0,
        body,
    }
}

fn lost(rank: Rank, attempt: Attempt) -> PeerEvent {
    PeerEvent::Lost {
        rank,
        attempt,
        reason: format!("worker {rank}'s connection closed"),
    }
}

fn ended<B>(end: Option<Result<B, SyncError>>) -> SyncError {
    match end {
        Some(Err(e)) => e,
        Some(Ok(_)) => panic!("the call ended well"),
        None => panic!("the call did not end"),
    }
}

#[test]
fn two_ranks_sum_and_end_once_their_part_is_done_without_the_master_s_node_s_word() {
    // Each rank's sum holds the other's piece, checked against its own call: it proves
    // that both made the call, and the call ends on it.
    let now = Instant::now();
    let (mut early_a, mut early_b) = (Early::new(ATTEMPT), Early::new(ATTEMPT));
    let mut a = summing(0, 2, vec![1.0, 2.0], now, &mut early_a);
    let mut b = summing(1, 2, vec![10.0, 20.0], now, &mut early_b);
    for (to, m) in sent(&mut a) {
        assert_eq!(to, 1);
        b.handle_peer(now, PeerEvent::Message(m), &mut early_b);
    }
    assert!(
        a.poll_outcome().is_none(),
        "rank 0 waits for rank 1's piece"
    );
    for (to, m) in sent(&mut b) {
        assert_eq!(to, 0);
        a.handle_peer(now, PeerEvent::Message(m), &mut early_a);
    }
    for call in [&mut a, &mut b] {
        let sums = call.poll_outcome().expect("done").expect("summed");
        assert_eq!(sums.0, vec![11.0, 22.0]);
        assert!(call.poll_outcome().is_none(), "an end is taken once");
        assert!(call.poll_timeout().is_none());
        // The node's word, if it comes late, changes nothing.
        call.handle_answer(CallKey::all(EPOCH), Err(SyncError::NoAnswer(PATIENCE)));
        assert!(call.poll_outcome().is_none());
    }
}

#[test]
fn a_rank_whose_result_proves_nothing_of_the_others_ends_once_the_master_s_node_released_it() {
    // A reduce to rank 0: rank 1 only sends, so its part is done at once — yet it heard
    // nothing of rank 0's call, and waits for the node's word that every rank made it.
    let now = Instant::now();
    let reduce = CallShape::call(
        Some(CallShape {
            len: 2,
            algorithm: Algorithm::Tree,
            chunk: 1024,
        }),
        EPOCH,
        CallAt {
            iteration: 3,
            call: 1,
            group: crate::ids::GroupId::ALL,
        },
        CollectiveKind::Reduce {
            root: 0,
            op: Some(crate::ids::ReduceOp::Sum),
        },
    );
    let (mut early_a, mut early_b) = (Early::new(ATTEMPT), Early::new(ATTEMPT));
    let start = |rank, values| {
        CallStart::Known(Box::new(exchange(
            reduce,
            &setup(rank, 2, false),
            Sums(values),
        )))
    };
    let mut a = RankCall::new(
        setup(0, 2, false),
        start(0, vec![1.0, 2.0]),
        false,
        now,
        &mut early_a,
    );
    let mut b = RankCall::new(
        setup(1, 2, false),
        start(1, vec![10.0, 20.0]),
        false,
        now,
        &mut early_b,
    );
    for (to, m) in sent(&mut b) {
        assert_eq!(to, 0);
        a.handle_peer(now, PeerEvent::Message(m), &mut early_a);
    }
    assert!(sent(&mut a).is_empty());
    let sums = a
        .poll_outcome()
        .expect("the root heard rank 1")
        .expect("summed");
    assert_eq!(sums.0, vec![11.0, 22.0]);
    assert!(
        b.poll_outcome().is_none(),
        "its part is done, the others unknown"
    );
    b.handle_answer(CallKey::all(EPOCH - 1), Ok(()));
    assert!(
        b.poll_outcome().is_none(),
        "an earlier call's answer releases nothing"
    );
    b.handle_answer(CallKey::all(EPOCH), Ok(()));
    assert!(b.poll_outcome().expect("released").is_ok());
}

#[test]
fn a_silent_peer_fails_the_call_after_the_patience_naming_it_and_every_piece_pushes_it_back() {
    let start = Instant::now();
    let mut early = Early::new(ATTEMPT);
    let mut a = summing(0, 4, vec![1.0; 4], start, &mut early);
    let _ = sent(&mut a);
    // A long wait says it still waits, and is woken for it before the limit.
    let first = a.poll_timeout().expect("a wait is bounded");
    assert!(first < start + PATIENCE);
    a.handle_timeout(first);
    assert!(a.poll_outcome().is_none(), "a word is no end");
    assert!(a.poll_timeout().unwrap() > first);

    // A piece from rank 1 at half the patience: the limit moves to 1.5 patience.
    let half = start + PATIENCE / 2;
    let mut early_b = Early::new(ATTEMPT);
    let mut b = summing(1, 4, vec![1.0; 4], start, &mut early_b);
    for (to, m) in sent(&mut b) {
        if to == 0 {
            a.handle_peer(half, PeerEvent::Message(m), &mut early);
        }
    }
    a.handle_timeout(start + PATIENCE);
    assert!(
        a.poll_outcome().is_none(),
        "the piece pushed the limit back"
    );
    a.handle_timeout(half + PATIENCE);
    match ended(a.poll_outcome()) {
        SyncError::CollectiveTimedOut {
            rank,
            waiting_on,
            waited,
            call,
            ..
        } => {
            assert_eq!(rank, 0);
            assert_eq!(
                waiting_on,
                vec![2],
                "rank 1 sent its piece; rank 2 is the next"
            );
            assert_eq!(waited, PATIENCE / 2 + PATIENCE);
            assert_eq!(*call, sum_call(4));
        }
        other => panic!("not a timeout naming the peer: {other}"),
    }
}

#[test]
fn a_peer_lost_before_the_release_waits_for_the_node_s_word_which_may_say_it_was_a_mistake() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    let mut a = summing(0, 2, vec![1.0], now, &mut early);
    let _ = sent(&mut a);
    a.handle_peer(now, lost(1, ATTEMPT), &mut early);
    assert!(a.poll_outcome().is_none(), "it waits for the node's word");
    assert_eq!(a.poll_timeout(), Some(now + LOSS_GRACE));
    // The node says another rank made another call: the loss was its consequence.
    a.handle_answer(CallKey::all(EPOCH), Err(SyncError::NothingToBroadcast(1)));
    assert!(matches!(
        ended(a.poll_outcome()),
        SyncError::NothingToBroadcast(1)
    ));
    // The loss stays for later calls: the next fails on it at once.
    let (pieces, kept) = early.take(CallKey::all(EPOCH + 1), |_| true);
    assert!(pieces.is_empty());
    assert_eq!(kept.map(|(rank, _)| rank), Some(1));
}

#[test]
fn a_peer_lost_fails_the_call_on_the_loss_when_no_word_says_otherwise() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    // Released: at once.
    let mut a = summing(0, 2, vec![1.0], now, &mut early);
    a.handle_answer(CallKey::all(EPOCH), Ok(()));
    a.handle_peer(now, lost(1, ATTEMPT), &mut early);
    assert!(matches!(
        ended(a.poll_outcome()),
        SyncError::PeerLost {
            rank: 0,
            peer: 1,
            ..
        }
    ));
    // Not released: once the grace passed.
    let mut early = Early::new(ATTEMPT);
    let mut b = summing(0, 2, vec![1.0], now, &mut early);
    b.handle_send_failed(now, 1, sum_call(1), SendFailure::Lost("refused".into()));
    b.handle_timeout(now + LOSS_GRACE / 2);
    assert!(b.poll_outcome().is_none());
    b.handle_timeout(now + LOSS_GRACE);
    assert!(matches!(
        ended(b.poll_outcome()),
        SyncError::PeerLost { peer: 1, .. }
    ));
    // Not released, and the job failed for a reason that is no mistake: the loss.
    let mut early = Early::new(ATTEMPT);
    let mut c = summing(0, 2, vec![1.0], now, &mut early);
    c.handle_peer(now, lost(1, ATTEMPT), &mut early);
    c.handle_job_failed(SyncError::NoAnswer(PATIENCE));
    assert!(matches!(
        ended(c.poll_outcome()),
        SyncError::PeerLost { peer: 1, .. }
    ));
}

#[test]
fn pieces_and_losses_of_another_attempt_never_reach_the_call() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    // Found lost after the gang restart: the connection of the attempt replaced.
    early.keep(lost(1, ATTEMPT - 1), CallKey::all(EPOCH));
    let mut a = summing(0, 2, vec![1.0], now, &mut early);
    a.handle_peer(now, lost(1, ATTEMPT - 1), &mut early);
    let mut early_b = Early::new(ATTEMPT - 1);
    let mut old = summing(1, 2, vec![5.0], now, &mut early_b);
    for (_, mut m) in sent(&mut old) {
        m.attempt = ATTEMPT - 1;
        a.handle_peer(now, PeerEvent::Message(m), &mut early);
    }
    assert!(a.poll_outcome().is_none());
    assert_eq!(
        a.poll_timeout(),
        Some(now + PATIENCE / 4),
        "still running, at its word"
    );
    assert!(
        early.take(CallKey::all(EPOCH), |_| true).1.is_none(),
        "no loss kept"
    );
}

#[test]
fn pieces_of_a_later_call_wait_for_it_and_those_of_an_earlier_one_are_dropped() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    let mut a = summing(0, 2, vec![1.0], now, &mut early);
    let mut early_b = Early::new(ATTEMPT);
    let mut b = summing(1, 2, vec![2.0], now, &mut early_b);
    let pieces = sent(&mut b);
    for (_, mut m) in pieces {
        m.call.seq = EPOCH + 1;
        a.handle_peer(now, PeerEvent::Message(m), &mut early);
    }
    assert!(a.poll_outcome().is_none(), "not this call's piece");
    // The later call finds its piece waiting for it.
    let (pieces, _) = early.take(CallKey::all(EPOCH + 1), |_| true);
    assert_eq!(pieces.len(), 1);
    // An earlier call's piece is dropped.
    let mut m = sent(&mut summing(1, 2, vec![2.0], now, &mut Early::new(ATTEMPT)))
        .pop()
        .unwrap()
        .1;
    m.call.seq = EPOCH - 1;
    early.keep(PeerEvent::Message(m), CallKey::all(EPOCH));
    assert!(early.take(CallKey::all(EPOCH - 1), |_| true).0.is_empty());
}

#[test]
fn a_piece_finds_its_call_by_its_group_and_its_number_among_the_groups_calls() {
    let now = Instant::now();
    let group = GroupId(7);
    let piece = |group| {
        let mut m = sent(&mut summing(1, 2, vec![2.0], now, &mut Early::new(ATTEMPT)))
            .pop()
            .unwrap()
            .1;
        m.call.at.group = group;
        PeerEvent::Message(m)
    };
    let mut early = Early::new(ATTEMPT);
    // Kept while a later call of another group waits: not an earlier call of its own.
    early.keep(
        piece(GroupId::ALL),
        CallKey {
            group,
            epoch: EPOCH + 5,
        },
    );
    early.keep(piece(group), CallKey::all(EPOCH + 5));
    let (pieces, _) = early.take(
        CallKey {
            group,
            epoch: EPOCH,
        },
        |_| true,
    );
    assert_eq!(pieces.len(), 1);
    assert_eq!(pieces[0].call.at.group, group);
    // Rank 0's sum among ranks 0 and 1 of three.
    let among = |early: &mut Early| {
        let setup = CallSetup {
            group,
            members: Some(vec![0, 1].into()),
            ..setup(0, 3, false)
        };
        let call = CallShape::call(
            Some(CallShape {
                len: 1,
                algorithm: Algorithm::Doubling,
                chunk: 1024,
            }),
            EPOCH,
            sum_call(1).at.in_group(group),
            CollectiveKind::AllReduce(Some(crate::ids::ReduceOp::Sum)),
        );
        let start = CallStart::Known(Box::new(exchange(call, &setup, Sums(vec![1.0]))));
        RankCall::new(setup, start, false, now, early)
    };
    // The group's call of the same number does not take the job's piece, and ranks
    // summing among every rank find theirs; a peer lost outside the group, before the
    // call or during it, fails none of its calls.
    let mut early_a = Early::new(ATTEMPT);
    early_a.keep(piece(GroupId::ALL), CallKey::all(EPOCH));
    early_a.keep(lost(2, ATTEMPT), CallKey::all(EPOCH));
    let mut a = among(&mut early_a);
    sent(&mut a);
    a.handle_peer(now, lost(2, ATTEMPT), &mut early_a);
    assert!(
        a.poll_outcome().is_none(),
        "the job's piece is not the group's"
    );
    a.handle_peer(now, piece(group), &mut early_a);
    let sum = a
        .poll_outcome()
        .expect("the group's piece ends it")
        .unwrap();
    assert_eq!(sum.0, vec![3.0]);
    assert_eq!(early_a.take(CallKey::all(EPOCH), |_| true).0.len(), 1);
    // A peer of the group lost: its call fails on it.
    let mut early_b = Early::new(ATTEMPT);
    early_b.keep(lost(2, ATTEMPT), CallKey::all(EPOCH));
    early_b.keep(lost(1, ATTEMPT), CallKey::all(EPOCH));
    let mut b = among(&mut early_b);
    b.handle_timeout(now + LOSS_GRACE);
    assert!(matches!(
        ended(b.poll_outcome()),
        SyncError::PeerLost { peer: 1, .. }
    ));
}

#[test]
fn a_piece_of_another_call_is_a_mismatch_before_its_bytes_are_read() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    let mut a = summing(0, 2, vec![1.0, 2.0], now, &mut early);
    let mut other = sum_call(3);
    other.algorithm = Algorithm::Ring;
    // Bytes no decoder takes: never read.
    let m = first_piece(
        1,
        other,
        PeerBody::Encoded(Bytes::from_static(&[0xc1, 0xc1])),
    );
    a.handle_peer(now, PeerEvent::Message(m), &mut early);
    match ended(a.poll_outcome()) {
        SyncError::CollectiveMismatch {
            rank,
            peer,
            peer_call,
            ..
        } => {
            assert_eq!((rank, peer), (0, 1));
            assert_eq!(*peer_call, other);
        }
        e => panic!("not a mismatch: {e}"),
    }
}

#[test]
fn a_piece_that_does_not_decode_names_its_sender() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    let mut a = summing(0, 2, vec![1.0, 2.0], now, &mut early);
    let m = first_piece(
        1,
        sum_call(2),
        PeerBody::Encoded(Bytes::from_static(&[0xc1])),
    );
    a.handle_peer(now, PeerEvent::Message(m), &mut early);
    assert!(matches!(
        ended(a.poll_outcome()),
        SyncError::BadPiece {
            rank: 0,
            peer: 1,
            ..
        }
    ));
}

#[test]
fn a_broadcast_awaited_starts_from_its_first_piece_and_names_its_root_while_none_comes() {
    fn zeros(call: &CollectiveCall) -> Result<Sums, String> {
        if call.len > 16 {
            return Err(format!("{} elements are too many here", call.len));
        }
        Ok(Sums(vec![0.0; call.len as usize]))
    }
    let kind = CollectiveKind::Broadcast { root: 1 };
    let now = Instant::now();
    let awaited = || CallStart::Awaited { kind, make: zeros };
    // Nothing comes: it names the root.
    let mut early = Early::new(ATTEMPT);
    let mut a = RankCall::new(setup(0, 2, true), awaited(), true, now, &mut early);
    a.handle_timeout(now + PATIENCE);
    match ended(a.poll_outcome()) {
        SyncError::CollectiveTimedOut { waiting_on, .. } => assert_eq!(waiting_on, vec![1]),
        e => panic!("not a timeout: {e}"),
    }
    // The root's piece, which came before the call, starts it.
    let mut call = sum_call(3);
    call.kind = kind;
    call.algorithm = Algorithm::Tree;
    let mut root = RankCall::new(
        setup(1, 2, true),
        CallStart::Known(Box::new(exchange(
            call,
            &setup(1, 2, true),
            Sums(vec![7.0, 8.0, 9.0]),
        ))),
        true,
        now,
        &mut Early::new(ATTEMPT),
    );
    let mut early = Early::new(ATTEMPT);
    for (_, m) in sent(&mut root) {
        early.keep(PeerEvent::Message(m), CallKey::all(EPOCH));
    }
    let mut b = RankCall::new(setup(0, 2, true), awaited(), true, now, &mut early);
    assert_eq!(b.call(), call);
    let got = b.poll_outcome().expect("done").expect("received");
    assert_eq!(got.0, vec![7.0, 8.0, 9.0]);
    // A first piece announcing what cannot be made names its sender.
    call.len = 100;
    let mut c = RankCall::new(
        setup(0, 2, true),
        awaited(),
        true,
        now,
        &mut Early::new(ATTEMPT),
    );
    let m = first_piece(1, call, PeerBody::Value(Box::new(Vec::<f64>::new())));
    c.handle_peer(now, PeerEvent::Message(m), &mut Early::new(ATTEMPT));
    assert!(matches!(
        ended(c.poll_outcome()),
        SyncError::BadPiece { peer: 1, ref reason, .. } if reason.contains("too many")
    ));
}

#[test]
fn a_piece_too_large_for_the_transport_names_the_peer_and_both_sizes() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    let mut a = summing(0, 2, vec![1.0], now, &mut early);
    let (to, m) = sent(&mut a).pop().unwrap();
    let failure = SendFailure::TooLarge {
        bytes: 300,
        limit: 200,
    };
    a.handle_send_failed(now, to, m.call, failure);
    assert!(matches!(
        ended(a.poll_outcome()),
        SyncError::TooLarge {
            rank: 0,
            peer: 1,
            bytes: 300,
            limit: 200,
            ..
        }
    ));
}

#[test]
fn the_job_s_failure_or_the_node_s_error_ends_a_running_call_with_it() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    let mut a = summing(0, 2, vec![1.0], now, &mut early);
    a.handle_job_failed(SyncError::NoAnswer(PATIENCE));
    assert!(matches!(ended(a.poll_outcome()), SyncError::NoAnswer(_)));
    let mut b = summing(0, 2, vec![1.0], now, &mut early);
    b.handle_answer(CallKey::all(EPOCH), Err(SyncError::NothingToBroadcast(0)));
    assert!(matches!(
        ended(b.poll_outcome()),
        SyncError::NothingToBroadcast(0)
    ));
}

#[test]
fn a_peer_lost_before_the_call_fails_it() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    early.keep(lost(1, ATTEMPT), CallKey::all(EPOCH - 3));
    let mut a = summing(0, 2, vec![1.0], now, &mut early);
    assert!(
        sent(&mut a).is_empty(),
        "nothing goes to a call that cannot be"
    );
    a.handle_timeout(now + LOSS_GRACE);
    assert!(matches!(
        ended(a.poll_outcome()),
        SyncError::PeerLost { peer: 1, .. }
    ));
}

#[test]
fn of_two_early_pieces_that_do_not_fit_the_first_names_the_call_s_failure() {
    let now = Instant::now();
    let mut early = Early::new(ATTEMPT);
    let mut other = sum_call(3);
    other.algorithm = Algorithm::Ring;
    // Rank 1 made another call (a mistake in the program); then rank 2's piece does not
    // decode.
    for (from, call) in [(1, other), (2, sum_call(2))] {
        let m = first_piece(from, call, PeerBody::Encoded(Bytes::from_static(&[0xc1])));
        early.keep(PeerEvent::Message(m), CallKey::all(EPOCH));
    }
    let mut a = summing(0, 4, vec![1.0, 2.0], now, &mut early);
    match ended(a.poll_outcome()) {
        e @ SyncError::CollectiveMismatch { peer: 1, .. } => assert!(e.is_mistake()),
        e => panic!("not the first piece's mismatch: {e}"),
    }
}
