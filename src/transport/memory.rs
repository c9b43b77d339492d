//! The in-memory transport: every part of the job in this process, typed messages, and no
//! serialization — unless its wire check is on (by default in debug builds), which sends
//! every message that carries a user's result through the wire encoding first.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock, RwLock};

use super::{Inbox, LinkSpec, MasterLink, Topology, Transport, TransportError, WorkerLink};
use crate::compute::Payload;
use crate::protocol::{Attempt, Envelope, Rank, ToMaster, ToWorker};

/// Runs the master and every worker in this process. Messages are handed over as typed
/// values; a broadcast master result is one `Arc` shared by every worker.
///
/// This is the default transport of [`Job`](crate::Job).
///
/// # The wire check
///
/// A result type whose serde form does not survive an encoding works in memory and fails
/// over TCP. With the wire check on, every message that carries a master or worker result
/// (`Iterate`, `Finish`, `Result`) is encoded as the TCP transport would encode it and
/// decoded again, and the decoded copy is what the peer gets — so such a type fails the
/// job's own tests in memory, with the same [`JobError::Decode`](crate::JobError::Decode)
/// (or a wrong result) that a cluster run would give. It is on by default in builds with
/// debug assertions (`cargo test`, `cargo run` without `--release`), where a test should
/// find this, and off in release builds, where it would cost an encoding per message;
/// [`wire_check`](Self::wire_check) sets it either way.
pub struct MemoryTransport<M, W> {
    hub: Option<Arc<Hub<M, W>>>,
    wire_check: bool,
    _types: PhantomData<fn() -> (M, W)>,
}

struct Hub<M, W> {
    master: OnceLock<Inbox<Envelope<ToMaster<W>>>>,
    workers: Vec<RwLock<Option<Connected<M>>>>,
    wire_check: bool,
}

/// The worker connected to a rank: its inbox, and which connection of the rank it is. A
/// link of an earlier connection is closed: a replaced worker can no longer reach the
/// master.
struct Connected<M> {
    inbox: Inbox<ToWorker<M>>,
    generation: u64,
}

impl<M, W> MemoryTransport<M, W> {
    /// A transport for one job, with the wire check on in builds with debug assertions.
    pub fn new() -> Self {
        MemoryTransport {
            hub: None,
            wire_check: cfg!(debug_assertions),
            _types: PhantomData,
        }
    }

    /// Turns the [wire check](Self#the-wire-check) on or off.
    pub fn wire_check(mut self, on: bool) -> Self {
        self.wire_check = on;
        self
    }

    fn hub(&self) -> Result<&Arc<Hub<M, W>>, TransportError> {
        self.hub.as_ref().ok_or(TransportError::NotPrepared)
    }
}

impl<M, W> Default for MemoryTransport<M, W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M, W> fmt::Debug for MemoryTransport<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let workers = self.hub.as_ref().map(|h| h.workers.len());
        f.debug_struct("MemoryTransport")
            .field("workers", &workers)
            .field("wire_check", &self.wire_check)
            .finish()
    }
}

impl<M: Payload, W: Payload> Transport<M, W> for MemoryTransport<M, W> {
    fn prepare(&mut self, spec: &LinkSpec) -> Result<Topology, TransportError> {
        self.hub = Some(Arc::new(Hub {
            master: OnceLock::new(),
            workers: (0..spec.workers).map(|_| RwLock::new(None)).collect(),
            wire_check: self.wire_check,
        }));
        Ok(Topology {
            master: true,
            workers: (0..spec.workers).collect(),
            restarted: 0,
        })
    }

    fn bind_master(
        &mut self,
        _attempt: Attempt,
        inbox: Inbox<Envelope<ToMaster<W>>>,
    ) -> Result<Box<dyn MasterLink<M>>, TransportError> {
        let hub = Arc::clone(self.hub()?);
        hub.master
            .set(inbox)
            .map_err(|_| TransportError::AlreadyConnected {
                what: "the master".into(),
            })?;
        Ok(Box::new(MemoryMasterLink { hub }))
    }

