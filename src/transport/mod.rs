//! How a message reaches a peer.
//!
//! The runtime talks to peers only through the three traits here, so a job runs unchanged
//! over any implementation. [`MemoryTransport`] runs the whole job in one process: the
//! master's node steps its workers directly, with no message and no serialization
//! ([`Transport::in_process`]).
//!
//! # Writing a transport
//!
//! A transport is set up once per job, on each process, in this order:
//!
//! 1. [`Transport::prepare`] learns the job (its id and worker count) and answers which
//!    parts of the job run in this process: the master's node and/or which worker ranks.
//! 2. If the master's node is here, [`Transport::bind_master`] gets the attempt it runs
//!    (not 0 when it was started again: [`Topology::restarted`]) and the [`Inbox`] into which
//!    every message from any worker must be delivered, stamped with that worker's rank
//!    (an [`Envelope`]); it returns the [`MasterLink`] the master uses to reach workers.
//! 3. For each local worker rank, [`Transport::connect_worker`] gets that worker's inbox
//!    and returns the [`WorkerLink`] it uses to reach the master's node.
//!
//! When a failure policy replaces a local worker, [`Transport::reconnect_worker`] connects
//! its replacement and closes the old worker's link.
//!
//! Delivery rules the runtime relies on: messages between one worker and the master's
//! node arrive in the order they were sent; an inbox may be called from any thread; a
//! message may be lost only when its peer is gone (the protocol detects that by timeouts
//! and drops duplicates and stale messages, so at-least-once delivery is also fine).
//! Sending must not block: queue the message and return.

mod memory;
#[cfg(feature = "tcp")]
pub mod tcp;

use std::sync::Arc;

use crate::protocol::{Envelope, PeerMessage, ToMaster, ToWorker, Unsent};

use crate::ids::{Attempt, Rank};

pub(crate) use memory::MemoryMesh;
pub use memory::MemoryTransport;
#[cfg(feature = "tcp")]
pub use tcp::{ClusterEnv, TcpSettings, TcpTransport};

/// A transport that runs every part of a job in this process ([`Transport::in_process`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct InProcess {
    /// Whether every message that carries a master or worker result goes through the wire
    /// encoding first ([`MemoryTransport::wire_check`]).
    pub wire_check: WireCheck,
}

impl InProcess {
    /// Every part of the job in this process, with the wire check as given.
    pub fn new(wire_check: WireCheck) -> Self {
        InProcess { wire_check }
    }
}

/// Whether the messages of a job run in one process that carry a user's value (a master
/// or worker result, a piece of a collective) go through the wire encoding, as they would
/// between processes ([`MemoryTransport::wire_check`]): a type whose serde form loses or
/// refuses something then fails in memory as it would over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireCheck {
    /// Values are handed over as they are.
    Off,
    /// Values are encoded and decoded again on their way.
    On,
}

impl WireCheck {
    /// `On` if `on`.
    pub fn of(on: bool) -> Self {
        if on {
            WireCheck::On
        } else {
            WireCheck::Off
        }
    }

    /// `msg` as a peer across a wire would get it, if it carries a result
    /// ([`Carrying::carries_result`](crate::protocol::Carrying)) and the check is on:
    /// encoded and decoded again.
    #[inline]
    pub(crate) fn apply<T>(
        self,
        msg: T,
        direction: impl FnOnce() -> String,
    ) -> Result<T, TransportError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + crate::protocol::Carrying,
    {
        if !self.applies_to(&msg) {
            return Ok(msg);
        }
        // Named by what it carries: the user's type, and which value of it.
        crate::codec::round_trip(&msg).map_err(|message| {
            let (type_name, what) = msg.carried();
            TransportError::Undecodable {
                direction: format!("{}, {what},", direction()),
                type_name: type_name.to_owned(),
                message,
            }
        })
    }

    /// Whether [`apply`](Self::apply) encodes `msg`.
    pub(crate) fn applies_to<T: crate::protocol::Carrying>(self, msg: &T) -> bool {
        self == WireCheck::On && msg.carries_result()
    }
}

/// Where a transport delivers incoming messages. Cheap to call from any thread; never
/// blocks.
pub type Inbox<T> = Box<dyn Fn(T) + Send + Sync + 'static>;

