//! The crop geometry: torchvision's RandomResizedCrop and centre crop, the
//! flip draw, and the window of pixels a resize of the crop reads. Pure
//! arithmetic on sizes, keyed by `(seed, epoch, index)`.

use super::{ImageTransform, Transforms};
use crate::geometry::{Crop, Window};
use crate::rng::{keyed_rng, Purpose};
use rand::Rng;

impl ImageTransform {
    /// The crop window and flip for an `iw x ih` image.
    pub(super) fn params(&self, iw: usize, ih: usize, epoch: u64, index: usize) -> (Crop, bool) {
        match self.transforms {
            Transforms::ResizeCenterCrop { resize } => (
                center_crop(iw, ih, resize, (self.width, self.height)),
                false,
            ),
            Transforms::RandomResizedCrop { scale, ratio, flip } => {
                let mut rng = keyed_rng(self.seed, epoch, Purpose::Sample, index as u64);
                random_resized_crop_and_flip(&mut rng, iw, ih, scale, ratio, flip)
            }
        }
    }

    /// The pixels a resize of `crop` reads in a `w x h` image: the crop
    /// plus the filter's reach past its edges (the antialiased bilinear
    /// filter spans the downscale factor, at least 1 pixel, either side),
    /// so decoding only this window gives the same output as decoding all.
    pub(super) fn window(&self, crop: Crop, w: usize, h: usize) -> Window {
        let reach = |len: f64, out: usize| (len / out as f64).max(1.0).ceil() + 1.0;
        let (rx, ry) = (
            reach(crop.width, self.width),
            reach(crop.height, self.height),
        );
        Window {
            x0: (crop.left - rx).floor().max(0.0) as usize,
            y0: (crop.top - ry).floor().max(0.0) as usize,
            x1: ((crop.left + crop.width + rx).ceil() as usize).min(w),
            y1: ((crop.top + crop.height + ry).ceil() as usize).min(h),
        }
    }
}

/// torchvision's eval crop of an `iw x ih` image: `Resize(resize)` (the
/// shorter side to `resize`, the longer truncated) then `CenterCrop(out)`,
/// as a box of the original image's pixels.
pub(crate) fn center_crop(iw: usize, ih: usize, resize: usize, out: (usize, usize)) -> Crop {
    let (w, h) = (iw as f64, ih as f64);
    let (ow, oh) = out;
    // torchvision: shorter side -> resize, longer side truncated.
    let (nw, nh) = if iw <= ih {
        (resize, (resize as f64 * h / w) as usize)
    } else {
        ((resize as f64 * w / h) as usize, resize)
    };
    let (nw, nh) = (nw.max(ow), nh.max(oh));
    // Python's `round`, as torchvision's `center_crop`: ties go
    // to even (an odd margin of 117 starts the crop at 58).
    let left = ((nw - ow) as f64 / 2.0).round_ties_even();
    let top = ((nh - oh) as f64 / 2.0).round_ties_even();
    let (sx, sy) = (w / nw as f64, h / nh as f64);
    // `min`: rounding must not push the window past the edge
    // (20x18 -> 13x12, crop 12: 1.538 + 18.46 > 20 by an ulp).
    Crop {
        left: left * sx,
        top: top * sy,
        width: (ow as f64 * sx).min(w - left * sx),
        height: (oh as f64 * sy).min(h - top * sy),
    }
}

/// torchvision's `RandomResizedCrop(scale, ratio)` then, if `flip`,
/// `RandomHorizontalFlip(0.5)`, drawn from `rng` in that order.
pub(crate) fn random_resized_crop_and_flip(
    rng: &mut impl Rng,
    iw: usize,
    ih: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    flip: bool,
) -> (Crop, bool) {
    let crop = random_resized_crop(rng, iw, ih, scale, ratio);
    let flipped = flip && rng.random::<f64>() < 0.5;
    (crop, flipped)
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
    use crate::geometry::Size;
    use crate::layout::{HostLayout, Slot};

    #[test]
    fn centre_crop_margins_round_as_python() {
        // torchvision: crop_top = int(round((17 - 12) / 2.0)) = 2 (ties to
        // even); it was 3.
        let t = ImageTransform::new(
            Transforms::ResizeCenterCrop { resize: 12 },
            HostLayout::U8Nhwc,
            Size::square(12),
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
                HostLayout::U8Nhwc,
                Size::square(size),
                0,
            )
            .unwrap();
            let mut out = vec![0u8; t.slot_len()];
            for (w, h) in [(20, 18), (18, 20), (31, 7), (7, 31), (24, 24)] {
                let px = vec![7u8; w * h * 3];
                t.apply_decoded("k", &px, Size::new(w, h), 0, 0, Slot::U8(&mut out))
                    .unwrap_or_else(|e| panic!("{w}x{h} -> {size}: {e}"));
            }
        }
    }
}
