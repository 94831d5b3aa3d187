//! Where a [`Mixture`](crate::source::Mixture)'s members' samples go in an
//! epoch, position by position: the epoch is cut into blocks of
//! [`BLOCK`] positions; each member's count before every block is kept
//! (`8 * members` bytes a block), and a block's picks are placed when one
//! of its positions is asked for (a greedy pass over its positions,
//! cached for the next asks). Nothing of the epoch's size is held, and a
//! position of a resumed epoch costs one block's placement.
//!
//! - [`BlendRule::WithinOne`]: the counts before each block are the
//!   members' quotas apportioned by largest remainder (kept monotone from
//!   block to block), so every block boundary holds each quota within one
//!   sample; within a block, Tijdeman's greedy rule with the true weights,
//!   capped at the next boundary's counts. The boundaries are arithmetic:
//!   nothing of the epoch's size is computed, even once.
//! - [`BlendRule::Megatron`]: Megatron-Core's rule is a sequential pass
//!   (each pick depends on every one before), so the counts before each
//!   block come from one pass over the epoch, made once per weight set
//!   (as Megatron makes it once and caches it); each block is placed again
//!   from its counts, to the bit.

use crate::source::BlendRule;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Positions of a block.
pub(crate) const BLOCK: usize = 1 << 16;

/// Blocks a placement keeps placed.
const KEEP: usize = 4;

/// One weight set's placement over an epoch ([module docs](self)).
#[derive(Debug)]
pub(crate) struct Placement {
    weights: Vec<f64>,
    rule: BlendRule,
    /// Positions of the epoch.
    len: usize,
    /// Positions of a block ([`BLOCK`]; smaller in tests).
    block: usize,
    /// Each member's count before each block, then at the end: `members`
    /// entries a row.
    before: Vec<u64>,
    /// Blocks placed lately, the latest last.
    placed: Mutex<VecDeque<(usize, Arc<Block>)>>,
}

/// A block's picks and, for each, how many of its member's picks come
/// before it in the block.
#[derive(Debug)]
struct Block {
    picks: Vec<u16>,
    nth: Vec<u32>,
}

impl Placement {
    /// The placement of `len` positions by `rule` for `weights`
    /// (normalized, at most 65,536 members).
    pub(crate) fn new(weights: &[f64], len: usize, rule: BlendRule) -> Self {
        Self::with_block(weights, len, rule, BLOCK)
    }

    fn with_block(weights: &[f64], len: usize, rule: BlendRule, block: usize) -> Self {
        let k = weights.len();
        let blocks = len.div_ceil(block);
        let mut before = Vec::with_capacity((blocks + 1) * k);
        let mut counts = vec![0u64; k];
        before.extend_from_slice(&counts);
        for b in 0..blocks {
            let end = ((b + 1) * block).min(len);
            match rule {
                BlendRule::WithinOne => apportion(weights, &mut counts, end as u64),
                BlendRule::Megatron => {
                    place(weights, rule, b * block, end - b * block, &mut counts, None);
                }
            }
            before.extend_from_slice(&counts);
        }
        Self {
            weights: weights.to_vec(),
            rule,
            len,
            block,
            before,
            placed: Mutex::default(),
        }
    }

    /// Each member's samples in the epoch.
    pub(crate) fn counts(&self) -> &[u64] {
        &self.before[self.before.len() - self.weights.len()..]
    }

    /// Each member's count before block `b`.
    fn row(&self, b: usize) -> &[u64] {
        let k = self.weights.len();
        &self.before[b * k..(b + 1) * k]
    }

    /// The member at position `p` (below the length) and how many of its
    /// samples come before it in the epoch.
    pub(crate) fn at(&self, p: usize) -> (usize, u64) {
        debug_assert!(p < self.len, "position {p} of {}", self.len);
        let b = p / self.block;
        let block = self.block(b);
        let q = p - b * self.block;
        let d = block.picks[q] as usize;
        (d, self.row(b)[d] + u64::from(block.nth[q]))
    }

