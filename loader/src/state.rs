//! Resumable loader state: where a run is, as a small serde value.
//!
//! A loader's order is a pure function of its seed, the epoch and the
//! batch index, so the position is two numbers: the epoch and the next
//! batch in it. Resuming is arithmetic ([`Loader::epoch_from`]), never a
//! replay of decoding; the streaming mode re-reads (without decoding) the
//! records of the epoch before the position, because its shuffle buffer
//! is rebuilt from them. Beside the position the state keeps what decides
//! which batches those numbers mean (the [`Identity`]): a loader built
//! with [`LoaderBuilder::resume`] checks it and refuses a state saved by a
//! loader with another source or other settings, saying what differs.
//! The worker count, batches in flight, prefetch depth, device and RAM
//! budget are not in it: a run may resume with any of them.
//!
//! [`Loader::epoch_from`]: crate::Loader::epoch_from
//! [`LoaderBuilder::resume`]: crate::LoaderBuilder::resume

use serde::{Deserialize, Serialize};

/// The format version [`LoaderState::version`] this build writes and reads.
pub const STATE_VERSION: u32 = 1;

/// Where a loader is: the next batch it will deliver, and what decides
/// which batch that is. Serializes to a few hundred bytes of JSON
/// (`serde_json::to_string`) to keep beside a checkpoint; give it back to
/// [`LoaderBuilder::resume`](crate::LoaderBuilder::resume) in any process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// The format version ([`STATE_VERSION`]).
    pub version: u32,
    /// The epoch the next batch belongs to.
    pub epoch: u64,
    /// The next batch of `epoch`: the ones before it were delivered.
    pub batch: usize,
    /// Samples of `epoch` in the batches before `batch`, as planned
    /// (samples left out under the skip policy included).
    pub samples: u64,
    /// What decides order and content.
    pub identity: Identity,
}

/// What decides which samples a loader's batches hold, in which order and
/// how they are turned into tensors: checked on resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The seed of the order and of the per-sample random streams.
    pub seed: u64,
    /// Whether the order is shuffled.
    pub shuffle: bool,
    /// Samples per batch.
    pub batch_size: usize,
    /// Whether a last, shorter batch is dropped.
    pub drop_last: bool,
    /// This loader's rank.
    pub rank: usize,
    /// Ranks in the job.
    pub world_size: usize,
    /// Random access, or the streaming mode with its interleave and
    /// shuffle-buffer settings.
    pub mode: String,
    /// Samples in the source.
    pub source_len: usize,
    /// A checksum of the source's shard table (file names and record
    /// counts); 0 for a source without shards.
    pub source_shards: u32,
    /// The batch's fields: name, element type, per-sample shape.
    pub fields: Vec<String>,
    /// The built-in image map's settings (transforms, output, size);
    /// `None` under a user map, whose code is the user's to keep the same.
    pub map: Option<String>,
}

impl Identity {
    /// What differs from `other` (the loader being built), one line per
    /// setting: empty when they agree.
    pub fn differences(&self, other: &Identity) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |what: &str, saved: String, now: String| {
            if saved != now {
                out.push(format!("{what}: the state has {saved}, this loader {now}"));
            }
        };
        check("seed", self.seed.to_string(), other.seed.to_string());
        check(
            "shuffle",
            self.shuffle.to_string(),
            other.shuffle.to_string(),
        );
        check(
            "batch size",
            self.batch_size.to_string(),
            other.batch_size.to_string(),
        );
        check(
            "drop_last",
            self.drop_last.to_string(),
            other.drop_last.to_string(),
        );
        check(
            "rank",
            format!("{} of {}", self.rank, self.world_size),
            format!("{} of {}", other.rank, other.world_size),
        );
        check("mode", self.mode.clone(), other.mode.clone());
        check(
            "source length",
            self.source_len.to_string(),
            other.source_len.to_string(),
        );
        check(
            "source shard table checksum",
            format!("{:08x}", self.source_shards),
            format!("{:08x}", other.source_shards),
        );
        check(
            "fields",
            format!("{:?}", self.fields),
            format!("{:?}", other.fields),
        );
        let map = |m: &Option<String>| m.clone().unwrap_or_else(|| "a user map".into());
        check("map", map(&self.map), map(&other.map));
        out
    }
}

