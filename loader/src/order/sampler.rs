//! The order of an epoch: shuffling, sharding across ranks, batching, resume.

use super::permute::Permutation;
use crate::contract::{EpochOrder, Source};
use crate::error::{Error, Result};
use crate::rng::Purpose;

/// What an epoch does with the samples that do not fill a batch on every
/// rank (the last `len % (world_size * batch_size)`). Set with
/// [`LoaderBuilder::remainder`](crate::LoaderBuilder::remainder); every
/// policy gives every rank the same number of batches in every epoch, so
/// data-parallel ranks step together and none waits at a collective for a
/// batch another rank does not have.
///
/// | policy | samples of an epoch | batches | peers |
/// |---|---|---|---|
/// | `Split` (default) | each once | the tail split evenly across ranks (each rank's last batch may be shorter) | torch `DataLoader(drop_last=False)` on one rank |
/// | `Drop` | the tail left out | all full | `drop_last=True`, `DistributedSampler(drop_last=True)` |
/// | `Pad` | the epoch padded to a multiple of `world_size` by wrap-around: at most `world_size - 1` samples twice | the tail split evenly | `DistributedSampler(drop_last=False)` |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Remainder {
    /// Every sample once; the tail split as evenly as possible across the
    /// ranks. When fewer samples than ranks are left over, the last full
    /// step and the tail are split together into two smaller batches per
    /// rank; where even that cannot give every rank a sample (batch size
    /// 1, or fewer samples than ranks in all), `build` fails and says to
    /// choose `Drop` or `Pad`.
    #[default]
    Split,
    /// The tail left out: every batch full. An epoch with no full batch on
    /// every rank is an error.
    Drop,
    /// As PyTorch's `DistributedSampler`: the epoch's order is extended by
    /// its own first samples (wrap-around) to a multiple of `world_size`,
    /// then split as `Split` does. Never fails; at most `world_size - 1`
    /// samples are seen twice in an epoch.
    Pad,
}

impl Remainder {
    /// The name in a [`LoaderState`](crate::LoaderState)'s identity.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Remainder::Split => "split",
            Remainder::Drop => "drop",
            Remainder::Pad => "pad",
        }
    }
}

/// Decides which samples go in which batch, for one rank.
///
/// - **Order**: the source order, or (with a seed) a permutation drawn from
///   `(seed, epoch)`: different every epoch, the same on every run and rank.
///   A source that orders its own epochs ([`Source::begin_epoch`], a
///   [`Mixture`](crate::source::Mixture)) gives the order instead; with a
///   seed, each stretch (all ranks' batch `k`) is then shuffled within
///   itself, so ranks get fair shares of it while every stretch keeps the
///   samples the source put there.
/// - **Sharding**: the epoch's order is cut into consecutive *stretches*,
///   one per batch index: `world_size * batch_size` samples each, then what
///   the [`Remainder`] policy makes of the tail. Rank `r` takes the `r`-th
///   part of each stretch (parts differ in size by at most one). Ranks
///   never overlap and every rank gets the same number of batches.
/// - **Resume at any world size**: because every batch index of every rank
///   together covers one stretch, the batches delivered before a position
///   are a prefix of the epoch's order: one number (the samples before it,
///   over all ranks) says where every rank is. The rest of the epoch is
///   planned from there by the same rules, for any world size
///   ([`plan`](Self::plan) with `from`); for the world size that planned
///   the prefix, that gives exactly the batches an uninterrupted run
///   yields.
#[derive(Debug, Clone)]
pub(crate) struct Sampler {
    /// The source, when it orders its own epochs ([`Source::begin_epoch`]).
    ordered_by: Option<std::sync::Arc<dyn Source>>,
    /// The shard-block shuffle's settings and the shards' record counts,
    /// when it orders the epochs ([`super::shards`]).
    by_shards: Option<(super::shards::Blocks, std::sync::Arc<[usize]>)>,
    len: usize,
    batch_size: usize,
    seed: Option<u64>,
    remainder: Remainder,
    rank: usize,
    world_size: usize,
}

/// This rank's batches of an epoch: which source indices each holds.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Samples of the epoch, over all ranks, planned before each batch
    /// index: one entry more than the batches. Entry 0 is where the plan
    /// starts (0, or a resume point); random access: a prefix of the
    /// epoch's order.
    pub(crate) before: Before,
    batches: Batches,
}

