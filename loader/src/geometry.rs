//! Pixel boxes shared by the decoders and the transforms: the crop a
//! transform asks for, and the window of pixels a decoder produces (a leaf,
//! so neither depends on the other), and the one size type of the API.

/// A width and a height in pixels: the one size type of wick's API (no
/// bare tuple whose order a reader has to remember).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Size {
    /// Pixels across.
    pub width: usize,
    /// Pixels down.
    pub height: usize,
}

impl Size {
    /// `width x height`.
    pub const fn new(width: usize, height: usize) -> Self {
        Self { width, height }
    }

    /// `side x side`.
    pub const fn square(side: usize) -> Self {
        Self::new(side, side)
    }

    /// `width * height`.
    pub const fn area(&self) -> usize {
        self.width * self.height
    }
}

impl From<usize> for Size {
    /// A square.
    fn from(side: usize) -> Self {
        Self::square(side)
    }
}

/// A box of an image in pixels, fractional (the eval path's scaled centre
/// crop): what a resize reads ([`crate::ops`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crop {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
}

impl Crop {
    /// The whole of a `width x height` image.
    pub fn whole(width: usize, height: usize) -> Self {
        Crop {
            left: 0.0,
            top: 0.0,
            width: width as f64,
            height: height as f64,
        }
    }
}

/// A window of image pixels: columns `x0..x1`, rows `y0..y1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) x0: usize,
    pub(crate) y0: usize,
    pub(crate) x1: usize,
    pub(crate) y1: usize,
}

impl Window {
    #[inline]
    pub(crate) fn width(&self) -> usize {
        self.x1 - self.x0
    }
    #[inline]
    pub(crate) fn height(&self) -> usize {
        self.y1 - self.y0
    }
}

/// `crop` relative to the window `win` holding it; one expression for every
/// path, so a window decode and a full decode resample alike.
#[inline]
pub(crate) fn relative(crop: Crop, win: &Window) -> Crop {
    let left = crop.left - win.x0 as f64;
    let top = crop.top - win.y0 as f64;
    Crop {
        left,
        top,
        width: crop.width.min(win.width() as f64 - left),
        height: crop.height.min(win.height() as f64 - top),
    }
}
