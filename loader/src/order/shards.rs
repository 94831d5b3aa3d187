//! The shard-block shuffle of the random-access mode
//! ([`LoaderBuilder::shard_blocks`](crate::LoaderBuilder::shard_blocks)):
//! an epoch order in which each rank reads a few shards at a time, front
//! to back in large requests, yet every sample is placed by a keyed
//! permutation and a position costs arithmetic.
//!
//! 1. The shards are put in a keyed order (the shard order of
//!    `(seed, epoch)`), their samples laid end to end: `N` samples.
//! 2. That sequence is cut into `partitions` equal parts (sizes differ by
//!    at most one sample; a shard may be cut between two). Partitions are
//!    Mosaic Streaming's canonical nodes: fixed for a run, whatever the
//!    world size, so an elastic resume keeps the order.
//! 3. Each part is cut into windows of `window` samples, each window's
//!    samples permuted among themselves by a keyed [`Permutation`].
//! 4. The parts are dealt round robin in lanes of `lane` samples (the
//!    batch size times the ranks that share a part, `world_size /
//!    partitions`, at the first run): position `p` of the epoch's first
//!    `partitions * lane * F` positions (`F` full rounds) is sample
//!    `(p / (partitions * lane)) * lane + p % lane` of part
//!    `(p / lane) % partitions`; the parts' last samples follow, part
//!    after part.
//!
//! A batch index covers `world_size * batch_size` positions, rank `r`
//! taking the `r`-th batch of them ([`super::sampler`]), so on the world
//! size of the first run rank `r` reads only part `r / (world_size /
//! partitions)`: with as many parts as ranks its own, with as many as
//! nodes its node's (consecutive ranks), one window at a time. On
//! another world size the order is the same and every sample is still
//! read once; a rank's batches then come from the parts that lanes put
//! there. Without a seed nothing is permuted: the shards in stored order,
//! cut and dealt the same way.
//!
//! Memory is a few words a shard; a position costs two binary searches
//! (over the parts' tails and the shards) and a permutation lookup.

use super::permute::Permutation;
use crate::contract::EpochOrder;
use crate::rng::Purpose;

/// The shard-block shuffle's settings ([module docs](self)), given to
/// [`LoaderBuilder::shard_blocks`](crate::LoaderBuilder::shard_blocks).
///
/// - `partitions`: the parts the epoch is cut into (Mosaic Streaming's
///   canonical nodes). Default: the world size of the run that starts the
///   training, a part a rank; the number of nodes gives a part a node,
///   read by its ranks (consecutive ranks, as launchers number them)
///   through the node's cache directory. A resumed run takes the parts
///   its state was saved with, so the order stays the same on any world
///   size.
/// - `window`: the samples a part is shuffled within (a sample stays
///   within its window; a window spans about `window / samples per shard`
///   shards, whose chunks are held in memory, or in the cache directory
///   when there is one, while it is read from object storage). Default:
///   the largest power of two of samples whose bytes fit an eighth of the
///   RAM budget ([`LoaderBuilder::ram_budget`](crate::LoaderBuilder::ram_budget)
///   when set, else 4 GiB, so that ranks on nodes with different free
///   memory agree) or, for remote shards with a cache directory, a
///   quarter of its limit over the node's ranks, whichever is larger; at
///   least the batch size. A resumed run takes the one its state was
///   saved with.
///
/// ```
/// use candle_wick::ShardBlocks;
/// let blocks = ShardBlocks::new().partitions(64).window(1 << 16);
/// assert_eq!(blocks, ShardBlocks::new().window(65536).partitions(64));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShardBlocks {
    pub(crate) partitions: Option<usize>,
    pub(crate) window: Option<usize>,
}

impl ShardBlocks {
    /// Both settings chosen by the loader (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// Cut each epoch into `n` parts.
    pub fn partitions(mut self, n: usize) -> Self {
        self.partitions = Some(n);
        self
    }

    /// Shuffle each part within windows of `samples` samples.
    pub fn window(mut self, samples: usize) -> Self {
        self.window = Some(samples);
        self
    }
}

/// The settings an epoch's order is built from, once chosen: what a
/// resume state keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocks {
    pub(crate) partitions: usize,
    pub(crate) window: usize,
    pub(crate) lane: usize,
}

impl Blocks {
    /// The words a state's mode holds them in.
    pub(crate) fn describe(&self) -> String {
        format!(
            "shard blocks (partitions {}, window {}, lane {})",
            self.partitions, self.window, self.lane
        )
    }

    /// The settings [`describe`](Self::describe) wrote in `mode`, if any.
    pub(crate) fn parse(mode: &str) -> Option<Self> {
        let inner = mode.split("shard blocks (").nth(1)?.split(')').next()?;
        let mut got = [None; 3];
        for (slot, name) in got.iter_mut().zip(["partitions ", "window ", "lane "]) {
            *slot = inner
                .split(", ")
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| v.parse().ok());
        }
        Some(Self {
            partitions: got[0]?,
            window: got[1]?,
            lane: got[2]?,
        })
    }
}