/// The samples of all ranks planned before each batch index of an epoch,
/// and one entry more for its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Before {
    /// Listed (the streaming mode's).
    Listed(Vec<u64>),
    /// The random-access mode's, by arithmetic over its stretches.
    Stretches(Stretches),
}

impl Before {
    /// Entries: the batches and one more.
    pub(crate) fn len(&self) -> usize {
        match self {
            Before::Listed(v) => v.len(),
            Before::Stretches(s) => s.count() + 1,
        }
    }

    /// Entry `k`, `None` past the last.
    pub(crate) fn get(&self, k: usize) -> Option<u64> {
        match self {
            Before::Listed(v) => v.get(k).copied(),
            Before::Stretches(s) => (k <= s.count()).then(|| s.start(k)),
        }
    }

    /// Every entry (tests).
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u64> {
        (0..self.len()).filter_map(|k| self.get(k)).collect()
    }
}

/// How the samples of an epoch from `from` on are cut into stretches, one
/// per batch index (each split across the ranks): `full` of `step`
/// samples, then the `tail`'s (at most two). Nothing of the epoch's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stretches {
    from: u64,
    step: usize,
    full: usize,
    tail: Vec<usize>,
}

impl Stretches {
    /// Stretches (batch indices).
    pub(crate) fn count(&self) -> usize {
        self.full + self.tail.len()
    }

    /// Samples of stretch `k`.
    fn size(&self, k: usize) -> usize {
        if k < self.full {
            self.step
        } else {
            self.tail[k - self.full]
        }
    }

    /// Samples before stretch `k` (`k` up to the count: the end).
    fn start(&self, k: usize) -> u64 {
        let tail: usize = self.tail[..k.saturating_sub(self.full)].iter().sum();
        self.from + (self.step as u64) * k.min(self.full) as u64 + tail as u64
    }
}

/// How a plan knows its batches' indices.
#[derive(Debug, Clone)]
enum Batches {
    /// Listed: this rank's indices, batch after batch, and each batch's
    /// range of them (the streaming mode's plan).
    Listed {
        indices: Vec<usize>,
        ranges: Vec<std::ops::Range<usize>>,
    },
    /// Computed when a batch is asked for: batch `k` is rank `rank`'s
    /// part of stretch `k` of `before` (shuffled within itself by
    /// `within`'s key when set), of the epoch's order.
    Computed {
        order: std::sync::Arc<GlobalOrder>,
        len: usize,
        /// `(rank, world_size)`.
        rank: (usize, usize),
        /// `(seed, epoch)` of a source-ordered epoch's stretch shuffle.
        within: Option<(u64, u64)>,
    },
}

/// Rank `r` of `ws`'s part of a stretch of `n` samples: after the `r`
/// parts before it, the first `n % ws` parts one larger.
fn part(n: usize, (r, ws): (usize, usize)) -> std::ops::Range<usize> {
    let (q, extra) = (n / ws, n % ws);
    let start = r * q + r.min(extra);
    start..start + q + usize::from(r < extra)
}

impl Plan {
    /// A plan of listed batches: `ranges` into `indices`.
    pub(crate) fn listed(
        indices: Vec<usize>,
        ranges: Vec<std::ops::Range<usize>>,
        before: Vec<u64>,
    ) -> Self {
        Self {
            before: Before::Listed(before),
            batches: Batches::Listed { indices, ranges },
        }
    }

    /// Stretch `k`'s start and size (a computed plan's).
    fn stretch(&self, k: usize) -> (usize, usize) {
        match &self.before {
            Before::Stretches(s) => (s.start(k) as usize, s.size(k)),
            Before::Listed(v) => (v[k] as usize, (v[k + 1] - v[k]) as usize),
        }
    }

    /// This rank's batches in the plan.
    pub(crate) fn len(&self) -> usize {
        match &self.batches {
            Batches::Listed { ranges, .. } => ranges.len(),
            Batches::Computed { .. } => self.before.len() - 1,
        }
    }

    /// Samples in batch `k` (below [`len`](Self::len)).
    pub(crate) fn batch_len(&self, k: usize) -> usize {
        match &self.batches {
            Batches::Listed { ranges, .. } => ranges[k].len(),
            Batches::Computed { rank, .. } => part(self.stretch(k).1, *rank).len(),
        }
    }

