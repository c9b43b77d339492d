//! The TCP transport: the same job, unchanged, with its master and workers in separate
//! processes, on one host or many.
//!
//! Each worker holds one connection to the master's node. Frames are length-delimited with
//! MessagePack bodies, fields by name; every frame carries the protocol version
//! ([`PROTOCOL_VERSION`]), and a peer of another version is refused naming both.
//! A connection starts with a handshake — protocol version, job id, rank, the job's
//! [`Fingerprint`], and proof of the shared secret by
//! HMAC-SHA256 challenge–response (the secret never crosses the wire) — and a peer that
//! fails it is refused with the reason sent back and logged (once per kind per interval),
//! while the job goes on; a proven process whose job differs from the master's is refused
//! naming the field, and fails the job at once (or, under a policy that replaces workers,
//! only its own rank's process). At most 64 connections may be in their handshake at once;
//! a new one takes the slot of the oldest, so unauthenticated peers cannot keep workers
//! out.
//! Heartbeats flow both ways whenever a side has nothing else to send; a side that hears
//! nothing for `heartbeat_timeout` declares its peer lost, naming its rank.
//!
//! All socket I/O runs on a thread of the transport's own, so heartbeats keep flowing (and
//! silence is noticed) even while user code holds the job's coordination thread. The links
//! the runtime holds only queue frames for that thread.
//!
//! Where each process's part comes from, and how ranks map to roles, is in [`ClusterEnv`].

mod admission;
mod client;
mod conn;
pub(crate) mod env;
mod io;
mod lane;
mod peer;
mod server;
pub(crate) mod wire;

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tracing::Instrument;

use super::{
    Fingerprint, Inbox, LinkSpec, MasterLink, PeerLink, Topology, Transport, TransportError,
    WorkerLink,
};
use crate::ids::{Attempt, Rank};
use crate::payload::Payload;
use crate::protocol::{CallRun, Envelope, ToMaster, ToWorker};

pub use env::ClusterEnv;
use io::IoThread;
use lane::Lane;
use wire::Wire;
pub use wire::PROTOCOL_VERSION;