    /// Block `b`, placed now unless it was lately.
    fn block(&self, b: usize) -> Arc<Block> {
        if let Some((_, block)) = crate::sync::lock(&self.placed)
            .iter()
            .find(|(at, _)| *at == b)
        {
            return block.clone();
        }
        let from = b * self.block;
        let n = (from + self.block).min(self.len) - from;
        let mut taken = self.row(b).to_vec();
        let caps = (self.rule == BlendRule::WithinOne).then(|| self.row(b + 1));
        let picks = place(&self.weights, self.rule, from, n, &mut taken, caps);
        let mut seen = vec![0u32; self.weights.len()];
        let nth = picks
            .iter()
            .map(|&d| {
                seen[d as usize] += 1;
                seen[d as usize] - 1
            })
            .collect();
        let block = Arc::new(Block { picks, nth });
        let mut placed = crate::sync::lock(&self.placed);
        if placed.len() == KEEP {
            placed.pop_front();
        }
        placed.push_back((b, block.clone()));
        block
    }
}

/// `counts` raised to the members' quotas of `p` samples, by largest
/// remainder: each member its quota's whole part (never below its count
/// so far), then one more each to those furthest below their quota (the
/// first on a tie) until they hold `p`. Each then holds its quota within
/// one sample, unless a member of a weight under `1 / (p - counts' sum)`
/// was already a sample ahead (its count never falls).
fn apportion(weights: &[f64], counts: &mut [u64], p: u64) {
    let quota = |d: usize| weights[d] * p as f64;
    let raised: Vec<u64> = counts
        .iter()
        .enumerate()
        .map(|(d, &c)| c.max(quota(d).floor() as u64))
        .collect();
    if raised.iter().sum::<u64>() <= p {
        counts.copy_from_slice(&raised);
    }
    let rest = p - counts.iter().sum::<u64>();
    let behind = |d: usize, c: &[u64]| quota(d) - c[d] as f64;
    let mut open: Vec<usize> = (0..counts.len()).filter(|&d| weights[d] > 0.0).collect();
    if rest as usize <= open.len() {
        // Each of the `rest` furthest behind once (sorted, not searched
        // `rest` times: a block costs `k log k` for `k` members).
        open.sort_by(|&a, &b| {
            let (a_, b_) = (behind(a, counts), behind(b, counts));
            b_.partial_cmp(&a_)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(&b))
        });
        for &d in &open[..rest as usize] {
            counts[d] += 1;
        }
        return;
    }
    for _ in 0..rest {
        let mut best: Option<(usize, f64)> = None;
        for (d, &c) in counts.iter().enumerate() {
            let behind = quota(d) - c as f64;
            if weights[d] > 0.0 && best.is_none_or(|(_, b)| behind > b) {
                best = Some((d, behind));
            }
        }
        counts[best.expect("a weight above 0").0] += 1;
    }
}