    fn connect_worker(
        &mut self,
        rank: Rank,
        inbox: Inbox<ToWorker<M>>,
    ) -> Result<Box<dyn WorkerLink<W>>, TransportError> {
        self.attach(rank, inbox, false)
    }

    fn reconnect_worker(
        &mut self,
        rank: Rank,
        inbox: Inbox<ToWorker<M>>,
    ) -> Result<Box<dyn WorkerLink<W>>, TransportError> {
        self.attach(rank, inbox, true)
    }
}

impl<M, W> MemoryTransport<M, W> {
    /// Connects `inbox` to `rank`; `replace` closes the link of the worker connected to it
    /// before, if any (a connected rank is refused otherwise).
    fn attach(
        &mut self,
        rank: Rank,
        inbox: Inbox<ToWorker<M>>,
        replace: bool,
    ) -> Result<Box<dyn WorkerLink<W>>, TransportError>
    where
        M: Payload,
        W: Payload,
    {
        let hub = Arc::clone(self.hub()?);
        let workers = hub.workers.len();
        let slot = hub
            .workers
            .get(rank)
            .ok_or(TransportError::UnknownRank { rank, workers })?;
        let generation = {
            let mut slot = slot.write().unwrap_or_else(|e| e.into_inner());
            let generation = match &*slot {
                Some(_) if !replace => {
                    return Err(TransportError::AlreadyConnected {
                        what: format!("worker {rank}"),
                    })
                }
                Some(old) => old.generation + 1,
                None => 0,
            };
            *slot = Some(Connected { inbox, generation });
            generation
        };
        Ok(Box::new(MemoryWorkerLink {
            rank,
            generation,
            hub,
        }))
    }
}

struct MemoryMasterLink<M, W> {
    hub: Arc<Hub<M, W>>,
}

/// `msg` as a peer across a wire would get it, if it carries a result and the wire check
/// is on: encoded and decoded again.
fn checked<T: Payload>(
    on: bool,
    carries_result: bool,
    msg: T,
    direction: impl FnOnce() -> String,
) -> Result<T, TransportError> {
    if !(on && carries_result) {
        return Ok(msg);
    }
    Ok(crate::codec::through_wire(msg, direction)?)
}

impl<M: Payload, W> MemoryMasterLink<M, W> {
    fn checked(&self, msg: ToWorker<M>, to: Option<Rank>) -> Result<ToWorker<M>, TransportError> {
        let carries = msg.carries_result();
        checked(self.hub.wire_check, carries, msg, || match to {
            Some(rank) => format!("master → worker {rank}"),
            None => "master → every worker".to_string(),
        })
    }

    fn deliver(&self, to: Rank, msg: ToWorker<M>) -> Result<(), TransportError> {
        let slot = self
            .hub
            .workers
            .get(to)
            .ok_or(TransportError::NotConnected { rank: to })?
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let connected = slot
            .as_ref()
            .ok_or(TransportError::NotConnected { rank: to })?;
        (connected.inbox)(msg);
        Ok(())
    }
}

impl<M: Payload, W: Send + 'static> MasterLink<M> for MemoryMasterLink<M, W> {
    fn send(&self, to: Rank, msg: ToWorker<M>) -> Result<(), TransportError> {
        let msg = self.checked(msg, Some(to))?;
        self.deliver(to, msg)
    }

    fn broadcast(&self, msg: ToWorker<M>) -> Result<(), TransportError> {
        // Checked once, as a broadcast is encoded once; clones share the master result:
        // each is an `Arc` bump, never a copy of `M`. Every rank is tried even when one
        // fails: the others must still hear of it.
        let msg = self.checked(msg, None)?;
        let n = self.hub.workers.len();
        let mut first = Ok(());
        for rank in 0..n {
            let sent = self.deliver(rank, msg.clone());
            if first.is_ok() {
                first = sent;
            }
        }
        first
    }
}

struct MemoryWorkerLink<M, W> {
    rank: Rank,
    /// Which connection of the rank this link is.
    generation: u64,
    hub: Arc<Hub<M, W>>,
}