    /// Batch `k`'s source indices (below [`len`](Self::len)): its
    /// positions of the epoch's order, computed now.
    pub(crate) fn batch(&self, k: usize) -> Vec<usize> {
        match &self.batches {
            Batches::Listed { indices, ranges } => indices[ranges[k].clone()].to_vec(),
            Batches::Computed {
                order,
                len,
                rank,
                within,
            } => {
                let (at, n) = self.stretch(k);
                // Keyed by where the stretch starts, which a resume on the
                // same ranks plans alike.
                let within = within.map(|(seed, epoch)| {
                    Permutation::new(n as u64, seed, epoch, Purpose::Stretch, at as u64)
                });
                part(n, *rank)
                    .map(|j| {
                        let j = within.as_ref().map_or(j, |p| p.at(j as u64) as usize);
                        // Past the end: padding, the epoch's own first samples.
                        order.at((at + j) % len)
                    })
                    .collect()
            }
        }
    }

    /// Every index the plan lists (tests): a streaming plan's whole
    /// order for this rank, read past its batches; else the batches'.
    #[cfg(test)]
    pub(crate) fn indices(&self) -> Vec<usize> {
        match &self.batches {
            Batches::Listed { indices, .. } => indices.clone(),
            Batches::Computed { .. } => self.batch_indices().concat(),
        }
    }

    /// This rank's batches, as source indices.
    pub(crate) fn batch_indices(&self) -> Vec<Vec<usize>> {
        (0..self.len()).map(|k| self.batch(k)).collect()
    }
}

/// An epoch's global order, asked position by position.
#[derive(Debug)]
enum GlobalOrder {
    /// The source order.
    Identity,
    /// The keyed permutation of `(seed, epoch)`.
    Keyed(Permutation),
    /// The order the source gave ([`Source::begin_epoch`]), cut or
    /// repeated to the sampler's length `len`, indices wrapped below it.
    Given {
        order: std::sync::Arc<dyn EpochOrder>,
        len: usize,
    },
}

impl GlobalOrder {
    /// The source index at position `pos` (below the length).
    fn at(&self, pos: usize) -> usize {
        match self {
            GlobalOrder::Identity => pos,
            GlobalOrder::Keyed(p) => p.at(pos as u64) as usize,
            GlobalOrder::Given { order, len } => match order.len() {
                0 => 0,
                n => order.at(pos % n) % len,
            },
        }
    }
}

impl Sampler {
    /// A sampler over `len` samples. `seed: None` keeps the source order.
    ///
    /// Fails when `batch_size` or `world_size` is 0, `rank >= world_size`,
    /// `len` is 0, or the policy cannot plan an epoch of `len` samples
    /// ([`stretches`](Self::stretches)). A sampler that builds has at least
    /// one batch.
    pub(crate) fn new(
        len: usize,
        batch_size: usize,
        seed: Option<u64>,
        remainder: Remainder,
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
        if world_size.checked_mul(batch_size).is_none() {
            return Err(Error::InvalidConfig(format!(
                "world_size {world_size} x batch_size {batch_size} overflows"
            )));
        }
        if len == 0 {
            return Err(Error::InvalidConfig("the sampler has no samples".into()));
        }
        let s = Self {
            ordered_by: None,
            by_shards: None,
            len,
            batch_size,
            seed,
            remainder,
            rank,
            world_size,
        };
        s.stretches(len).map_err(Error::InvalidConfig)?;
        Ok(s)
    }

