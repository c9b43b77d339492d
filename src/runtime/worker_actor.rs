//! A worker reached through a transport — in a process without the master, or across a
//! network from it — as an actor of its own around its driver.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, ActorContext, AsyncContext, Context, Handler, Message};

use super::worker::{guarded_send, Homeward, Host, WorkerDriver, WorkerHome};
use crate::payload::Payload;
use crate::protocol::{ToMaster, ToWorker};
use crate::transport::{TransportError, WorkerLink};

/// A worker reached through a transport (in a process without the master, or across a
/// network from it): its driver in an actor of its own, its messages to the master on its
/// link.
pub(crate) struct WorkerActor<M: Payload, W: Payload> {
    driver: WorkerDriver<M, W>,
    link: Arc<dyn WorkerLink<W>>,
}

impl<M: Payload, W: Payload> WorkerActor<M, W> {
    pub(crate) fn new(driver: WorkerDriver<M, W>, link: Arc<dyn WorkerLink<W>>) -> Self {
        WorkerActor { driver, link }
    }
}

/// The host of a worker in an actor of its own.
struct ActorHost<'a, M: Payload, W: Payload> {
    link: &'a Arc<dyn WorkerLink<W>>,
    ctx: &'a mut Context<WorkerActor<M, W>>,
}

impl<M: Payload, W: Payload> Host<M, W> for ActorHost<'_, M, W> {
    fn send(&mut self, msg: ToMaster<W>) -> Result<(), TransportError> {
        guarded_send(|| self.link.send(msg))
    }

    // The unit given back is the one handed in, moved, only when the actor is gone: boxing
    // it would cost every round an allocation.
    #[allow(clippy::result_large_err)]
    fn homeward(&mut self) -> Homeward<M, W> {
        let addr = self.ctx.address();
        Box::new(move |done| match addr.try_send(Home(done)) {
            Err(actix::dev::SendError::Closed(Home(done))) => Err(done),
            // An unbounded mailbox is never full.
            _ => Ok(()),
        })
    }

    fn arm(&mut self, after: Duration) {
        self.ctx.run_later(after, move |act, ctx| {
            let link = &act.link;
            act.driver.handle_timeout(&mut ActorHost { link, ctx });
        });
    }

    fn stop(&mut self) {
        self.ctx.stop();
    }
}

impl<M: Payload, W: Payload> Actor for WorkerActor<M, W> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let link = &self.link;
        self.driver.start(&mut ActorHost { link, ctx });
    }
}

impl<M: 'static> Message for ToWorker<M> {
    type Result = ();
}

impl<M: Payload, W: Payload> Handler<ToWorker<M>> for WorkerActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: ToWorker<M>, ctx: &mut Context<Self>) {
        let link = &self.link;
        self.driver
            .handle_message(msg, &mut ActorHost { link, ctx });
    }
}

/// A unit of work came back from the pool.
struct Home<M, W>(WorkerHome<M, W>);

impl<M: 'static, W: 'static> Message for Home<M, W> {
    type Result = ();
}

impl<M: Payload, W: Payload> Handler<Home<M, W>> for WorkerActor<M, W> {
    type Result = ();

    fn handle(&mut self, Home(done): Home<M, W>, ctx: &mut Context<Self>) {
        let link = &self.link;
        self.driver.handle_done(done, &mut ActorHost { link, ctx });
    }
}
