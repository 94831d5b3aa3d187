//! The per-sample function: a [`Map`] reads a record's parts and writes one
//! sample's fields straight into its slot of a batch buffer, on the
//! loader's decode pool.
//!
//! A loader runs exactly one map. Without [`LoaderBuilder::map`] it is the
//! built-in image classification map ([`ImageClassification`]: decode,
//! RandomResizedCrop or the eval crop, flip, `u8` or normalized output,
//! plus the class), which is written against the same trait; with it, the
//! map's [`Map::fields`] are the batch's tensors, by name
//! ([`Batch::get`](crate::Batch::get)).
//!
//! Everything that makes the built-in map fast is public in [`crate::ops`],
//! so a segmentation map that applies one crop and flip to an image and its
//! mask is a few lines:
//!
//! ```
//! use candle_wick::fields::{Field, FieldType};
//! use candle_wick::map::{map_fn, Sample};
//! use candle_wick::ops::{self, RandomResizedCrop, Resize, Slot};
//! use candle_wick::source::Parts;
//! use candle_wick::Size;
//!
//! # fn main() -> candle_wick::Result<()> {
//! let out = Size::new(128, 96);
//! let resize = Resize::new(out)?;
//! let rrc = RandomResizedCrop::default();
//! let segmentation = map_fn(
//!     vec![
//!         Field::new("image", FieldType::U8, &[96, 128, 3]),
//!         Field::new("mask", FieldType::U8, &[96, 128]),
//!     ],
//!     move |s: &mut Sample<'_>| {
//!         let (image, mask) = (s.take::<u8>(0)?, s.take::<u8>(1)?);
//!         let (record, rng) = (s.record(), s.rng());
//!         // One crop and flip for both, drawn from (seed, epoch, index).
//!         let plan = |w, h| rrc.draw(&mut rng.clone(), w, h);
//!         let done = resize.decode_into(s.scratch(), &record.key, &record.bytes, plan, Slot::U8(image))?;
//!         let mut labels = Vec::new();
//!         let size = ops::decode_label_map_into(&record.key, record.part_bytes("seg.png")?, &mut labels)?;
//!         if size != done.image {
//!             return Err(candle_wick::Error::Transform {
//!                 key: record.key.clone(),
//!                 reason: format!("mask {size:?} and image {:?} differ", done.image),
//!                 source: None,
//!             });
//!         }
//!         ops::resample_nearest(&record.key, &labels, size, 1, done.crop, done.flip, out, mask)
//!     },
//! )
//! .parts(Parts::Named(vec!["seg.png".into()]));
//! # let _ = segmentation;
//! # Ok(()) }
//! ```
//!
//! [`LoaderBuilder::map`]: crate::LoaderBuilder::map

mod image;
mod tokens;

pub use image::ImageClassification;
pub use tokens::TokenWindowsMap;

use crate::contract::{Parts, Record};
use crate::error::{Error, Result};
use crate::fields::{Element, Field, FieldLayout, FieldType};
use crate::rng::{keyed_rng, Purpose};
use crate::stats::SampleTimes;
use crate::transform::Scratch;

/// A per-sample function: reads a [`Record`] and writes one sample's
/// fields.
///
/// It runs on the loader's decode pool, as many samples at once as
/// AUTOTUNE (or [`workers`](crate::LoaderBuilder::workers)) allows, so it
/// is `Send + Sync` and works through `&self`. Its random draws must come
/// from [`Sample::rng`] (keyed by `(seed, epoch, index)`) for batches to
/// stay bit-identical for any worker count. An error or a panic is the
/// sample's, named by its key, and follows the loader's
/// [`BadSamples`](crate::BadSamples) policy.
pub trait Map: Send + Sync + 'static {
    /// The fields it writes, in the order [`Sample::take`] numbers them.
    fn fields(&self) -> Vec<Field>;

    /// The record parts it reads; sources read only these. Default: the
    /// image and class ([`Parts::Default`]).
    fn parts(&self) -> Parts {
        Parts::Default
    }

    /// Batch tensors that are slices of its fields, not written by it
    /// ([`View`](crate::fields::View)). Default: none.
    fn views(&self) -> Vec<crate::fields::View> {
        Vec::new()
    }

    /// Writes sample [`Sample::index`]'s fields from [`Sample::record`].
    /// Every field must be taken ([`Sample::take`]; the sample is an error
    /// naming the field otherwise, except a padded field given a count of
    /// 0) and every fixed field written completely: the slot may hold an
    /// earlier batch's bytes, not zeros.
    fn map(&self, sample: &mut Sample<'_>) -> Result<()>;

    /// A hint, given while the worker still maps the sample before it:
    /// sample `index` of `epoch` (for a loader seeded `seed`, as
    /// [`Sample::seed`]) is the worker's next. A map that reads memory
    /// itself (a memory-mapped file) can start those loads now, so they
    /// are in the cache when [`map`](Self::map) copies them. It must not
    /// fail or block, and what it does cannot change any output. Default:
    /// nothing.
    fn prefetch(&self, seed: u64, epoch: u64, index: usize) {
        let _ = (seed, epoch, index);
    }
}