    /// The stretches `n` samples are cut into, one per batch index (each
    /// split across the ranks), or why the policy cannot give every rank
    /// the same number of non-empty batches.
    fn stretches(&self, n: usize) -> std::result::Result<Stretches, String> {
        let (bs, ws) = (self.batch_size, self.world_size);
        let step = ws * bs;
        let full = n / step;
        let cut = |full, tail| Stretches {
            from: 0,
            step,
            full,
            tail,
        };
        match self.remainder {
            Remainder::Drop if full == 0 => Err(format!(
                "with drop_last, {n} samples make no full batch of {bs} on each of {ws} ranks \
                 (an epoch of 0 batches): lower batch_size or keep the tail (Remainder::Split \
                 or Pad)"
            )),
            Remainder::Drop => Ok(cut(full, Vec::new())),
            Remainder::Split | Remainder::Pad => {
                // Padding to a multiple of the ranks leaves a tail of at least one per rank.
                let n = match self.remainder {
                    Remainder::Pad => n.div_ceil(ws) * ws,
                    _ => n,
                };
                let (full, tail) = (n / step, n % step);
                if tail == 0 || tail >= ws {
                    Ok(cut(full, (tail > 0).then_some(tail).into_iter().collect()))
                } else if full >= 1 && bs >= 2 {
                    // Too few left for one per rank: the last full step and
                    // the tail, as two stretches (each at least one per rank).
                    let m = step + tail;
                    Ok(cut(full - 1, vec![m.div_ceil(2), m / 2]))
                } else {
                    Err(format!(
                        "{n} samples cannot be split into {ws} shards with equal batch counts at \
                         batch size {bs} without repeating samples: set drop_last(true) or \
                         remainder(Remainder::Pad)"
                    ))
                }
            }
        }
    }

    /// Whether the rest of an epoch from sample `from` of its order can be
    /// planned at this world size: the error says why not.
    pub(crate) fn check_from(&self, from: u64) -> Result<()> {
        let left = self.len.saturating_sub(from as usize);
        if left == 0 {
            return Ok(());
        }
        self.stretches(left).map(drop).map_err(|why| {
            Error::InvalidConfig(format!(
                "the {left} samples left of the epoch (from sample {from} of {}) cannot be \
                 planned on {} ranks: {why}; resume on fewer ranks or from the next epoch",
                self.len, self.world_size
            ))
        })
    }

    /// Batches this rank gets per whole epoch (the same for every epoch and rank).
    pub(crate) fn num_batches(&self) -> usize {
        self.stretches(self.len).map_or(0, |s| s.count())
    }

    /// This sampler, taking each epoch's order from `source` when it
    /// gives one ([`Source::begin_epoch`]); an error when epoch 0's order
    /// is not `len` indices below `len`.
    pub(crate) fn ordered_by(mut self, source: std::sync::Arc<dyn Source>) -> Result<Self> {
        if let Some(order) = source.begin_epoch(self.seed, 0) {
            // The length, and the first and last positions (the order is
            // not walked: it may be a billion long).
            let ends = (0..order.len().min(64)).chain(order.len().saturating_sub(64)..order.len());
            let bad = ends.map(|p| order.at(p)).find(|&i| i >= self.len);
            if order.len() != self.len || bad.is_some() {
                return Err(Error::InvalidConfig(format!(
                    "the source's epoch order has {} positions (one gives index {bad:?}); it \
                     must give {} indices below {}",
                    order.len(),
                    self.len,
                    self.len
                )));
            }
            self.ordered_by = Some(source);
        }
        Ok(self)
    }

    /// This sampler, ordering each epoch by the shard-block shuffle
    /// ([`super::shards`]) over shards of `records` samples each (in
    /// index order, `len` in all).
    pub(crate) fn by_shards(mut self, blocks: super::shards::Blocks, records: Vec<usize>) -> Self {
        debug_assert_eq!(records.iter().sum::<usize>(), self.len);
        self.by_shards = Some((blocks, records.into()));
        self
    }

    /// The epoch's global order: the source order or its `(seed, epoch)`
    /// permutation, the shard-block shuffle, or the order the source gives
    /// (cut or repeated to `len`, indices wrapped below it, should a later
    /// epoch's not fit).
    fn epoch_order(&self, epoch: u64) -> GlobalOrder {
        if let Some((blocks, records)) = &self.by_shards {
            let order = super::shards::ShardBlockOrder::new(records, *blocks, self.seed, epoch);
            return GlobalOrder::Given {
                order: std::sync::Arc::new(order),
                len: self.len,
            };
        }
        if let Some(order) = self
            .ordered_by
            .as_ref()
            .and_then(|s| s.begin_epoch(self.seed, epoch))
        {
            return GlobalOrder::Given {
                order,
                len: self.len,
            };
        }
        match self.seed {
            Some(seed) => GlobalOrder::Keyed(Permutation::new(
                self.len as u64,
                seed,
                epoch,
                Purpose::Shuffle,
                0,
            )),
            None => GlobalOrder::Identity,
        }
    }