impl<M: Send + Sync + 'static, W: Payload> WorkerLink<W> for MemoryWorkerLink<M, W> {
    fn send(&self, msg: ToMaster<W>) -> Result<(), TransportError> {
        let carries = msg.carries_result();
        let msg = checked(self.hub.wire_check, carries, msg, || {
            format!("worker {} → master", self.rank)
        })?;
        let inbox = self.hub.master.get().ok_or(TransportError::NoMaster)?;
        // Checked and sent under the rank's lock: once a replacement is connected, not one
        // more message of this link reaches the master.
        let slot = self.hub.workers[self.rank]
            .read()
            .unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().map(|c| c.generation) != Some(self.generation) {
            return Err(TransportError::Replaced { rank: self.rank });
        }
        inbox(Envelope {
            from: self.rank,
            msg,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn messages_reach_their_peer_and_a_broadcast_shares_one_value() {
        let mut t = MemoryTransport::<String, u32>::new().wire_check(false);
        let topology = t.prepare(&LinkSpec::new("t", 2)).unwrap();
        assert_eq!(topology.workers, vec![0, 1]);
        let at_master = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&at_master);
        let master = t
            .bind_master(0, Box::new(move |env| sink.lock().unwrap().push(env)))
            .unwrap();
        let mut received = Vec::new();
        let mut links = Vec::new();
        for rank in 0..2 {
            let got = Arc::new(Mutex::new(Vec::new()));
            let sink = Arc::clone(&got);
            links.push(
                t.connect_worker(rank, Box::new(move |m| sink.lock().unwrap().push(m)))
                    .unwrap(),
            );
            received.push(got);
        }
        links[1]
            .send(ToMaster::Done {
                attempt: 0,
                rows: Default::default(),
                attachments: Vec::new(),
            })
            .unwrap();
        assert_eq!(at_master.lock().unwrap()[0].from, 1);
        let shared = Arc::new("weights".to_string());
        master
            .broadcast(ToWorker::Iterate {
                attempt: 0,
                iteration: 2,
                last: Some(Arc::clone(&shared)),
            })
            .unwrap();
        for got in &received {
            match &got.lock().unwrap()[0] {
                ToWorker::Iterate { last: Some(m), .. } => assert!(Arc::ptr_eq(m, &shared)),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(matches!(
            t.connect_worker(1, Box::new(|_| {})),
            Err(TransportError::AlreadyConnected { .. })
        ));
        assert!(matches!(
            t.connect_worker(7, Box::new(|_| {})),
            Err(TransportError::UnknownRank { rank: 7, .. })
        ));
    }

    #[test]
    fn a_replacement_takes_the_rank_and_closes_the_old_link() {
        let mut t = MemoryTransport::<String, u32>::new();
        t.prepare(&LinkSpec::new("t", 1)).unwrap();
        let at_master = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&at_master);
        let master = t
            .bind_master(0, Box::new(move |env| sink.lock().unwrap().push(env.msg)))
            .unwrap();
        let old_got = Arc::new(Mutex::new(0));
        let sink = Arc::clone(&old_got);
        let old = t
            .connect_worker(0, Box::new(move |_| *sink.lock().unwrap() += 1))
            .unwrap();
        let new_got = Arc::new(Mutex::new(0));
        let sink = Arc::clone(&new_got);
        let new = t
            .reconnect_worker(0, Box::new(move |_| *sink.lock().unwrap() += 1))
            .unwrap();
        assert_eq!(
            old.send(ToMaster::Done {
                attempt: 0,
                rows: Default::default(),
                attachments: Vec::new(),
            }),
            Err(TransportError::Replaced { rank: 0 })
        );
        new.send(ToMaster::Registered { attempt: 0 }).unwrap();
        assert_eq!(
            *at_master.lock().unwrap(),
            vec![ToMaster::Registered { attempt: 0 }],
            "only the replacement reaches the master"
        );
        master
            .send(
                0,
                ToWorker::Abort {
                    attempt: 0,
                    error: crate::JobError::Runtime {
                        message: "x".into(),
                    },
                },
            )
            .unwrap();
        assert_eq!((*old_got.lock().unwrap(), *new_got.lock().unwrap()), (0, 1));
    }
}