/// The settings of a [`TcpTransport`]; [`TcpSettings::new`] gives the defaults.
///
/// A settings document in any serde format names this process's `rank`, the
/// `world_size` and the `master_addr` — a process that is not told which it is must not
/// guess — and only the other settings it changes (the rest keep their defaults), with
/// durations written as `"30s"` or a number of seconds and the secret as text:
///
/// ```
/// # use superstep::transport::TcpSettings;
/// let settings: TcpSettings = serde_json::from_str(
///     r#"{"rank": 2, "world_size": 4, "master_addr": "10.0.0.1:29500", "heartbeat_timeout": "1m"}"#,
/// )?;
/// assert_eq!(settings.heartbeat_timeout, std::time::Duration::from_secs(60));
/// assert_eq!(settings.heartbeat_interval, std::time::Duration::from_secs(1));
/// # Ok::<(), serde_json::Error>(())
/// ```
///
/// In a cluster job the environment gives them ([`from_cluster`](Self::from_cluster),
/// [`ClusterEnv`]), heartbeats and frame size included.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TcpSettings {
    /// This process's rank: it runs worker `rank`, and the master if `rank == 0`.
    pub rank: Rank,
    /// The number of processes, which is the number of workers.
    pub world_size: usize,
    /// The master's address (`host:port`) that workers connect to.
    pub master_addr: String,
    /// Where rank 0 listens. Default: `127.0.0.1` and the master address's port. Any
    /// address other than loopback needs a `secret`.
    #[serde(default)]
    pub bind: Option<SocketAddr>,
    /// The job's id: peers of another job are refused. Left at its default
    /// ([`TcpSettings::DEFAULT_JOB_ID`]), it becomes the job's own when the job starts; one
    /// that names another id than the job's is refused then.
    #[serde(default = "defaults::job_id")]
    pub job_id: String,
    /// The id of this run of the job, as its scheduler or launcher names it (Slurm's job
    /// id, torchrun's run id, `superstep-launch`'s): a process of another run is refused
    /// at its handshake, naming both ids (it is a field of the job's fingerprint). It
    /// plays another part than [`job_id`](Self::job_id), the program's name for its job,
    /// which the job's checkpoints keep from run to run: the two never conflict.
    /// Default: none.
    #[serde(default)]
    pub run_id: Option<String>,
    /// How many more processes the launcher starts in the place of ones that die, if it
    /// says (`SUPERSTEP_RESTARTS_LEFT`, which `superstep-launch` sets; the master's node
    /// also learns it from each process the launcher started again). At 0 — and under
    /// `srun` or `mpirun`, which start no process of a run again — a worker's process
    /// lost under a policy that would wait for a new one fails the job at once, naming
    /// the rank and why none will come. Default: not known (the wait lasts its timeout).
    #[serde(default)]
    pub restarts_left: Option<u32>,
    /// Which launcher's variables gave this process its rank ([`ClusterEnv::launcher`]),
    /// when the settings came from the environment.
    #[serde(default)]
    pub launcher: Option<String>,
    /// The shared secret every worker must prove it knows (an empty one counts as none).
    /// It authenticates workers to the master; it does not encrypt the traffic, nor prove
    /// the master to the workers: run jobs on a network you trust, or through a tunnel.
    #[serde(default, deserialize_with = "secret_text")]
    pub secret: Option<Vec<u8>>,
    /// The largest frame accepted or sent. Default 256 MiB.
    #[serde(default = "defaults::max_frame")]
    pub max_frame: usize,
    /// How long a new connection may take to complete the handshake. Default 5 s: a
    /// handshake is two round trips, and a peer that is slower than that holds a slot an
    /// authenticated worker may need.
    #[serde(
        with = "crate::protocol::duration",
        default = "defaults::handshake_timeout"
    )]
    pub handshake_timeout: Duration,
    /// How often a side that has nothing else to send sends a heartbeat. Default 1 s.
    #[serde(
        with = "crate::protocol::duration",
        default = "defaults::heartbeat_interval"
    )]
    pub heartbeat_interval: Duration,
    /// How long a side may hear nothing from its peer before declaring it lost.
    /// Default 30 s.
    #[serde(
        with = "crate::protocol::duration",
        default = "defaults::heartbeat_timeout"
    )]
    pub heartbeat_timeout: Duration,
    /// How long a worker keeps trying to reach the master at start-up, and how long the
    /// master's node waits for every rank's first connection before it fails the job
    /// naming the ranks that never connected (and the peers it refused, and why).
    /// Default 60 s: long enough for processes a scheduler starts together, short enough
    /// that a misconfigured job (a wrong address, a wrong secret, a process that never
    /// started) fails in about a minute. Raise it when processes may start far apart
    /// (pods waiting for a node, say): `SUPERSTEP_CONNECT_TIMEOUT`.
    #[serde(
        with = "crate::protocol::duration",
        default = "defaults::connect_timeout"
    )]
    pub connect_timeout: Duration,
    /// How long a worker that lost the master keeps trying to reach it again — a master
    /// process started again in its place, say — before the job fails for it with
    /// `JobError::MasterLost`. Zero (the default) never tries: the loss is final at once.
    #[serde(
        with = "crate::protocol::duration",
        default = "defaults::reconnect_timeout"
    )]
    pub reconnect_timeout: Duration,
    /// How many times this process was started again in the place of one that died
    /// ([`ClusterEnv::restart_count`]). A master's node started again resumes from its
    /// newest checkpoint as a new attempt.
    #[serde(default)]
    pub restart_count: u32,
    /// The port a worker listens on for its peers (in barrier mode, for collectives), on
    /// the host `bind` names (loopback by default). Default: one the system picks; the
    /// master's node tells every worker where the others listen.
    #[serde(default)]
    pub peer_port: Option<u16>,
    /// How long a worker's compute, waiting in a collective, reads its peers' connections
    /// itself — yielding its core between looks, as an MPI rank polls — before it sleeps
    /// until the transport's I/O thread wakes it with what came. A piece that comes
    /// meanwhile is taken by the thread that waits for it, with no thread to wake
    /// (`SUPERSTEP_PEER_POLL`). Zero never polls; longer suits ranks with cores of their
    /// own; it never delays what comes. Default 200 µs; at most 1 s.
    #[serde(with = "crate::protocol::duration", default = "defaults::peer_poll")]
    pub peer_poll: Duration,
    /// The variables the master's address came from, in a cluster job: what an error
    /// reaching the master names to check.
    #[serde(skip)]
    pub(crate) master_addr_from: Option<&'static str>,
}

