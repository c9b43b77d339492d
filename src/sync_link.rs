//! How a worker's compute waits in its sync calls and collectives: the link its calls go
//! out on ([`SyncSender`], which the runtime or the simulator gives it) and where what it
//! waits for comes back — the master's node's answers, its peers' pieces, the job's
//! failure, a wake-up at the time it waits until — blocking its thread or as a future.
//! The waits read the time from the link, so the simulator runs them in virtual time.

use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::error::{JobError, SyncError};
use crate::flight::What;
use crate::ids::{Attempt, CallKey, Epoch, GroupId, Rank, SyncKind};
use crate::protocol::{
    Early, Flight, Flights, PeerMessage, SendFailure, SyncResult, ToMaster, WorkerConfig,
};
use crate::transport::{PeerEvent, PeerLink, TransportError};

/// Where a worker's sync calls go: its link to the master's node, as its driver (the
/// runtime's worker, or the simulator) gives it.
pub(crate) trait SyncSender<W>: Send + Sync {
    /// Sends the call; an error says why it could not go, as the job would fail with it.
    fn send_call(&self, call: ToMaster<W>) -> Result<(), JobError>;

    /// Sends a call whose answer no one waits for, soon (see
    /// [`WorkerLink::send_soon`](crate::transport::WorkerLink::send_soon)); by default now.
    fn send_call_soon(&self, call: ToMaster<W>) -> Result<(), JobError> {
        self.send_call(call)
    }

    /// The compute is about to wait for what comes next, nothing having come, until
    /// `until` at the latest (`None`: as long as it takes): said once per wait, however
    /// often the wait wakes to say it still waits. The simulator, which runs one thread
    /// at a time, goes on from here; the runtime has nothing to do.
    fn waiting(&self, until: Option<Instant>) {
        let _ = until;
    }

    /// Now, as the compute's calls read it: the runtime's clock, or the simulator's
    /// virtual time.
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// Whether whoever drives the compute wakes it ([`Incoming::Wake`]) at the time it
    /// said it waits until: its waits then do not time out by themselves (the simulator,
    /// whose time is virtual).
    fn wakes(&self) -> bool {
        false
    }
}

/// A worker's way to make sync calls from its compute thread: send on the shared link,
/// then wait for the answer its actor forwards.
pub(crate) struct SyncLink<W> {
    pub(crate) link: Arc<dyn SyncSender<W>>,
    /// The answers to sync calls and what peers send for collectives, in the order they
    /// came.
    pub(crate) answers: mpsc::Receiver<Incoming>,
    /// The way to the other workers, for collectives; `None` where the transport has
    /// none (said in the error).
    pub(crate) peers: Result<Arc<dyn PeerLink>, &'static str>,
    /// Pieces of collectives this rank has not called yet, and peers lost.
    pub(crate) early: Early,
    /// The collectives this rank started and has not finished: every wait drives them.
    pub(crate) flying: Flights,
    pub(crate) attempt: Attempt,
    /// The worker's settings: how long a call waits for an answer before giving up on the
    /// master's node (`sync_patience`: longer than the sync timeout, which normally
    /// answers first, unless the coordination thread is held by inline code for longer).
    pub(crate) config: Arc<WorkerConfig>,
    /// The job's first failure, once this worker heard of it (the master's abort): the
    /// call waiting, and every call after it, fails with it at once — the master may be
    /// gone, or past answering.
    pub(crate) ended: Arc<OnceLock<JobError>>,
    /// Whether the compute said it waits ([`SyncSender::waiting`]) and nothing came since.
    pub(crate) said_waiting: std::sync::atomic::AtomicBool,
    /// Woken after each send on the channel of `answers`: what an `_async` call awaits.
    pub(crate) arrived: Arc<tokio::sync::Notify>,
    /// The rank's flight recorder: its calls, their ends, what its compute did.
    pub(crate) recorder: Arc<crate::flight::Recorder>,
}

