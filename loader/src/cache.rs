//! `cache()` / `cache_to()`: samples kept after their first read, in memory
//! within the RAM budget or in a file, so later epochs skip the read (and,
//! for decoded samples, the decode). Augmentation runs after the cache, so
//! every epoch still draws new crops.

use crate::error::{Error, Result};
use crate::source::{read_exact_at, Record};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// What [`crate::LoaderBuilder::cache`] keeps of each sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheMode {
    /// The encoded bytes as the source gave them: saves the read (slow or
    /// remote storage), costs the file size.
    Encoded,
    /// The decoded RGB pixels, before any augmentation: saves the read and
    /// the decode, costs `width * height * 3` bytes per sample. Batches are
    /// bit-identical to an uncached run (which decodes JPEGs crop-window
    /// only, resampling through the same window) in every build, so which
    /// samples fit a partly filled cache changes speed, never pixels: a
    /// JPEG whose full decode could differ from the uncached crop-window
    /// decode is kept encoded instead (one wick's decoder cannot decode
    /// whole, e.g. damaged below the crop; every JPEG with the `turbojpeg`
    /// feature, whose crop decode rounds differently).
    Decoded,
}

#[derive(Debug)]
enum Payload {
    Memory(Box<[u8]>),
    Disk { offset: u64, len: u64 },
}

#[derive(Debug)]
struct Entry {
    payload: Payload,
    /// The key the read gave (a source's `key()` may name it otherwise).
    key: Box<str>,
    label: u32,
    rgb_size: Option<(usize, usize)>,
}

#[derive(Debug)]
struct Disk {
    path: PathBuf,
    writer: Mutex<(File, u64)>,
    reader: File,
}

/// The cache of one loader.
#[derive(Debug)]
pub(crate) struct Cache {
    pub(crate) mode: CacheMode,
    entries: Vec<OnceLock<Entry>>,
    disk: Option<Disk>,
    bytes: AtomicU64,
    full: AtomicBool,
}

impl Cache {
    /// A cache for `len` samples, in memory or in the file `path` (created
    /// anew; the loader owns it while it runs).
    pub(crate) fn new(mode: CacheMode, len: usize, path: Option<&Path>) -> Result<Self> {
        let disk = match path {
            None => None,
            Some(p) => {
                let io = |source| Error::Io {
                    path: p.to_path_buf(),
                    source,
                };
                let file = File::create(p).map_err(io)?;
                let reader = File::open(p).map_err(io)?;
                Some(Disk {
                    path: p.to_path_buf(),
                    writer: Mutex::new((file, 0)),
                    reader,
                })
            }
        };
        Ok(Self {
            mode,
            entries: (0..len).map(|_| OnceLock::new()).collect(),
            disk,
            bytes: AtomicU64::new(0),
            full: AtomicBool::new(false),
        })
    }

    /// Bytes of memory the cache holds (0 for a disk cache).
    pub(crate) fn memory(&self) -> u64 {
        if self.disk.is_some() {
            0
        } else {
            self.bytes.load(Relaxed)
        }
    }

    /// The cached sample `index`, with the key its read gave.
    pub(crate) fn get(&self, index: usize) -> Option<Result<Record>> {
        let e = self.entries.get(index)?.get()?;
        let bytes = match &e.payload {
            Payload::Memory(b) => Ok(b.to_vec()),
            Payload::Disk { offset, len } => {
                let d = self.disk.as_ref().expect("disk entries need a disk cache");
                let mut buf = vec![0; *len as usize];
                read_exact_at(&d.reader, &d.path, *offset, &mut buf).map(|()| buf)
            }
        };
        Some(bytes.map(|bytes| Record {
            key: e.key.to_string(),
            bytes,
            label: e.label,
            rgb_size: e.rgb_size,
        }))
    }

    /// Keeps sample `index` if `fits(bytes held after)` allows (memory) or
    /// the file takes it (disk). What does not fit stays uncached: nothing
    /// is evicted. Returns whether it was stored.
    pub(crate) fn put(&self, index: usize, r: &Record, fits: impl FnOnce(u64) -> bool) -> bool {
        let Some(slot) = self.entries.get(index) else {
            return false;
        };
        if slot.get().is_some() || self.full.load(Relaxed) {
            return false;
        }
        // The key is held in memory in both modes; it counts with the pixels.
        let len = (r.bytes.len() + r.key.len()) as u64;
        let payload = match &self.disk {
            None => {
                let after = self.bytes.load(Relaxed) + len;
                if !fits(after) {
                    self.full.store(true, Relaxed);
                    return false;
                }
                Payload::Memory(r.bytes.clone().into_boxed_slice())
            }
            Some(d) => {
                let mut w = crate::lock(&d.writer);
                let offset = w.1;
                if w.0.write_all(&r.bytes).and_then(|()| w.0.flush()).is_err() {
                    // A full or failing disk: stop caching, keep reading the source.
                    self.full.store(true, Relaxed);
                    return false;
                }
                let on_disk = r.bytes.len() as u64;
                w.1 += on_disk;
                Payload::Disk {
                    offset,
                    len: on_disk,
                }
            }
        };
        let stored = slot
            .set(Entry {
                payload,
                key: r.key.as_str().into(),
                label: r.label,
                rgb_size: r.rgb_size,
            })
            .is_ok();
        if stored {
            self.bytes.fetch_add(len, Relaxed);
        }
        stored
    }
}