/// One epoch's shard-block order ([module docs](self)).
#[derive(Debug)]
pub(crate) struct ShardBlockOrder {
    /// Each shard's first index, by shard, then the total.
    firsts: Vec<usize>,
    /// The shards in the epoch's order.
    shards: Vec<usize>,
    /// Samples of the epoch's sequence before each shard of that order,
    /// then the total.
    before: Vec<usize>,
    blocks: Blocks,
    /// Full rounds: every part deals `lane` samples in each.
    rounds: usize,
    seed: Option<u64>,
    epoch: u64,
}

impl ShardBlockOrder {
    /// The order of epoch `epoch` over shards of `records` samples each
    /// (in index order), shuffled by `seed` when given.
    pub(crate) fn new(records: &[usize], blocks: Blocks, seed: Option<u64>, epoch: u64) -> Self {
        let blocks = Blocks {
            partitions: blocks.partitions.max(1),
            window: blocks.window.max(1),
            lane: blocks.lane.max(1),
        };
        let mut firsts = Vec::with_capacity(records.len() + 1);
        firsts.push(0);
        for &r in records {
            firsts.push(firsts[firsts.len() - 1] + r);
        }
        let shards: Vec<usize> = match seed {
            Some(seed) => {
                let p =
                    Permutation::new(records.len() as u64, seed, epoch, Purpose::ShardBlocks, 0);
                (0..records.len() as u64)
                    .map(|i| p.at(i) as usize)
                    .collect()
            }
            None => (0..records.len()).collect(),
        };
        let mut before = Vec::with_capacity(shards.len() + 1);
        before.push(0);
        for &s in &shards {
            before.push(before[before.len() - 1] + records[s]);
        }
        let mut me = Self {
            firsts,
            shards,
            before,
            blocks,
            rounds: 0,
            seed,
            epoch,
        };
        me.rounds = me.part_start(1) / blocks.lane;
        me
    }

    fn total(&self) -> usize {
        self.before.last().copied().unwrap_or(0)
    }

    /// Where part `j` starts in the epoch's sequence (`j` up to the
    /// parts: the end).
    fn part_start(&self, j: usize) -> usize {
        (self.total() as u128 * j as u128 / self.blocks.partitions as u128) as usize
    }

    /// Part `j`'s `o`-th sample, its windows shuffled: a place in the
    /// epoch's sequence.
    fn in_part(&self, j: usize, o: usize) -> usize {
        let (start, end) = (self.part_start(j), self.part_start(j + 1));
        let w = self.blocks.window;
        let o = match self.seed {
            Some(seed) => {
                let first = o / w * w;
                let n = (first + w).min(end - start) - first;
                let key = ((j as u64) << 32) ^ (o / w) as u64;
                let p = Permutation::new(n as u64, seed, self.epoch, Purpose::ShardBlocks, 1 + key);
                first + p.at((o - first) as u64) as usize
            }
            None => o,
        };
        start + o
    }
}

impl EpochOrder for ShardBlockOrder {
    fn len(&self) -> usize {
        self.total()
    }