/// A loader's place in its run: the next batch it delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Position {
    pub(crate) epoch: u64,
    pub(crate) batch: usize,
    pub(crate) samples: u64,
}

impl Position {
    /// Batch `batch` of `epoch`, where `before[k]` is the samples planned
    /// before batch `k` (one entry more than the epoch has batches): the
    /// first batch of the next epoch once `batch` is past the last.
    pub(crate) fn new(epoch: u64, batch: usize, before: &[u64]) -> Self {
        match before.get(batch) {
            Some(&samples) if batch + 1 < before.len() => Self {
                epoch,
                batch,
                samples,
            },
            _ => Self {
                epoch: epoch + 1,
                batch: 0,
                samples: 0,
            },
        }
    }

    /// The `before` table of [`new`](Self::new) for batches of `sizes`
    /// samples, summed once per epoch (not once per batch).
    pub(crate) fn samples_before(sizes: impl Iterator<Item = usize>) -> Vec<u64> {
        std::iter::once(0)
            .chain(sizes.scan(0u64, |sum, n| {
                *sum += n as u64;
                Some(*sum)
            }))
            .collect()
    }

    /// The state at this position.
    pub(crate) fn state(&self, identity: &Identity) -> LoaderState {
        LoaderState {
            version: STATE_VERSION,
            epoch: self.epoch,
            batch: self.batch,
            samples: self.samples,
            identity: identity.clone(),
        }
    }
}

/// A checksum of a source's shard table: each shard's file name, first
/// record and record count (0 for a source without shards).
pub(crate) fn shard_table(source: &dyn crate::Source) -> u32 {
    let mut text = String::new();
    for shard in source.shards() {
        let name = shard.path.file_name().unwrap_or(shard.path.as_os_str());
        text.push_str(&format!(
            " | {} {} {}",
            name.to_string_lossy(),
            shard.first,
            shard.records
        ));
    }
    if text.is_empty() {
        0
    } else {
        crc32c::crc32c(text.as_bytes())
    }
}

impl LoaderState {
    /// The position this state names.
    pub(crate) fn position(&self) -> Position {
        Position {
            epoch: self.epoch,
            batch: self.batch,
            samples: self.samples,
        }
    }

    /// Refuses a state of another format version or another identity than
    /// `identity`'s, naming every difference.
    pub(crate) fn check(&self, identity: &Identity) -> crate::Result<()> {
        if self.version != STATE_VERSION {
            return Err(crate::Error::StateMismatch {
                differences: vec![format!(
                    "format version: the state has {}, this build reads {STATE_VERSION}",
                    self.version
                )],
            });
        }
        let differences = self.identity.differences(identity);
        if differences.is_empty() {
            Ok(())
        } else {
            Err(crate::Error::StateMismatch { differences })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            seed: 7,
            shuffle: true,
            batch_size: 4,
            drop_last: false,
            rank: 0,
            world_size: 1,
            mode: "random access".into(),
            source_len: 21,
            source_shards: 0,
            fields: vec!["images u8 [16, 16, 3]".into(), "labels u32 []".into()],
            map: None,
        }
    }

    #[test]
    fn a_state_round_trips_through_json_and_names_what_differs() {
        let state = LoaderState {
            version: STATE_VERSION,
            epoch: 3,
            batch: 2,
            samples: 8,
            identity: identity(),
        };
        let json = serde_json::to_string(&state).unwrap();
        let back: LoaderState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
        back.check(&identity()).unwrap();

        let other = Identity {
            batch_size: 8,
            rank: 1,
            world_size: 2,
            ..identity()
        };
        let crate::Error::StateMismatch { differences } = state.check(&other).unwrap_err() else {
            panic!("not a mismatch")
        };
        assert_eq!(
            differences,
            [
                "batch size: the state has 4, this loader 8",
                "rank: the state has 0 of 1, this loader 1 of 2"
            ]
        );
        let old = LoaderState {
            version: 0,
            ..state
        };
        let msg = old.check(&identity()).unwrap_err().to_string();
        assert!(msg.contains("format version: the state has 0"), "{msg}");
    }
}
