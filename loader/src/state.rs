//! Resumable loader state: where a run is, as a small serde value.
//!
//! A loader's order is a pure function of its seed, the epoch and the
//! batch index, so the position is two numbers: the epoch and the next
//! batch in it. Resuming is arithmetic ([`Loader::epoch_from`]), never a
//! replay of decoding or reading; the streaming mode replays its
//! interleave and shuffle buffer over the records' indices up to the
//! position (arithmetic), reading only the records it then delivers (a
//! compressed TFRecord shard, which cannot skip, is read through).
//! Beside the position the state keeps what decides
//! which batches those numbers mean (the [`Identity`]): a loader built
//! with [`LoaderBuilder::resume`] checks it and refuses a state saved by a
//! loader with another source or other settings, saying what differs.
//! The worker count, batches in flight, prefetch depth, device and RAM
//! budget are not in it: a run may resume with any of them. Nor is the
//! rank: every rank is at the same batch of the same epoch, and the
//! position counts the samples of all ranks together, so every rank of a
//! job saves the same state (compare them to check) and one state resumes
//! every rank, each recomputing its own share.
//!
//! **Elastic resume.** In the random-access mode the batches before a
//! position are a prefix of the epoch's order, `samples` long, so a state
//! saved by `N` ranks resumes on any `M >= 1`: the rest of the epoch is
//! planned from sample `samples` on `M` ranks, no sample of it seen twice
//! or skipped (the [`Remainder`](crate::Remainder) policy decides the tail
//! as usual; under `Split`, fewer samples left than ranks is an error that
//! says so). On the same world size the rest is exactly the batches the
//! uninterrupted run yields. The streaming mode deals whole shards to ranks,
//! so its position is not a prefix: a state saved mid-epoch resumes only on
//! the world size that saved it (another is refused, naming both); one
//! saved at an epoch's end resumes on any.
//!
//! [`Loader::epoch_from`]: crate::Loader::epoch_from
//! [`LoaderBuilder::resume`]: crate::LoaderBuilder::resume

use crate::order::sampler::Before;
use serde::{Deserialize, Serialize};

/// The format version [`LoaderState::version`] this build writes and reads.
pub const STATE_VERSION: u32 = 3;

/// The version of the algorithms that turn `(seed, epoch, index)` into
/// batches: the permutation, ranks' shares, the streaming plan, token
/// windows' placement and the per-sample random streams. A state saved
/// under another is refused. Changed whenever any of them changes; the
/// golden tests (tests/tests/resume_golden.rs) fail when one changes
/// without it.
pub const ORDER_VERSION: &str = "wick-order-5";

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
    /// The next batch of `epoch`: the ones before it were delivered. After
    /// a resume on another world size, counted from the resume point.
    pub batch: usize,
    /// Samples of `epoch` in the batches before `batch`, as planned, over
    /// all ranks together (samples left out under the skip policy
    /// included): in the random-access mode, how far into the epoch's
    /// order the job is, which is where a resumed loader of any world size
    /// goes on.
    pub samples: u64,
    /// What decides order and content.
    pub identity: Identity,
}

