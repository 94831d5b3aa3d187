//! `cache()` / `cache_to()`: samples kept after their first read, in memory
//! within the RAM budget or in a file, so later epochs skip the read (and,
//! for decoded samples, the decode). Augmentation runs after the cache, so
//! every epoch still draws new crops.

use crate::contract::Record;
use crate::error::{Error, Result};
use crate::geometry::Size;
use crate::storage::local::read_exact_at;
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
    /// Bytes in the cache file, with their CRC-32C: a disk that returns
    /// other bytes is caught, and the sample read from its source instead.
    Disk {
        offset: u64,
        len: u64,
        crc: u32,
    },
}

#[derive(Debug)]
struct Entry {
    payload: Payload,
    /// The key the read gave (a source's `key()` may name it otherwise).
    key: Box<str>,
    label: u32,
    rgb_size: Option<Size>,
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

    /// The cached sample `index`, with the key its read gave. An error (a
    /// cache file that cannot be read back, or gives other bytes) is for
    /// the caller to fall back on the source.
    pub(crate) fn get(&self, index: usize) -> Option<Result<Record>> {
        let e = self.entries.get(index)?.get()?;
        let bytes = match &e.payload {
            Payload::Memory(b) => Ok(b.to_vec()),
            Payload::Disk { offset, len, crc } => {
                let d = self.disk.as_ref().expect("disk entries need a disk cache");
                let mut buf = vec![0; *len as usize];
                read_exact_at(&d.reader, &d.path, *offset, &mut buf).and_then(|()| {
                    if crc32c::crc32c(&buf) == *crc {
                        Ok(buf)
                    } else {
                        Err(Error::Shard {
                            path: d.path.clone(),
                            offset: *offset,
                            reason: format!(
                                "cache entry of sample {index} ({len} bytes) fails its CRC"
                            ),
                            source: None,
                        })
                    }
                })
            }
        };
        Some(bytes.map(|bytes| Record {
            key: e.key.to_string(),
            bytes,
            label: e.label,
            rgb_size: e.rgb_size,
            parts: Vec::new(),
        }))
    }

    /// Keeps sample `index` if `fits(bytes held after)` allows (memory) or
    /// the file takes it (disk). What does not fit stays uncached: nothing
    /// is evicted. Returns whether it was stored.
    pub(crate) fn put(&self, index: usize, r: &Record, fits: impl Fn(u64) -> bool) -> bool {
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
                // Reserved before the copy: concurrent puts cannot all pass
                // the check and overshoot the budget together.
                let mut held = self.bytes.load(Relaxed);
                loop {
                    if !fits(held + len) {
                        self.full.store(true, Relaxed);
                        return false;
                    }
                    match self
                        .bytes
                        .compare_exchange_weak(held, held + len, Relaxed, Relaxed)
                    {
                        Ok(_) => break,
                        Err(now) => held = now,
                    }
                }
                Payload::Memory(r.bytes.clone().into_boxed_slice())
            }
            Some(d) => {
                let mut w = crate::sync::lock(&d.writer);
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
                    crc: crc32c::crc32c(&r.bytes),
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
        match (&self.disk, stored) {
            (Some(_), true) => {
                self.bytes.fetch_add(len, Relaxed);
            }
            // Another worker stored it first: give the reservation back.
            (None, false) => {
                self.bytes.fetch_sub(len, Relaxed);
            }
            _ => {}
        }
        stored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_puts_stay_within_the_budget() {
        // 8 workers storing 64 KB records at once under a 1 MB budget: the
        // check and the count are one step, so no two pass it together.
        for round in 0..20 {
            let cache = Cache::new(CacheMode::Encoded, 256, None).unwrap();
            let budget = 1 << 20;
            let go = std::sync::Barrier::new(8);
            std::thread::scope(|s| {
                for t in 0..8 {
                    let (cache, go) = (&cache, &go);
                    s.spawn(move || {
                        let r = Record::encoded(format!("r{t}"), vec![t as u8; 64 << 10], 0);
                        go.wait();
                        for i in (t..256).step_by(8) {
                            cache.put(i, &r, |after| after <= budget);
                        }
                    });
                }
            });
            assert!(
                cache.memory() <= budget,
                "round {round}: {}",
                cache.memory()
            );
            let stored = cache.entries.iter().filter(|e| e.get().is_some()).count() as u64;
            assert_eq!(cache.memory(), stored * ((64 << 10) + 2), "round {round}");
        }
    }
}
