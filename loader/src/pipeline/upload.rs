//! The uploader thread: puts finished batches back in order, turns each
//! into device tensors and hands it to the epoch within the prefetch depth.

use super::direct::Inbox;
use super::epoch::{Batch, Pending};
use super::reorder::Reorder;
use super::{caught, Acks, HostBatch, Msg, Shared};
use crate::device::HostBuf;
use crate::device::On;
use crate::error::Result;
use crate::stats::trace::{Trace, LANE_UPLOAD};
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The uploader's view of the running epoch.
pub(super) struct Running {
    pub(super) gen: u64,
    pub(super) out: Option<Sender<Result<Pending>>>,
    pub(super) cancel: Arc<AtomicBool>,
    /// Batches back from the workers, waiting for their turn; `None` for
    /// one cancelled meanwhile.
    pub(super) order: Reorder<Option<Result<HostBatch>>>,
    /// `Done` messages received for this epoch.
    pub(super) received: usize,
    /// How many batches the feeder dispatched, once its `End` came: the
    /// epoch is over when `received` reaches it.
    pub(super) dispatched: Option<usize>,
    /// Where the epoch's channel goes once the `dispatched` batches are
    /// through: the rest of the epoch is a direct one ([`super::direct`]).
    pub(super) handover: Option<Arc<Inbox>>,
}

/// Gives back what a batch that will never be delivered holds: its buffer
/// (a batch that failed or was cancelled gave it back already).
pub(super) fn discard(shared: &Shared, result: Option<Result<HostBatch>>) {
    if let Some(Ok(host)) = result {
        shared.pool.release(Some(host.buf));
    }
    shared.counters.batch_dropped();
}

/// The uploader thread: reorder, upload, hand over.
pub(super) fn upload_loop(shared: &Arc<Shared>, done: &Receiver<Msg>, acks: &Acks) {
    let mut running: Option<Running> = None;
    for msg in done {
        match msg {
            Msg::Begin {
                gen,
                out,
                first,
                cancel,
            } => {
                // An epoch still running here was forgotten and then
                // cancelled: what it left is given back; its late batches
                // are discarded as they come (their generation is old).
                if let Some(old) = running.take() {
                    old.order.into_rest().for_each(|r| discard(shared, r));
                }
                running = Some(Running {
                    gen,
                    out: Some(out),
                    cancel,
                    order: Reorder::new(first),
                    received: 0,
                    dispatched: None,
                    handover: None,
                });
            }
            Msg::Done(gen, filled) => match running.as_mut() {
                Some(r) if r.gen == gen => {
                    r.received += 1;
                    r.order.push(filled.index, filled.result);
                    flush(shared, r);
                }
                _ => discard(shared, filled.result),
            },
            Msg::End { gen, dispatched } => {
                if let Some(r) = running.as_mut().filter(|r| r.gen == gen) {
                    r.dispatched = Some(dispatched);
                }
            }
            Msg::Handover {
                gen,
                dispatched,
                inbox,
            } => match running.as_mut().filter(|r| r.gen == gen) {
                Some(r) => {
                    r.dispatched = Some(dispatched);
                    r.handover = Some(inbox);
                }
                // Not this thread's epoch (it cannot happen: the feeder
                // sends the epoch's `Begin` first): the inbox must not wait.
                None => inbox.hand_over(shared, None),
            },
        }
        if let Some(mut r) = running.take_if(|r| r.dispatched == Some(r.received)) {
            match r.handover.take() {
                // Every batch before the switch went through (`flush`
                // delivers each once its turn comes): the channel goes on
                // to the direct epoch, which acknowledges it.
                Some(inbox) => inbox.hand_over(shared, r.out.take()),
                // Dropping the epoch's sender ends its channel after the
                // last batch.
                None => acks.ack(r.gen),
            }
        }
    }
}

/// Records a span on a lane when dropped.
pub(super) struct TraceSpan<'a>(&'a Trace, &'static str, u64, Instant);

impl Drop for TraceSpan<'_> {
    fn drop(&mut self) {
        self.0.record(self.1, self.2, self.3, Instant::now());
    }
}