/// What decides which samples a loader's batches hold, in which order and
/// how they are turned into tensors: checked on resume.
///
/// A state written by another format version parses (fields this one
/// adds take defaults, fields it dropped are ignored) and is then refused
/// naming the version: every change of these fields changes
/// [`STATE_VERSION`] (a test pins the list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The order algorithms' version ([`ORDER_VERSION`]).
    #[serde(default)]
    pub order_version: String,
    /// The seed of the per-sample random streams (augmentation).
    pub seed: u64,
    /// The shuffle seed (`None`: not shuffled).
    #[serde(default)]
    pub shuffle_seed: Option<u64>,
    /// Samples per batch.
    pub batch_size: usize,
    /// The [`Remainder`](crate::Remainder) policy: `split`, `drop` or `pad`.
    #[serde(default)]
    pub remainder: String,
    /// Ranks in the job that saved the state (each rank's share is
    /// recomputed from it; see the module docs for resuming on another).
    pub world_size: usize,
    /// Random access, or the streaming mode with its interleave and
    /// shuffle-buffer settings.
    pub mode: String,
    /// Samples in the source.
    pub source_len: usize,
    /// A checksum of the source's shard table (file names and record
    /// counts); 0 for a source without shards.
    pub source_shards: u32,
    /// The source's own checksum ([`Source::digest`](crate::Source::digest)):
    /// names, order and lengths of what it reads.
    #[serde(default)]
    pub source_digest: u32,
    /// Most pixels an image may declare: an image over it is refused.
    #[serde(default)]
    pub max_pixels: u64,
    /// The bad-sample policy (which batches hold which samples).
    #[serde(default)]
    pub bad_samples: String,
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
        check(
            "order algorithms",
            self.order_version.clone(),
            other.order_version.clone(),
        );
        check("seed", self.seed.to_string(), other.seed.to_string());
        let shuffle = |s: Option<u64>| s.map_or("no shuffle".into(), |s| format!("shuffle({s})"));
        check(
            "shuffle",
            shuffle(self.shuffle_seed),
            shuffle(other.shuffle_seed),
        );
        check(
            "batch size",
            self.batch_size.to_string(),
            other.batch_size.to_string(),
        );
        check(
            "remainder policy",
            self.remainder.clone(),
            other.remainder.clone(),
        );
        check(
            "world size",
            self.world_size.to_string(),
            other.world_size.to_string(),
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
            "source checksum (names, order and lengths)",
            format!("{:08x}", self.source_digest),
            format!("{:08x}", other.source_digest),
        );
        check(
            "max_pixels",
            self.max_pixels.to_string(),
            other.max_pixels.to_string(),
        );
        check(
            "bad-sample policy",
            self.bad_samples.clone(),
            other.bad_samples.clone(),
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
    /// The batch, in the plan of `epoch` that starts at sample `from`.
    pub(crate) batch: usize,
    /// Samples of all ranks before it.
    pub(crate) samples: u64,
    /// Where the epoch's plan starts: 0, or the point a loader resumed on
    /// another world size went on from.
    pub(crate) from: u64,
}