impl fmt::Debug for TcpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpSettings")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("master_addr", &self.master_addr)
            .field("bind", &self.bind)
            .field("job_id", &self.job_id)
            .field("run_id", &self.run_id)
            .field("restarts_left", &self.restarts_left)
            .field("launcher", &self.launcher)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("max_frame", &self.max_frame)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_timeout", &self.reconnect_timeout)
            .field("restart_count", &self.restart_count)
            .field("peer_port", &self.peer_port)
            .field("peer_poll", &self.peer_poll)
            .finish()
    }
}

/// The defaults of the settings a document may leave out: those of [`TcpSettings::new`].
mod defaults {
    use std::time::Duration;

    fn new() -> super::TcpSettings {
        super::TcpSettings::new(0, 1, String::new())
    }
    pub(super) fn job_id() -> String {
        new().job_id
    }
    pub(super) fn max_frame() -> usize {
        new().max_frame
    }
    pub(super) fn handshake_timeout() -> Duration {
        new().handshake_timeout
    }
    pub(super) fn heartbeat_interval() -> Duration {
        new().heartbeat_interval
    }
    pub(super) fn peer_poll() -> Duration {
        new().peer_poll
    }
    pub(super) fn heartbeat_timeout() -> Duration {
        new().heartbeat_timeout
    }
    pub(super) fn connect_timeout() -> Duration {
        new().connect_timeout
    }
    pub(super) fn reconnect_timeout() -> Duration {
        new().reconnect_timeout
    }
}

/// A secret written as text in a settings document; an empty one is none.
fn secret_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    let text: Option<String> = serde::Deserialize::deserialize(d)?;
    Ok(text.filter(|t| !t.is_empty()).map(String::into_bytes))
}

impl TcpSettings {
    /// The job id of settings that name none: the transport takes the job's own
    /// ([`JobBuilder::job_id`](crate::JobBuilder::job_id)) when the job starts.
    pub const DEFAULT_JOB_ID: &'static str = "superstep";

    /// Settings for the process of `rank` in a job of `world_size` workers whose master
    /// (rank 0) is at `master_addr`; every other setting at its default.
    pub fn new(rank: Rank, world_size: usize, master_addr: impl Into<String>) -> Self {
        TcpSettings {
            rank,
            world_size,
            master_addr: master_addr.into(),
            bind: None,
            job_id: Self::DEFAULT_JOB_ID.into(),
            run_id: None,
            restarts_left: None,
            launcher: None,
            master_addr_from: None,
            peer_port: None,
            peer_poll: Duration::from_micros(200),
            secret: None,
            max_frame: 256 << 20,
            handshake_timeout: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(60),
            reconnect_timeout: Duration::ZERO,
            restart_count: 0,
        }
    }

    /// Settings from a cluster environment.
    pub fn from_cluster(env: &ClusterEnv) -> Result<Self, TransportError> {
        let mut settings = TcpSettings::new(env.rank, env.world_size, env.master_addr.clone());
        settings.job_id = env.job_id.clone();
        settings.run_id = env.run_id.clone();
        settings.restarts_left = env.restarts_left;
        settings.launcher = Some(env.launcher.to_string());
        settings.master_addr_from = Some(env.master_addr_from);
        settings.secret = env.secret.clone();
        settings.restart_count = env.restart_count;
        if let Some(reconnect) = env.reconnect_timeout {
            settings.reconnect_timeout = reconnect;
        }
        if let Some(connect) = env.connect_timeout {
            settings.connect_timeout = connect;
        }
        if let Some(interval) = env.heartbeat_interval {
            settings.heartbeat_interval = interval;
        }
        if let Some(timeout) = env.heartbeat_timeout {
            settings.heartbeat_timeout = timeout;
        }
        if let Some(timeout) = env.handshake_timeout {
            settings.handshake_timeout = timeout;
        }
        if let Some(max) = env.max_frame {
            settings.max_frame = max;
        }
        settings.peer_port = env.peer_port;
        if let Some(poll) = env.peer_poll {
            settings.peer_poll = poll;
        }
        if let Some(bind) = &env.bind {
            settings.bind = Some(bind_addr(bind, &settings.master_addr)?);
        }
        Ok(settings)
    }

