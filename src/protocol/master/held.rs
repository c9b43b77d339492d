//! The iteration's span, held entered on the master node's thread from the iteration's
//! start to its end, so that a trace shows each iteration as one slice that holds its
//! work (not a sliver at each step the node takes in it).

/// A span entered until dropped, on the thread that made it. Unlike a `tracing`
/// guard it is not tied to a borrow: the node keeps it across the steps of an iteration.
/// The node's driver steps it on one thread, so it is exited where it was entered.
pub(crate) struct HeldSpan {
    span: tracing::Span,
}

impl HeldSpan {
    /// Enters `span` and holds it.
    pub(crate) fn enter(span: tracing::Span) -> Self {
        span.with_subscriber(|(id, dispatch)| dispatch.enter(id));
        HeldSpan { span }
    }

    /// The span, to make children of.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }
}

impl Drop for HeldSpan {
    fn drop(&mut self) {
        self.span
            .with_subscriber(|(id, dispatch)| dispatch.exit(id));
    }
}
