//! At most one message per vertex, by place: what a combiner leaves for each vertex of a
//! partition. The messages lie in one array and a bit per vertex says which are there, so
//! a superstep's folds touch the array of messages alone (an `Option` per vertex would
//! double it for a message of eight bytes), and a vertex without one costs a bit.

/// A message or none for each of `len` vertices.
pub(crate) struct Slots<M> {
    len: usize,
    /// Empty until the first message, then `len` of them: a place whose bit is clear
    /// holds a message read before (or a copy of the first), never read again.
    messages: Vec<M>,
    /// Bit `i` is set when `messages[i]` is vertex `i`'s message.
    there: Vec<u64>,
}

impl<M: Clone> Slots<M> {
    /// No message for any of `len` vertices.
    pub(crate) fn new(len: usize) -> Self {
        Slots {
            len,
            messages: Vec::new(),
            there: vec![0; len.div_ceil(64)],
        }
    }

    /// Folds `message` into vertex `i`'s by `fold`, or makes it vertex `i`'s. Inlined
    /// where it is called, in the loops over a run of messages: a call per message costs
    /// a superstep a tenth of its time.
    #[inline(always)]
    pub(crate) fn fold(&mut self, i: usize, message: M, fold: impl Fn(&mut M, M)) {
        let bit = 1 << (i % 64);
        let word = &mut self.there[i / 64];
        if *word & bit != 0 {
            fold(&mut self.messages[i], message);
            return;
        }
        *word |= bit;
        if self.messages.is_empty() {
            self.fill(&message);
        }
        self.messages[i] = message;
    }

    /// Makes the array of messages, at the first.
    #[cold]
    #[inline(never)]
    fn fill(&mut self, first: &M) {
        self.messages = vec![first.clone(); self.len];
    }

    /// Whether it has a place for no vertex.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// For how many vertices it has a place.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Vertex `i`'s message.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&M> {
        (self.there[i / 64] & (1 << (i % 64)) != 0).then(|| &self.messages[i])
    }

    /// Forgets every message.
    pub(crate) fn clear(&mut self) {
        self.there.fill(0);
    }

    /// Each vertex's message, with its place.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &M)> {
        (0..self.len).filter_map(|i| Some((i, self.get(i)?)))
    }
}

impl<M: Clone> Default for Slots<M> {
    fn default() -> Self {
        Slots::new(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_holds_the_fold_of_its_messages_until_cleared() {
        let mut slots = Slots::<String>::new(130);
        slots.fold(3, "a".into(), |into, m| into.push_str(&m));
        slots.fold(129, "x".into(), |into, m| into.push_str(&m));
        slots.fold(3, "b".into(), |into, m| into.push_str(&m));
        let there: Vec<(usize, &String)> = slots.iter().collect();
        assert_eq!(there, [(3, &"ab".to_string()), (129, &"x".to_string())]);
        assert_eq!(slots.get(64), None);
        slots.clear();
        assert_eq!(slots.iter().count(), 0);
        slots.fold(3, "c".into(), |into, m| into.push_str(&m));
        assert_eq!(
            slots.get(3).map(String::as_str),
            Some("c"),
            "not folded into one read before"
        );
    }
}