/// Makes batch `index`'s tensors on the device and counts it uploaded
/// (or dropped, with the error). The buffer's permit is the caller's to
/// give back, with the buffer when it can be reused (`Some`: not on the
/// CPU, where the tensor took it).
pub(super) fn upload_host(
    shared: &Shared,
    index: usize,
    host: HostBatch,
    lane: u64,
) -> (Result<Pending>, Option<HostBuf>) {
    let t = Instant::now();
    let _span = shared
        .trace
        .as_ref()
        .map(|tr| TraceSpan(tr, "upload", lane, t));
    // A panic in the device step (candle's ops) is this batch's error,
    // not the end of the upload thread and the loader.
    let (buf, n) = (host.buf, host.keys.len());
    let uploaded = caught(format!("batch {index} (upload)"), || {
        shared
            .uploader
            .upload(&shared.device, buf, n, &shared.schema)
    });
    let uploaded = uploaded.and_then(|mut up| {
        for v in &shared.schema.views {
            let field = &up.fields[v.of];
            let view = field.narrow(1, v.view.start, v.view.len);
            up.fields.push(view.on("making a batch's views")?);
        }
        Ok(up)
    });
    match uploaded {
        Ok(up) => {
            shared.counters.batch_uploaded(t.elapsed());
            for (time, bytes) in shared.uploader.finished_copies() {
                shared.counters.batch_copied(time, bytes);
            }
            let pending = Pending {
                batch: Some(Batch {
                    fields: up.fields,
                    schema: shared.schema.clone(),
                    keys: host.keys,
                    indices: host.indices,
                    index,
                    skipped: host.skipped,
                    ready: up.ready,
                    after: Default::default(),
                    identity: shared.identity.clone(),
                }),
                guards: shared.uploader.guards(),
            };
            (Ok(pending), up.reusable)
        }
        Err(e) => {
            shared.counters.batch_dropped();
            (Err(e), None)
        }
    }
}

