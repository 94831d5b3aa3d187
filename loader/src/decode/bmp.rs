//! BMP variants Pillow decodes and the `image` crate's decoder refuses,
//! rewritten into a form it takes:
//!
//! - **OS/2 2.x headers** (16 to 64 bytes): their first 40 bytes are laid
//!   out as Windows' `BITMAPINFOHEADER` (a truncated one reads as zeros),
//!   and their palette entries are four bytes as Windows' are, so the
//!   header becomes a 40-byte one and the pixel offset moves with it.
//!   A header too short to count its palette gets the colours that fit
//!   before the pixels. OS/2's own compressions (Huffman 1D, RLE24) stay
//!   unsupported: the decoder's error names them.
//! - **A plane count other than 1**: the field means nothing for a bitmap
//!   (Pillow ignores it) and is set to 1.
//! - **Top-down RLE** (a negative height with RLE4 or RLE8, which the
//!   format's spec forbids and Pillow decodes): the height is made
//!   positive and the decoded rows are flipped back.

/// Header offsets in the file: the info header starts after the 14-byte
/// file header.
const INFO: usize = 14;
/// Windows' `BITMAPINFOHEADER` size.
const WINDOWS: usize = 40;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// `bytes` rewritten as the module docs say, and whether the decoded
/// rows must be flipped; `None` when the file needs none of it (or is not
/// a BMP).
pub(crate) fn normalize(bytes: &[u8]) -> Option<(Vec<u8>, bool)> {
    if !bytes.starts_with(b"BM") {
        return None;
    }
    let size = usize::try_from(u32_at(bytes, INFO)?).ok()?;
    let mut out = bytes.to_vec();
    let mut changed = false;
    // OS/2 2.x: any size from 16 to 64 but Windows' own (40, 52, 56).
    if (16..=64).contains(&size) && ![WINDOWS, 52, 56].contains(&size) {
        let body = bytes.get(INFO..INFO + size)?;
        let mut header = [0u8; WINDOWS];
        let n = size.min(WINDOWS);
        header[..n].copy_from_slice(&body[..n]);
        header[..4].copy_from_slice(&(WINDOWS as u32).to_le_bytes());
        let offset = usize::try_from(u32_at(bytes, 10)?).ok()?;
        let moved = offset.checked_sub(size)?.checked_add(WINDOWS)?;
        // A header too short to count its colours: as many as fit between
        // it and the pixels (a full palette would read into them).
        let bits = u16::from_le_bytes([header[14], header[15]]);
        if u32_at(&header, 32) == Some(0) && bits <= 8 {
            let fit = (moved.saturating_sub(INFO + WINDOWS) / 4).min(1 << bits);
            header[32..36].copy_from_slice(&(fit as u32).to_le_bytes());
        }
        out = bytes[..INFO].to_vec();
        out.extend_from_slice(&header);
        out.extend_from_slice(bytes.get(INFO + size..)?);
        out[10..14].copy_from_slice(&u32::try_from(moved).ok()?.to_le_bytes());
        changed = true;
    }
    let size = usize::try_from(u32_at(&out, INFO)?).ok()?;
    // Planes: after width and height, 16-bit fields in the 12-byte core
    // header, 32-bit ones in the others.
    let planes = if size == 12 { INFO + 8 } else { INFO + 12 };
    if out.get(planes..planes + 2)? != [1, 0] {
        out[planes..planes + 2].copy_from_slice(&1u16.to_le_bytes());
        changed = true;
    }
    let mut flip = false;
    if size >= WINDOWS {
        let height = i32::from_le_bytes(out.get(INFO + 8..INFO + 12)?.try_into().ok()?);
        let compression = u32_at(&out, INFO + 16)?;
        if height < 0 && height != i32::MIN && matches!(compression, 1 | 2) {
            out[INFO + 8..INFO + 12].copy_from_slice(&(-height).to_le_bytes());
            flip = true;
            changed = true;
        }
    }
    changed.then_some((out, flip))
}