    /// The epoch's whole global order (tests).
    #[cfg(test)]
    pub(crate) fn order(&self, epoch: u64) -> Vec<usize> {
        let order = self.epoch_order(epoch);
        (0..self.len).map(|p| order.at(p)).collect()
    }

    /// This rank's batches of `epoch` from sample `from` of the epoch's
    /// order on (0: the whole epoch). A `from` that
    /// [`check_from`](Self::check_from) refuses, or one at or past the end,
    /// plans no batch.
    ///
    /// Nothing of size `len` is made: a batch's indices are computed when
    /// it is asked for ([`Plan::batch`]), at this rank's positions only
    /// (of the source's own order too, when it gives one).
    pub(crate) fn plan(&self, epoch: u64, from: u64) -> Plan {
        let from = (from as usize).min(self.len);
        let mut stretches = self
            .stretches(self.len - from)
            .unwrap_or_else(|_| Stretches {
                from: 0,
                step: 1,
                full: 0,
                tail: Vec::new(),
            });
        stretches.from = from as u64;
        // With a seed, a source-ordered stretch is shuffled within itself.
        let within = match (&self.ordered_by, self.seed) {
            (Some(_), Some(seed)) => Some((seed, epoch)),
            _ => None,
        };
        Plan {
            before: Before::Stretches(stretches),
            batches: Batches::Computed {
                order: std::sync::Arc::new(self.epoch_order(epoch)),
                len: self.len,
                rank: (self.rank, self.world_size),
                within,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const POLICIES: [Remainder; 3] = [Remainder::Split, Remainder::Drop, Remainder::Pad];

    fn sampler(len: usize, bs: usize, rem: Remainder, r: usize, ws: usize) -> Result<Sampler> {
        Sampler::new(len, bs, Some(7), rem, r, ws)
    }

    /// Every rank's batches of epoch 3 from `from`: equal counts, each
    /// non-empty and at most `bs`; returns the samples by rank.
    fn rank_batches(len: usize, bs: usize, ws: usize, rem: Remainder, from: u64) -> Vec<usize> {
        let plans: Vec<Plan> = (0..ws)
            .map(|r| sampler(len, bs, rem, r, ws).unwrap().plan(3, from))
            .collect();
        let nb = plans[0].len();
        let mut all = Vec::new();
        for p in &plans {
            assert_eq!(p.len(), nb, "len {len} bs {bs} ws {ws} {rem:?}");
            assert_eq!(
                p.before.to_vec(),
                plans[0].before.to_vec(),
                "every rank plans the same stretches"
            );
            for b in p.batch_indices() {
                assert!(!b.is_empty() && b.len() <= bs, "len {len} bs {bs} ws {ws}");
                if rem == Remainder::Drop {
                    assert_eq!(b.len(), bs);
                }
                all.extend(b);
            }
        }
        all
    }

    #[test]
    fn shards_are_disjoint_equal_and_cover() {
        for len in 1..70 {
            for bs in 1..6 {
                for ws in 1..5 {
                    for rem in POLICIES {
                        if sampler(len, bs, rem, 0, ws).is_err() {
                            // Only Drop with no full step, or Split with no
                            // way to give each rank a sample, fail.
                            assert!(rem != Remainder::Pad, "len {len} bs {bs} ws {ws}");
                            continue;
                        }
                        let all = rank_batches(len, bs, ws, rem, 0);
                        let set: HashSet<usize> = all.iter().copied().collect();
                        let ctx = format!("len {len} bs {bs} ws {ws} {rem:?}");
                        match rem {
                            Remainder::Split => assert_eq!(all.len(), len, "{ctx}"),
                            Remainder::Drop => assert_eq!(all.len(), len / (bs * ws) * bs * ws),
                            Remainder::Pad => {
                                assert_eq!(all.len(), len.div_ceil(ws) * ws, "{ctx}");
                                assert_eq!(set.len(), len, "{ctx}: every sample at least once");
                            }
                        }
                        if rem != Remainder::Pad {
                            assert_eq!(set.len(), all.len(), "{ctx}: a sample twice");
                        }
                    }
                }
            }
        }
    }

    /// The batches before any position are a prefix of the order; the
    /// rest planned from it at the same world size is the uninterrupted
    /// run's rest, and at any other world size covers the rest of the
    /// epoch once (elastic resume).
    #[test]
    fn the_rest_of_an_epoch_plans_at_any_world_size() {
        for len in 1..60 {
            for bs in 1..5 {
                for ws in 1..5 {
                    for rem in POLICIES {
                        let Ok(s) = sampler(len, bs, rem, 0, ws) else {
                            continue;
                        };
                        let whole = s.plan(3, 0);
                        let order = s.order(3);
                        for (k, at) in whole.before.to_vec().into_iter().enumerate() {
                            let ctx = format!("len {len} bs {bs} ws {ws} {rem:?} batch {k}");
                            // Same world size: the suffix, for every rank.
                            for r in 0..ws {
                                let s = sampler(len, bs, rem, r, ws).unwrap();
                                let rest = s.plan(3, at).batch_indices();
                                let full = s.plan(3, 0).batch_indices();
                                assert_eq!(rest, full[k.min(full.len())..], "{ctx} rank {r}");
                            }
                            let at = at.min(len as u64);
                            for m in 1..6 {
                                let Ok(first) = sampler(len, bs, rem, 0, m) else {
                                    continue;
                                };
                                if first.check_from(at).is_err() {
                                    continue;
                                }
                                let mut rest = rank_batches(len, bs, m, rem, at);
                                let mut want = order[at as usize..].to_vec();
                                if rem == Remainder::Drop {
                                    let keep = want.len() / (bs * m) * bs * m;
                                    want.truncate(keep);
                                }
                                if rem == Remainder::Pad {
                                    // The rest once, and fewer than `m` repeats.
                                    assert_eq!(rest.len(), want.len().div_ceil(m) * m, "{ctx}");
                                    let got: HashSet<usize> = rest.iter().copied().collect();
                                    assert!(want.iter().all(|i| got.contains(i)), "{ctx} on {m}");
                                    continue;
                                }
                                rest.sort_unstable();
                                want.sort_unstable();
                                assert_eq!(rest, want, "{ctx} resumed on {m}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pad_wraps_around_to_the_epochs_first_samples() {
        let s = Sampler::new(5, 2, None, Remainder::Pad, 0, 4).unwrap();
        let p = s.plan(0, 0);
        assert_eq!(p.batch_indices(), vec![vec![0, 1]]);
        let s3 = Sampler::new(5, 2, None, Remainder::Pad, 3, 4).unwrap();
        assert_eq!(s3.plan(0, 0).batch_indices(), vec![vec![1, 2]]);
        // With one sample and four ranks Split has no plan; Pad does.
        assert!(Sampler::new(1, 2, None, Remainder::Split, 0, 4).is_err());
        assert_eq!(
            Sampler::new(1, 2, None, Remainder::Pad, 2, 4)
                .unwrap()
                .plan(0, 0)
                .batch_indices(),
            vec![vec![0]]
        );
    }

    #[test]
    fn a_rest_that_cannot_be_planned_says_so() {
        let s = Sampler::new(10, 2, None, Remainder::Split, 0, 4).unwrap();
        let err = s.check_from(9).unwrap_err().to_string();
        assert!(
            err.contains("1 samples left") && err.contains("4 ranks"),
            "{err}"
        );
        assert!(s.check_from(10).is_ok(), "the end is the next epoch");
    }

    #[test]
    fn unshuffled_is_source_order_and_shuffle_changes_per_epoch() {
        let s = Sampler::new(10, 4, None, Remainder::Split, 0, 1).unwrap();
        assert_eq!(
            s.plan(0, 0).batch_indices(),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
        );
        let s = Sampler::new(100, 10, Some(1), Remainder::Split, 0, 1).unwrap();
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
                    for rem in POLICIES {
                        if let Ok(s) = Sampler::new(len, bs, None, rem, 0, ws) {
                            assert!(s.num_batches() > 0, "len {len} bs {bs} ws {ws} {rem:?}");
                            assert_eq!(s.num_batches(), s.plan(0, 0).len());
                        }
                    }
                }
            }
        }
        let err = Sampler::new(5, 8, None, Remainder::Drop, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("drop_last"), "{err}");
    }

    #[test]
    fn an_overflowing_rank_times_batch_is_an_error() {
        assert!(Sampler::new(10, usize::MAX / 2, None, Remainder::Split, 0, 4).is_err());
    }
}