/// Hands over every batch that is next in order.
pub(super) fn flush(shared: &Shared, r: &mut Running) {
    while let Some((index, result)) = r.order.pop() {
        let live = r.out.is_some() && !r.cancel.load(Ordering::Relaxed);
        let item = match result {
            None => {
                shared.counters.batch_dropped();
                continue;
            }
            Some(Err(e)) => {
                shared.counters.batch_dropped();
                Err(e)
            }
            Some(Ok(host)) if !live => {
                shared.pool.release(Some(host.buf));
                shared.counters.batch_dropped();
                continue;
            }
            Some(Ok(host)) => {
                let (item, reusable) = upload_host(shared, index, host, LANE_UPLOAD);
                shared.pool.release(reusable);
                item
            }
        };
        if let Some(out) = &r.out {
            // Waits for a place within the prefetch depth AUTOTUNE chose
            // (never above the channel's size), or for the epoch's cancel:
            // the uploader is the channel's only sender, so a place found
            // stays free for this send. A cancelled epoch (dropped, or
            // forgotten with a full channel nobody reads) takes no more.
            let cap = out.capacity().unwrap_or(usize::MAX);
            shared.room.wait_while(|| {
                let depth = shared.knobs.prefetch.load(Ordering::Relaxed);
                out.len() >= depth.min(cap) && !r.cancel.load(Ordering::Relaxed)
            });
            let sent = out.len() < cap && out.try_send(item).is_ok();
            if !sent {
                r.out = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Output;
    use crate::pipeline::{Filled, Loader};
    use crate::source::{MemorySource, Record};
    use crossbeam_channel::bounded;
    use std::time::Duration;

    /// The uploader's protocol, message by message: batches are handed over
    /// in index order whatever order they finish in, a cancelled batch
    /// (`Done(None)`) is passed over, `End` before the last `Done` waits
    /// for it, a late batch of an older generation is given back and never
    /// delivered, and every buffer returns to the pool.
    #[test]
    fn the_uploader_reorders_skips_and_keeps_generations_apart() {
        // A broken protocol hangs (a channel that never ends): fail instead.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            uploader_protocol();
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hang: watchdog expired"),
            // A panic in the body (the harness prints it) or success.
            r => r.expect("the protocol test panicked"),
        }
    }

    fn uploader_protocol() {
        let records = (0..4)
            .map(|i| Record::encoded(format!("r{i}"), vec![1], 0))
            .collect();
        let loader = Loader::builder(MemorySource::new(records))
            .batch_size(2)
            .image_size(2)
            .output(Output::U8Nhwc)
            .workers(1)
            .batches_in_flight(8)
            .prefetch(8)
            .shard(0, 1)
            .build()
            .unwrap();
        let shared = loader.shared.clone();
        let (tx, rx) = bounded::<Msg>(64);
        let acks = Arc::new(Acks::default());
        let uploader = {
            let (shared, acks) = (shared.clone(), acks.clone());
            std::thread::spawn(move || upload_loop(&shared, &rx, &acks))
        };
        let never = AtomicBool::new(false);
        // Batch `index` of a generation, its images' bytes all `tag`, its
        // labels `tag`.
        let done = |gen: u64, index: usize, tag: u8| {
            let mut buf = shared.pool.acquire(&never).unwrap().unwrap();
            let mut regions = buf.regions(&shared.schema).unwrap();
            regions[0].fill(tag);
            for l in regions[1].chunks_exact_mut(4) {
                l.copy_from_slice(&u32::from(tag).to_ne_bytes());
            }
            drop(regions);
            let host = HostBatch {
                buf,
                keys: vec![format!("k{index}"); 2],
                indices: vec![2 * index, 2 * index + 1],
                skipped: Vec::new(),
            };
            Msg::Done(
                gen,
                Filled {
                    index,
                    result: Some(Ok(host)),
                },
            )
        };
        let begin = |gen: u64, out: Sender<Result<Pending>>| Msg::Begin {
            gen,
            out,
            first: 0,
            cancel: Arc::new(AtomicBool::new(false)),
        };
        let delivered = |rx: Receiver<Result<Pending>>| -> Vec<(usize, u8)> {
            rx.iter()
                .map(|p| {
                    let b = p.unwrap().take();
                    let images = b.images().unwrap();
                    let px = images.flatten_all().unwrap().to_vec1::<u8>().unwrap();
                    assert!(px.iter().all(|&x| x == px[0]), "batch {} torn", b.index);
                    let labels = b.labels().unwrap().to_vec1::<u32>().unwrap();
                    assert_eq!(labels, [px[0] as u32; 2]);
                    (b.index, px[0])
                })
                .collect()
        };

        // Generation 1: finished out of order, batch 1 cancelled, End
        // before the last two.
        let (out, got) = bounded(16);
        tx.send(begin(1, out)).unwrap();
        tx.send(done(1, 2, 12)).unwrap();
        tx.send(done(1, 0, 10)).unwrap();
        let none = Filled {
            index: 1,
            result: None,
        };
        tx.send(Msg::Done(1, none)).unwrap();
        tx.send(Msg::End {
            gen: 1,
            dispatched: 5,
        })
        .unwrap();
        tx.send(done(1, 4, 14)).unwrap();
        tx.send(done(1, 3, 13)).unwrap();
        // The channel ends once all five are back.
        assert_eq!(delivered(got), [(0, 10), (2, 12), (3, 13), (4, 14)]);
        acks.wait(1);

        // Generation 2 begins while generation 1's stragglers still arrive
        // (a forgotten epoch): those are given back, not delivered.
        let (out, got) = bounded(16);
        tx.send(begin(2, out)).unwrap();
        tx.send(done(1, 0, 99)).unwrap();
        tx.send(done(2, 1, 21)).unwrap();
        tx.send(done(1, 1, 98)).unwrap();
        tx.send(Msg::End {
            gen: 1,
            dispatched: 9,
        })
        .unwrap();
        tx.send(done(2, 0, 20)).unwrap();
        tx.send(Msg::End {
            gen: 2,
            dispatched: 2,
        })
        .unwrap();
        assert_eq!(delivered(got), [(0, 20), (1, 21)]);
        acks.wait(2);
        drop(tx);
        uploader.join().unwrap();
        assert_eq!(shared.pool.out(), 0, "every buffer is back in the pool");
    }
}