/// What a transport learns about the job before it connects anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    /// The job's id.
    pub job_id: String,
    /// The number of workers.
    pub workers: usize,
    /// What every process of the job must agree on: a transport that connects processes
    /// checks that a worker's process runs the job as the master's does.
    pub fingerprint: Fingerprint,
    /// Whether workers reach each other (barrier mode: for collectives): a transport
    /// that connects processes gives each worker a way to its peers
    /// ([`Transport::peers`]).
    pub peers: bool,
}

impl LinkSpec {
    /// The job `job_id` of `workers` workers, with no fingerprint (every process agrees).
    pub fn new(job_id: impl Into<String>, workers: usize) -> Self {
        LinkSpec {
            job_id: job_id.into(),
            workers,
            fingerprint: Fingerprint::default(),
            peers: false,
        }
    }
}

/// What every process of a job must agree on — the world size, the settings that change
/// what a worker computes or how the protocol runs, the input, the result types, the
/// versions — as named values, in the order they are checked. The TCP transport sends it
/// in each worker's handshake, and the master refuses a worker whose fingerprint differs,
/// naming the first field that does and both values: processes started with different
/// settings never run one job to a wrong answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint(Vec<(String, String)>);

impl Fingerprint {
    /// An empty fingerprint.
    pub fn new() -> Self {
        Fingerprint::default()
    }

    /// Adds the field `name` with `value`.
    pub fn with(mut self, name: impl Into<String>, value: impl std::fmt::Display) -> Self {
        self.0.push((name.into(), value.to_string()));
        self
    }

    /// Adds the job's own parameters ([`JobParams`](crate::params::JobParams)), each as the field
    /// `params.<name>`. A long value (a list of files, say) is its beginning, its length
    /// and its checksum, so that the handshake stays small (the checkpoints keep it whole).
    pub(crate) fn with_params(mut self, params: Option<&crate::params::JobParams>) -> Self {
        for (name, value) in params.into_iter().flat_map(|p| p.fields()) {
            let value = if value.len() > 200 {
                let head: String = value.chars().take(64).collect();
                let crc = crc32fast::hash(value.as_bytes());
                format!("{head}… ({} bytes, CRC-32 {crc:08x})", value.len())
            } else {
                value.to_string()
            };
            self.0.push((format!("params.{name}"), value));
        }
        self
    }

    /// The value of the field `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every field, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The first field, in this fingerprint's order (then the other's), whose values
    /// differ: `(field, this value, the other's value)`; a field one side lacks reads
    /// `(none)`.
    pub fn first_difference(&self, other: &Fingerprint) -> Option<(String, String, String)> {
        crate::params::first_difference(&self.0, &other.0)
    }
}

/// Which parts of the job run in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Whether the master and the barrier run here.
    pub master: bool,
    /// The worker ranks that run here.
    pub workers: Vec<Rank>,
    /// How many times this process was started again in the place of one that died (0
    /// for the first). A master's node started again resumes the job from its newest
    /// checkpoint as a new attempt, which the workers that reconnect learn.
    pub restarted: u32,
}