    fn at(&self, position: usize) -> usize {
        let Blocks {
            partitions, lane, ..
        } = self.blocks;
        let dealt = partitions * lane * self.rounds;
        let (j, o) = if position < dealt {
            let round = position / (partitions * lane);
            (
                (position / lane) % partitions,
                round * lane + position % lane,
            )
        } else {
            // The tails: part `j`'s starts after the tails before it.
            let t = position - dealt;
            let tail = |j: usize| self.part_start(j) - j * lane * self.rounds;
            // The last part whose tail starts at or before `t`.
            let (mut j, mut hi) = (0, partitions - 1);
            while j < hi {
                let mid = (j + hi).div_ceil(2);
                if tail(mid) <= t {
                    j = mid;
                } else {
                    hi = mid - 1;
                }
            }
            (j, lane * self.rounds + t - tail(j))
        };
        let s = self.in_part(j, o);
        let k = self.before.partition_point(|&b| b <= s) - 1;
        self.firsts[self.shards[k]] + (s - self.before[k])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    /// Shards of uneven sizes, some empty.
    fn records() -> Vec<usize> {
        (0..37).map(|i| [50, 0, 73, 12, 64][i % 5]).collect()
    }

    fn shard_of(records: &[usize], index: usize) -> usize {
        let mut first = 0;
        for (k, &r) in records.iter().enumerate() {
            if index < first + r {
                return k;
            }
            first += r;
        }
        unreachable!("index {index} past the shards")
    }

    #[test]
    fn every_sample_once_for_any_cut() {
        let records = records();
        let n: usize = records.iter().sum();
        for partitions in [1, 2, 3, 7, 64] {
            for window in [1, 5, 64, 1000, 5000] {
                for lane in [1, 4, 32] {
                    for seed in [None, Some(3)] {
                        let blocks = Blocks {
                            partitions,
                            window,
                            lane,
                        };
                        let o = ShardBlockOrder::new(&records, blocks, seed, 2);
                        let all = o.to_vec();
                        assert_eq!(all.len(), n);
                        let seen: HashSet<usize> = all.iter().copied().collect();
                        assert_eq!(seen.len(), n, "{blocks:?} {seed:?}");
                        assert!(all.iter().all(|&i| i < n));
                    }
                }
            }
        }
    }

    #[test]
    fn a_rank_of_as_many_as_partitions_reads_its_own_shards_window_by_window() {
        let records: Vec<usize> = vec![100; 64];
        let (ranks, lane, window) = (4, 8, 200);
        let blocks = Blocks {
            partitions: ranks,
            window,
            lane,
        };
        let o = ShardBlockOrder::new(&records, blocks, Some(9), 1);
        let mut owner: HashMap<usize, HashSet<usize>> = HashMap::new();
        for step in 0..o.len() / (ranks * lane) {
            for r in 0..ranks {
                let at = step * ranks * lane + r * lane;
                let part: Vec<usize> = (at..at + lane).map(|p| o.at(p)).collect();
                for &i in &part {
                    owner.entry(shard_of(&records, i)).or_default().insert(r);
                }
                // A lane lies inside one window: at most window/100 + 1
                // shards (and it is shuffled: not one run of a shard).
                let shards: HashSet<usize> = part.iter().map(|&i| shard_of(&records, i)).collect();
                assert!(shards.len() <= window / 100 + 1, "{shards:?}");
            }
        }
        // 64 shards of 100 in 4 parts of 1,600: each shard read by one rank.
        assert_eq!(owner.len(), 64);
        assert!(owner.values().all(|r| r.len() == 1), "{owner:?}");
        // And the shuffle moved samples within their windows.
        let first: Vec<usize> = (0..lane).map(|p| o.at(p)).collect();
        assert_ne!(first, (first[0]..first[0] + lane).collect::<Vec<_>>());
    }

    #[test]
    fn consecutive_ranks_share_a_part_when_lanes_hold_their_batches() {
        // 8 ranks, batch 4, 2 parts (two nodes of 4 ranks): lanes of 16.
        let records: Vec<usize> = vec![50; 40];
        let (world, batch) = (8, 4);
        let blocks = Blocks {
            partitions: 2,
            window: 100,
            lane: batch * world / 2,
        };
        let o = ShardBlockOrder::new(&records, blocks, Some(4), 0);
        let mut parts_of_rank: Vec<HashSet<usize>> = vec![HashSet::new(); world];
        let first_of_part: HashSet<usize> = (0..40).filter(|&s| s * 50 < 1000).collect();
        for step in 0..o.len() / (world * batch) {
            for (r, parts) in parts_of_rank.iter_mut().enumerate() {
                let at = step * world * batch + r * batch;
                for p in at..at + batch {
                    let shard = shard_of(&records, o.at(p));
                    parts.insert(usize::from(!first_of_part.contains(&shard_rank(&o, shard))));
                }
            }
        }
        for (r, parts) in parts_of_rank.iter().enumerate() {
            assert_eq!(parts.len(), 1, "rank {r} read parts {parts:?}");
            assert!(parts.contains(&(r / 4)), "rank {r} read parts {parts:?}");
        }
    }

    /// Where shard `s` sits in the epoch's shard order.
    fn shard_rank(o: &ShardBlockOrder, s: usize) -> usize {
        o.shards.iter().position(|&k| k == s).unwrap()
    }

    #[test]
    fn the_order_is_keyed_by_seed_and_epoch() {
        let records = records();
        let blocks = Blocks {
            partitions: 3,
            window: 100,
            lane: 4,
        };
        let order =
            |seed, epoch| ShardBlockOrder::new(&records, blocks, Some(seed), epoch).to_vec();
        assert_eq!(order(1, 1), order(1, 1));
        assert_ne!(order(1, 1), order(1, 2));
        assert_ne!(order(1, 1), order(2, 1));
        // Unshuffled: the stored order, dealt part by part.
        let plain = ShardBlockOrder::new(&records, blocks, None, 0);
        let total: usize = records.iter().sum();
        let part = total / 3;
        assert_eq!(
            (0..4).map(|p| plain.at(p)).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(
            (4..8).map(|p| plain.at(p)).collect::<Vec<_>>(),
            (part..part + 4).collect::<Vec<_>>()
        );
    }

    #[test]
    fn settings_read_back_from_their_description() {
        let b = Blocks {
            partitions: 4096,
            window: 1 << 18,
            lane: 32,
        };
        let mode = format!("random access, {}", b.describe());
        assert_eq!(Blocks::parse(&mode), Some(b));
        assert_eq!(Blocks::parse("random access"), None);
    }
}
