//! Crop, resize, flip, layout and normalize, written straight into a batch slot.

mod crop;
pub(crate) mod resize;
pub(crate) use crop::{center_crop, random_resized_crop_and_flip};
mod scratch;
mod write;

pub use scratch::Scratch;
use scratch::SCRATCH;
pub(crate) use scratch::{PooledScratch, ScratchPool};

use crate::decode::Decoded;
use crate::error::{Error, Result};
use crate::geometry::{relative, Size};
use crate::layout::{normalize_coefficients, HostLayout, Slot};
use crate::stats::SampleTimes;
use crate::transform::resize::{Crop, Resampler, View};
use std::time::Instant;

/// The geometric transforms applied to every decoded image.
///
/// Resizing uses an antialiased bilinear (triangle) filter whose support
/// grows with the downscale factor, as PIL and torchvision (`antialias=True`)
/// do.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Transforms {
    /// Evaluation: resize the shorter side to `resize`, then take the
    /// centre `image_size` crop (torchvision `Resize(resize)` +
    /// `CenterCrop(size)`). Deterministic.
    ResizeCenterCrop {
        /// Length of the shorter side after resizing; at least the crop size.
        resize: usize,
    },
    /// Training: torchvision's `RandomResizedCrop(size, scale, ratio)`
    /// followed, if `flip`, by `RandomHorizontalFlip(0.5)`.
    RandomResizedCrop {
        /// Range of the crop's area as a fraction of the image's area.
        scale: (f64, f64),
        /// Range of the crop's aspect ratio (width / height).
        ratio: (f64, f64),
        /// Flip horizontally with probability 0.5.
        flip: bool,
    },
}

impl Transforms {
    /// torchvision's training recipe: `RandomResizedCrop(scale=(0.08, 1),
    /// ratio=(3/4, 4/3))` and a random horizontal flip.
    pub fn train() -> Self {
        Transforms::RandomResizedCrop {
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            flip: true,
        }
    }

    /// torchvision's evaluation recipe for crop size `size`: resize the
    /// shorter side to `round(size / 0.875)` (256 for 224), centre crop.
    pub fn eval(size: usize) -> Self {
        Transforms::ResizeCenterCrop {
            resize: (size as f64 / 0.875).round() as usize,
        }
    }
}

/// What [`ImageTransform::apply_planned`] did: its times, the decoded
/// image's size, and the crop (in that image's pixels) and flip it applied.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Applied {
    pub(crate) times: SampleTimes,
    pub(crate) image: Size,
    pub(crate) crop: Crop,
    pub(crate) flip: bool,
}

/// The per-sample function of a loader: decode, transform, write into a slot.
///
/// It is what the decode workers run; it is public so benchmarks and tools
/// can run the exact same code outside the pipeline.
#[derive(Debug, Clone)]
pub struct ImageTransform {
    transforms: Transforms,
    output: HostLayout,
    height: usize,
    width: usize,
    seed: u64,
    /// `lut[c][v]` = normalized value of byte `v` in channel `c`:
    /// `v * scale[c] + bias[c]` with one rounding (a fused multiply-add),
    /// so the table and the vector path give the same floats.
    lut: Box<[[f32; 256]; 3]>,
    /// `1 / (255 std[c])`.
    scale: [f32; 3],
    /// `-mean[c] / std[c]`.
    bias: [f32; 3],
}

impl ImageTransform {
    /// A transform producing images of `size`.
    pub fn new(transforms: Transforms, output: HostLayout, size: Size, seed: u64) -> Result<Self> {
        let Size { width, height } = size;
        if height == 0 || width == 0 {
            return Err(Error::InvalidConfig("image_size must be at least 1".into()));
        }
        match transforms {
            Transforms::ResizeCenterCrop { resize } if resize < height.max(width) => {
                return Err(Error::InvalidConfig(format!(
                    "eval resize {resize} is smaller than the crop {height}x{width}"
                )));
            }
            Transforms::RandomResizedCrop { scale, ratio, .. }
                if !(scale.0 > 0.0
                    && scale.0 <= scale.1
                    && ratio.0 > 0.0
                    && ratio.0 <= ratio.1) =>
            {
                return Err(Error::InvalidConfig(format!(
                    "random resized crop needs 0 < scale.0 <= scale.1 and 0 < ratio.0 <= ratio.1, \
                     got scale {scale:?} ratio {ratio:?}"
                )));
            }
            _ => {}
        }
        let mut lut = Box::new([[0f32; 256]; 3]);
        let (mut scale, mut bias) = ([0f32; 3], [0f32; 3]);
        if let HostLayout::F32Nchw { mean, std } = output {
            if std.iter().any(|s| !s.is_finite() || *s == 0.0) {
                return Err(Error::InvalidConfig(format!(
                    "normalize std must be non-zero, got {std:?}"
                )));
            }
            (scale, bias) = normalize_coefficients(mean, std);
            for c in 0..3 {
                for v in 0..256 {
                    lut[c][v] = (v as f32).mul_add(scale[c], bias[c]);
                }
            }
        }
        Ok(Self {
            transforms,
            output,
            height,
            width,
            seed,
            lut,
            scale,
            bias,
        })
    }

