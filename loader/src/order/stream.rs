//! The streaming mode: shards read one after another, `interleave`d, through
//! a seeded shuffle buffer, with the shards split across ranks.
//!
//! | wick | tf.data | WebDataset |
//! |---|---|---|
//! | `shuffle(seed)`: shard order reshuffled every epoch | `Dataset.list_files(shuffle=True)` / `files.shuffle(n)` | `WebDataset(urls, shardshuffle=True)` |
//! | shards split across ranks after the shuffle, round robin | `files.shard(world_size, rank)` | `split_by_node` |
//! | `interleave(cycle_length, block_length)` | `files.interleave(TFRecordDataset, cycle_length, block_length, deterministic=True)` | `cycle_length = 1, block_length = 1` (one shard after another) |
//! | `shuffle_buffer(n)` | `.shuffle(n)` | `.shuffle(n)` |
//!
//! The order of an epoch depends only on `(seed, epoch, rank)` and the shard
//! table, so it is computed up front (the epoch's [`Plan`]) and the records
//! read from the shards are checked against it.

use crate::contract::ShardInfo;
use crate::error::{Error, Result};
use crate::order::sampler::Plan;
use crate::rng::{keyed_rng, Purpose};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Shards open at once, and records taken from each in turn: tf.data's
/// `interleave(cycle_length, block_length)`, deterministic. Set with
/// [`crate::LoaderBuilder::interleave`].
///
/// The streaming mode beside tf.data and WebDataset:
///
/// | wick | tf.data | WebDataset |
/// |---|---|---|
/// | `shuffle(seed)`: shard order reshuffled every epoch | `Dataset.list_files(shuffle=True)` | `WebDataset(urls, shardshuffle=True)` |
/// | ranks get whole shards, round robin after the shuffle | `files.shard(world_size, rank)` | `split_by_node` |
/// | `interleave(cycle_length, block_length)` | `files.interleave(TFRecordDataset, cycle_length, block_length, deterministic=True)` | cycle 1, block 1 (one shard after another) |
/// | `shuffle_buffer(n)` | `.shuffle(n)` | `.shuffle(n)` |
///
/// An exhausted shard's slot is refilled with the next shard when the cycle
/// comes back to it, as in tf.data. The shuffle buffer fills to `n`, then
/// emits a uniformly drawn record and refills its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interleave {
    /// Shards read concurrently (at least 1).
    pub cycle_length: usize,
    /// Consecutive records taken from one shard before moving to the next
    /// (at least 1).
    pub block_length: usize,
}

/// tf.data's deterministic interleave over inputs opened lazily, in order.
struct InterleaveIter<I, F> {
    open_next: F,
    slots: Vec<Option<I>>,
    cycle: usize,
    block: usize,
    block_length: usize,
    open: usize,
    end_of_input: bool,
}

impl<I: Iterator, F: FnMut() -> Option<I>> InterleaveIter<I, F> {
    fn new(open_next: F, il: Interleave) -> Self {
        Self {
            open_next,
            slots: (0..il.cycle_length.max(1)).map(|_| None).collect(),
            cycle: 0,
            block: 0,
            block_length: il.block_length.max(1),
            open: 0,
            end_of_input: false,
        }
    }

    fn advance(&mut self) {
        self.block = 0;
        self.cycle = (self.cycle + 1) % self.slots.len();
    }
}

impl<I: Iterator, F: FnMut() -> Option<I>> Iterator for InterleaveIter<I, F> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        while !self.end_of_input || self.open > 0 {
            match &mut self.slots[self.cycle] {
                Some(input) => match input.next() {
                    Some(x) => {
                        self.block += 1;
                        if self.block == self.block_length {
                            self.advance();
                        }
                        return Some(x);
                    }
                    None => {
                        self.slots[self.cycle] = None;
                        self.open -= 1;
                        self.advance();
                    }
                },
                None if !self.end_of_input => match (self.open_next)() {
                    Some(input) => {
                        self.slots[self.cycle] = Some(input);
                        self.open += 1;
                    }
                    None => self.end_of_input = true,
                },
                None => self.advance(),
            }
        }
        None
    }
}