    /// Checks the settings; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), TransportError> {
        let invalid = |what: String| Err(TransportError::Env(what));
        if self.world_size == 0 || self.world_size > MAX_WORLD {
            return invalid(format!(
                "world size {} is outside 1..={MAX_WORLD}",
                self.world_size
            ));
        }
        if self.rank >= self.world_size {
            return invalid(format!(
                "rank {} is outside 0..{}",
                self.rank, self.world_size
            ));
        }
        if self.max_frame < wire::HANDSHAKE_MAX_FRAME || self.max_frame > u32::MAX as usize {
            return invalid(format!(
                "max_frame {} is outside {}..={}",
                self.max_frame,
                wire::HANDSHAKE_MAX_FRAME,
                u32::MAX
            ));
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval >= self.heartbeat_timeout {
            return invalid(format!(
                "heartbeat_interval {:?} must be above zero and below heartbeat_timeout {:?}",
                self.heartbeat_interval, self.heartbeat_timeout
            ));
        }
        if self.peer_poll > Duration::from_secs(1) {
            return invalid(format!(
                "peer_poll {:?} is over 1s: a compute waiting that long polls its peers' connections for nothing",
                self.peer_poll
            ));
        }
        if self.handshake_timeout.is_zero() || self.connect_timeout.is_zero() {
            return invalid("handshake_timeout and connect_timeout must be above zero".into());
        }
        self.master_port()?;
        Ok(())
    }

    /// The master address's port, checked: `host:port` with a port in 1–65535 (rank 0,
    /// which listens on it, may ask for 0: a port the system chooses).
    pub(super) fn master_port(&self) -> Result<u16, TransportError> {
        let lowest = if self.rank == 0 { 0 } else { 1 };
        env::check_addr_port(&self.master_addr, lowest)
            .map_err(|e| TransportError::Env(format!("master address {:?} {e}", self.master_addr)))
    }

    /// Where rank 0 listens: `bind`, or loopback on the master address's port.
    fn listen_addr(&self) -> Result<SocketAddr, TransportError> {
        if let Some(bind) = self.bind {
            return Ok(bind);
        }
        Ok(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            self.master_port()?,
        ))
    }
}

/// Where rank 0 listens, from `SUPERSTEP_BIND`: `host:port`, or an address alone (`0.0.0.0`,
/// `[::]`), which takes the master address's port.
fn bind_addr(bind: &str, master_addr: &str) -> Result<SocketAddr, TransportError> {
    let bind = bind.trim();
    let invalid = |e: String| TransportError::Env(format!("SUPERSTEP_BIND = {bind:?} {e}"));
    if let Ok(ip) = bind
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        let port = env::check_addr_port(master_addr, 1).map_err(|e| {
            invalid(format!(
                "takes the port of the master address {master_addr:?}, which {e}"
            ))
        })?;
        return Ok(SocketAddr::new(ip, port));
    }
    env::check_addr_port(bind, 0).map_err(invalid)?;
    resolve(bind).map_err(|e| invalid(format!("cannot be resolved: {e}")))
}

/// The most processes a job may have.
const MAX_WORLD: usize = 1 << 16;

fn resolve(addr: &str) -> Result<SocketAddr, TransportError> {
    addr.to_socket_addrs()
        .map_err(|e| TransportError::io(format!("cannot resolve {addr}: {e}"), Some(e)))?
        .next()
        .ok_or_else(|| TransportError::io(format!("{addr} resolves to no address"), None))
}

/// Runs a job's processes over TCP. See the [module docs](self).
pub struct TcpTransport<M, W> {
    settings: Arc<TcpSettings>,
    /// Rank 0's listener, bound in `new` so that its address is known at once.
    listener: Option<std::net::TcpListener>,
    local_addr: Option<SocketAddr>,
    io: Option<IoThread>,
    /// The attempt the master's node runs, once bound: rank 0's own worker starts in it.
    attempt: Option<Attempt>,
    /// The job as this process runs it, from `prepare`.
    fingerprint: Arc<Fingerprint>,
    /// This process's worker's way to its peers, when the job asked for one.
    mesh: Option<Arc<peer::Mesh>>,
    _types: PhantomData<fn() -> (M, W)>,
}

impl<M, W> Drop for TcpTransport<M, W> {
    fn drop(&mut self) {
        // Before the I/O thread stops: peers see the goodbye, not a loss.
        if let Some(mesh) = &self.mesh {
            mesh.close();
        }
    }
}