/// How the master's node hears of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Now, and the call waits for its word that every rank made it.
    Awaited,
    /// Now, with no word awaited: this rank's result proves the call, but another rank
    /// waits for the word (a reduce's other ranks), which needs this call.
    Now,
    /// With the rank's next frame to the master's node, or a few milliseconds later at
    /// most (`protocol::HOLD`, over TCP and in the simulator), no rank awaiting a word: one
    /// write for many calls, none on a call's way, and one word for those that follow one
    /// another (`protocol::CallRun`).
    Soon,
}

/// How a sync call or a collective waits for what comes next: blocking the compute's
/// thread, or as a future that leaves the thread to the async runtime's other tasks
/// meanwhile (the `_async` forms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    Block,
    Await,
}

/// Runs a future whose waits block (`Wait::Block`): it is ready when first polled.
pub(crate) fn block<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        // Not reached: a wait that blocks is never pending.
        std::thread::yield_now();
    }
}

/// Runs `future` in `span`: entered while it is polled, so an awaited call is in its
/// span only while it runs — and, unlike `tracing::Instrument`, not entered again while
/// the future is dropped, so a call is one slice in a trace.
pub(crate) async fn in_span<F: std::future::Future>(span: tracing::Span, future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        let _entered = span.enter();
        future.as_mut().poll(cx)
    })
    .await
}

/// Checks that an `_async` call is awaited where Tokio's timers are, which bound its
/// waits.
pub(crate) fn awaitable() -> Result<(), SyncError> {
    tokio::runtime::Handle::try_current()
        .map(drop)
        .map_err(|_| SyncError::NoTimer)
}

/// What reaches a worker's compute while it waits in a sync call or a collective.
pub(crate) enum Incoming {
    /// The master's node's answer to sync call `key` (or, at epoch `Epoch::MAX` of every
    /// rank's, word that the job failed).
    Answer(CallKey, SyncResult),
    /// A peer's piece, or a peer lost.
    Peer(PeerEvent),
    /// The time the compute said it waits until came ([`SyncSender::wakes`]): only a
    /// driver that wakes its computes (the simulator) sends it.
    #[cfg_attr(not(any(test, feature = "sim")), allow(dead_code))]
    Wake,
}

/// A wait for the master's node's answer to this rank's call `epoch`, at most until
/// `deadline`: what its peers send meanwhile is kept for the calls it is for.
struct Answer {
    epoch: Epoch,
    deadline: Option<Instant>,
    patience: std::time::Duration,
    result: Option<SyncResult>,
}

impl Flight for Answer {
    fn key(&self) -> CallKey {
        CallKey::all(self.epoch)
    }

    fn handle_peer(&mut self, _: Instant, event: PeerEvent, early: &mut Early) {
        // A peer's piece of a later call, or of this one (an all_gather's ring, which may
        // start before this answer comes here; or another call, which the master's node
        // fails on every rank): kept.
        early.keep(event, self.key());
    }

    fn handle_answer(&mut self, answered: CallKey, result: &SyncResult) {
        if answered == self.key() && self.result.is_none() {
            self.result = Some(result.clone());
        }
    }

    fn handle_job_failed(&mut self, failure: SyncError) {
        self.result.get_or_insert(Err(failure));
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| now >= d) {
            self.result
                .get_or_insert(Err(SyncError::NoAnswer(self.patience)));
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline.filter(|_| self.result.is_none())
    }

    fn settled(&mut self) -> bool {
        self.result.is_some()
    }
}

/// A wait for a call in flight: nothing of its own; what comes for no call in flight is
/// kept for the calls it is for, from `next` on (of its group).
struct Idle {
    next: CallKey,
}

impl Flight for Idle {
    fn key(&self) -> CallKey {
        self.next
    }

    fn handle_peer(&mut self, _: Instant, event: PeerEvent, early: &mut Early) {
        early.keep(event, self.next);
    }

    fn handle_answer(&mut self, _: CallKey, _: &SyncResult) {}

