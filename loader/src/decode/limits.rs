//! What a decoder accepts from a file before it allocates: the limits
//! against hostile headers, shared by every decoder (a leaf: decoders
//! depend on it, never on their dispatcher).

/// Largest width or height a sample may declare.
pub(crate) const MAX_SIDE: u32 = 32_768;
/// Largest decoded image, in bytes (1 GiB).
pub(crate) const MAX_ALLOC: u64 = 1 << 30;

/// Pillow's decompression-bomb limit (`Image.MAX_IMAGE_PIXELS`): the most
/// pixels a sample may declare unless the loader is built with another
/// [`max_pixels`](crate::LoaderBuilder::max_pixels).
pub(crate) const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// What one decode may take, checked against the file's header before the
/// decoder allocates anything large.
///
/// Whether an image is refused depends on the image and on fixed settings
/// only (the pixel limit and [`MAX_ALLOC`]), never on the worker count or
/// the RAM budget, which may change between runs (or, under AUTOTUNE,
/// within one) while the batches must not. The budget's share of one
/// worker, `max_bytes`, decides instead how an image is decoded: one
/// larger than the share waits for the one [`oversize`](Limits::oversize)
/// pass of the process, so at most one decode at a time goes past its
/// share, and its buffers are given back after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Most pixels (width x height).
    pub(crate) max_pixels: u64,
    /// The decoded bytes (RGB) the RAM budget grants one worker's
    /// scratch, at most [`MAX_ALLOC`].
    pub(crate) max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_pixels: DEFAULT_MAX_PIXELS,
            max_bytes: MAX_ALLOC,
        }
    }
}

/// The pass a decode larger than its worker's share holds.
static OVERSIZE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held while a decode larger than its worker's share runs; see
/// [`Limits::oversize`].
pub(crate) type Oversize = std::sync::MutexGuard<'static, ()>;

impl Limits {
    /// The image's size from its header, refused when it passes a limit.
    /// A header the probe cannot read passes: the decoder then fails with
    /// its own error naming what is wrong.
    pub(crate) fn check(&self, key: &str, bytes: &[u8]) -> crate::error::Result<()> {
        let Some((width, height)) = dimensions(bytes) else {
            return Ok(());
        };
        let pixels = u64::from(width) * u64::from(height);
        let reason = if pixels > self.max_pixels {
            format!(
                "more than the limit of {} pixels, a guard against decompression bombs \
                 (LoaderBuilder::max_pixels raises it)",
                self.max_pixels
            )
        } else if pixels * 3 > MAX_ALLOC {
            format!("its {} decoded bytes are more than {MAX_ALLOC}", pixels * 3)
        } else {
            return Ok(());
        };
        Err(crate::error::Error::ImageTooLarge {
            key: key.into(),
            width,
            height,
            reason,
        })
    }
}

impl Limits {
    /// The oversize pass, waited for, when the image's decoded bytes are
    /// more than this worker's share; `None` (at once) otherwise, or when
    /// its header cannot be read. The holder's buffers go back to the
    /// share afterwards ([`crate::transform::Scratch`]).
    pub(crate) fn oversize(&self, bytes: &[u8]) -> Option<Oversize> {
        if self.max_bytes >= MAX_ALLOC {
            return None;
        }
        let (width, height) = dimensions(bytes)?;
        let decoded = u64::from(width) * u64::from(height) * 3;
        (decoded > self.max_bytes).then(|| crate::sync::lock(&OVERSIZE))
    }
}

/// Width and height from the header (JPEG, PNG, WebP, BMP, sniffed), read
/// without decoding; `None` when the header cannot be read.
fn dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.starts_with(&[0xFF, 0xD8]) {
        return jpeg_dimensions(bytes);
    }
    image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .ok()?
        .into_dimensions()
        .ok()
}

/// What a JPEG's first frame header (SOF0-SOF15) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegFrame {
    /// The SOF marker's second byte: `0xC2`, `0xC6`, `0xCA` and `0xCE`
    /// are progressive.
    pub marker: u8,
    /// Bits per sample.
    pub precision: u8,
    /// Width.
    pub width: u16,
    /// Height.
    pub height: u16,
    /// Components: 1 gray, 3 colour, 4 CMYK or YCCK.
    pub components: u8,
}