impl<M, W> fmt::Debug for TcpTransport<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpTransport")
            .field("settings", &self.settings)
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl<M, W> TcpTransport<M, W> {
    /// A transport with these settings. Rank 0 binds its listener now; binding an address
    /// other than loopback without a secret is refused.
    pub fn new(mut settings: TcpSettings) -> Result<Self, TransportError> {
        settings.validate()?;
        // An empty secret proves nothing: it is no secret.
        if settings.secret.as_ref().is_some_and(|s| s.is_empty()) {
            settings.secret = None;
        }
        let (listener, local_addr) = if settings.rank == 0 {
            let addr = settings.listen_addr()?;
            if !addr.ip().is_loopback() && settings.secret.is_none() {
                return Err(TransportError::Insecure {
                    addr: addr.to_string(),
                });
            }
            let listener = std::net::TcpListener::bind(addr).map_err(|e| {
                TransportError::io(format!("cannot listen on {addr}: {e}"), Some(e))
            })?;
            listener
                .set_nonblocking(true)
                .map_err(|e| TransportError::io(e.to_string(), Some(e)))?;
            let local = listener
                .local_addr()
                .map_err(|e| TransportError::io(e.to_string(), Some(e)))?;
            (Some(listener), Some(local))
        } else {
            (None, None)
        };
        Ok(TcpTransport {
            settings: Arc::new(settings),
            listener,
            local_addr,
            io: None,
            attempt: None,
            fingerprint: Arc::default(),
            mesh: None,
            _types: PhantomData,
        })
    }

    /// The transport this process's environment describes ([`ClusterEnv`]), or `None`
    /// when the process is not part of a cluster job.
    pub fn from_env() -> Result<Option<Self>, TransportError> {
        match ClusterEnv::from_env()? {
            Some(env) => Ok(Some(Self::new(TcpSettings::from_cluster(&env)?)?)),
            None => Ok(None),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &TcpSettings {
        &self.settings
    }

    /// Where rank 0 listens (with its actual port when bound to port 0); `None` on other
    /// ranks.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    fn io(&self) -> Result<&IoThread, TransportError> {
        self.io.as_ref().ok_or(TransportError::NotPrepared)
    }
}

impl<M: Payload, W: Payload> Transport<M, W> for TcpTransport<M, W> {
    fn world_size(&self) -> Option<usize> {
        Some(self.settings.world_size)
    }

    fn job_id(&self) -> Option<&str> {
        let id = self.settings.job_id.as_str();
        (id != TcpSettings::DEFAULT_JOB_ID).then_some(id)
    }

    fn prepare(&mut self, spec: &LinkSpec) -> Result<Topology, TransportError> {
        // Every process of one run: a process of another run of the job is refused,
        // naming both runs' ids (a side that names none reads `(none)`).
        let mut fingerprint = spec.fingerprint.clone();
        if let Some(run) = &self.settings.run_id {
            fingerprint = fingerprint.with("run id", run);
        }
        self.fingerprint = Arc::new(fingerprint);
        // One id: the job's, unless these settings name another — which is a mistake.
        if self.settings.job_id == TcpSettings::DEFAULT_JOB_ID {
            Arc::make_mut(&mut self.settings).job_id = spec.job_id.clone();
        } else if self.settings.job_id != spec.job_id {
            return Err(TransportError::Env(format!(
                "the TCP settings' job id `{}` is not the job's `{}`: set it once (JobBuilder::job_id, or SUPERSTEP_JOB_ID before cluster_from_env)",
                self.settings.job_id, spec.job_id
            )));
        }
        if spec.workers != self.settings.world_size {
            return Err(TransportError::WorldSize {
                job: spec.workers,
                cluster: self.settings.world_size,
            });
        }
        if self.io.is_none() {
            let name = format!(
                "{}-io-{}",
                crate::config::thread_prefix(&self.settings.job_id),
                self.settings.rank
            );
            self.io = Some(IoThread::start(name)?);
        }
        if spec.peers && self.mesh.is_none() {
            let io = self.io()?;
            let io = peer::Io {
                handle: io.handle.clone(),
                tracker: io.tracker.clone(),
                stop: io.stop.subscribe(),
            };
            let mesh = peer::Mesh::bind(&self.settings, Arc::clone(&self.fingerprint), io)?;
            mesh.start();
            self.mesh = Some(mesh);
        }
        Ok(Topology {
            master: self.settings.rank == 0,
            workers: vec![self.settings.rank],
            restarted: self.settings.restart_count,
        })
    }

    fn connects_peers(&self) -> bool {
        true
    }

    fn peers(&mut self, rank: Rank) -> Result<Option<Arc<dyn PeerLink>>, TransportError> {
        if rank != self.settings.rank {
            return Err(TransportError::UnknownRank {
                rank,
                workers: self.settings.world_size,
            });
        }
        Ok(self
            .mesh
            .as_ref()
            .map(|mesh| Arc::clone(mesh) as Arc<dyn PeerLink>))
    }

    fn bind_master(
        &mut self,
        attempt: Attempt,
        inbox: Inbox<Envelope<ToMaster<W>>>,
    ) -> Result<Box<dyn MasterLink<M>>, TransportError> {
        self.attempt = Some(attempt);
        let listener = self
            .listener
            .take()
            .ok_or_else(|| TransportError::AlreadyConnected {
                what: "the master".into(),
            })?;
        let io = self.io()?;
        let world = self.settings.world_size;
        let peers = Arc::new(Mutex::new(Peers {
            conns: vec![None; world],
            ever: vec![false; world],
            closing: vec![false; world],
            addrs: vec![None; world],
            remote: vec![None; world],
            ending: None,
            attempt,
            restarts_left: self.settings.restarts_left,
        }));
        let refusals = Arc::new(Mutex::new(admission::Refusals::new(
            world,
            std::time::Instant::now(),
        )));
        let server = server::Server::<M, W> {
            settings: Arc::clone(&self.settings),
            inbox: Arc::new(inbox),
            peers: Arc::clone(&peers),
            fingerprint: Arc::clone(&self.fingerprint),
            stop: io.stop.subscribe(),
            tracker: io.tracker.clone(),
            unproven: Arc::default(),
            refusals: Arc::clone(&refusals),
            _types: PhantomData,
        };
        // Every line the master's node logs (a refusal, a lost worker, a wait) says whose —
        // a span at WARN, so that it shows wherever the warnings do.
        let span = tracing::warn_span!("master_node", job = %self.settings.job_id);
        io.spawn(server.serve(listener).instrument(span));
        Ok(Box::new(TcpMasterLink::<M> {
            peers,
            launcher: self.settings.launcher.clone(),
            reconnect_timeout: self.settings.reconnect_timeout,
            refusals,
            max_frame: self.settings.max_frame,
            _types: PhantomData,
        }))
    }

    fn connect_worker(
        &mut self,
        rank: Rank,
        inbox: Inbox<ToWorker<M>>,
    ) -> Result<Box<dyn WorkerLink<W>>, TransportError> {
        if rank != self.settings.rank {
            return Err(TransportError::UnknownRank {
                rank,
                workers: self.settings.world_size,
            });
        }
        let io = self.io()?;
        // Rank 0's own worker reaches its master on the address it listens on.
        let target = match self.local_addr {
            Some(local) if local.ip().is_unspecified() => {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), local.port()).to_string()
            }
            Some(local) => local.to_string(),
            None => self.settings.master_addr.clone(),
        };
        let (lane, rx) = Lane::new();
        let said_done = Arc::new(AtomicBool::new(false));
        let attempt = Arc::new(AtomicU32::new(self.attempt.unwrap_or(FIRST_ATTEMPT)));
        let client = client::Client::<M, W> {
            settings: Arc::clone(&self.settings),
            target,
            inbox,
            said_done: Arc::clone(&said_done),
            stop: io.stop.subscribe(),
            attempt: Arc::clone(&attempt),
            fingerprint: Arc::clone(&self.fingerprint),
            to_master: Arc::downgrade(&lane),
            mesh: self.mesh.clone(),
            _types: PhantomData,
        };
        let span = tracing::warn_span!("worker_link", job = %self.settings.job_id, rank);
        io.spawn(client.run(rx).instrument(span));
        Ok(Box::new(TcpWorkerLink::<W> {
            lane,
            said_done,
            attempt,
            max_frame: self.settings.max_frame,
            _types: PhantomData,
        }))
    }
}

