//! Crop, resize, flip, layout and normalize, written straight into a batch slot.

use crate::decode::decode_rgb_into;
use crate::error::{Error, Result};
use crate::resize::{Crop, Resampler, View};
use crate::rng::{keyed_rng, Purpose};
use rand::Rng;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// ImageNet's per-channel mean, on the 0..1 scale.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation, on the 0..1 scale.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The geometric transforms applied to every decoded image.
///
/// Resizing uses an antialiased bilinear (triangle) filter whose support
/// grows with the downscale factor, as PIL and torchvision (`antialias=True`)
/// do.
#[derive(Debug, Clone, Copy, PartialEq)]
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

/// The element type and layout of the batch images.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Output {
    /// `u8`, shape `[batch, height, width, 3]`, values as decoded.
    U8Nhwc,
    /// `f32`, shape `[batch, 3, height, width]`, `(v / 255 - mean[c]) / std[c]`.
    F32Nchw {
        /// Per-channel mean on the 0..1 scale.
        mean: [f32; 3],
        /// Per-channel standard deviation on the 0..1 scale.
        std: [f32; 3],
    },
}

impl Output {
    /// `f32` NCHW normalized with ImageNet's mean and std.
    pub fn imagenet() -> Self {
        Output::F32Nchw {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }
}

/// One sample's slot in a batch buffer.
#[derive(Debug)]
pub enum Slot<'a> {
    /// For [`Output::U8Nhwc`]: `height * width * 3` bytes.
    U8(&'a mut [u8]),
    /// For [`Output::F32Nchw`]: `3 * height * width` floats.
    F32(&'a mut [f32]),
}

/// Time spent on one sample, by stage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SampleTimes {
    /// Decoding the encoded bytes to RGB.
    pub decode: Duration,
    /// Crop, resize, flip, layout and normalize.
    pub transform: Duration,
    /// Bytes of the decoded RGB image (`width * height * 3`).
    pub decoded_bytes: u64,
}

/// `crop` relative to the window `win` holding it; one expression for every
/// path, so a window decode and a full decode resample alike.
fn relative(crop: Crop, win: &crate::jpeg::Window) -> Crop {
    let left = crop.left - win.x0 as f64;
    let top = crop.top - win.y0 as f64;
    Crop {
        left,
        top,
        width: crop.width.min(win.width() as f64 - left),
        height: crop.height.min(win.height() as f64 - top),
    }
}

/// The per-sample function of a loader: decode, transform, write into a slot.
///
/// It is what the decode workers run; it is public so benchmarks and tools
/// can run the exact same code outside the pipeline.
#[derive(Debug, Clone)]
pub struct ImageTransform {
    transforms: Transforms,
    output: Output,
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

/// Buffers reused across samples, so steady-state work allocates nothing
/// of its own: one per active decode worker in the loader (a
/// [`ScratchPool`]), one per thread for direct calls of
/// [`ImageTransform::apply`].
#[derive(Default)]
pub(crate) struct Scratch {
    resampler: Resampler,
    /// The decoded image.
    decoded: Vec<u8>,
    /// The resized image, for outputs that are not written by the resizer.
    resized: Vec<u8>,
    /// The window decoder's tables and planes.
    jpeg: crate::jpeg::Scratch,
    /// The byte buffer of the next record read with this scratch.
    read: Vec<u8>,
    /// The bytes this scratch held when last counted by its pool.
    counted: u64,
    /// The thread that last used it: its buffers are in that core's cache.
    last_thread: Option<std::thread::ThreadId>,
}

/// Read buffers above this size are not kept: one huge file must not pin
/// its size on every worker.
const MAX_KEPT_READ: usize = 8 << 20;

impl Scratch {
    /// The byte buffer for the next record read (empty at first); see
    /// [`crate::Source::read_reusing`].
    pub(crate) fn take_read_buffer(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.read)
    }

    /// Keeps a record's byte buffer for the next read with this scratch.
    pub(crate) fn recycle_read_buffer(&mut self, bytes: Vec<u8>) {
        if bytes.capacity() <= MAX_KEPT_READ {
            self.read = bytes;
        }
    }