/// Why a message could not be sent or a link could not be made.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The transport was used before [`Transport::prepare`].
    #[error("the transport was not prepared for a job")]
    NotPrepared,
    /// No worker of this rank is connected.
    #[error("worker {rank} is not connected")]
    NotConnected {
        /// The rank.
        rank: Rank,
    },
    /// The master's node is not bound.
    #[error("the master's node is not bound")]
    NoMaster,
    /// A rank outside `0..workers`.
    #[error("rank {rank} is outside 0..{workers}")]
    UnknownRank {
        /// The rank.
        rank: Rank,
        /// The number of workers.
        workers: usize,
    },
    /// The link was made twice.
    #[error("{what} is connected already")]
    AlreadyConnected {
        /// What: the master, or a worker's rank.
        what: String,
    },
    /// The job's worker count and the cluster's world size differ.
    #[error("the job has {} but the cluster's world size is {cluster}", crate::error::counted(*job, "worker"))]
    WorldSize {
        /// The job's `workers`.
        job: usize,
        /// The cluster's world size.
        cluster: usize,
    },
    /// A message could not be encoded (too large for a frame, or not serializable).
    #[error("could not send a message: {0}")]
    Encode(String),
    /// The connection is closed.
    #[error("the connection is closed")]
    Closed,
    /// Binding or connecting failed, or the transport's own machinery did (its thread,
    /// its runtime).
    #[error("{message}")]
    Io {
        /// What failed, naming the address.
        message: String,
        /// The operating system's error, when there is one: `source()`.
        #[source]
        source: Option<crate::error::ErrorSource>,
    },
    /// Binding to an address other than loopback without a shared secret is refused.
    #[error(
        "refusing to bind {addr} without a secret: set one (SUPERSTEP_SECRET) or bind 127.0.0.1"
    )]
    Insecure {
        /// The address.
        addr: String,
    },
    /// A replacement took this worker's rank ([`Transport::reconnect_worker`]): the old
    /// worker's link is closed.
    #[error("worker {rank} was replaced: this link is closed")]
    Replaced {
        /// The rank.
        rank: Rank,
    },
    /// A message is larger than the transport carries in one frame
    /// ([`TcpSettings::max_frame`](crate::transport::TcpSettings::max_frame),
    /// `SUPERSTEP_MAX_FRAME`).
    #[error("a frame of {bytes} bytes is over the limit of {limit} bytes (max_frame)")]
    TooLarge {
        /// The frame's size.
        bytes: usize,
        /// The largest frame the transport carries.
        limit: usize,
    },
    /// The transport cannot do what was asked of it.
    #[error("{0}")]
    Unsupported(String),
    /// The cluster environment is incomplete or invalid.
    #[error("cluster environment: {0}")]
    Env(String),
    /// A message did not survive the wire encoding
    /// ([`MemoryTransport::wire_check`](MemoryTransport::wire_check)).
    #[error(
        "a message {direction} does not survive the wire encoding as `{type_name}`: {message}"
    )]
    Undecodable {
        /// Which way the message went: `worker 2 → master`, `master → worker 2`.
        direction: String,
        /// The type it was encoded and decoded as.
        type_name: String,
        /// What the encoder or decoder said.
        message: String,
    },
}

crate::error::debug_as_sentence!(TransportError);

impl TransportError {
    /// Binding, connecting or starting failed with `error`, as `message` says.
    pub(crate) fn io(message: impl Into<String>, error: Option<std::io::Error>) -> Self {
        TransportError::Io {
            message: message.into(),
            source: error.map(crate::error::ErrorSource::new),
        }
    }
}

impl From<crate::codec::Undecodable> for TransportError {
    fn from(u: crate::codec::Undecodable) -> Self {
        TransportError::Undecodable {
            direction: u.direction,
            type_name: u.type_name,
            message: u.message,
        }
    }
}

impl From<TransportError> for crate::error::JobError {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Undecodable {
                direction,
                type_name,
                message,
            } => crate::codec::Undecodable {
                direction,
                type_name,
                message,
            }
            .sent_by("this process"),
            e => crate::error::JobError::transport(
                e.to_string(),
                Some(crate::error::ErrorSource::new(e)),
            ),
        }
    }
}

impl From<TransportError> for Unsent {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Replaced { .. } => Unsent::Replaced,
            e @ TransportError::Undecodable { .. } => Unsent::Undecodable(e.into()),
            e => Unsent::Failed(crate::error::ErrorSource::new(e)),
        }
    }
}