impl std::fmt::Debug for dyn Map {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.fields().into_iter().map(|f| f.name).collect();
        write!(f, "Map({names:?})")
    }
}

/// A [`Map`] made of a closure ([`map_fn`]).
pub struct FnMap<F> {
    fields: Vec<Field>,
    parts: Parts,
    f: F,
}

impl<F> std::fmt::Debug for FnMap<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnMap")
            .field("fields", &self.fields)
            .field("parts", &self.parts)
            .finish()
    }
}

/// A map that writes `fields` with the closure `f`.
pub fn map_fn<F>(fields: Vec<Field>, f: F) -> FnMap<F>
where
    F: Fn(&mut Sample<'_>) -> Result<()> + Send + Sync + 'static,
{
    FnMap {
        fields,
        parts: Parts::Default,
        f,
    }
}

impl<F> FnMap<F> {
    /// The same map, reading the record parts `parts`.
    pub fn parts(mut self, parts: Parts) -> Self {
        self.parts = parts;
        self
    }
}

impl<F> Map for FnMap<F>
where
    F: Fn(&mut Sample<'_>) -> Result<()> + Send + Sync + 'static,
{
    fn fields(&self) -> Vec<Field> {
        self.fields.clone()
    }

    fn parts(&self) -> Parts {
        self.parts.clone()
    }

    fn map(&self, sample: &mut Sample<'_>) -> Result<()> {
        (self.f)(sample)
    }
}

/// One field's slot of the sample being written.
struct Out<'a> {
    bytes: Option<&'a mut [u8]>,
    dtype: FieldType,
    /// Written by the loader (a padded field's count).
    by_loader: bool,
}

/// What a [`Map`] gets for one sample: the record, where it sits in the
/// epoch, its random stream, its slots of the batch's fields and the
/// worker's reusable decode scratch.
pub struct Sample<'a> {
    record: &'a Record,
    epoch: u64,
    index: usize,
    seed: u64,
    /// Inline for up to four fields: no allocation a sample.
    out: smallvec::SmallVec<[Out<'a>; 4]>,
    lens: Vec<Option<usize>>,
    scratch: &'a mut Scratch,
    pub(crate) times: Option<SampleTimes>,
}

impl std::fmt::Debug for Sample<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sample")
            .field("key", &self.record.key)
            .field("epoch", &self.epoch)
            .field("index", &self.index)
            .finish()
    }
}

impl<'a> Sample<'a> {
    /// The sample's slots (`slots[f]`: field `f`'s bytes of this sample).
    pub(crate) fn new(
        record: &'a Record,
        (seed, epoch, index): (u64, u64, usize),
        fields: &[FieldLayout],
        slots: impl Iterator<Item = &'a mut [u8]>,
        scratch: &'a mut Scratch,
    ) -> Self {
        let out = slots
            .zip(fields)
            .map(|(bytes, f)| Out {
                bytes: Some(bytes),
                dtype: f.field.dtype,
                by_loader: f.by_loader,
            })
            .collect();
        Self {
            record,
            epoch,
            index,
            seed,
            out,
            // Grown by the first `set_len` (most maps have no padded field).
            lens: Vec::new(),
            scratch,
            times: None,
        }
    }