    /// The heap bytes this scratch holds.
    fn bytes(&self) -> u64 {
        (self.decoded.capacity()
            + self.resized.capacity()
            + self.read.capacity()
            + self.jpeg.bytes()
            + self.resampler.bytes()) as u64
    }
}

/// The loader's decode scratch: one [`Scratch`] per sample being worked
/// on, taken after the worker gate and given back after the sample, so
/// the scratch held is the active workers' (the gate's limit), not one per
/// pool thread, and what is held is what is counted in the RAM budget.
#[derive(Default)]
pub(crate) struct ScratchPool {
    /// Scratches not in use, and how many exist (in use or not). Boxed: a
    /// set holds the JPEG decoder's tables inline, moved per sample.
    #[allow(clippy::vec_box)]
    free: Mutex<(Vec<Box<Scratch>>, usize)>,
    /// Heap bytes held by every scratch of the pool, as counted when each
    /// was last given back.
    held: AtomicU64,
    /// The most one scratch has held.
    largest: AtomicU64,
}

impl std::fmt::Debug for ScratchPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScratchPool")
            .field("held", &self.held)
            .field("largest", &self.largest)
            .finish_non_exhaustive()
    }
}

/// A scratch taken from a [`ScratchPool`]; goes back when dropped (a
/// panic in the sample included).
pub(crate) struct PooledScratch<'a> {
    pool: &'a ScratchPool,
    keep: usize,
    scratch: Option<Box<Scratch>>,
}

impl std::ops::Deref for PooledScratch<'_> {
    type Target = Scratch;
    fn deref(&self) -> &Scratch {
        self.scratch.as_deref().expect("taken until drop")
    }
}

impl std::ops::DerefMut for PooledScratch<'_> {
    fn deref_mut(&mut self) -> &mut Scratch {
        self.scratch.as_deref_mut().expect("taken until drop")
    }
}

impl Drop for PooledScratch<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.scratch.take() {
            self.pool.give_back(s, self.keep);
        }
    }
}

impl ScratchPool {
    /// A scratch for one sample; `keep` is how many the pool keeps once it
    /// is back (the gate's limit then): a surplus one, left by a lowered
    /// limit or a nested sample, is freed.
    pub(crate) fn take(&self, keep: usize) -> PooledScratch<'_> {
        let scratch = {
            let mut free = crate::lock(&self.free);
            // The set this thread used last, if free: its buffers are warm
            // in this core's cache.
            let me = Some(std::thread::current().id());
            let mine = free.0.iter().rposition(|s| s.last_thread == me);
            match mine.map(|i| free.0.swap_remove(i)).or_else(|| free.0.pop()) {
                Some(s) => s,
                None => {
                    free.1 += 1;
                    Box::default()
                }
            }
        };
        PooledScratch {
            pool: self,
            keep,
            scratch: Some(scratch),
        }
    }

    fn give_back(&self, mut s: Box<Scratch>, keep: usize) {
        let bytes = s.bytes();
        let mut free = crate::lock(&self.free);
        if free.1 > keep.max(1) {
            free.1 -= 1;
            self.held.fetch_sub(s.counted, Relaxed);
            drop(free);
            return;
        }
        self.held.fetch_add(bytes, Relaxed);
        self.held.fetch_sub(s.counted, Relaxed);
        self.largest.fetch_max(bytes, Relaxed);
        s.counted = bytes;
        s.last_thread = Some(std::thread::current().id());
        free.0.push(s);
    }

    /// Heap bytes the pool will hold with `workers` active workers: what
    /// its scratches hold now, plus the largest one's size for each worker
    /// beyond them.
    pub(crate) fn memory(&self, workers: usize) -> u64 {
        let made = crate::lock(&self.free).1;
        self.held.load(Relaxed) + self.largest.load(Relaxed) * workers.saturating_sub(made) as u64
    }

    /// How many scratches exist now.
    pub(crate) fn count(&self) -> usize {
        crate::lock(&self.free).1
    }
}