    fn handle_job_failed(&mut self, _: SyncError) {}

    fn handle_timeout(&mut self, _: Instant) {}

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn settled(&mut self) -> bool {
        false
    }
}

impl<W> SyncLink<W> {
    /// The master's node's answer to this rank's call `epoch`, waited for at most the
    /// worker's `sync_patience`.
    pub(crate) async fn answer(&mut self, epoch: Epoch, wait: Wait) -> SyncResult {
        let patience = self.config.sync_patience;
        let mut answer = Answer {
            epoch,
            deadline: self.now().checked_add(patience),
            patience,
            result: None,
        };
        self.drive(&mut answer, wait).await;
        answer.result.expect("a driven wait ends settled")
    }

    /// Drives `main` until it ends, and with it every call in flight: sends what they
    /// send, hands each what comes for it, and wakes them at the times they ask.
    pub(crate) async fn drive<F: Flight + ?Sized>(&mut self, main: &mut F, wait: Wait) {
        self.drive_until(main, wait, |main, _| main.settled()).await;
    }

    /// Drives the calls in flight until call `key` among them ended; it stays in flight
    /// (a wait given up half-way leaves it there, to be finished or named). `next`: the
    /// rank's next call of its group — pieces of earlier calls not in flight are stale.
    pub(crate) async fn finish(&mut self, key: CallKey, next: CallKey, wait: Wait) {
        let mut idle = Idle { next };
        self.drive_until(&mut idle, wait, |_, flying| {
            flying.call(key).is_none() || flying.ended(key)
        })
        .await;
    }

    /// [`drive`](Self::drive), until `done` says so.
    async fn drive_until<F: Flight + ?Sized>(
        &mut self,
        main: &mut F,
        wait: Wait,
        mut done: impl FnMut(&mut F, &mut Flights) -> bool,
    ) {
        // The calls in flight went unattended while the rank did other work.
        if !self.flying.is_empty() {
            let now = self.now();
            self.flying.resume(now);
        }
        loop {
            self.send(main);
            self.flying.settle();
            if done(main, &mut self.flying) {
                return;
            }
            let deadline = match (main.poll_timeout(), self.flying.poll_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match self.next(wait, deadline).await {
                Ok(Incoming::Peer(event)) => {
                    let now = self.now();
                    if let Some(event) = self.flying.handle_peer(now, event, &mut self.early) {
                        main.handle_peer(now, event, &mut self.early);
                    }
                }
                Ok(Incoming::Answer(answered, result)) => {
                    // Not a call's own answer: the job failed (the worker woke the wait
                    // to say so), or it answers an earlier call.
                    let failure = self.failure();
                    main.handle_answer(answered, &result);
                    if let Some(e) = failure.clone().filter(|_| answered != main.key()) {
                        main.handle_job_failed(e);
                    }
                    self.flying
                        .handle_answer(answered, &result, failure.as_ref());
                }
                Ok(Incoming::Wake) | Err(mpsc::RecvTimeoutError::Timeout) => match self.failure() {
                    Some(e) => {
                        self.flying.handle_job_failed(&e);
                        main.handle_job_failed(e);
                    }
                    None => {
                        let now = self.now();
                        self.flying.handle_timeout(now);
                        main.handle_timeout(now);
                    }
                },
                // The worker is gone: nothing more comes.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let e = self
                        .failure()
                        .unwrap_or(SyncError::NoAnswer(self.config.sync_patience));
                    self.flying.handle_job_failed(&e);
                    main.handle_job_failed(e);
                }
            }
        }
    }

    /// Sends what `main`, then the calls in flight, have to send; a piece that cannot go
    /// is handed back to its call.
    fn send<F: Flight + ?Sized>(&mut self, main: &mut F) {
        while let Some((to, msg)) = main.poll_send() {
            let call = msg.call;
            if let Err(failure) = self.send_piece(to, msg) {
                main.handle_send_failed(self.now(), to, call, failure);
            }
        }
        self.send_flights();
    }