/// Flips packed RGB8 rows of a `width`-pixel image top to bottom.
pub(crate) fn flip_rows(px: &mut [u8], width: usize) {
    let row = width * 3;
    if row == 0 {
        return;
    }
    let rows = px.len() / row;
    for y in 0..rows / 2 {
        let (top, bottom) = px.split_at_mut((rows - 1 - y) * row);
        top[y * row..(y + 1) * row].swap_with_slice(&mut bottom[..row]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_rgb_into;

    /// A BMP: the file header, `header` (its size first), a 2-colour
    /// palette (red, blue) and `pixels`.
    fn bmp(header: &[u8], pixels: &[u8]) -> Vec<u8> {
        let palette = [0, 0, 255, 0, 255, 0, 0, 0];
        let offset = 14 + header.len() + palette.len();
        let mut b = b"BM".to_vec();
        b.extend(((offset + pixels.len()) as u32).to_le_bytes());
        b.extend([0; 4]);
        b.extend((offset as u32).to_le_bytes());
        b.extend(header);
        b.extend(palette);
        b.extend(pixels);
        b
    }

    /// An info header of `size` bytes: 4x2, `planes`, 8 bits a pixel,
    /// `compression`, 2 colours.
    fn info(size: u32, height: i32, planes: u16, compression: u32) -> Vec<u8> {
        let mut h = size.to_le_bytes().to_vec();
        h.extend(4i32.to_le_bytes());
        h.extend(height.to_le_bytes());
        h.extend(planes.to_le_bytes());
        h.extend(8u16.to_le_bytes());
        h.extend(compression.to_le_bytes());
        h.extend([0; 12]);
        h.extend(2u32.to_le_bytes());
        h.extend([0; 4]);
        h.resize(size as usize, 0);
        h
    }

    const RED: [u8; 3] = [255, 0, 0];
    const BLUE: [u8; 3] = [0, 0, 255];

    /// Rows top to bottom: red red blue blue, then blue red red red.
    fn want() -> Vec<u8> {
        [RED, RED, BLUE, BLUE, BLUE, RED, RED, RED].concat()
    }

    /// The two rows as 8-bit indices, bottom-up (each 4 bytes: no padding).
    const ROWS_BOTTOM_UP: [u8; 8] = [1, 0, 0, 0, 0, 0, 1, 1];

    fn decode(b: &[u8]) -> crate::error::Result<Vec<u8>> {
        let mut px = Vec::new();
        let size = decode_rgb_into("t.bmp", b, &mut px)?;
        assert_eq!((size.width, size.height), (4, 2));
        Ok(px[..4 * 2 * 3].to_vec())
    }

    #[test]
    fn os2_headers_other_plane_counts_and_top_down_rle_decode_as_pillow_does() {
        // The plain Windows file, for reference.
        assert_eq!(
            decode(&bmp(&info(40, 2, 1, 0), &ROWS_BOTTOM_UP)).unwrap(),
            want()
        );
        // OS/2 2.x, a full 64-byte header and a truncated 16-byte one.
        for size in [64, 16] {
            let b = bmp(&info(size, 2, 1, 0), &ROWS_BOTTOM_UP);
            assert!(normalize(&b).is_some());
            assert_eq!(decode(&b).unwrap(), want(), "OS/2 header of {size} bytes");
        }
        // Three planes.
        let b = bmp(&info(40, 2, 3, 0), &ROWS_BOTTOM_UP);
        assert_eq!(decode(&b).unwrap(), want());
        // Top-down RLE8: the top row first, each row runs then end-of-line,
        // then end-of-bitmap.
        let rle = [2, 0, 2, 1, 0, 0, 1, 1, 3, 0, 0, 0, 0, 1];
        let b = bmp(&info(40, -2, 1, 1), &rle);
        assert_eq!(normalize(&b).map(|(_, flip)| flip), Some(true));
        assert_eq!(decode(&b).unwrap(), want());
        // Nothing to do for the plain file or another format.
        assert!(normalize(&bmp(&info(40, 2, 1, 0), &ROWS_BOTTOM_UP)).is_none());
        assert!(normalize(b"\x89PNG").is_none());
        // Cut short inside the header: left to the decoder's error.
        assert!(normalize(&bmp(&info(64, 2, 1, 0), &[])[..40]).is_none());
    }
}