/// The master's node's way to reach workers.
pub trait MasterLink<M>: Send + 'static {
    /// Sends `msg` to the worker of rank `to`.
    fn send(&self, to: Rank, msg: ToWorker<M>) -> Result<(), TransportError>;

    /// Sends `msg` to every worker. A transport that serializes should encode once; the
    /// in-memory one shares the master result (an `Arc`) instead of copying it. A worker
    /// that connects after the job's end ([`ToWorker::Finish`] or [`ToWorker::Abort`]) was
    /// broadcast should get it at once. A transport that tells a worker the master's
    /// attempt when it connects should tell it the one a [`ToWorker::Restart`] broadcast
    /// last (a gang restart).
    fn broadcast(&self, msg: ToWorker<M>) -> Result<(), TransportError>;

    /// Whether the worker of `rank` is connected now: a message sent to it can reach it.
    /// The default: every rank is.
    fn is_connected(&self, rank: Rank) -> bool {
        let _ = rank;
        true
    }

    /// Whether the worker of `rank` may still hear from the master's node: it is
    /// connected, or it may yet connect (a worker of a master's node that was started
    /// again, reconnecting; a process that has not connected yet — started late, or
    /// still trying when the job failed). The end of a job gives those a short grace to
    /// connect and hear how the job ended, and does not wait for a rank that may not: one
    /// whose connection ended.
    /// The default: [`is_connected`](Self::is_connected).
    fn may_reach(&self, rank: Rank) -> bool {
        self.is_connected(rank)
    }

    /// What the transport turned away lately that claimed one of `ranks` — a peer with a
    /// wrong secret, say — one line each, for the error of a wait for those ranks that
    /// timed out. The default: nothing.
    fn refusals(&self, ranks: &[Rank]) -> Vec<String> {
        let _ = ranks;
        Vec::new()
    }

    /// Whether the worker of `rank` runs on another host than the master's node, as far
    /// as the transport can tell from its connection (`None`: it cannot, or the rank is
    /// not connected). Copies of checkpoints go to workers on other hosts first
    /// (`JobConfig::checkpoint_replicas`). The default: `None`.
    fn on_another_host(&self, rank: Rank) -> Option<bool> {
        let _ = rank;
        None
    }

    /// Why no new process of `rank` will take the place of the one lost, if the
    /// transport knows none will (its launcher has no restarts left, or never starts one
    /// again, and the lost one will not reconnect): a worker lost under a policy that
    /// would wait for a new process then fails the job at once, with this said. The
    /// default: `None` (not known; the wait lasts its timeout).
    fn no_new_process(&self, rank: Rank) -> Option<String> {
        let _ = rank;
        None
    }
}

/// A worker's way to reach the master's node. Shared by the worker's actor and, in
/// barrier mode, its compute thread (which sends its sync calls directly).
pub trait WorkerLink<W>: Send + Sync + 'static {
    /// Sends `msg` to the master's node, which receives it stamped with this worker's rank.
    fn send(&self, msg: ToMaster<W>) -> Result<(), TransportError>;

    /// Sends `msg` soon: with the next message, or within a few milliseconds — in order
    /// with every other. For word the master's node needs but no one waits on: the call
    /// of a collective that returns without the node's answer. The default sends it now.
    fn send_soon(&self, msg: ToMaster<W>) -> Result<(), TransportError> {
        self.send(msg)
    }
}

/// A worker's way to the other workers, for collectives (`all_reduce`, `broadcast`, …):
/// what it sends one peer reaches it in order.
pub trait PeerLink: Send + Sync + 'static {
    /// Sends `msg` to worker `to`.
    fn send(&self, to: Rank, msg: PeerMessage) -> Result<(), TransportError>;

    /// From now on, what peers send worker `rank` goes to `inbox` (the newest worker of
    /// the rank's: one started again replaces the one before).
    fn join(&self, rank: Rank, inbox: PeerInbox);

    /// Whether every peer is in this process, so that pieces travel as values and are
    /// never encoded.
    fn carries_values(&self) -> bool {
        false
    }

    /// Whether the peers are in other processes (with the wire check on, pieces between
    /// workers of one process are encoded, yet they are in one process).
    fn spans_processes(&self) -> bool {
        true
    }

    /// The most bytes of an encoded piece that one [`send`](Self::send) carries, if there
    /// is a limit: the transport's largest frame less the frame's own head. A larger piece
    /// is refused with [`TransportError::TooLarge`]; the messages between supersteps
    /// travel in pieces of at most this size.
    fn max_piece(&self) -> Option<usize> {
        None
    }

    /// How long a compute that waits for what comes next reads its peers' connections
    /// itself ([`read_now`](Self::read_now)), yielding its core between looks, before it
    /// sleeps until what comes wakes it. The default: not at all.
    fn poll_for(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Reads, on the calling thread, what the peers' connections hold that came, handing
    /// it to the inbox as their I/O would. A compute waiting for pieces calls it so that
    /// a piece is taken by the thread that waits for it, without a hand-off from a thread
    /// that had to wake first. Each call says the compute goes on reading for
    /// [`poll_for`](Self::poll_for): until then, or until
    /// [`stop_reading`](Self::stop_reading), the transport's own I/O leaves the
    /// connections to it. The default reads nothing.
    fn read_now(&self) {}

    /// The compute that read the peers' connections ([`read_now`](Self::read_now)) stops
    /// for now, and sleeps until what comes wakes it: whatever comes is read by the
    /// transport again, at once. Cheap when the compute had not read since it last
    /// stopped.
    fn stop_reading(&self) {}
}