/// The members of positions `from..from + n` of an epoch, by `rule`,
/// each member's count starting at `taken` (and left at its end), none
/// past its `caps` (whose sum is where the counts end); members of weight
/// 0 are never picked.
///
/// - Megatron's pick: the largest `w * max(p, 1) - taken`, the first on a
///   tie.
/// - Within one (Tijdeman's rule for the chairman assignment problem,
///   1980): among the members this sample would not put `delta` ahead
///   (`delta = 1 - 1/(2k - 2)` for `k` members), the one that would fall
///   `delta` behind first; the most behind stands in when rounding leaves
///   none.
fn place(
    weights: &[f64],
    rule: BlendRule,
    from: usize,
    n: usize,
    taken: &mut [u64],
    caps: Option<&[u64]>,
) -> Vec<u16> {
    let k = weights.iter().filter(|&&w| w > 0.0).count();
    let delta = if k > 1 {
        1.0 - 1.0 / (2 * k - 2) as f64
    } else {
        0.0
    };
    let open = |d: usize, taken: &[u64]| weights[d] > 0.0 && caps.is_none_or(|c| taken[d] < c[d]);
    (from..from + n)
        .map(|p| {
            let most_behind = |at: f64, taken: &[u64]| {
                let mut best: Option<(usize, f64)> = None;
                for (d, &w) in weights.iter().enumerate() {
                    let error = w * at - taken[d] as f64;
                    if open(d, taken) && best.is_none_or(|(_, e)| error > e) {
                        best = Some((d, error));
                    }
                }
                best.expect("a member below its cap").0
            };
            let d = match rule {
                BlendRule::Megatron => most_behind((p as f64).max(1.0), taken),
                BlendRule::WithinOne => {
                    let n = (p + 1) as f64;
                    let mut best: Option<(usize, f64)> = None;
                    for (d, &w) in weights.iter().enumerate() {
                        let t = taken[d] as f64;
                        if open(d, taken) && w * n - t >= 1.0 - delta - 1e-9 {
                            let deadline = (t + delta) / w;
                            if best.is_none_or(|(_, b)| deadline < b) {
                                best = Some((d, deadline));
                            }
                        }
                    }
                    best.map_or_else(|| most_behind(n, taken), |b| b.0)
                }
            };
            taken[d] += 1;
            d as u16
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEIGHTS: [&[f64]; 6] = [
        &[0.5, 0.3, 0.2],
        &[1.0, 1.0],
        &[0.9, 0.05, 0.05],
        &[3.0, 1.0, 0.0, 2.0],
        &[0.123, 0.456, 0.789, 0.01, 0.3],
        &[0.999, 0.0005, 0.0005],
    ];

    fn normalized(w: &[f64]) -> Vec<f64> {
        let sum: f64 = w.iter().sum();
        w.iter().map(|w| w / sum).collect()
    }

    /// The members of every position, and the worst gap between a
    /// member's count and its quota over every prefix.
    fn walk(p: &Placement) -> (Vec<usize>, f64) {
        let mut taken = vec![0u64; p.weights.len()];
        let mut worst = 0f64;
        let mut picks = Vec::new();
        for i in 0..p.len {
            let (d, nth) = p.at(i);
            assert_eq!(nth, taken[d], "position {i}: member {d}'s draw");
            taken[d] += 1;
            picks.push(d);
            for (d, &t) in taken.iter().enumerate() {
                worst = worst.max((t as f64 - p.weights[d] * (i + 1) as f64).abs());
            }
        }
        assert_eq!(taken, p.counts());
        (picks, worst)
    }

    /// Every prefix holds each member within one sample of its quota,
    /// with the epoch in one block and in many (whose boundaries are
    /// apportioned, not walked), and the Megatron rule strays further.
    #[test]
    fn every_prefix_is_within_one_of_its_quota() {
        for w in WEIGHTS {
            let w = normalized(w);
            for (len, block) in [(5000, BLOCK), (5000, 64), (4999, 1000), (777, 7)] {
                let p = Placement::with_block(&w, len, BlendRule::WithinOne, block);
                let (_, worst) = walk(&p);
                assert!(worst < 1.0, "{w:?} {len} in blocks of {block}: {worst}");
            }
            let (_, megatron) = walk(&Placement::new(&w, 5000, BlendRule::Megatron));
            if w == [0.9, 0.05, 0.05] {
                assert!(megatron > 1.1, "{megatron}");
            }
        }
    }

    /// Random weight sets (2 to 8 members, some small) over several
    /// blocks of the real size: every prefix within one.
    #[test]
    fn random_weights_over_real_blocks_stay_within_one() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for _ in 0..20 {
            let k = rng.random_range(2..9);
            let w: Vec<f64> = (0..k).map(|_| rng.random::<f64>().powi(3)).collect();
            let w = normalized(&w);
            let len = rng.random_range(BLOCK..4 * BLOCK);
            let (_, worst) = walk(&Placement::new(&w, len, BlendRule::WithinOne));
            assert!(worst < 1.0, "{w:?} over {len}: {worst}");
        }
    }

    /// Megatron's placement from its blocks is the one sequential pass.
    #[test]
    fn megatron_blocks_are_the_sequential_pass() {
        for w in WEIGHTS {
            let w = normalized(w);
            let mut taken = vec![0; w.len()];
            let whole: Vec<usize> = place(&w, BlendRule::Megatron, 0, 3000, &mut taken, None)
                .into_iter()
                .map(usize::from)
                .collect();
            let p = Placement::with_block(&w, 3000, BlendRule::Megatron, 128);
            assert_eq!(walk(&p).0, whole, "{w:?}");
        }
    }

    /// Positions asked out of order, and again, give the same members.
    #[test]
    fn blocks_placed_again_are_the_same() {
        let w = normalized(&[0.5, 0.3, 0.2]);
        let p = Placement::with_block(&w, 1000, BlendRule::WithinOne, 10);
        let (picks, _) = walk(&p);
        for i in (0..1000).rev().step_by(7) {
            assert_eq!(p.at(i).0, picks[i]);
        }
    }
}