/// The master's node's view of its workers' connections, shared by its link and its
/// connection tasks. One lock orders a broadcast of the job's end and a new connection:
/// a worker either was connected when the end was sent, or hears it right after its
/// welcome.
struct Peers {
    /// By rank: the worker's connection's lane.
    conns: Vec<Option<Arc<Lane>>>,
    /// By rank: whether it ever connected.
    ever: Vec<bool>,
    /// By rank: whether its connection ended and its loss is on its way to the master's
    /// node (the rank stays claimed until then, so a new process's hello comes after it).
    closing: Vec<bool>,
    /// By rank: where its peers reach it, as its hello said.
    addrs: Vec<Option<String>>,
    /// By rank: whether its connection came from another host than the master's
    /// ([`another_host`]).
    remote: Vec<Option<bool>>,
    /// The job's last message (finish or abort), once broadcast.
    ending: Option<Bytes>,
    /// The attempt the master's node runs: a connection is welcomed in it, and what ends
    /// a connection (its `Done`, its loss) is of it. A gang restart's broadcast moves it
    /// on.
    attempt: Attempt,
    /// How many more processes the launcher starts, as the newest process to say so said
    /// (this one's settings, then each connecting process's hello): it only goes down.
    restarts_left: Option<u32>,
}

impl Peers {
    /// Whether a connection of `rank` stands.
    fn holds(&self, rank: Rank) -> bool {
        self.conns.get(rank).is_some_and(Option::is_some)
    }

