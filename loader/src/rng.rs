//! Random streams keyed by `(seed, epoch, purpose, index)`, never by thread
//! state, so results do not depend on which worker ran what.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// What a random stream is used for; different purposes never share draws.
#[derive(Debug, Clone, Copy)]
#[repr(u64)]
pub(crate) enum Purpose {
    /// The epoch's permutation.
    Shuffle = 1,
    /// The augmentation draws of one sample.
    Sample = 2,
    /// The order of the shards in the streaming mode.
    ShardShuffle = 3,
    /// The shuffle buffer of the streaming mode (one stream per rank).
    ShuffleBuffer = 4,
    /// A mixture member's order in one pass over it (one stream per member).
    MixturePass = 5,
    /// The shuffle inside one stretch of a source-ordered epoch.
    Stretch = 6,
    /// A Parquet source's row-group order (index 0) and the shuffle of
    /// each window of row groups (index `1 + window`).
    #[cfg_attr(not(feature = "parquet"), allow(dead_code))]
    BlockShuffle = 7,
    /// The shard-block shuffle's shard order (index 0) and each window's
    /// shuffle (index `1 + (part << 32 ^ window)`).
    ShardBlocks = 8,
}

/// The ChaCha8 stream for `(seed, epoch, purpose, index)`.
///
/// ChaCha's output is specified by its key and stream, so the draws are the
/// same on every platform and for every worker count.
pub(crate) fn keyed_rng(seed: u64, epoch: u64, purpose: Purpose, index: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..24].copy_from_slice(&(purpose as u64).to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(index);
    rng
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn streams_differ_by_every_key_part() {
        let draw = |s, e, p, i| keyed_rng(s, e, p, i).random::<u64>();
        let base = draw(1, 2, Purpose::Sample, 3);
        assert_eq!(base, draw(1, 2, Purpose::Sample, 3));
        assert_ne!(base, draw(0, 2, Purpose::Sample, 3));
        assert_ne!(base, draw(1, 3, Purpose::Sample, 3));
        assert_ne!(base, draw(1, 2, Purpose::Shuffle, 3));
        assert_ne!(base, draw(1, 2, Purpose::Sample, 4));
    }
}
