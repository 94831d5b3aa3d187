//! An in-memory timeline of the pipeline's stages, written as a Chrome
//! trace (`chrome://tracing`, <https://ui.perfetto.dev>).

use crate::error::{Error, Result};
use std::borrow::Cow;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// Events kept at most (about 48 MB, counted in the loader's memory);
/// later ones are counted, not stored.
const MAX_EVENTS: usize = 1_000_000;

/// Thread lanes of the timeline.
pub(crate) const LANE_FEED: u64 = 1;
pub(crate) const LANE_UPLOAD: u64 = 2;
/// The training loop's lane: its waits, and spans added with
/// [`Trace::span`].
pub(crate) const LANE_CONSUMER: u64 = 3;
/// Decode worker `i` is lane `LANE_DECODE + i`.
pub(crate) const LANE_DECODE: u64 = 10;

#[derive(Debug, Clone)]
struct Event {
    /// The loader's own span names are static: no allocation per event.
    name: Cow<'static, str>,
    lane: u64,
    start_us: f64,
    dur_us: f64,
}

/// A recorder of timed spans, shared by the loader's threads and the
/// training loop (see [`crate::LoaderBuilder::trace`]).
#[derive(Debug)]
pub struct Trace {
    origin: Instant,
    /// The events, how many were dropped, and the bytes of owned names.
    events: Mutex<(Vec<Event>, u64, u64)>,
}

impl Trace {
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
            events: Mutex::new((Vec::new(), 0, 0)),
        }
    }

    pub(crate) fn record(
        &self,
        name: impl Into<Cow<'static, str>>,
        lane: u64,
        start: Instant,
        end: Instant,
    ) {
        let to_us = |t: Instant| t.saturating_duration_since(self.origin).as_secs_f64() * 1e6;
        let mut ev = crate::sync::lock(&self.events);
        if ev.0.len() < MAX_EVENTS {
            let name = name.into();
            if let Cow::Owned(s) = &name {
                ev.2 += s.capacity() as u64;
            }
            ev.0.push(Event {
                name,
                lane,
                start_us: to_us(start),
                dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
            });
        } else {
            ev.1 += 1;
        }
    }

    /// Adds a span of the training loop (a step, an evaluation) to the
    /// timeline, on the same lane as its waits for batches.
    pub fn span(&self, name: &str, start: Instant, end: Instant) {
        self.record(name.to_string(), LANE_CONSUMER, start, end);
    }

    /// Bytes the timeline holds (counted in the loader's RAM budget).
    pub(crate) fn memory(&self) -> u64 {
        let ev = crate::sync::lock(&self.events);
        (ev.0.capacity() * std::mem::size_of::<Event>()) as u64 + ev.2
    }

    /// Writes the timeline as Chrome trace JSON.
    pub fn write_chrome_json(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        // A copy, so the loader's threads go on recording while it is written.
        let ev = crate::sync::lock(&self.events).clone();
        let mut lanes: Vec<u64> = ev.0.iter().map(|e| e.lane).collect();
        lanes.sort_unstable();
        lanes.dedup();
        let lane_name = |l: u64| match l {
            LANE_FEED => "wick-feed".to_string(),
            LANE_UPLOAD => "wick-upload".to_string(),
            LANE_CONSUMER => "training loop".to_string(),
            l => format!("wick-decode-{}", l - LANE_DECODE),
        };
        let mut out: Vec<serde_json::Value> = lanes
            .iter()
            .map(|&l| {
                serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": l,
                                   "args": {"name": lane_name(l)}})
            })
            .collect();
        out.extend(ev.0.iter().map(|e| {
            serde_json::json!({"name": e.name, "ph": "X", "pid": 1, "tid": e.lane,
                               "ts": e.start_us, "dur": e.dur_us})
        }));
        let doc = serde_json::json!({"traceEvents": out, "otherData": {"dropped_events": ev.1}});
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        serde_json::to_writer(std::io::BufWriter::new(file), &doc).map_err(|e| io(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bytes_count_events_and_owned_names() {
        let t = Trace::new();
        assert_eq!(t.memory(), 0);
        let now = Instant::now();
        t.record("upload", LANE_UPLOAD, now, now);
        let one = t.memory();
        assert!(one >= std::mem::size_of::<Event>() as u64);
        t.span("a user step name", now, now);
        let ev = crate::sync::lock(&t.events);
        assert!(ev.2 >= "a user step name".len() as u64, "owned names count");
        drop(ev);
        assert!(t.memory() >= one + "a user step name".len() as u64);
    }
}