    /// The ranks that never connected, in rank order.
    fn never_connected(&self) -> Vec<Rank> {
        (0..self.ever.len()).filter(|&r| !self.ever[r]).collect()
    }
}

type Shared = Arc<Mutex<Peers>>;

/// The attempt a worker starts in, until a master's node tells it another.
const FIRST_ATTEMPT: Attempt = 0;

/// Locks `mutex`, also when a thread panicked holding it: what it guards stays usable
/// (each change under it is a single assignment).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

struct TcpMasterLink<M> {
    peers: Shared,
    /// The launcher that started this process, from its settings.
    launcher: Option<String>,
    /// How long a worker that lost the master tries to reach it again (the settings'):
    /// one that lives comes back within it.
    reconnect_timeout: Duration,
    refusals: Arc<Mutex<admission::Refusals>>,
    max_frame: usize,
    _types: PhantomData<fn() -> M>,
}

impl<M: Payload> TcpMasterLink<M> {
    fn frame(&self, msg: ToWorker<M>) -> Result<Bytes, TransportError> {
        wire::encode(&Wire::<M, ()>::ToWorker(msg), self.max_frame)
            .map_err(|e| TransportError::Encode(e.to_string()))
    }
}

impl<M: Payload> MasterLink<M> for TcpMasterLink<M> {
    fn send(&self, to: Rank, msg: ToWorker<M>) -> Result<(), TransportError> {
        let frame = self.frame(msg)?;
        let peers = lock(&self.peers);
        let conn = peers
            .conns
            .get(to)
            .and_then(Option::as_ref)
            .ok_or(TransportError::NotConnected { rank: to })?;
        conn.send(frame)
            .map_err(|_| TransportError::NotConnected { rank: to })
    }

    fn broadcast(&self, msg: ToWorker<M>) -> Result<(), TransportError> {
        // Encoded once; every connection writes the same bytes. A rank not connected
        // (lost, or not yet there) is the gate's to notice, by its timeouts — except the
        // job's end, which a worker connecting later hears at once; and a gang restart,
        // whose attempt a worker connecting later is welcomed in.
        let ends = matches!(msg, ToWorker::Finish { .. } | ToWorker::Abort { .. });
        let restart = match &msg {
            ToWorker::Restart { attempt, .. } => Some(*attempt),
            _ => None,
        };
        let frame = self.frame(msg)?;
        let mut peers = lock(&self.peers);
        if ends {
            peers.ending = Some(frame.clone());
        }
        if let Some(attempt) = restart {
            peers.attempt = attempt;
        }
        for conn in peers.conns.iter().flatten() {
            let _ = conn.send(frame.clone());
        }
        Ok(())
    }

    fn is_connected(&self, rank: Rank) -> bool {
        lock(&self.peers).holds(rank)
    }

    fn may_reach(&self, rank: Rank) -> bool {
        let peers = lock(&self.peers);
        // A rank that never connected to this node may still: a worker of its predecessor
        // reconnecting to a node started again, or a process that was still trying when
        // the job failed (another's refusal failed it at once, say). It must hear how the
        // job ended, not find the master gone and wait out its connect timeout.
        peers.holds(rank) || !peers.ever.get(rank).copied().unwrap_or(true)
    }

    fn refusals(&self, ranks: &[Rank]) -> Vec<String> {
        lock(&self.refusals).of(ranks)
    }

    fn on_another_host(&self, rank: Rank) -> Option<bool> {
        let peers = lock(&self.peers);
        peers
            .holds(rank)
            .then(|| peers.remote.get(rank).copied().flatten())?
    }