impl Position {
    /// Batch `batch` of `epoch`, where `before[k]` is the samples planned
    /// before batch `k` (one entry more than the epoch has batches;
    /// `before[0]` is where the plan starts): the first batch of the next
    /// epoch once `batch` is past the last.
    pub(crate) fn new(epoch: u64, batch: usize, before: &Before) -> Self {
        match before.get(batch) {
            Some(samples) if batch + 1 < before.len() => Self {
                epoch,
                batch,
                samples,
                from: before.get(0).unwrap_or(0),
            },
            _ => Self {
                epoch: epoch + 1,
                ..Self::default()
            },
        }
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
pub(crate) fn shard_table(source: &dyn crate::contract::Source) -> u32 {
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
    /// Refuses a state of another format version or another identity than
    /// `identity`'s, naming every difference. The world size may differ
    /// where the position allows it (module docs).
    pub(crate) fn check(&self, identity: &Identity) -> crate::error::Result<()> {
        if self.version != STATE_VERSION {
            return Err(crate::error::Error::StateMismatch {
                differences: vec![format!(
                    "format version: the state has {}, this build reads {STATE_VERSION}",
                    self.version
                )],
            });
        }
        let mut differences = self.identity.differences(identity);
        let elastic = self.identity.mode.starts_with("random access") || self.samples == 0;
        differences.retain(|d| !(elastic && d.starts_with("world size:")));
        // At an epoch's start nothing of the epoch was delivered: it
        // begins there under this build's order as well as under the one
        // that saved it.
        let at_start = self.samples == 0 && self.batch == 0;
        differences.retain(|d| !(at_start && d.starts_with("order algorithms:")));
        for d in differences
            .iter_mut()
            .filter(|d| d.starts_with("order algorithms:"))
        {
            d.push_str(
                " (the order of an epoch changed between the build that saved the state and \
                 this one: a state saved mid-epoch resumes only with a build of its order \
                 version; one saved at an epoch's start resumes here)",
            );
        }
        for d in differences
            .iter_mut()
            .filter(|d| d.starts_with("world size:"))
        {
            d.push_str(&format!(
                " (the streaming mode deals whole shards to ranks: a state saved mid-epoch \
                 resumes on the {} ranks that saved it; one saved at an epoch's end on any)",
                self.identity.world_size
            ));
        }
        if differences.is_empty() {
            Ok(())
        } else {
            Err(crate::error::Error::StateMismatch { differences })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            order_version: ORDER_VERSION.into(),
            seed: 7,
            shuffle_seed: Some(7),
            batch_size: 4,
            remainder: "split".into(),
            world_size: 1,
            mode: "random access".into(),
            source_len: 21,
            source_shards: 0,
            source_digest: 0x1234,
            max_pixels: 1000,
            bad_samples: "Fail".into(),
            fields: vec!["images u8 [16, 16, 3]".into(), "labels u32 []".into()],
            map: None,
        }
    }

    #[test]
    fn a_state_of_an_earlier_order_resumes_only_at_an_epochs_start() {
        let old = |batch, samples| LoaderState {
            version: STATE_VERSION,
            epoch: 2,
            batch,
            samples,
            identity: Identity {
                order_version: "wick-order-3".into(),
                ..identity()
            },
        };
        let msg = old(1, 4).check(&identity()).unwrap_err().to_string();
        assert!(
            msg.contains("order algorithms: the state has wick-order-3")
                && msg.contains("saved mid-epoch"),
            "{msg}"
        );
        old(0, 0).check(&identity()).unwrap();
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
            shuffle_seed: Some(8),
            world_size: 2,
            ..identity()
        };
        let crate::error::Error::StateMismatch { differences } = state.check(&other).unwrap_err()
        else {
            panic!("not a mismatch")
        };
        // Random access resumes on any world size.
        assert_eq!(
            differences,
            [
                "shuffle: the state has shuffle(7), this loader shuffle(8)",
                "batch size: the state has 4, this loader 8",
            ]
        );
        // The streaming mode mid-epoch does not; at an epoch's end it does.
        let stream = |mode: &str, world_size| Identity {
            mode: mode.into(),
            world_size,
            ..identity()
        };
        let saved = LoaderState {
            identity: stream("streaming", 2),
            ..state.clone()
        };
        let msg = saved
            .check(&stream("streaming", 3))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("world size: the state has 2, this loader 3") && msg.contains("2 ranks"),
            "{msg}"
        );
        let at_end = LoaderState {
            batch: 0,
            samples: 0,
            ..saved
        };
        at_end.check(&stream("streaming", 3)).unwrap();
        let old = LoaderState {
            version: 0,
            ..state
        };
        let msg = old.check(&identity()).unwrap_err().to_string();
        assert!(msg.contains("format version: the state has 0"), "{msg}");
        // A version-1 state, as wick wrote it, parses and is refused by
        // its version.
        let v1 = r#"{"version":1,"epoch":0,"batch":3,"samples":12,"identity":{"seed":5,
            "shuffle":true,"batch_size":4,"drop_last":false,"rank":0,"world_size":1,
            "mode":"random access","source_len":21,"source_shards":0,"fields":[],"map":null}}"#;
        let v1: LoaderState = serde_json::from_str(v1).unwrap();
        let msg = v1.check(&identity()).unwrap_err().to_string();
        assert!(msg.contains("format version: the state has 1"), "{msg}");
    }

    /// The identity's fields as this format version writes them: a field
    /// added, dropped or renamed fails this test until [`STATE_VERSION`]
    /// changes with it (an older build then refuses the newer state by
    /// its version instead of ignoring the new field).
    #[test]
    fn the_identity_fields_are_pinned_to_the_format_version() {
        let value = serde_json::to_value(identity()).unwrap();
        let mut names: Vec<_> = value.as_object().unwrap().keys().cloned().collect();
        names.sort();
        assert_eq!(
            (STATE_VERSION, names.join(" ")),
            (
                3,
                "bad_samples batch_size fields map max_pixels mode order_version remainder \
                 seed shuffle_seed source_digest source_len source_shards world_size"
                    .into()
            )
        );
    }
}