    /// Sends what the calls in flight have to send.
    pub(crate) fn send_flights(&mut self) {
        while let Some((to, msg)) = self.flying.poll_send() {
            let call = msg.call;
            if let Err(failure) = self.send_piece(to, msg) {
                let now = self.now();
                self.flying.handle_send_failed(now, to, call, failure);
            }
        }
    }

    /// Sends `msg` to rank `to`.
    fn send_piece(&self, to: Rank, msg: PeerMessage) -> Result<(), SendFailure> {
        let peers = self
            .peers
            .as_ref()
            .map_err(|why| SendFailure::Lost((*why).to_owned()))?;
        peers.send(to, msg).map_err(|e| match e {
            TransportError::TooLarge { bytes, limit } => SendFailure::TooLarge { bytes, limit },
            e => SendFailure::Lost(e.to_string()),
        })
    }
}

impl<W> SyncLink<W> {
    /// Tells the master's node of this rank's call `epoch` among `group` (`ranks`: its
    /// ranks, said with the rank's first call among it), as `notice` says.
    pub(crate) fn call(
        &self,
        (epoch, group, ranks): (Epoch, GroupId, &[Rank]),
        (kind, len): (SyncKind, Option<u64>),
        message: Vec<u8>,
        notice: Notice,
    ) -> Result<(), SyncError> {
        self.recorder.record(What::Call {
            group,
            epoch,
            kind,
            len,
        });
        let awaits = notice == Notice::Awaited;
        let call = ToMaster::Sync {
            attempt: self.attempt,
            epoch,
            calls: 1,
            kind,
            message,
            awaits,
            group,
            ranks: ranks.to_vec(),
        };
        let sent = match notice {
            Notice::Soon => self.link.send_call_soon(call),
            Notice::Awaited | Notice::Now => self.link.send_call(call),
        };
        // A link closed by the job's end: the call fails as every waiting rank's does,
        // and ends there.
        let sent = sent.map_err(|e| {
            self.failure()
                .unwrap_or_else(|| SyncError::JobFailed(Box::new(e)))
        });
        if sent.is_err() {
            self.ended((epoch, group), &sent);
        }
        sent
    }

    /// Records the end of call `epoch` of `group`, as `result` says.
    pub(crate) fn ended<T>(&self, (epoch, group): (Epoch, GroupId), result: &Result<T, SyncError>) {
        let error = result.as_ref().err().map(ToString::to_string);
        self.recorder.record(What::Ended {
            group,
            epoch,
            error,
        });
    }

    /// The job's failure, once this worker heard of it, as every rank waiting in a call
    /// gets it ([`JobError::as_sync_failure`]).
    pub(crate) fn failure(&self) -> Option<SyncError> {
        self.ended.get().map(JobError::as_sync_failure)
    }

    /// What comes next, waiting until `deadline` (`None`: as long as it takes) as `wait`
    /// says.
    pub(crate) async fn next(
        &self,
        wait: Wait,
        deadline: Option<Instant>,
    ) -> Result<Incoming, mpsc::RecvTimeoutError> {
        match wait {
            Wait::Block => self.receive(deadline),
            Wait::Await => self.receive_async(deadline).await,
        }
    }

