//! Batches finish out of order (whichever workers are faster) and must
//! leave in index order, so the output never depends on the worker count.

use std::collections::BTreeMap;

/// Items pushed in any order, taken out in index order from `next` on.
#[derive(Debug)]
pub(super) struct Reorder<T> {
    next: usize,
    pending: BTreeMap<usize, T>,
}

impl<T> Reorder<T> {
    /// Nothing held; the first index to come out is `first`.
    pub(super) fn new(first: usize) -> Self {
        Self {
            next: first,
            pending: BTreeMap::new(),
        }
    }

    /// Holds `item` as index `index`. An index pushed twice keeps the later
    /// item (the feeder dispatches each index once, so it never happens).
    pub(super) fn push(&mut self, index: usize, item: T) {
        let replaced = self.pending.insert(index, item).is_some();
        // Each index arrives once: a second arrival would drop the first
        // item (and, for a batch, the pool permit it holds).
        debug_assert!(!replaced, "batch {index} arrived twice");
    }

    /// The item at the next index, once it has been pushed.
    pub(super) fn pop(&mut self) -> Option<(usize, T)> {
        let item = self.pending.remove(&self.next)?;
        let index = self.next;
        self.next += 1;
        Some((index, item))
    }

    /// The next index to come out.
    pub(super) fn next(&self) -> usize {
        self.next
    }

    /// The item at the next index, left in place; `None` until it has been
    /// pushed.
    pub(super) fn peek(&self) -> Option<&T> {
        self.pending.get(&self.next)
    }

    /// Whether nothing is held.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Everything still held, in index order (what an epoch dropped or
    /// replaced leaves behind).
    pub(super) fn into_rest(self) -> impl Iterator<Item = T> {
        self.pending.into_values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(r: &mut Reorder<char>) -> Vec<(usize, char)> {
        std::iter::from_fn(|| r.pop()).collect()
    }

    #[test]
    fn items_leave_in_index_order_whatever_order_they_arrive_in() {
        let mut r = Reorder::new(0);
        r.push(2, 'c');
        assert_eq!(drain(&mut r), [], "0 has not arrived");
        r.push(1, 'b');
        assert_eq!(drain(&mut r), []);
        r.push(0, 'a');
        assert_eq!(drain(&mut r), [(0, 'a'), (1, 'b'), (2, 'c')]);
        r.push(4, 'e');
        r.push(3, 'd');
        assert_eq!(drain(&mut r), [(3, 'd'), (4, 'e')]);
        assert_eq!(r.into_rest().count(), 0);
    }

    #[test]
    fn a_resumed_epoch_starts_at_its_first_batch() {
        let mut r = Reorder::new(5);
        r.push(6, 'g');
        r.push(5, 'f');
        assert_eq!(drain(&mut r), [(5, 'f'), (6, 'g')]);
    }

    #[test]
    fn what_is_left_behind_a_gap_comes_back_in_order() {
        let mut r = Reorder::new(0);
        for (i, c) in [(3, 'd'), (1, 'b'), (2, 'c')] {
            r.push(i, c);
        }
        assert_eq!(drain(&mut r), []);
        assert_eq!(r.into_rest().collect::<String>(), "bcd");
    }

    /// Every permutation of 6 indices comes out as 0..6, each once.
    #[test]
    fn every_arrival_order_of_six_gives_the_same_output() {
        fn permutations(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![vec![]];
            }
            let mut all = Vec::new();
            for p in permutations(n - 1) {
                for at in 0..=p.len() {
                    let mut q = p.clone();
                    q.insert(at, n - 1);
                    all.push(q);
                }
            }
            all
        }
        let orders = permutations(6);
        assert_eq!(orders.len(), 720);
        for order in orders {
            let mut r = Reorder::new(0);
            let mut out = Vec::new();
            for &i in &order {
                r.push(i, i);
                out.extend(std::iter::from_fn(|| r.pop()).map(|(i, v)| {
                    assert_eq!(i, v);
                    i
                }));
            }
            assert_eq!(out, (0..6).collect::<Vec<_>>(), "arrival order {order:?}");
        }
    }
}
