//! A keyed permutation of `[0, n)` computed position by position: the
//! epoch's shuffle without a table of `n` entries.
//!
//! A balanced Feistel network over the smallest even number of bits that
//! holds `n - 1` is a bijection of `[0, 4^h)`; cycle walking (applying it
//! again while the result is `n` or more) restricts it to a bijection of
//! `[0, n)`, since the walk from a position below `n` ends at the first
//! value of its cycle below `n`. The domain is under `4n`, so a position
//! takes fewer than four network passes on average. Grain's
//! `index_shuffle` does the same (four rounds); this one runs
//! [`ROUNDS`] rounds of a keyed 64-bit mixer, each round key drawn from
//! the ChaCha stream of `(seed, epoch, purpose, index)`, so the order is
//! the same on every platform, rank and worker count. Memory is the keys;
//! a position costs tens of nanoseconds; no work is done per epoch.

use crate::rng::{keyed_rng, Purpose};
use rand::RngCore;

/// Feistel rounds. Four make a pseudorandom permutation from a
/// pseudorandom round function (Luby–Rackoff); six leave margin for a
/// mixer that is not one.
const ROUNDS: usize = 6;

/// A bijection of `[0, n)` keyed by `(seed, epoch, purpose, index)`.
#[derive(Debug, Clone)]
pub(crate) struct Permutation {
    n: u64,
    /// Bits of each half of the network's input.
    half: u32,
    keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation of `[0, n)` for the key (`n` of 0 or 1: the
    /// identity).
    pub(crate) fn new(n: u64, seed: u64, epoch: u64, purpose: Purpose, index: u64) -> Self {
        // Bits that hold `n - 1`, at least 2, rounded up to even.
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let mut rng = keyed_rng(seed, epoch, purpose, index);
        Self {
            n,
            half: bits.div_ceil(2),
            keys: std::array::from_fn(|_| rng.next_u64()),
        }
    }

    /// The value at position `i` (`i < n`).
    pub(crate) fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n, "position {i} of {}", self.n);
        let mut x = i;
        loop {
            x = self.network(x);
            if x < self.n {
                return x;
            }
        }
    }

    /// One pass of the Feistel network over `[0, 4^half)`.
    fn network(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut left, mut right) = (x >> self.half, x & mask);
        for &k in &self.keys {
            let f = mix(right ^ k) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half) | right
    }
}

/// The 64-bit finalizer of SplitMix64 (Stafford's Mix13): every input bit
/// moves every output bit.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(n: u64, seed: u64, epoch: u64) -> Vec<u64> {
        let p = Permutation::new(n, seed, epoch, Purpose::Shuffle, 0);
        (0..n).map(|i| p.at(i)).collect()
    }

    #[test]
    fn every_size_is_a_bijection() {
        for n in (0..600).chain([1 << 12, (1 << 12) + 1, 65_537]) {
            let mut got = perm(n, 7, 3);
            got.sort_unstable();
            assert!(got.iter().copied().eq(0..n), "n {n}");
        }
    }

    #[test]
    fn keys_change_the_order_and_fix_it() {
        let base = perm(1000, 1, 0);
        assert_eq!(base, perm(1000, 1, 0));
        assert_ne!(base, perm(1000, 2, 0), "another seed");
        assert_ne!(base, perm(1000, 1, 1), "another epoch");
        let moved = base.iter().enumerate().filter(|&(i, &v)| i as u64 != v);
        assert!(moved.count() > 950, "nearly every position moves");
    }

    /// Where each value lands over many keys is close to uniform (a
    /// chi-squared test over positions), and neighbours are not kept
    /// together (the mean distance between the images of `i` and `i + 1`
    /// is near `n / 3`, as for a uniform shuffle).
    #[test]
    fn positions_look_uniform() {
        let n = 64u64;
        let keys = 20_000u64;
        let mut counts = vec![[0u32; 64]; n as usize];
        let mut gap = 0f64;
        for key in 0..keys {
            let p = perm(n, key, 0);
            for (i, &v) in p.iter().enumerate() {
                counts[v as usize][i] += 1;
            }
            gap += p
                .windows(2)
                .map(|w| w[0].abs_diff(w[1]) as f64)
                .sum::<f64>();
        }
        let expect = keys as f64 / n as f64;
        for (v, row) in counts.iter().enumerate() {
            let chi: f64 = row
                .iter()
                .map(|&c| (c as f64 - expect).powi(2) / expect)
                .sum();
            // 63 degrees of freedom: the 0.9999 quantile is about 117.
            assert!(chi < 117.0, "value {v}: chi-squared {chi:.1}");
        }
        let mean = gap / (keys * (n - 1)) as f64;
        let uniform = (n * n - 1) as f64 / (3 * n) as f64;
        assert!(
            (mean - uniform).abs() < 0.02 * uniform,
            "mean gap {mean:.2}, uniform {uniform:.2}"
        );
    }

    #[test]
    fn a_billion_positions_need_no_table() {
        let p = Permutation::new(1_000_000_000, 5, 2, Purpose::Shuffle, 0);
        let some: Vec<u64> = (0..1000).map(|i| p.at(999_000_000 + i)).collect();
        assert!(some.iter().all(|&v| v < 1_000_000_000));
        let mut dedup = some.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), some.len());
        let top = Permutation::new(u64::MAX, 5, 2, Purpose::Shuffle, 0);
        assert!(top.at(u64::MAX - 1) < u64::MAX);
    }
}