    /// [`receive`](Self::receive), awaiting what comes on Tokio's timers rather than
    /// blocking the thread.
    async fn receive_async(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Incoming, mpsc::RecvTimeoutError> {
        /// A wait given up by dropping its future has not waited on: the next one says
        /// it waits again.
        struct Unsaid<'a>(&'a std::sync::atomic::AtomicBool, bool);
        impl Drop for Unsaid<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    self.0.store(false, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        let mut unsaid = Unsaid(&self.said_waiting, false);
        loop {
            // This wait reads no peer's connection: the transport's I/O does, at once,
            // even where a blocking wait just read them itself.
            if let Ok(peers) = &self.peers {
                peers.stop_reading();
            }
            if let Some(came) = self.look(deadline) {
                unsaid.1 = true;
                return came;
            }
            // A send after the look above leaves its wake-up stored: none is lost.
            let arrived = self.arrived.notified();
            match deadline.filter(|_| !self.link.wakes()) {
                None => arrived.await,
                Some(deadline) => {
                    let at = tokio::time::Instant::from_std(deadline);
                    if tokio::time::timeout_at(at, arrived).await.is_err() {
                        unsaid.1 = true;
                        return Err(mpsc::RecvTimeoutError::Timeout);
                    }
                }
            }
        }
    }

    /// What comes next, waiting until `deadline` (`None`: as long as it takes).
    pub(crate) fn receive(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Incoming, mpsc::RecvTimeoutError> {
        loop {
            if let Some(came) = self.look(deadline) {
                return came;
            }
            if let Some(came) = self.read_peers(deadline) {
                return came;
            }
            let incoming = match deadline.filter(|_| !self.link.wakes()) {
                Some(deadline) => self
                    .answers
                    .recv_timeout(deadline.saturating_duration_since(self.now())),
                None => self
                    .answers
                    .recv()
                    .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            };
            self.said_waiting
                .store(false, std::sync::atomic::Ordering::Relaxed);
            if let Some(came) = self.came(incoming?, deadline) {
                return came;
            }
        }
    }

    /// Where the peers' pieces come through sockets this thread can read: reads them
    /// itself and looks again, yielding the core between looks, for as long as the
    /// peers' link says ([`PeerLink::poll_for`]) before the wait parks the thread.
    fn read_peers(
        &self,
        deadline: Option<Instant>,
    ) -> Option<Result<Incoming, mpsc::RecvTimeoutError>> {
        let peers = self.peers.as_ref().ok()?;
        let spin = peers.poll_for();
        if spin.is_zero() {
            return None;
        }
        let start = Instant::now();
        loop {
            peers.read_now();
            if let Some(came) = self.look(deadline) {
                return Some(came);
            }
            let now = Instant::now();
            if now.duration_since(start) >= spin || deadline.is_some_and(|d| now >= d) {
                // What comes from now on, the transport reads, and wakes this thread with.
                peers.stop_reading();
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// What came, already, if anything did (or the channel's end); otherwise `None`, the
    /// compute having said it waits until `deadline` ([`SyncSender::waiting`]) unless it
    /// said so since the last thing came.
    fn look(&self, deadline: Option<Instant>) -> Option<Result<Incoming, mpsc::RecvTimeoutError>> {
        use std::sync::atomic::Ordering::Relaxed;
        loop {
            match self.answers.try_recv() {
                Ok(incoming) => {
                    self.said_waiting.store(false, Relaxed);
                    if let Some(came) = self.came(incoming, deadline) {
                        return Some(came);
                    }
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Some(Err(mpsc::RecvTimeoutError::Disconnected))
                }
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        if !self.said_waiting.swap(true, Relaxed) {
            self.link.waiting(deadline);
        }
        None
    }

    /// `incoming`, as a wait until `deadline` sees it: a wake-up at the deadline is the
    /// wait's end; one before it (the time said by an earlier wait) is nothing.
    fn came(
        &self,
        incoming: Incoming,
        deadline: Option<Instant>,
    ) -> Option<Result<Incoming, mpsc::RecvTimeoutError>> {
        match incoming {
            Incoming::Wake if deadline.is_some_and(|d| self.now() >= d) => {
                Some(Err(mpsc::RecvTimeoutError::Timeout))
            }
            Incoming::Wake => None,
            other => Some(Ok(other)),
        }
    }

    /// Now, as the link's driver keeps time.
    pub(crate) fn now(&self) -> Instant {
        self.link.now()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// A link whose driver keeps the time and wakes the compute (as the simulator does),
    /// and hears what the compute says it waits until.
    struct Driven {
        now: Mutex<Instant>,
        said: mpsc::Sender<Option<Instant>>,
    }

    impl SyncSender<u64> for Arc<Driven> {
        fn send_call(&self, _: ToMaster<u64>) -> Result<(), JobError> {
            Ok(())
        }

        fn waiting(&self, until: Option<Instant>) {
            let _ = self.said.send(until);
        }

        fn now(&self) -> Instant {
            *self.now.lock().unwrap()
        }

        fn wakes(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_driven_wait_ends_on_a_wake_up_at_its_deadline_and_goes_on_past_an_earlier_one() {
        let start = Instant::now();
        let (said, heard) = mpsc::channel();
        let driven = Arc::new(Driven {
            now: Mutex::new(start),
            said,
        });
        let config = Arc::new(crate::protocol::NodeConfig::for_tests().worker());
        let (sync, answers) = crate::runtime::sync_calls::sync_link::<u64>(
            Arc::new(Arc::clone(&driven)),
            1,
            config,
            Err("none"),
            Arc::new(crate::flight::Recorder::new(0)),
        );
        let deadline = start + Duration::from_secs(5);
        let waiting = std::thread::spawn(move || sync.receive(Some(deadline)).map(drop));
        // It says it waits, until its deadline: a real-time wait of its own never ends it.
        assert_eq!(heard.recv().unwrap(), Some(deadline));
        std::thread::sleep(Duration::from_millis(20));
        // Woken before the deadline (the time an earlier wait said): it waits on, and says
        // so again.
        *driven.now.lock().unwrap() = start + Duration::from_secs(1);
        answers.wake();
        assert_eq!(heard.recv().unwrap(), Some(deadline));
        // At the deadline: the wait ends, timed out.
        *driven.now.lock().unwrap() = deadline;
        answers.wake();
        let ended = waiting.join().unwrap();
        assert!(matches!(ended, Err(mpsc::RecvTimeoutError::Timeout)));
    }

    #[test]
    fn a_job_failed_of_a_ranks_mismatch_fails_a_waiting_call_with_that_mismatch() {
        use crate::error::{BoxError, Cause, Phase};
        use crate::ids::CallAt;
        let mismatch = SyncError::Mismatch {
            at: CallAt {
                iteration: 1,
                call: 1,
                group: crate::ids::GroupId::ALL,
            },
            calls: vec![(0, SyncKind::Barrier), (1, SyncKind::AllGather)],
        };
        let failed = |cause: Cause| JobError::Worker {
            rank: 1,
            iteration: 1,
            phase: Phase::Compute,
            cause,
        };
        let rank_local = SyncError::OutsideCompute(SyncKind::Barrier);
        let plain = Cause::from_error(BoxError::from("no such file"));
        let cases = [
            // The rank that met the mismatch failed its compute of it: every waiting
            // rank gets the mismatch itself, as that rank did.
            (
                plain.clone().mistaken(mismatch.clone()),
                Some(mismatch.clone()),
            ),
            // A mistake of the rank's own (a call where none may be made) names that
            // rank's code: the others hear of the job's failure.
            (plain.clone().mistaken(rank_local), None),
            (plain, None),
        ];
        for (cause, expected) in cases {
            let config = Arc::new(crate::protocol::NodeConfig::for_tests().worker());
            let (said, _heard) = mpsc::channel();
            let driven = Arc::new(Driven {
                now: Mutex::new(Instant::now()),
                said,
            });
            let (sync, _answers) = crate::runtime::sync_calls::sync_link::<u64>(
                Arc::new(driven),
                1,
                config,
                Err("none"),
                Arc::new(crate::flight::Recorder::new(0)),
            );
            // As it reaches a worker of another process.
            let job_error = crate::codec::round_trip(&failed(cause)).unwrap();
            assert!(sync.failure().is_none());
            sync.ended.set(job_error.clone()).unwrap();
            let got = sync.failure().unwrap();
            match expected {
                Some(expected) => assert_eq!(got, expected),
                None => assert_eq!(got, SyncError::JobFailed(Box::new(job_error))),
            }
        }
    }
}
