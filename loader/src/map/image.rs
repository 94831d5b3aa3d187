//! The built-in map: image classification (decode, crop, flip, `u8` or
//! normalized output, and the class), written against [`Map`] like any
//! user map.

use super::{Map, Sample};
use crate::error::Result;
use crate::fields::{Field, FieldType};
use crate::layout::{HostLayout, Slot};
use crate::stats::SampleTimes;
use crate::transform::ImageTransform;
use std::time::{Duration, Instant};

/// Image classification: field `images` (`u8 [h, w, 3]`, or normalized
/// `f32 [3, h, w]`) from the record's encoded image (or its decoded pixels,
/// from a pre-resized safetensors shard or a decoded cache) through the
/// loader's [`Transforms`](crate::Transforms), and field `labels`
/// (`u32`) from its class. What a loader runs without
/// [`LoaderBuilder::map`](crate::LoaderBuilder::map).
#[derive(Debug, Clone)]
pub struct ImageClassification {
    transform: ImageTransform,
}

impl ImageClassification {
    pub(crate) fn new(transform: ImageTransform) -> Self {
        Self { transform }
    }
}

impl Map for ImageClassification {
    fn fields(&self) -> Vec<Field> {
        let size = self.transform.size();
        let (h, w) = (size.height, size.width);
        let images = match self.transform.output() {
            HostLayout::U8Nhwc => Field::new("images", FieldType::U8, &[h, w, 3]),
            HostLayout::F32Nchw { .. } => Field::new("images", FieldType::F32, &[3, h, w]),
        };
        vec![images, Field::new("labels", FieldType::U32, &[])]
    }

    fn map(&self, s: &mut Sample<'_>) -> Result<()> {
        let slot = match self.transform.output() {
            HostLayout::U8Nhwc => Slot::U8(s.take::<u8>(0)?),
            HostLayout::F32Nchw { .. } => Slot::F32(s.take::<f32>(0)?),
        };
        let label = s.take::<u32>(1)?;
        let record = s.record();
        let (epoch, index) = (s.epoch(), s.index());
        let tr = &self.transform;
        let times = match record.rgb_size {
            None => tr.apply_with(s.scratch(), &record.key, &record.bytes, epoch, index, slot)?,
            Some(wh) => {
                let t = Instant::now();
                let scratch = s.scratch();
                tr.apply_decoded_with(scratch, &record.key, &record.bytes, wh, epoch, index, slot)?;
                SampleTimes {
                    decode: Duration::ZERO,
                    transform: t.elapsed(),
                    decoded_bytes: record.bytes.len() as u64,
                }
            }
        };
        label[0] = record.label;
        s.times = Some(times);
        Ok(())
    }
}