pub use crate::protocol::PeerEvent;

/// Where a worker's peers' messages are handed to it: called on whichever thread they
/// arrive on.
pub type PeerInbox = Box<dyn Fn(PeerEvent) + Send + Sync>;

/// A way to connect the parts of a job. See the [module docs](self) for the call order.
pub trait Transport<M, W>: Send + 'static {
    /// The number of workers this transport's cluster has, if it knows it (the TCP
    /// transport: its world size). A job whose worker count was not set takes it; one set
    /// to another count is refused with a [`ConfigError`](crate::ConfigError).
    fn world_size(&self) -> Option<usize> {
        None
    }

    /// The job id this transport was given, if it names one (the TCP transport's
    /// settings, from `SUPERSTEP_JOB_ID` or `SLURM_JOB_ID`): a job whose id was not set
    /// takes it; one set to another id is refused with a
    /// [`ConfigError`](crate::ConfigError). A transport that names none takes the job's
    /// ([`LinkSpec::job_id`]).
    fn job_id(&self) -> Option<&str> {
        None
    }

    /// Whether this transport runs every part of the job in this process and leaves the
    /// connecting to the runtime (`Some`): [`prepare`](Self::prepare) answers the master
    /// and every rank, and the master's node then steps each worker directly — a broadcast
    /// is handed to every worker's state machine in turn, and their results are taken as
    /// one batch — with no message through the transport:
    /// [`bind_master`](Self::bind_master), [`connect_worker`](Self::connect_worker) and
    /// [`reconnect_worker`](Self::reconnect_worker) are not called. The default: `None`.
    fn in_process(&self) -> Option<InProcess> {
        None
    }

    /// Learns the job and answers which parts of it run in this process.
    fn prepare(&mut self, spec: &LinkSpec) -> Result<Topology, TransportError>;

    /// Binds the master's node, which runs `attempt`: every worker's messages go to
    /// `inbox`. A transport whose workers can connect (or reconnect) at any time tells
    /// each the attempt with [`ToWorker::Connected`].
    fn bind_master(
        &mut self,
        attempt: Attempt,
        inbox: Inbox<Envelope<ToMaster<W>>>,
    ) -> Result<Box<dyn MasterLink<M>>, TransportError>;

    /// Connects the local worker of rank `rank`: the master's messages to it go to `inbox`.
    fn connect_worker(
        &mut self,
        rank: Rank,
        inbox: Inbox<ToWorker<M>>,
    ) -> Result<Box<dyn WorkerLink<W>>, TransportError>;

    /// Connects a replacement for the local worker of `rank`, which failed (a
    /// [`FailurePolicy`](crate::FailurePolicy) replaces it): the master's messages to the
    /// rank go to `inbox` from now on, and nothing the old worker sends after this call
    /// may reach the master's node — its link is closed.
    ///
    /// The default refuses: such a transport's failed local workers cannot be replaced in
    /// process (the job then fails with this error).
    fn reconnect_worker(
        &mut self,
        rank: Rank,
        inbox: Inbox<ToWorker<M>>,
    ) -> Result<Box<dyn WorkerLink<W>>, TransportError> {
        let _ = inbox;
        Err(TransportError::Unsupported(format!(
            "this transport cannot replace worker {rank} in process"
        )))
    }

    /// The local worker of `rank`'s way to the other workers, for collectives, when the
    /// job asked for one ([`LinkSpec::peers`]); what its peers send it goes to the inbox
    /// given to [`PeerLink::join`]. Called after [`connect_worker`](Self::connect_worker).
    /// The default: `None` (this transport connects no workers to each other; a
    /// collective then fails saying so).
    fn peers(&mut self, rank: Rank) -> Result<Option<Arc<dyn PeerLink>>, TransportError> {
        let _ = rank;
        Ok(None)
    }

    /// Whether [`peers`](Self::peers) gives workers a way to each other (in a job that
    /// asks for one): what lets a job fold its results among the workers
    /// (`Aggregation::Tree`, `Ring`). The default: `false`.
    fn connects_peers(&self) -> bool {
        false
    }
}
