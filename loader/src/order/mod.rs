//! Stage 2, the order of an epoch: a permutation of the source's indices
//! dealt to ranks ([`sampler`]), or shard streams interleaved and shuffled
//! through a buffer ([`stream`]). Both give a [`sampler::Plan`]: which
//! samples make each batch of an epoch, a pure function of `(seed, epoch)`.

pub(crate) mod blend;
pub(crate) mod blocks;
pub(crate) mod permute;
pub(crate) mod ranks;
pub(crate) mod sampler;
pub(crate) mod shards;
pub(crate) mod stream;