/// A JPEG's first frame header (SOF0-SOF15, not DHT, JPG or DAC), found
/// by walking the marker segments from the start, whatever the rest of
/// the header holds: so no decoder's own header checks decide whether the
/// pixel limit applies. `None` when the bytes end first.
pub fn jpeg_frame(bytes: &[u8]) -> Option<JpegFrame> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut i = 2;
    loop {
        // Fill bytes before a marker.
        while bytes.get(i) == Some(&0xFF) && bytes.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        let (&ff, &marker) = (bytes.get(i)?, bytes.get(i + 1)?);
        if ff != 0xFF {
            return None;
        }
        if matches!(marker, 0xD0..=0xD9 | 0x01) {
            // Markers without a length.
            i += 2;
            continue;
        }
        let len = usize::from(u16::from_be_bytes([*bytes.get(i + 2)?, *bytes.get(i + 3)?]));
        if matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC) {
            let field = |at: usize| bytes.get(i + at).copied();
            return Some(JpegFrame {
                marker,
                precision: field(4)?,
                height: u16::from_be_bytes([field(5)?, field(6)?]),
                width: u16::from_be_bytes([field(7)?, field(8)?]),
                // A header cut right after the size still gives the size.
                components: field(9).unwrap_or(0),
            });
        }
        i += 2 + len;
    }
}

/// A JPEG's size from its frame header ([`jpeg_frame`]).
fn jpeg_dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    jpeg_frame(bytes).map(|f| (u32::from(f.width), u32::from(f.height)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG declaring `w x h` whose pixel data is one empty chunk: what a
    /// bomb's header says, with none of its (small, compressed) body.
    fn png_header(w: u32, h: u32) -> Vec<u8> {
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut chunk = |kind: &[u8], data: &[u8]| {
            png.extend((data.len() as u32).to_be_bytes());
            let body: Vec<u8> = kind.iter().chain(data).copied().collect();
            png.extend(&body);
            png.extend(crc32(&body).to_be_bytes());
        };
        let mut ihdr = w.to_be_bytes().to_vec();
        ihdr.extend(h.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        chunk(b"IHDR", &ihdr);
        chunk(b"IDAT", &[]);
        chunk(b"IEND", &[]);
        png
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn a_header_past_a_limit_is_refused_from_the_header_alone() {
        let limits = Limits::default();
        // Exactly Pillow's limit passes; one row more does not.
        let at = png_header(DEFAULT_MAX_PIXELS as u32, 1);
        limits.check("at.png", &at).unwrap();
        let err = limits
            .check("bomb.png", &png_header(20_000, 20_000))
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("bomb.png") && msg.contains("20000x20000"),
            "{msg}"
        );
        assert!(msg.contains("89478485 pixels"), "{msg}");
        // A worker's share decides how an image is decoded, never whether:
        // one over it passes the check, and waits for the oversize pass.
        let tight = Limits {
            max_pixels: DEFAULT_MAX_PIXELS,
            max_bytes: 1_000_000,
        };
        tight.check("small.png", &png_header(500, 600)).unwrap();
        tight.check("big.png", &png_header(1000, 1000)).unwrap();
        assert!(tight.oversize(&png_header(500, 600)).is_none());
        assert!(tight.oversize(&png_header(1000, 1000)).is_some());
        // Not an image header: left to the decoder.
        limits.check("junk", b"not an image").unwrap();
        // A JPEG frame header alone (no tables, no scan) is enough.
        let mut sof = vec![0xFF, 0xD8, 0xFF, 0xC0, 0, 17, 8];
        sof.extend(12_000u16.to_be_bytes());
        sof.extend(12_000u16.to_be_bytes());
        sof.extend([3, 1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0]);
        let msg = limits.check("b.jpg", &sof).unwrap_err().to_string();
        assert!(msg.contains("12000x12000"), "{msg}");
        assert_eq!(jpeg_dimensions(&sof[..8]), None, "cut short: no size");
    }
}
