//! A worker's end of barrier mode: the link its compute's sync calls (`barrier()`,
//! `all_gather()`) go out on, and where their answers — or the job's failure, which ends
//! every call — come back to the compute waiting in one.

use std::sync::{mpsc, Arc};

use crate::error::JobError;
use crate::flight::{Recorder, What};
use crate::ids::{Attempt, CallKey, Epoch, GroupId};
use crate::payload::Payload;
use crate::protocol::{Early, Flights, SyncResult, ToMaster, WorkerConfig};
use crate::sync_link::{Incoming, SyncLink, SyncSender};
use crate::transport::{PeerInbox, PeerLink, WorkerLink};

/// In barrier mode: where the answers to the worker's sync calls go, to the compute
/// waiting for them, and where the job's first failure goes once the worker heard of it
/// (every sync call then fails with it at once).
pub(crate) struct SyncAnswers {
    to: Handing,
    ended: Arc<std::sync::OnceLock<JobError>>,
    /// The rank's flight recorder: a peer lost is recorded as the word comes.
    recorder: Arc<Recorder>,
}

/// The way to the compute: a send, then a wake-up for an `_async` call awaiting it.
#[derive(Clone)]
struct Handing {
    to: mpsc::Sender<Incoming>,
    arrived: Arc<tokio::sync::Notify>,
}

impl Handing {
    fn send(&self, incoming: Incoming) {
        // The compute may have given up waiting already; then nobody listens.
        if self.to.send(incoming).is_ok() {
            self.arrived.notify_one();
        }
    }
}

impl SyncAnswers {
    /// The answer to call `epoch` of `group`'s, for the compute waiting in it (it may have
    /// given up waiting already; then nobody listens).
    pub(crate) fn answer(&self, (epoch, group): (Epoch, GroupId), result: SyncResult) {
        self.to
            .send(Incoming::Answer(CallKey { group, epoch }, result));
    }

    /// The job failed with `error`: the call waiting, and every later one, fails with it
    /// at once.
    pub(crate) fn end(&self, error: &JobError) {
        if self.ended.set(error.clone()).is_ok() {
            // Wakes a compute waiting in a sync call: not its epoch, so it looks.
            let failed = error.as_sync_failure();
            self.to
                .send(Incoming::Answer(CallKey::all(Epoch::MAX), Err(failed)));
        }
    }

    /// The time the compute said it waits until came: it looks at its deadline.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn wake(&self) {
        self.to.send(Incoming::Wake);
    }

    /// A peer's piece, or word of a peer lost, for the compute.
    #[cfg(feature = "sim")]
    pub(crate) fn peer(&self, event: crate::transport::PeerEvent) {
        self.to.send(Incoming::Peer(event));
    }

    /// Where the worker's peers' pieces go: to the compute, which takes them in its
    /// collectives.
    pub(crate) fn peer_inbox(&self) -> PeerInbox {
        let to = self.to.clone();
        let recorder = Arc::clone(&self.recorder);
        Box::new(move |event| {
            if let crate::transport::PeerEvent::Lost { rank, reason, .. } = &event {
                recorder.record(What::PeerLost {
                    peer: *rank,
                    reason: reason.clone(),
                });
            }
            to.send(Incoming::Peer(event))
        })
    }
}

/// A worker's link, as the way its sync calls go: a call that cannot go fails as the
/// transport's error.
pub(crate) struct LinkCalls<W>(pub(crate) Arc<dyn WorkerLink<W>>);

impl<W: Payload> SyncSender<W> for LinkCalls<W> {
    fn send_call(&self, call: ToMaster<W>) -> Result<(), JobError> {
        self.0.send(call).map_err(JobError::from)
    }

    fn send_call_soon(&self, call: ToMaster<W>) -> Result<(), JobError> {
        self.0.send_soon(call).map_err(JobError::from)
    }
}

/// A worker's end of barrier mode: its sync calls go out on `link`, in `attempt`, and each
/// waits at most the worker's `sync_patience` for its answer (`Duration::MAX`: until it
/// comes); the answers come in through the [`SyncAnswers`], which its driver holds. Its
/// collectives go to its peers on `peers` (or fail saying why there are none); what the
/// peers send it is to go to [`SyncAnswers::peer_inbox`].
pub(crate) fn sync_link<W: Payload>(
    link: Arc<dyn SyncSender<W>>,
    attempt: Attempt,
    config: Arc<WorkerConfig>,
    peers: Result<Arc<dyn PeerLink>, &'static str>,
    recorder: Arc<Recorder>,
) -> (SyncLink<W>, SyncAnswers) {
    let (to, answers) = mpsc::channel();
    let arrived = Arc::new(tokio::sync::Notify::new());
    let to = Handing {
        to,
        arrived: Arc::clone(&arrived),
    };
    let ended = Arc::new(std::sync::OnceLock::new());
    let sync = SyncLink {
        link,
        said_waiting: Default::default(),
        arrived,
        answers,
        peers,
        early: Early::new(attempt),
        flying: Flights::default(),
        attempt,
        config,
        ended: Arc::clone(&ended),
        recorder: Arc::clone(&recorder),
    };
    (
        sync,
        SyncAnswers {
            to,
            ended,
            recorder,
        },
    )
}
