//! The order of an epoch: shuffling, sharding across ranks, batching, resume.

use crate::error::{Error, Result};
use crate::rng::{keyed_rng, Purpose};
use rand::seq::SliceRandom;

/// Decides which samples go in which batch, for one rank.
///
/// - **Order**: the source order, or (with a seed) a permutation drawn from
///   `(seed, epoch)`: different every epoch, the same on every run and rank.
/// - **Sharding**: the epoch's order is cut into steps of
///   `world_size * batch_size` samples; within a step rank `r` takes the
///   `r`-th run of `batch_size`. Ranks never overlap and every rank gets the
///   same number of batches, as data-parallel training needs.
/// - **The tail** (fewer than `world_size * batch_size` samples left): with
///   `drop_last` it is dropped. Without it, it is split as evenly as possible
///   across ranks so every sample is seen once; when fewer samples than ranks
///   are left, the last full step and the tail are split together into two
///   smaller batches per rank. Unlike PyTorch's `DistributedSampler`, no
///   sample is repeated to pad the shards.
#[derive(Debug, Clone)]
pub(crate) struct Sampler {
    len: usize,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    rank: usize,
    world_size: usize,
}

/// How an epoch's order is cut into this rank's batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Source indices, the epoch's global order.
    pub(crate) order: Vec<usize>,
    /// This rank's batches as ranges into `order`.
    pub(crate) batches: Vec<std::ops::Range<usize>>,
}

impl Plan {
    /// This rank's batches, as source indices.
    pub(crate) fn batch_indices(&self) -> Vec<Vec<usize>> {
        self.batches
            .iter()
            .map(|r| self.order[r.clone()].to_vec())
            .collect()
    }
}

/// `m` split into `parts` contiguous sizes differing by at most one, larger first.
fn split_even(m: usize, parts: usize) -> impl Iterator<Item = usize> {
    let (q, r) = (m / parts, m % parts);
    (0..parts).map(move |i| q + usize::from(i < r))
}