    /// The seed of the augmentation draws.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The output images' size.
    pub fn size(&self) -> Size {
        Size::new(self.width, self.height)
    }

    /// The output format.
    pub fn output(&self) -> HostLayout {
        self.output
    }

    /// The geometric settings (transforms and size), for the resumable
    /// state's identity (the builder adds the output layout).
    pub(crate) fn describe(&self) -> String {
        format!("{:?} {}x{}", self.transforms, self.width, self.height)
    }

    /// The geometric transforms.
    pub fn transforms(&self) -> Transforms {
        self.transforms
    }

    /// Elements (bytes or floats) in one sample's slot.
    pub fn slot_len(&self) -> usize {
        self.height * self.width * 3
    }

    /// Decodes `bytes` and writes the transformed image of sample `index` in
    /// `epoch` into `slot`. The random draws come from `(seed, epoch, index)`
    /// only. Errors name `key`.
    pub fn apply(
        &self,
        key: &str,
        bytes: &[u8],
        epoch: u64,
        index: usize,
        slot: Slot<'_>,
    ) -> Result<SampleTimes> {
        SCRATCH.with(|cell| {
            let scratch = &mut *cell.borrow_mut();
            self.apply_with(scratch, key, bytes, epoch, index, slot)
        })
    }

    /// The output's `(width, height)`.
    pub(crate) fn out_size(&self) -> (usize, usize) {
        (self.width, self.height)
    }

    /// [`apply`](Self::apply) with the given scratch.
    pub(crate) fn apply_with(
        &self,
        scratch: &mut Scratch,
        key: &str,
        bytes: &[u8],
        epoch: u64,
        index: usize,
        slot: Slot<'_>,
    ) -> Result<SampleTimes> {
        let plan = |w, h| self.params(w, h, epoch, index);
        self.apply_planned(scratch, key, bytes, plan, slot)
            .map(|a| a.times)
    }

    /// Decodes `bytes` and writes the crop and flip `plan(width, height)`
    /// chooses for the image, resized to the output, into `slot`: decoding
    /// only the window the resize reads where the format allows it.
    pub(crate) fn apply_planned(
        &self,
        scratch: &mut Scratch,
        key: &str,
        bytes: &[u8],
        plan: impl Fn(usize, usize) -> (Crop, bool),
        slot: Slot<'_>,
    ) -> Result<Applied> {
        let Scratch {
            resampler,
            decoded,
            resized,
            jpeg,
            limits,
            ..
        } = scratch;
        let t0 = Instant::now();
        let chosen = std::cell::Cell::new(None);
        let planned = |w, h| {
            let (crop, flip) = plan(w, h);
            chosen.set(Some((Size::new(w, h), crop, flip)));
            (crop, flip)
        };
        let out_size = (self.width, self.height);
        // An image over this worker's share waits for the process's one
        // oversize pass, and gives its buffers back after.
        let oversize = limits.oversize(bytes);
        let got = crate::decode::decode_for_crop(
            key,
            bytes,
            (jpeg, limits),
            decoded,
            out_size,
            planned,
            |crop, w, h| self.window(crop, w, h),
        )?;
        let t1 = Instant::now();
        let (decoded_px, image, crop, flip) = match got {
            Decoded::Window {
                width,
                height,
                crop,
                flip,
            } => {
                let src = View::whole(decoded, width, height);
                self.resample(resampler, resized, key, src, crop, flip, slot)?;
                let (image, full_crop, _) = chosen.get().ok_or_else(|| Error::Transform {
                    key: key.into(),
                    reason: "the window decoder did not ask for a crop".into(),
                    source: None,
                })?;
                (width * height, image, full_crop, flip)
            }
            Decoded::Whole { width, height } => {
                let (crop, flip) = plan(width, height);
                let wh = (width, height);
                self.resample_full(resampler, resized, key, decoded, wh, (crop, flip), slot)?;
                (width * height, Size::new(width, height), crop, flip)
            }
        };
        if oversize.is_some() {
            let share = usize::try_from(limits.max_bytes).unwrap_or(usize::MAX);
            for buf in [&mut *decoded, &mut *resized] {
                buf.clear();
                buf.shrink_to(share);
            }
            jpeg.shrink_to(share);
        }
        drop(oversize);
        Ok(Applied {
            times: SampleTimes {
                decode: t1 - t0,
                transform: t1.elapsed(),
                decoded_bytes: (decoded_px * 3) as u64,
            },
            image,
            crop,
            flip,
        })
    }