/// A shuffle buffer of `size` items: fill, then emit a random one and
/// refill its place (tf.data `shuffle`, WebDataset `shuffle`).
struct ShuffleBuffer<I: Iterator> {
    input: I,
    buf: Vec<I::Item>,
    size: usize,
    rng: Option<ChaCha8Rng>,
}

impl<I: Iterator> Iterator for ShuffleBuffer<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let Some(rng) = &mut self.rng else {
            return self.input.next();
        };
        while self.buf.len() < self.size {
            match self.input.next() {
                Some(x) => self.buf.push(x),
                None => break,
            }
        }
        if self.buf.is_empty() {
            return None;
        }
        let j = rng.random_range(0..self.buf.len());
        Some(self.buf.swap_remove(j))
    }
}

/// Plans the epochs of the streaming mode for one rank (read by
/// [`crate::read::stream::records`]).
#[derive(Debug, Clone)]
pub(crate) struct StreamPlanner {
    shards: Vec<ShardInfo>,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    rank: usize,
    world_size: usize,
    interleave: Interleave,
    buffer: usize,
}

impl StreamPlanner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        shards: &[ShardInfo],
        batch_size: usize,
        seed: Option<u64>,
        drop_last: bool,
        (rank, world_size): (usize, usize),
        interleave: Interleave,
        buffer: usize,
    ) -> Result<Self> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if shards.is_empty() {
            return bad(
                "interleave needs a sharded source (TfRecord, WebDataset, SafetensorsShards)"
                    .into(),
            );
        }
        if interleave.cycle_length == 0 || interleave.block_length == 0 {
            return bad("interleave cycle_length and block_length must be at least 1".into());
        }
        if batch_size == 0 {
            return bad("batch_size must be at least 1".into());
        }
        if world_size == 0 || rank >= world_size {
            return bad(format!("rank {rank} is not below world_size {world_size}"));
        }
        if shards.len() < world_size {
            return bad(format!(
                "{} shards cannot be split across {world_size} ranks: the streaming mode gives each \
                 rank whole shards; write more shards or use random access",
                shards.len()
            ));
        }
        let p = Self {
            shards: shards.to_vec(),
            batch_size,
            seed,
            drop_last,
            rank,
            world_size,
            interleave,
            buffer,
        };
        // Every epoch must give every rank a batch. Without a seed the deal
        // repeats every `shards` epochs: check them all. With one, any deal
        // can come up: the rank dealt the fewest, smallest shards must
        // still fill a batch.
        let empty_epoch = match seed {
            // Where the ranks divide the shards, a rotation by one shard
            // deals each rank the shards another had: one epoch tells.
            None if shards.len().is_multiple_of(world_size) => p.num_batches(0) == 0,
            None => (0..shards.len() as u64).any(|e| p.num_batches(e) == 0),
            Some(_) => {
                let mut sizes: Vec<usize> = shards.iter().map(|s| s.records).collect();
                sizes.sort_unstable();
                let fewest = shards.len() / world_size;
                p.batches_of(sizes[..fewest].iter().sum()) == 0
            }
        };
        if empty_epoch {
            return bad(
                "some epoch would deal a rank shards that hold less than one batch (an epoch of 0 \
                 batches on every rank): lower batch_size, set drop_last(false), or balance the \
                 shards"
                    .into(),
            );
        }
        Ok(p)
    }

    /// This epoch's shard order, the same on every rank: a seeded shuffle,
    /// or without a seed the written order rotated by one shard per epoch
    /// (epoch 0 as written), so that the shards a rank cannot fit in one
    /// epoch are dealt to other positions in the next.
    fn shard_order(&self, epoch: u64) -> Vec<usize> {
        let n = self.shards.len();
        let mut order: Vec<usize> = (0..n).collect();
        match self.seed {
            Some(seed) => order.shuffle(&mut keyed_rng(seed, epoch, Purpose::ShardShuffle, 0)),
            None if n > 0 => order.rotate_left((epoch % n as u64) as usize),
            None => {}
        }
        order
    }

    /// The shard table the plans are made of.
    pub(crate) fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }

    /// The rank whose epochs are planned.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Shards of `rank` in `epoch`, in reading order.
    pub(crate) fn rank_shards(&self, epoch: u64, rank: usize) -> Vec<usize> {
        self.shard_order(epoch)
            .into_iter()
            .skip(rank)
            .step_by(self.world_size)
            .collect()
    }

    fn batches_of(&self, records: usize) -> usize {
        if self.drop_last {
            records / self.batch_size
        } else {
            records.div_ceil(self.batch_size)
        }
    }

    /// Batches every rank gets in `epoch`: the fewest any rank's shards
    /// fill, so that data-parallel ranks step together. A rank with more
    /// records stops there; its surplus is read in other epochs, which deal
    /// the shards differently (reshuffled with a seed, rotated without).
    pub(crate) fn num_batches(&self, epoch: u64) -> usize {
        self.fewest_batches(&self.rank_records(epoch))
    }

    /// The batches the rank dealt the fewest records (`dealt`, by rank) fills.
    fn fewest_batches(&self, dealt: &[usize]) -> usize {
        dealt.iter().map(|&n| self.batches_of(n)).min().unwrap_or(0)
    }

    /// Records dealt to each rank in `epoch`: one pass over the shard
    /// order (O(shards), whatever the world size).
    fn rank_records(&self, epoch: u64) -> Vec<usize> {
        let mut records = vec![0usize; self.world_size];
        for (i, s) in self.shard_order(epoch).into_iter().enumerate() {
            records[i % self.world_size] += self.shards[s].records;
        }
        records
    }

    /// Interleaves and shuffles the inputs of this rank's shards.
    pub(crate) fn order_of<I: Iterator>(
        &self,
        epoch: u64,
        mut inputs: impl FnMut(usize) -> I,
    ) -> impl Iterator<Item = I::Item> {
        let mut shards = self.rank_shards(epoch, self.rank).into_iter();
        let il = InterleaveIter::new(move || shards.next().map(&mut inputs), self.interleave);
        ShuffleBuffer {
            input: il,
            buf: Vec::new(),
            size: self.buffer.max(1),
            rng: self
                .seed
                .map(|s| keyed_rng(s, epoch, Purpose::ShuffleBuffer, self.rank as u64)),
        }
    }

    /// The epoch's order and batches for this rank.
    pub(crate) fn plan(&self, epoch: u64) -> Plan {
        let dealt = self.rank_records(epoch);
        let batches = self.fewest_batches(&dealt);
        let indices: Vec<usize> = self
            .order_of(epoch, |s| {
                let info = &self.shards[s];
                info.first..info.first + info.records
            })
            .collect();
        let take = indices.len().min(batches * self.batch_size);
        let bs = self.batch_size;
        // Every rank's planned records, for the samples of all ranks before
        // each batch (the state's position, the same on every rank).
        let takes: Vec<usize> = dealt.iter().map(|&n| n.min(batches * bs)).collect();
        Plan::listed(
            indices,
            (0..batches)
                .map(|b| b * bs..((b + 1) * bs).min(take))
                .collect(),
            (0..=batches)
                .map(|b| takes.iter().map(|&t| t.min(b * bs) as u64).sum())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn il(inputs: Vec<Vec<u32>>, cycle: usize, block: usize) -> Vec<u32> {
        let mut it = inputs.into_iter();
        InterleaveIter::new(
            move || it.next().map(|v| v.into_iter()),
            Interleave {
                cycle_length: cycle,
                block_length: block,
            },
        )
        .collect()
    }

    #[test]
    fn interleave_matches_tf_data() {
        // tf.data: Dataset.range(1, 4).interleave(lambda x: repeat(x, 3),
        // cycle_length=2, block_length=2) -> 1 1 2 2 1 2 3 3 3  (refills the
        // exhausted slot with the next input when the cycle comes back)
        let out = il(vec![vec![1; 3], vec![2; 3], vec![3; 3]], 2, 2);
        assert_eq!(out, [1, 1, 2, 2, 1, 2, 3, 3, 3]);
        // The tf.data docs example: range(1, 6), repeat 6 times, cycle 2, block 4.
        let inputs = (1..6).map(|x| vec![x; 6]).collect();
        let out = il(inputs, 2, 4);
        let want = [
            1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5,
            5,
        ];
        assert_eq!(out, want);
        assert_eq!(il(vec![vec![1, 2], vec![], vec![3]], 1, 1), [1, 2, 3]);
    }

    fn shards(counts: &[usize]) -> Vec<ShardInfo> {
        let mut first = 0;
        counts
            .iter()
            .enumerate()
            .map(|(i, &records)| {
                let s = ShardInfo {
                    path: PathBuf::from(format!("s{i}")),
                    records,
                    first,
                };
                first += records;
                s
            })
            .collect()
    }

    #[test]
    fn ranks_get_disjoint_shards_and_equal_batch_counts() {
        let sh = shards(&[10, 7, 12, 9, 8]);
        let il = Interleave {
            cycle_length: 2,
            block_length: 3,
        };
        for epoch in 0..5 {
            let plans: Vec<Plan> = (0..2)
                .map(|r| {
                    StreamPlanner::new(&sh, 4, Some(3), false, (r, 2), il, 5)
                        .unwrap()
                        .plan(epoch)
                })
                .collect();
            assert_eq!(plans[0].len(), plans[1].len());
            // Every rank plans the same samples-before table: the sum of
            // all ranks' batches before each index.
            assert_eq!(plans[0].before, plans[1].before);
            for (b, before) in plans[0].before.to_vec().into_iter().enumerate() {
                let sum: usize = plans
                    .iter()
                    .map(|p| (0..b).map(|k| p.batch_len(k)).sum::<usize>())
                    .sum();
                assert_eq!(before, sum as u64, "epoch {epoch} batch {b}");
            }
            let mut seen: Vec<usize> = plans.iter().flat_map(|p| p.indices()).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), 46, "every record belongs to exactly one rank");
        }
    }

    #[test]
    fn shuffle_buffer_is_a_seeded_permutation() {
        let sh = shards(&[50, 50]);
        let il = Interleave {
            cycle_length: 2,
            block_length: 1,
        };
        let p = |seed, buf| StreamPlanner::new(&sh, 10, seed, false, (0, 1), il, buf).unwrap();
        let a = p(Some(1), 16).plan(0).indices();
        assert_eq!(a, p(Some(1), 16).plan(0).indices());
        assert_ne!(a, p(Some(1), 16).plan(1).indices());
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        // A buffer of n moves no record more than about n places early.
        assert!(a.iter().enumerate().all(|(pos, &i)| {
            let unshuffled = p(Some(1), 1)
                .plan(0)
                .indices()
                .iter()
                .position(|&x| x == i)
                .unwrap();
            unshuffled <= pos + 16
        }));
        // No seed: shard order and records as written, interleaved.
        let plain = p(None, 16).plan(0).indices();
        assert_eq!(&plain[..4], &[0, 50, 1, 51]);
    }

    fn batch_indices(p: &Plan) -> Vec<usize> {
        p.batch_indices().concat()
    }

    #[test]
    fn without_a_seed_the_records_a_rank_cannot_fit_are_read_in_later_epochs() {
        // 3 shards of 10, 2 ranks, batch 4: one rank holds 20 records and
        // the other 10, so each epoch stops at 3 batches per rank.
        let sh = shards(&[10, 10, 10]);
        let il = Interleave {
            cycle_length: 1,
            block_length: 1,
        };
        let mut seen = std::collections::BTreeSet::new();
        for epoch in 0..3 {
            for r in 0..2 {
                let p = StreamPlanner::new(&sh, 4, None, false, (r, 2), il, 1).unwrap();
                seen.extend(batch_indices(&p.plan(epoch)));
            }
        }
        assert_eq!(
            seen.len(),
            30,
            "records never read: {:?}",
            (0..30).filter(|i| !seen.contains(i)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_planner_that_builds_has_batches_in_every_epoch() {
        let il = Interleave {
            cycle_length: 1,
            block_length: 1,
        };
        for (counts, bs, drop_last) in [
            (&[10, 10, 3, 3][..], 8, true),
            (&[0, 0, 5, 5][..], 4, false),
        ] {
            for seed in (0..200).map(Some).chain([None]) {
                for rank in 0..2 {
                    if let Ok(p) =
                        StreamPlanner::new(&shards(counts), bs, seed, drop_last, (rank, 2), il, 16)
                    {
                        assert!(
                            (0..64).all(|e| p.num_batches(e) > 0),
                            "{counts:?} bs {bs} seed {seed:?}: an epoch of 0 batches"
                        );
                    }
                }
            }
        }
    }
}