    fn no_new_process(&self, rank: Rank) -> Option<String> {
        let peers = lock(&self.peers);
        // A new process of the rank is here already: its hello, which may have brought the
        // count down, came before the old one's loss was heard. (The lost one's own
        // connection, still claimed while its loss is told, is no new process.)
        if peers.holds(rank) && !peers.closing[rank] {
            return None;
        }
        let reconnects = !self.reconnect_timeout.is_zero();
        no_new_process(peers.restarts_left, self.launcher.as_deref(), reconnects)
    }
}

/// Why no new process will take the place of one that dies, from what the launcher said
/// of its restarts (`left`) and which launcher it is: `None` when one may come. Under a
/// launcher that starts none again, a lost process that lives may still come back when
/// workers reconnect (`reconnects`: across hosts, a connection may break under a live
/// process); `superstep-launch`'s processes share one host, where only a process that
/// ended loses its connection.
fn no_new_process(left: Option<u32>, launcher: Option<&str>, reconnects: bool) -> Option<String> {
    match (left, launcher) {
        (Some(0), _) => Some(
            "no new process of it will come: its launcher has no restarts left (SUPERSTEP_RESTARTS_LEFT=0; `superstep-launch --restarts K` starts dead processes again K times)".into(),
        ),
        (Some(_), _) => None,
        (None, _) if reconnects => None,
        (None, Some("Slurm")) => Some(
            "no new process of it will come: srun starts no task of a job step again (a requeue, `sbatch --requeue` or `scontrol requeue`, starts the whole job again)".into(),
        ),
        (None, Some(mpi @ ("Open MPI" | "PMI"))) => Some(format!(
            "no new process of it will come: {mpi}'s launcher starts no process of a run again (a scheduler's requeue starts the whole job again)"
        )),
        (None, _) => None,
    }
}

/// Whether a connection between `local` (the master's end) and `peer` joins two hosts:
/// its ends have different addresses, and not both are loopback ones (`127.0.0.1` and
/// `127.0.0.2` are one host). An IPv4 address mapped into IPv6 is the IPv4 one.
pub(crate) fn another_host(local: std::net::IpAddr, peer: std::net::IpAddr) -> bool {
    let (local, peer) = (local.to_canonical(), peer.to_canonical());
    local != peer && !(local.is_loopback() && peer.is_loopback())
}

struct TcpWorkerLink<W> {
    lane: Arc<Lane>,
    /// Set once the worker queued its last message (`Done`, of the attempt it runs, unless
    /// it awaits the master's word on its failure): its connection is then not made again.
    said_done: Arc<AtomicBool>,
    /// The attempt the worker runs in, as its connection knows it: the `Done` of a worker
    /// a gang restart replaced is not the rank's last word.
    attempt: Arc<AtomicU32>,
    max_frame: usize,
    _types: PhantomData<fn() -> W>,
}

impl<W: Payload> WorkerLink<W> for TcpWorkerLink<W> {
    fn send(&self, msg: ToMaster<W>) -> Result<(), TransportError> {
        // A worker that awaits the master's word on its failure has not said its last.
        let done = matches!(msg, ToMaster::Done { attempt, awaits_word: false, .. } if attempt == self.attempt.load(Ordering::Acquire));
        let frame = wire::encode(&Wire::<(), W>::ToMaster(msg), self.max_frame)
            .map_err(|e| TransportError::Encode(e.to_string()))?;
        if done {
            self.said_done.store(true, Ordering::SeqCst);
        }
        self.lane.send(frame).map_err(|_| TransportError::Closed)
    }

    /// A call no rank awaits the word on is held back on the lane until the next frame
    /// goes, two milliseconds at most: one write for a run of collectives' calls, none of
    /// its own on a call's way, and one word for the calls that follow one another.
    fn send_soon(&self, msg: ToMaster<W>) -> Result<(), TransportError> {
        match CallRun::of(msg) {
            Ok(calls) => {
                if calls.most_bytes() > self.max_frame {
                    // (Not met by a call's word of a few dozen bytes; by a small largest
                    // frame and a group of many ranks, say.) Refused now, as it would go.
                    let word = Wire::<(), W>::ToMaster(calls.clone().word());
                    wire::encode(&word, self.max_frame)
                        .map_err(|e| TransportError::Encode(e.to_string()))?;
                }
                self.lane
                    .defer(calls, self.max_frame)
                    .map_err(|_| TransportError::Closed)
            }
            Err(msg) => self.send(msg),
        }
    }
}

#[cfg(test)]
mod tests;