impl Sampler {
    /// A sampler over `len` samples. `seed: None` keeps the source order.
    ///
    /// Fails when `batch_size` or `world_size` is 0, `rank >= world_size`,
    /// `len` is 0, `drop_last` leaves no batch at all (fewer samples than
    /// `world_size * batch_size`), or the shards cannot have equal batch
    /// counts without repeating or dropping samples (fewer samples than
    /// ranks; or batch size 1 with a tail shorter than the number of ranks):
    /// set `drop_last` then. A sampler that builds has at least one batch.
    pub(crate) fn new(
        len: usize,
        batch_size: usize,
        seed: Option<u64>,
        drop_last: bool,
        rank: usize,
        world_size: usize,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::InvalidConfig("batch_size must be at least 1".into()));
        }
        if world_size == 0 || rank >= world_size {
            return Err(Error::InvalidConfig(format!(
                "rank {rank} is not below world_size {world_size}"
            )));
        }
        let Some(step) = world_size.checked_mul(batch_size) else {
            return Err(Error::InvalidConfig(format!(
                "world_size {world_size} x batch_size {batch_size} overflows"
            )));
        };
        if len == 0 {
            return Err(Error::InvalidConfig("the sampler has no samples".into()));
        }
        if drop_last && len < step {
            return Err(Error::InvalidConfig(format!(
                "with drop_last, {len} samples make no full batch of {batch_size} on each of \
                 {world_size} ranks (an epoch of 0 batches): lower batch_size or set \
                 drop_last(false)"
            )));
        }
        let tail = len % step;
        if !drop_last && tail > 0 && tail < world_size && (len < step || batch_size == 1) {
            return Err(Error::InvalidConfig(format!(
                "{len} samples cannot be split into {world_size} shards with equal batch counts \
                 at batch size {batch_size} without repeating samples: set drop_last(true)"
            )));
        }
        Ok(Self {
            len,
            batch_size,
            seed,
            drop_last,
            rank,
            world_size,
        })
    }

    /// Batches this rank gets per epoch (the same for every epoch and rank).
    pub(crate) fn num_batches(&self) -> usize {
        let step = self.world_size * self.batch_size;
        let (full, tail) = (self.len / step, self.len % step);
        // A short tail adds one batch; a tail shorter than the rank count
        // replaces the last full batch by two (see `plan`): one more either way.
        if tail == 0 || self.drop_last {
            full
        } else {
            full + 1
        }
    }

    /// The epoch's global order: the source order or its `(seed, epoch)` permutation.
    pub(crate) fn order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = self.seed {
            order.shuffle(&mut keyed_rng(seed, epoch, Purpose::Shuffle, 0));
        }
        order
    }

    pub(crate) fn plan(&self, epoch: u64) -> Plan {
        let (bs, ws, r) = (self.batch_size, self.world_size, self.rank);
        let step = ws * bs;
        let (full, tail) = (self.len / step, self.len % step);
        let mut batches: Vec<_> = (0..full)
            .map(|t| t * step + r * bs..t * step + (r + 1) * bs)
            .collect();
        if tail > 0 && !self.drop_last {
            // Where this rank's part of a contiguous stretch starts and ends.
            let part = |start: usize, total: usize| {
                let mut at = start;
                let mut mine = 0..0;
                for (i, n) in split_even(total, ws).enumerate() {
                    if i == r {
                        mine = at..at + n;
                    }
                    at += n;
                }
                mine
            };
            if tail >= ws {
                batches.push(part(full * step, tail));
            } else {
                // Too few left for one per rank: split the last full step and
                // the tail together, two batches per rank (each <= batch_size).
                batches.pop();
                let mine = part((full - 1) * step, step + tail);
                let mid = mine.start + mine.len().div_ceil(2);
                batches.push(mine.start..mid);
                batches.push(mid..mine.end);
            }
        }
        Plan {
            order: self.order(epoch),
            batches,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn check_shards(len: usize, bs: usize, ws: usize, drop_last: bool) {
        let samplers: Vec<_> = (0..ws)
            .map(|r| Sampler::new(len, bs, Some(7), drop_last, r, ws).unwrap())
            .collect();
        let mut seen = HashSet::new();
        let nb = samplers[0].num_batches();
        for s in &samplers {
            let batches = s.plan(3).batch_indices();
            assert_eq!(batches.len(), nb, "len {len} bs {bs} ws {ws}");
            for b in &batches {
                assert!(
                    !b.is_empty() && b.len() <= bs,
                    "len {len} bs {bs} ws {ws}: {b:?}"
                );
                if drop_last {
                    assert_eq!(b.len(), bs);
                }
                for &i in b {
                    assert!(seen.insert(i), "sample {i} on two ranks");
                }
            }
        }
        let expect = if drop_last {
            len / (bs * ws) * bs * ws
        } else {
            len
        };
        assert_eq!(
            seen.len(),
            expect,
            "len {len} bs {bs} ws {ws} drop {drop_last}"
        );
    }

    #[test]
    fn shards_are_disjoint_equal_and_cover() {
        for len in 1..70 {
            for bs in 1..6 {
                for ws in 1..5 {
                    for drop_last in [false, true] {
                        if Sampler::new(len, bs, None, drop_last, 0, ws).is_ok() {
                            check_shards(len, bs, ws, drop_last);
                        } else {
                            // drop_last fails only where it would leave no batch.
                            assert!(!drop_last || len < bs * ws);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn unshuffled_is_source_order_and_shuffle_changes_per_epoch() {
        let s = Sampler::new(10, 4, None, false, 0, 1).unwrap();
        assert_eq!(
            s.plan(0).batch_indices(),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
        );
        let s = Sampler::new(100, 10, Some(1), false, 0, 1).unwrap();
        assert_ne!(s.order(0), s.order(1));
        assert_eq!(s.order(1), s.order(1));
        let mut sorted = s.order(0);
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn a_sampler_that_builds_has_batches() {
        for len in 0..70 {
            for bs in 1..6 {
                for ws in 1..5 {
                    for drop_last in [true, false] {
                        if let Ok(s) = Sampler::new(len, bs, None, drop_last, 0, ws) {
                            assert!(
                                s.num_batches() > 0,
                                "len {len} bs {bs} ws {ws} drop_last {drop_last}: 0 batches"
                            );
                        }
                    }
                }
            }
        }
        let err = Sampler::new(5, 8, None, true, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("drop_last"), "{err}");
    }

    #[test]
    fn an_overflowing_rank_times_batch_is_an_error() {
        assert!(Sampler::new(10, usize::MAX / 2, None, false, 0, 4).is_err());
    }
}
