//! A block shuffle computed position by position: a source's blocks (a
//! Parquet file's row groups, a dataset's shards) in a given order, and
//! the samples of each window of `window` consecutive blocks of that
//! order permuted among themselves by a keyed [`Permutation`]. Memory is
//! a few words a block; a position costs a binary search over the blocks
//! and one permutation lookup; nothing is done per sample of the epoch.

#![cfg_attr(not(feature = "parquet"), allow(dead_code))]

use super::permute::Permutation;
use crate::contract::EpochOrder;
use crate::rng::Purpose;

/// One epoch's block shuffle ([module docs](self)).
#[derive(Debug)]
pub(crate) struct BlockShuffle {
    /// The blocks in the epoch's order.
    blocks: Vec<usize>,
    /// Each block's first source index, by block, then the total.
    starts: Vec<usize>,
    /// Samples before each block of the epoch's order, then the total.
    before: Vec<usize>,
    /// Blocks a window holds.
    window: usize,
    /// Each window's permutation of its samples; none without a seed.
    perms: Vec<Permutation>,
}

impl BlockShuffle {
    /// The order of the blocks `blocks` (each block once) whose first
    /// source indices are `starts` (one more entry: the total), their
    /// samples shuffled within each window of `window` blocks by the key
    /// `(seed, epoch, purpose, 1 + window's number)` when `seed` is given,
    /// else in stored order.
    pub(crate) fn new(
        starts: &[usize],
        blocks: Vec<usize>,
        window: usize,
        seed: Option<u64>,
        epoch: u64,
        purpose: Purpose,
    ) -> Self {
        let window = window.max(1);
        let mut before = Vec::with_capacity(blocks.len() + 1);
        before.push(0);
        for &b in &blocks {
            let total = before.last().copied().unwrap_or(0);
            before.push(total + (starts[b + 1] - starts[b]));
        }
        let perms = match seed {
            Some(seed) => (0..blocks.len().div_ceil(window))
                .map(|w| {
                    let end = ((w + 1) * window).min(blocks.len());
                    let n = before[end] - before[w * window];
                    Permutation::new(n as u64, seed, epoch, purpose, 1 + w as u64)
                })
                .collect(),
            None => Vec::new(),
        };
        Self {
            blocks,
            starts: starts.to_vec(),
            before,
            window,
            perms,
        }
    }

    /// The block (its place in the epoch's order) holding position `p`.
    fn block_at(&self, p: usize) -> usize {
        self.before.partition_point(|&b| b <= p) - 1
    }
}

impl EpochOrder for BlockShuffle {
    fn len(&self) -> usize {
        self.before.last().copied().unwrap_or(0)
    }

    fn at(&self, position: usize) -> usize {
        let mut p = position;
        let w = self.block_at(p) / self.window;
        if let Some(perm) = self.perms.get(w) {
            let first = self.before[w * self.window];
            p = first + perm.at((p - first) as u64) as usize;
        }
        let k = self.block_at(p);
        self.starts[self.blocks[k]] + (p - self.before[k])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Blocks of 3, 0, 5, 1 and 4 samples.
    const STARTS: [usize; 6] = [0, 3, 3, 8, 9, 13];

    #[test]
    fn every_sample_once_and_each_window_keeps_its_blocks() {
        let blocks = vec![3, 1, 4, 0, 2];
        for window in [1, 2, 3, 5, 9] {
            for seed in [None, Some(1), Some(2)] {
                let o = BlockShuffle::new(
                    &STARTS,
                    blocks.clone(),
                    window,
                    seed,
                    4,
                    Purpose::BlockShuffle,
                );
                let all = o.to_vec();
                assert_eq!(o.len(), 13);
                let seen: HashSet<usize> = all.iter().copied().collect();
                assert_eq!(seen.len(), 13, "{all:?}");
                // Window by window: the samples of its blocks.
                let mut at = 0;
                for w in blocks.chunks(window) {
                    let want: HashSet<usize> =
                        w.iter().flat_map(|&b| STARTS[b]..STARTS[b + 1]).collect();
                    let got: HashSet<usize> = all[at..at + want.len()].iter().copied().collect();
                    assert_eq!(got, want, "window {w:?} of {all:?}");
                    at += want.len();
                }
                if seed.is_none() {
                    // Stored order within each block, blocks in the given order.
                    let want: Vec<usize> = blocks
                        .iter()
                        .flat_map(|&b| STARTS[b]..STARTS[b + 1])
                        .collect();
                    assert_eq!(all, want);
                }
            }
        }
    }

    #[test]
    fn the_shuffle_is_keyed() {
        let order = |seed, epoch| {
            BlockShuffle::new(
                &STARTS,
                vec![0, 1, 2, 3, 4],
                5,
                Some(seed),
                epoch,
                Purpose::BlockShuffle,
            )
            .to_vec()
        };
        assert_eq!(order(1, 0), order(1, 0));
        assert_ne!(order(1, 0), order(2, 0));
        assert_ne!(order(1, 0), order(1, 1));
    }
}