    /// Transforms already-decoded packed RGB8 pixels of `size` of sample
    /// `index` into `slot`: the same crop, resize, flip and normalization as
    /// [`apply`](Self::apply), without the decode.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_decoded(
        &self,
        key: &str,
        rgb: &[u8],
        size: Size,
        epoch: u64,
        index: usize,
        slot: Slot<'_>,
    ) -> Result<()> {
        SCRATCH.with(|cell| {
            let scratch = &mut *cell.borrow_mut();
            self.apply_decoded_with(scratch, key, rgb, size, epoch, index, slot)
        })
    }

    /// [`apply_decoded`](Self::apply_decoded) with the given scratch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_decoded_with(
        &self,
        scratch: &mut Scratch,
        key: &str,
        rgb: &[u8],
        size: Size,
        epoch: u64,
        index: usize,
        slot: Slot<'_>,
    ) -> Result<()> {
        let drawn = self.params(size.width, size.height, epoch, index);
        self.resample_decoded(scratch, key, rgb, size, drawn, slot)
    }

    /// Writes `crop` (flipped if `flip`) of the packed RGB8 pixels `rgb` of
    /// `size`, resized, into `slot`.
    pub(crate) fn resample_decoded(
        &self,
        scratch: &mut Scratch,
        key: &str,
        rgb: &[u8],
        Size { width, height }: Size,
        drawn: (Crop, bool),
        slot: Slot<'_>,
    ) -> Result<()> {
        if width == 0 || height == 0 || rgb.len() < width * height * 3 {
            return Err(Error::Transform {
                key: key.into(),
                reason: format!(
                    "{} bytes do not hold a {width}x{height} RGB image",
                    rgb.len()
                ),
                source: None,
            });
        }
        let Scratch {
            resampler, resized, ..
        } = scratch;
        let wh = (width, height);
        self.resample_full(resampler, resized, key, rgb, wh, drawn, slot)
    }

    /// Resamples `crop` (flipped if `flip`) of a whole decoded image
    /// through the same window as the window decoder would have decoded, so
    /// both paths give bit-identical output.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn resample_full(
        &self,
        resampler: &mut Resampler,
        resized: &mut Vec<u8>,
        key: &str,
        rgb: &[u8],
        (width, height): (usize, usize),
        (crop, flip): (Crop, bool),
        slot: Slot<'_>,
    ) -> Result<()> {
        let win = self.window(crop, width, height);
        let src = View {
            x0: win.x0,
            y0: win.y0,
            width: win.width(),
            height: win.height(),
            ..View::whole(rgb, width, height)
        };
        let crop = relative(crop, &win);
        self.resample(resampler, resized, key, src, crop, flip, slot)
    }

    /// Resizes `crop` (relative to the window of `src`), flips and writes.
    #[allow(clippy::too_many_arguments)]
    fn resample(
        &self,
        resampler: &mut Resampler,
        resized: &mut Vec<u8>,
        key: &str,
        src: View<'_>,
        crop: Crop,
        flip: bool,
        slot: Slot<'_>,
    ) -> Result<()> {
        let len = match &slot {
            Slot::U8(s) => s.len(),
            Slot::F32(s) => s.len(),
        };
        let kind_ok = matches!(
            (&slot, self.output),
            (Slot::U8(_), HostLayout::U8Nhwc) | (Slot::F32(_), HostLayout::F32Nchw { .. })
        );
        if len != self.slot_len() || !kind_ok {
            return Err(Error::Transform {
                key: key.into(),
                reason: format!(
                    "slot of {len} elements does not match the output {:?} of {} elements",
                    self.output,
                    self.slot_len()
                ),
                source: None,
            });
        }
        if !src.fits() {
            return Err(Error::Transform {
                key: key.into(),
                reason: format!(
                    "{} bytes do not hold the {}x{} window at ({}, {})",
                    src.rgb.len(),
                    src.width,
                    src.height,
                    src.x0,
                    src.y0
                ),
                source: None,
            });
        }
        let (ow, oh) = (self.width, self.height);
        let exact = crop.width == ow as f64
            && crop.height == oh as f64
            && crop.left.fract() == 0.0
            && crop.top.fract() == 0.0;
        if exact {
            // No resampling needed: read the crop straight from the pixels.
            let at = src.row(crop.top as usize) + crop.left as usize * 3;
            self.write(&src.rgb[at..], src.stride, flip, slot);
        } else if let Slot::U8(out) = slot {
            // u8 HWC is the resampler's own layout: resize straight into the slot.
            resampler.resize(&src, crop, (ow, oh), flip, out);
        } else {
            resized.resize(ow * oh * 3, 0);
            resampler.resize(&src, crop, (ow, oh), flip, resized);
            self.write(resized, ow * 3, false, slot);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_of_the_wrong_size_or_type_is_an_error() {
        let t = ImageTransform::new(Transforms::train(), HostLayout::U8Nhwc, Size::square(8), 0)
            .unwrap();
        let px = vec![0u8; 16 * 16 * 3];
        let mut small = vec![0u8; 10];
        assert!(t
            .apply_decoded("k", &px, Size::square(16), 0, 0, Slot::U8(&mut small))
            .is_err());
        let mut floats = vec![0f32; t.slot_len()];
        assert!(t
            .apply_decoded("k", &px, Size::square(16), 0, 0, Slot::F32(&mut floats))
            .is_err());
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let t = |tr, o| ImageTransform::new(tr, o, Size::square(32), 0);
        assert!(t(
            Transforms::ResizeCenterCrop { resize: 16 },
            HostLayout::U8Nhwc
        )
        .is_err());
        assert!(t(
            Transforms::RandomResizedCrop {
                scale: (0.0, 1.0),
                ratio: (1.0, 1.0),
                flip: false
            },
            HostLayout::U8Nhwc
        )
        .is_err());
        let bad = HostLayout::F32Nchw {
            mean: [0.0; 3],
            std: [1.0, 0.0, 1.0],
        };
        assert!(t(Transforms::eval(32), bad).is_err());
    }

    /// The peak signal-to-noise ratio of `a` against `b`, in dB.
    #[cfg(not(feature = "turbojpeg"))]
    fn psnr(a: &[u8], b: &[u8]) -> f64 {
        let se: f64 = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
            .sum();
        let mse = se / a.len() as f64;
        10.0 * (255.0 * 255.0 / mse.max(1e-12)).log10()
    }

    /// (With `turbojpeg`, libjpeg-turbo takes these JPEGs instead.)
    #[cfg(not(feature = "turbojpeg"))]
    #[test]
    fn window_decode_gives_the_full_decode_output() {
        // A 4:2:0 baseline JPEG (image's encoder): `apply` decodes only the
        // crop's window; `apply_decoded` resizes the full decode. A crop
        // decoded at full scale gives the same bytes; one at least twice
        // the output is decoded at 1/2, 1/4 or 1/8 scale (`dct_scale`),
        // and is close.
        let (w, h) = (403u32, 354u32);
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            let v = ((x as f32 / 9.0).sin() * 60.0 + (y as f32 / 7.0).cos() * 60.0) as i32;
            image::Rgb([(128 + v) as u8, (x % 256) as u8, (y * 3 % 256) as u8])
        });
        let mut jpeg = std::io::Cursor::new(Vec::new());
        img.write_to(&mut jpeg, image::ImageFormat::Jpeg).unwrap();
        let jpeg = jpeg.into_inner();
        let mut full = Vec::new();
        let wh = crate::decode::decode_rgb_into("t", &jpeg, &mut full).unwrap();
        let (mut windows, mut scaled) = (0, 0);
        for (transforms, size) in [(Transforms::train(), 96), (Transforms::eval(224), 224)] {
            let t =
                ImageTransform::new(transforms, HostLayout::U8Nhwc, Size::square(size), 5).unwrap();
            for index in 0..12 {
                let mut a = vec![0u8; t.slot_len()];
                let times = t.apply("t", &jpeg, 0, index, Slot::U8(&mut a)).unwrap();
                windows += usize::from(times.decoded_bytes < (w * h * 3) as u64);
                let mut b = vec![0u8; t.slot_len()];
                t.apply_decoded("t", &full[..], wh, 0, index, Slot::U8(&mut b))
                    .unwrap();
                let (crop, _) = t.params(w as usize, h as usize, 0, index);
                let k = crate::decode::dct_scale(&crop, (size, size));
                if k == 1 {
                    assert!(a == b, "{transforms:?} sample {index} differs");
                } else {
                    scaled += 1;
                    let p = psnr(&a, &b);
                    assert!(
                        p >= 30.0,
                        "{transforms:?} sample {index} at 1/{k}: PSNR {p:.1} dB"
                    );
                }
            }
        }
        assert!(windows >= 12, "only {windows} samples decoded a window");
        assert!(
            scaled >= 4,
            "only {scaled} samples decoded at a reduced scale"
        );
    }
}