    /// The record read for this sample.
    pub fn record(&self) -> &'a Record {
        self.record
    }

    /// The sample's key (its path for file-backed sources).
    pub fn key(&self) -> &'a str {
        &self.record.key
    }

    /// The epoch being loaded.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The sample's index in the source.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The loader's seed ([`seed`](crate::LoaderBuilder::seed), else the
    /// shuffle seed, else 0).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// This sample's random stream: ChaCha8 keyed by `(seed, epoch,
    /// index)`, the same stream the built-in image map draws its crop and
    /// flip from, so every call gives the same draws whatever worker runs
    /// the sample.
    pub fn rng(&self) -> rand_chacha::ChaCha8Rng {
        keyed_rng(self.seed, self.epoch, Purpose::Sample, self.index as u64)
    }

    /// Field `field`'s slot of this sample, as elements of `T`: once per
    /// field per sample, so a map can hold several fields at once. An error
    /// when `T` is not the field's type, the field was taken already, or
    /// it is a `_len` field (the loader writes those).
    pub fn take<T: Element>(&mut self, field: usize) -> Result<&'a mut [T]> {
        let key = &self.record.key;
        let bad = |reason: String| Error::Transform {
            key: key.clone(),
            reason,
            source: None,
        };
        let n = self.out.len();
        let out = self
            .out
            .get_mut(field)
            .ok_or_else(|| bad(format!("the map asked for field {field} of {n}")))?;
        if out.by_loader {
            return Err(bad(format!(
                "field {field} is a padded field's count, written by the loader: call set_len"
            )));
        }
        if out.dtype != T::TYPE {
            return Err(bad(format!(
                "field {field} is {:?}, taken as {:?}",
                out.dtype,
                T::TYPE
            )));
        }
        let bytes = out
            .bytes
            .take()
            .ok_or_else(|| bad(format!("field {field} was taken twice")))?;
        bytemuck::try_cast_slice_mut(bytes)
            .map_err(|e| bad(format!("field {field}'s slot cannot be cast: {e}")))
    }

    /// Says how many items the map wrote into padded field `field`
    /// ([`Field::padded`]); the loader pads the rest and writes the count
    /// into its `_len` field. An error for a fixed field or a count over
    /// the maximum.
    pub fn set_len(&mut self, field: usize, items: usize) -> Result<()> {
        if self.lens.len() < self.out.len() {
            self.lens.resize(self.out.len(), None);
        }
        self.lens
            .get_mut(field)
            .map(|l| *l = Some(items))
            .ok_or_else(|| Error::Transform {
                key: self.record.key.clone(),
                reason: format!("set_len of field {field}, which does not exist"),
                source: None,
            })
    }

    /// The worker's reusable decode and resample buffers, for
    /// [`crate::ops`].
    pub fn scratch(&mut self) -> &mut Scratch {
        self.scratch
    }

    /// What the map left for the loader: each padded field's count and the
    /// times the map measured (the built-in map's decode and transform),
    /// or an error naming a field the map never took: its slot would go
    /// out holding zeros or an earlier batch's bytes. (A padded field
    /// needs no `take` when its count is 0.)
    pub(crate) fn finish(
        self,
        fields: &[FieldLayout],
    ) -> Result<(Vec<Option<usize>>, Option<SampleTimes>)> {
        for (i, (out, f)) in self.out.iter().zip(fields).enumerate() {
            let empty = f.field.pad.is_some() && self.lens.get(i) == Some(&Some(0));
            if out.bytes.is_some() && !out.by_loader && !empty {
                return Err(Error::Transform {
                    key: self.record.key.clone(),
                    reason: format!(
                        "the map did not write field {:?} (field {i}): every field must be \
                         taken with Sample::take and written",
                        f.field.name
                    ),
                    source: None,
                });
            }
        }
        Ok((self.lens, self.times))
    }
}

/// After the map: pads every padded field of the sample past its count and
/// writes the count into its `_len` field (`slots[f]`: field `f`'s bytes);
/// an error naming `key` when a padded field has no count or one over its
/// maximum.
pub(crate) fn pad_fields(
    key: &str,
    fields: &[FieldLayout],
    lens: &[Option<usize>],
    slots: &mut [&mut [u8]],
) -> Result<()> {
    for (i, f) in fields.iter().enumerate() {
        let (Some(pad), Some(len_field)) = (f.field.pad, f.len_field) else {
            continue;
        };
        let max = f.field.shape[0];
        let bad = |reason| Error::Transform {
            key: key.into(),
            reason,
            source: None,
        };
        let items = lens.get(i).copied().flatten().ok_or_else(|| {
            bad(format!(
                "the map did not set_len padded field {:?} (0 to {max} items)",
                f.field.name
            ))
        })?;
        if items > max {
            return Err(bad(format!(
                "{items} items for padded field {:?} of at most {max}",
                f.field.name
            )));
        }
        let item_bytes = f.field.item_elems() * f.field.dtype.size();
        fill_pad(&mut slots[i][items * item_bytes..], f.field.dtype, pad);
        slots[len_field].copy_from_slice(&(items as u32).to_ne_bytes());
    }
    Ok(())
}

/// Writes `pad` as `dtype` into every element of `bytes`.
fn fill_pad(bytes: &mut [u8], dtype: FieldType, pad: f64) {
    fn fill<T: Element>(bytes: &mut [u8], pad: f64) {
        let v = T::from_f64(pad);
        for e in bytemuck::cast_slice_mut::<u8, T>(bytes) {
            *e = v;
        }
    }
    match dtype {
        FieldType::U8 => fill::<u8>(bytes, pad),
        FieldType::U32 => fill::<u32>(bytes, pad),
        FieldType::I16 => fill::<i16>(bytes, pad),
        FieldType::I32 => fill::<i32>(bytes, pad),
        FieldType::I64 => fill::<i64>(bytes, pad),
        FieldType::BF16 => fill::<half::bf16>(bytes, pad),
        FieldType::F16 => fill::<half::f16>(bytes, pad),
        FieldType::F32 => fill::<f32>(bytes, pad),
        FieldType::F64 => fill::<f64>(bytes, pad),
    }
}