thread_local! {
    /// This thread's scratch for direct calls of [`ImageTransform::apply`]
    /// (the loader's workers use its [`ScratchPool`]).
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `(x / 255 - mean) / std` as `x * scale + bias` per channel: the one
/// place both the host's table and the device's fused normalize take their
/// coefficients from, so the two give the same bits.
pub(crate) fn normalize_coefficients(mean: [f32; 3], std: [f32; 3]) -> ([f32; 3], [f32; 3]) {
    (
        std.map(|s| 1.0 / (255.0 * s)),
        [0, 1, 2].map(|c| -mean[c] / std[c]),
    )
}

impl ImageTransform {
    /// A transform producing `height x width` images.
    pub fn new(
        transforms: Transforms,
        output: Output,
        height: usize,
        width: usize,
        seed: u64,
    ) -> Result<Self> {
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
        if let Output::F32Nchw { mean, std } = output {
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

    /// Output height and width.
    pub fn size(&self) -> (usize, usize) {
        (self.height, self.width)
    }

    /// The output format.
    pub fn output(&self) -> Output {
        self.output
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
        let Scratch {
            resampler,
            decoded,
            resized,
            jpeg,
            ..
        } = scratch;
        let t0 = Instant::now();
        #[cfg(feature = "turbojpeg")]
        if bytes.starts_with(&[0xFF, 0xD8]) {
            let params = |w, h| self.params(w, h, epoch, index);
            if let Some(r) =
                crate::decode_turbo::decode_region(bytes, decoded, self.size_wh(), params)
            {
                let t1 = Instant::now();
                let src = View::whole(decoded, r.width, r.height);
                self.resample(resampler, resized, key, src, r.crop, r.flip, slot)?;
                return Ok(SampleTimes {
                    decode: t1 - t0,
                    transform: t1.elapsed(),
                    decoded_bytes: (r.width * r.height * 3) as u64,
                });
            }
        }
        if bytes.starts_with(&[0xFF, 0xD8]) {
            let mut picked = None;
            let choose = |w, h| {
                let (crop, flip) = self.params(w, h, epoch, index);
                picked = Some((crop, flip));
                self.window(crop, w, h)
            };
            if let Some(win) = crate::jpeg::decode_window(bytes, jpeg, decoded, choose) {
                if let Some((crop, flip)) = picked {
                    let t1 = Instant::now();
                    let (rw, rh) = (win.width(), win.height());
                    let src = View::whole(decoded, rw, rh);
                    let crop = relative(crop, &win);
                    self.resample(resampler, resized, key, src, crop, flip, slot)?;
                    return Ok(SampleTimes {
                        decode: t1 - t0,
                        transform: t1.elapsed(),
                        decoded_bytes: (rw * rh * 3) as u64,
                    });
                }
            }
        }
        let (iw, ih) = decode_rgb_into(key, bytes, decoded)?;
        let t1 = Instant::now();
        self.resample_full(
            resampler,
            resized,
            key,
            decoded,
            (iw, ih),
            (epoch, index),
            slot,
        )?;
        Ok(SampleTimes {
            decode: t1 - t0,
            transform: t1.elapsed(),
            decoded_bytes: (iw * ih * 3) as u64,
        })
    }

    /// Transforms already-decoded packed RGB8 pixels (`width x height`) of
    /// sample `index` into `slot`: the same crop, resize, flip and
    /// normalization as [`apply`](Self::apply), without the decode.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_decoded(
        &self,
        key: &str,
        rgb: &[u8],
        (width, height): (usize, usize),
        epoch: u64,
        index: usize,
        slot: Slot<'_>,
    ) -> Result<()> {
        SCRATCH.with(|cell| {
            let scratch = &mut *cell.borrow_mut();
            self.apply_decoded_with(scratch, key, rgb, (width, height), epoch, index, slot)
        })
    }

    /// [`apply_decoded`](Self::apply_decoded) with the given scratch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_decoded_with(
        &self,
        scratch: &mut Scratch,
        key: &str,
        rgb: &[u8],
        (width, height): (usize, usize),
        epoch: u64,
        index: usize,
        slot: Slot<'_>,
    ) -> Result<()> {
        if width == 0 || height == 0 || rgb.len() < width * height * 3 {
            return Err(Error::Transform {
                key: key.into(),
                reason: format!(
                    "{} bytes do not hold a {width}x{height} RGB image",
                    rgb.len()
                ),
            });
        }
        let Scratch {
            resampler, resized, ..
        } = scratch;
        let wh = (width, height);
        self.resample_full(resampler, resized, key, rgb, wh, (epoch, index), slot)
    }

    /// Resamples sample `index` of `epoch` from a whole decoded image through
    /// the same window as the window decoder would have decoded, so both
    /// paths give bit-identical output.
    #[allow(clippy::too_many_arguments)]
    fn resample_full(
        &self,
        resampler: &mut Resampler,
        resized: &mut Vec<u8>,
        key: &str,
        rgb: &[u8],
        (width, height): (usize, usize),
        (epoch, index): (u64, usize),
        slot: Slot<'_>,
    ) -> Result<()> {
        let (crop, flip) = self.params(width, height, epoch, index);
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

    /// The pixels a resize of `crop` reads in a `w x h` image: the crop
    /// plus the filter's reach past its edges (the antialiased bilinear
    /// filter spans the downscale factor, at least 1 pixel, either side),
    /// so decoding only this window gives the same output as decoding all.
    fn window(&self, crop: Crop, w: usize, h: usize) -> crate::jpeg::Window {
        let reach = |len: f64, out: usize| (len / out as f64).max(1.0).ceil() + 1.0;
        let (rx, ry) = (
            reach(crop.width, self.width),
            reach(crop.height, self.height),
        );
        crate::jpeg::Window {
            x0: (crop.left - rx).floor().max(0.0) as usize,
            y0: (crop.top - ry).floor().max(0.0) as usize,
            x1: ((crop.left + crop.width + rx).ceil() as usize).min(w),
            y1: ((crop.top + crop.height + ry).ceil() as usize).min(h),
        }
    }

    /// Output width and height.
    #[cfg(feature = "turbojpeg")]
    fn size_wh(&self) -> (usize, usize) {
        (self.width, self.height)
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
            (Slot::U8(_), Output::U8Nhwc) | (Slot::F32(_), Output::F32Nchw { .. })
        );
        if len != self.slot_len() || !kind_ok {
            return Err(Error::Transform {
                key: key.into(),
                reason: format!(
                    "slot of {len} elements does not match the output {:?} of {} elements",
                    self.output,
                    self.slot_len()
                ),
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

    /// The crop window and flip for an `iw x ih` image.
    fn params(&self, iw: usize, ih: usize, epoch: u64, index: usize) -> (Crop, bool) {
        let (w, h) = (iw as f64, ih as f64);
        match self.transforms {
            Transforms::ResizeCenterCrop { resize } => {
                // torchvision: shorter side -> resize, longer side truncated.
                let (nw, nh) = if iw <= ih {
                    (resize, (resize as f64 * h / w) as usize)
                } else {
                    ((resize as f64 * w / h) as usize, resize)
                };
                let (nw, nh) = (nw.max(self.width), nh.max(self.height));
                // Python's `round`, as torchvision's `center_crop`: ties go
                // to even (an odd margin of 117 starts the crop at 58).
                let left = ((nw - self.width) as f64 / 2.0).round_ties_even();
                let top = ((nh - self.height) as f64 / 2.0).round_ties_even();
                let (sx, sy) = (w / nw as f64, h / nh as f64);
                // `min`: rounding must not push the window past the edge
                // (20x18 -> 13x12, crop 12: 1.538 + 18.46 > 20 by an ulp).
                let crop = Crop {
                    left: left * sx,
                    top: top * sy,
                    width: (self.width as f64 * sx).min(w - left * sx),
                    height: (self.height as f64 * sy).min(h - top * sy),
                };
                (crop, false)
            }
            Transforms::RandomResizedCrop { scale, ratio, flip } => {
                let mut rng = keyed_rng(self.seed, epoch, Purpose::Sample, index as u64);
                let crop = random_resized_crop(&mut rng, iw, ih, scale, ratio);
                let flipped = flip && rng.random::<f64>() < 0.5;
                (crop, flipped)
            }
        }
    }

    /// Writes an `height x width` RGB window whose rows start every `stride`
    /// bytes of `src` into `slot`, flipping and converting as configured.
    fn write(&self, src: &[u8], stride: usize, flip: bool, slot: Slot<'_>) {
        let (w, h) = (self.width, self.height);
        match slot {
            Slot::U8(out) => {
                for (y, dst) in out.chunks_exact_mut(w * 3).take(h).enumerate() {
                    let row = &src[y * stride..y * stride + w * 3];
                    if flip {
                        for (d, s) in dst.chunks_exact_mut(3).zip(row.chunks_exact(3).rev()) {
                            d.copy_from_slice(s);
                        }
                    } else {
                        dst.copy_from_slice(row);
                    }
                }
            }
            Slot::F32(out) => {
                #[cfg(target_arch = "x86_64")]
                if !flip
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: `planar_avx2` needs AVX2 and FMA, which this
                    // CPU has (detected just above).
                    return unsafe { self.planar_avx2(src, stride, out) };
                }
                let plane = w * h;
                let (r, rest) = out.split_at_mut(plane);
                let (g, b) = rest.split_at_mut(plane);
                let [l0, l1, l2] = &*self.lut;
                for y in 0..h {
                    let row = &src[y * stride..y * stride + w * 3];
                    let o = y * w;
                    let dst = r[o..o + w]
                        .iter_mut()
                        .zip(&mut g[o..o + w])
                        .zip(&mut b[o..o + w]);
                    // Two loops rather than a per-pixel branch; zipped
                    // iterators and u8-indexed tables leave no bounds checks.
                    if flip {
                        for (((r, g), b), p) in dst.zip(row.chunks_exact(3).rev()) {
                            (*r, *g, *b) =
                                (l0[p[0] as usize], l1[p[1] as usize], l2[p[2] as usize]);
                        }
                    } else {
                        for (((r, g), b), p) in dst.zip(row.chunks_exact(3)) {
                            (*r, *g, *b) =
                                (l0[p[0] as usize], l1[p[1] as usize], l2[p[2] as usize]);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl ImageTransform {
    /// The unflipped `F32` case of [`write`](Self::write), eight pixels at
    /// a time: byte shuffles split the channels, then widen, convert and
    /// one fused multiply-add per channel (the same floats as `lut`).
    #[target_feature(enable = "avx2,fma")]
    fn planar_avx2(&self, src: &[u8], stride: usize, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let (w, h) = (self.width, self.height);
        let plane = w * h;
        // Channel c of pixels 0-7: bytes c, c+3, ... of the first 16 bytes
        // (`first[c]`) and of the next 8 (`next[c]`), OR-ed together.
        #[rustfmt::skip]
        let first = [
            _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
            _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
            _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
        ];
        #[rustfmt::skip]
        let next = [
            _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, -1, -1, -1, -1, -1, -1, -1, -1),
            _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, -1, -1, -1, -1, -1, -1, -1, -1),
            _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, -1, -1, -1, -1, -1, -1, -1, -1),
        ];
        let scale = self.scale.map(|s| _mm256_set1_ps(s));
        let bias = self.bias.map(|b| _mm256_set1_ps(b));
        let lut = &*self.lut;
        let (r, rest) = out.split_at_mut(plane);
        let (g, b) = rest.split_at_mut(plane);
        let planes = [r, g, b];
        for y in 0..h {
            let row = &src[y * stride..y * stride + w * 3];
            let mut x = 0;
            while x + 8 <= w {
                let px = &row[x * 3..x * 3 + 24];
                // SAFETY: `px` is 24 bytes: 16 read at 0 and 8 at 16.
                let (a, b) = unsafe {
                    (
                        _mm_loadu_si128(px.as_ptr().cast()),
                        _mm_loadl_epi64(px.as_ptr().add(16).cast()),
                    )
                };
                for c in 0..3 {
                    let bytes =
                        _mm_or_si128(_mm_shuffle_epi8(a, first[c]), _mm_shuffle_epi8(b, next[c]));
                    let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                    let f = _mm256_fmadd_ps(v, scale[c], bias[c]);
                    let dst = &mut planes[c][y * w + x..y * w + x + 8];
                    // SAFETY: `dst` is 8 floats.
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), f) };
                }
                x += 8;
            }
            for x in x..w {
                for c in 0..3 {
                    planes[c][y * w + x] = lut[c][usize::from(row[x * 3 + c])];
                }
            }
        }
    }
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at a random area
/// and log-uniform aspect ratio, then a centre crop clamped to the ratio range.
fn random_resized_crop(
    rng: &mut impl Rng,
    iw: usize,
    ih: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
) -> Crop {
    let (w, h) = (iw as f64, ih as f64);
    let area = w * h;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * uniform(rng, scale.0, scale.1);
        let aspect = uniform(rng, lr0, lr1).exp();
        // Python's `round` (ties to even), as torchvision.
        let cw = (target * aspect).sqrt().round_ties_even() as usize;
        let ch = (target / aspect).sqrt().round_ties_even() as usize;
        if cw > 0 && cw <= iw && ch > 0 && ch <= ih {
            let top = rng.random_range(0..=ih - ch);
            let left = rng.random_range(0..=iw - cw);
            return Crop {
                left: left as f64,
                top: top as f64,
                width: cw as f64,
                height: ch as f64,
            };
        }
    }
    let in_ratio = w / h;
    let (cw, ch) = if in_ratio < ratio.0 {
        (iw, ((w / ratio.0).round_ties_even() as usize).clamp(1, ih))
    } else if in_ratio > ratio.1 {
        (((h * ratio.1).round_ties_even() as usize).clamp(1, iw), ih)
    } else {
        (iw, ih)
    };
    Crop {
        left: ((iw - cw) / 2) as f64,
        top: ((ih - ch) / 2) as f64,
        width: cw as f64,
        height: ch as f64,
    }
}

fn uniform(rng: &mut impl Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centre_crop_margins_round_as_python() {
        // torchvision: crop_top = int(round((17 - 12) / 2.0)) = 2 (ties to
        // even); it was 3.
        let t = ImageTransform::new(
            Transforms::ResizeCenterCrop { resize: 12 },
            Output::U8Nhwc,
            12,
            12,
            0,
        )
        .unwrap();
        let (crop, flip) = t.params(12, 17, 0, 0);
        assert_eq!(
            (crop.left, crop.top, crop.width, crop.height),
            (0.0, 2.0, 12.0, 12.0)
        );
        assert!(!flip);
        // 19 - 12 = 7: 3.5 goes to 4, as Python's round(3.5).
        assert_eq!(t.params(19, 12, 0, 0).0.left, 4.0);
    }

    #[test]
    fn scratch_pool_holds_one_set_per_active_worker_and_counts_it() {
        let pool = ScratchPool::default();
        {
            // Two workers at once (limit 2), each growing its buffers.
            let mut a = pool.take(2);
            let mut b = pool.take(2);
            a.decoded.reserve_exact(1000);
            b.decoded.reserve_exact(3000);
            assert_eq!(pool.count(), 2);
        }
        let largest = pool.largest.load(Relaxed);
        assert!(largest >= 3000, "the largest set is counted: {largest}");
        assert!(
            pool.memory(0) >= 4000,
            "both sets are counted: {}",
            pool.memory(0)
        );
        // A third worker would add the largest set once more.
        assert_eq!(pool.memory(3), pool.memory(0) + largest);
        // The limit drops to 1: the set given back beyond it is freed and
        // uncounted; the one kept is reused, not duplicated.
        let held = pool.memory(0);
        drop(pool.take(1));
        assert_eq!(pool.count(), 1);
        assert!(pool.memory(0) < held, "{} < {held}", pool.memory(0));
        let one = pool.memory(0);
        for _ in 0..5 {
            drop(pool.take(1));
        }
        assert_eq!((pool.count(), pool.memory(0)), (1, one));
        // A read buffer kept for the next read counts too.
        {
            let mut s = pool.take(1);
            s.recycle_read_buffer(Vec::with_capacity(5000));
        }
        assert!(pool.memory(0) >= one + 5000);
        // And goes back to no set at all only if the pool is dropped.
        assert_eq!(pool.count(), 1);
    }

    #[test]
    fn f32_rows_match_the_table() {
        // 13 wide: one 8-pixel vector step and a 5-pixel tail per row.
        let t = ImageTransform::new(Transforms::eval(13), Output::imagenet(), 4, 13, 0).unwrap();
        let stride = 13 * 3 + 5;
        let src: Vec<u8> = (0..stride * 4).map(|i| (i * 89 % 256) as u8).collect();
        let mut got = vec![0f32; t.slot_len()];
        t.write(&src, stride, false, Slot::F32(&mut got));
        for c in 0..3 {
            for y in 0..4 {
                for x in 0..13 {
                    let v = src[y * stride + x * 3 + c];
                    let want = (f32::from(v) / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
                    let got = got[c * 52 + y * 13 + x];
                    assert_eq!(got, t.lut[c][usize::from(v)], "c {c} y {y} x {x}");
                    assert!((got - want).abs() < 1e-6, "{got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn random_resized_crop_stays_inside_and_in_range() {
        let mut rng = keyed_rng(1, 0, Purpose::Sample, 0);
        for (iw, ih) in [(400, 350), (50, 500), (500, 40), (1, 1), (3, 200)] {
            for _ in 0..200 {
                let c = random_resized_crop(&mut rng, iw, ih, (0.08, 1.0), (0.75, 4.0 / 3.0));
                assert!(c.width >= 1.0 && c.height >= 1.0);
                assert!(c.left + c.width <= iw as f64 && c.top + c.height <= ih as f64);
            }
        }
    }

    #[test]
    fn eval_crop_never_leaves_the_image() {
        // Sizes whose scaled window overshot the edge by an ulp (20x18, 12).
        for size in 1..24 {
            let t = ImageTransform::new(
                Transforms::ResizeCenterCrop { resize: size },
                Output::U8Nhwc,
                size,
                size,
                0,
            )
            .unwrap();
            let mut out = vec![0u8; t.slot_len()];
            for (w, h) in [(20, 18), (18, 20), (31, 7), (7, 31), (24, 24)] {
                let px = vec![7u8; w * h * 3];
                t.apply_decoded("k", &px, (w, h), 0, 0, Slot::U8(&mut out))
                    .unwrap_or_else(|e| panic!("{w}x{h} -> {size}: {e}"));
            }
        }
    }

    #[test]
    fn a_slot_of_the_wrong_size_or_type_is_an_error() {
        let t = ImageTransform::new(Transforms::train(), Output::U8Nhwc, 8, 8, 0).unwrap();
        let px = vec![0u8; 16 * 16 * 3];
        let mut small = vec![0u8; 10];
        assert!(t
            .apply_decoded("k", &px, (16, 16), 0, 0, Slot::U8(&mut small))
            .is_err());
        let mut floats = vec![0f32; t.slot_len()];
        assert!(t
            .apply_decoded("k", &px, (16, 16), 0, 0, Slot::F32(&mut floats))
            .is_err());
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let t = |tr, o| ImageTransform::new(tr, o, 32, 32, 0);
        assert!(t(Transforms::ResizeCenterCrop { resize: 16 }, Output::U8Nhwc).is_err());
        assert!(t(
            Transforms::RandomResizedCrop {
                scale: (0.0, 1.0),
                ratio: (1.0, 1.0),
                flip: false
            },
            Output::U8Nhwc
        )
        .is_err());
        let bad = Output::F32Nchw {
            mean: [0.0; 3],
            std: [1.0, 0.0, 1.0],
        };
        assert!(t(Transforms::eval(32), bad).is_err());
    }

    /// (With `turbojpeg`, libjpeg-turbo takes these JPEGs instead.)
    #[cfg(not(feature = "turbojpeg"))]
    #[test]
    fn window_decode_gives_the_full_decode_output() {
        // A 4:2:0 baseline JPEG (image's encoder): `apply` decodes only the
        // crop's window; `apply_decoded` resizes the full decode.
        let (w, h) = (403u32, 354u32);
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            let v = ((x as f32 / 9.0).sin() * 60.0 + (y as f32 / 7.0).cos() * 60.0) as i32;
            image::Rgb([(128 + v) as u8, (x % 256) as u8, (y * 3 % 256) as u8])
        });
        let mut jpeg = std::io::Cursor::new(Vec::new());
        img.write_to(&mut jpeg, image::ImageFormat::Jpeg).unwrap();
        let jpeg = jpeg.into_inner();
        let mut full = Vec::new();
        let wh = decode_rgb_into("t", &jpeg, &mut full).unwrap();
        let mut windows = 0;
        for (transforms, size) in [(Transforms::train(), 96), (Transforms::eval(224), 224)] {
            let t = ImageTransform::new(transforms, Output::U8Nhwc, size, size, 5).unwrap();
            for index in 0..12 {
                let mut a = vec![0u8; t.slot_len()];
                let times = t.apply("t", &jpeg, 0, index, Slot::U8(&mut a)).unwrap();
                windows += usize::from(times.decoded_bytes < (w * h * 3) as u64);
                let mut b = vec![0u8; t.slot_len()];
                t.apply_decoded("t", &full[..], wh, 0, index, Slot::U8(&mut b))
                    .unwrap();
                assert!(a == b, "{transforms:?} sample {index} differs");
            }
        }
        assert!(windows >= 12, "only {windows} samples decoded a window");
    }
}
