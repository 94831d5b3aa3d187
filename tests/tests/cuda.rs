//! CUDA only (`--features cuda`, needs a GPU; run by `scripts/gpu-check.sh
//! run`). Every batch is read back through a tensor the *consumer* produced
//! on its own thread's stream and compared with the CPU loader bit for bit:
//! both candle CUDA device kinds, every output (u8, host f32, device f32,
//! bf16, f16), a stress run with large batches and a consumer that queues
//! tens of milliseconds of GPU work per batch without synchronizing, and
//! AUTOTUNE resizing the pinned pool in flight.
//!
//! `WICK_SKIP_GUARD=Pinned|Staged|Consumed|Ready|Undelivered` builds every
//! CUDA loader with that ordering guard removed (the mutation check). The
//! stress test runs with cudarc's event tracking off, so the loader's own
//! events are the only ordering (as for a user who turned tracking off):
//! without Pinned, Staged, Consumed or Ready it should then fail. The
//! Undelivered hazard needs the loader's stream to lag behind a dropped
//! epoch by the whole channel, which this test cannot force; the
//! simulated-stream model in `loader/src/device/ring.rs` covers it.

use candle_core::{DType, Device, Tensor};
use candle_wick::__test::Guard;
use candle_wick::source::{ImageFolder, SafetensorsShards};
use candle_wick::write::{SafetensorsWriter, ShardSample, ShardWriter};
use candle_wick::{BadSamples, FloatType, Loader, LoaderBuilder, NormalizeAt, Output};
use std::path::Path;
use tests::image_folder;

fn skipped_guard() -> Option<Guard> {
    let g = std::env::var("WICK_SKIP_GUARD").ok()?;
    Some(match g.as_str() {
        "Pinned" => Guard::Pinned,
        "Staged" => Guard::Staged,
        "Consumed" => Guard::Consumed,
        "Ready" => Guard::Ready,
        "Undelivered" => Guard::Undelivered,
        other => panic!("WICK_SKIP_GUARD={other:?} is not a guard"),
    })
}

fn on(b: LoaderBuilder, device: &Device) -> LoaderBuilder {
    let b = b.device(device.clone());
    match (device.is_cuda(), skipped_guard()) {
        (true, Some(g)) => b.__without_guard(g),
        _ => b,
    }
}

fn devices() -> Vec<(&'static str, Device)> {
    vec![
        ("new_cuda", Device::new_cuda(0).unwrap()),
        (
            "new_cuda_with_stream",
            Device::new_cuda_with_stream(0).unwrap(),
        ),
    ]
}

/// The consumer's own GPU op on the images: u8 -> f32 cast, f32 -> `x * 2`
/// (exact, fused or not), f16/bf16 -> f32 (exact widening).
fn consume(images: &Tensor) -> Tensor {
    match images.dtype() {
        DType::U8 => images.to_dtype(DType::F32).unwrap(),
        DType::F32 => images.affine(2.0, 0.0).unwrap(),
        _ => images.to_dtype(DType::F32).unwrap(),
    }
}

fn host(t: &Tensor) -> Vec<u32> {
    let t = t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap();
    match t.dtype() {
        DType::U32 => t.to_vec1::<u32>().unwrap(),
        _ => t
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    }
}

/// The consumer's results for a batch, made on its stream: its op on the
/// images and the labels plus one.
fn produce(b: &candle_wick::Batch) -> (Tensor, Tensor) {
    let labels = (b.labels().unwrap().to_dtype(DType::F32).unwrap() + 1.0).unwrap();
    (consume(b.images().unwrap()), labels)
}

/// A batch as the consumer saw it, read back to the host.
fn observe(b: &candle_wick::Batch) -> (Vec<u32>, Vec<u32>) {
    let (images, labels) = produce(b);
    (host(&images), host(&labels))
}

/// Every batch of epoch 1 as the consumer saw it. The results stay on the
/// device until the epoch is over (`work` runs after each batch, never
/// waited for), then are read back.
fn run(loader: Loader, work: impl Fn(&Device)) -> Vec<(Vec<u32>, Vec<u32>)> {
    run_kept(loader, work)
        .iter()
        .map(|(i, l)| (host(i), host(l)))
        .collect()
}

/// Every batch of epoch 1 as the consumer made it, left on its device
/// (as [`run`], without the read-back).
fn run_kept(mut loader: Loader, work: impl Fn(&Device)) -> Vec<(Tensor, Tensor)> {
    let mut kept = Vec::new();
    for b in loader.epoch(1) {
        let b = b.unwrap();
        let device = b.images().unwrap().device().clone();
        kept.push(produce(&b));
        drop(b);
        work(&device);
    }
    drop(loader);
    kept
}

/// The batches of `gpu` that differ from the CPU loader's `cpu` in any
/// element (or in shape), compared on the GPU: a large batch is counted
/// there and one number comes back, not 77 MB, so a mutant's run ends in
/// seconds. (Values, not bits: the every-output test checks the bits.)
fn differing(gpu: &[(Tensor, Tensor)], cpu: &[(Tensor, Tensor)]) -> Vec<usize> {
    let same = |g: &Tensor, c: &Tensor| {
        let c = c.to_device(g.device()).unwrap();
        g.dims() == c.dims()
            && g.ne(&c)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                == 0.0
    };
    (0..cpu.len().max(gpu.len()))
        .filter(|&i| match (gpu.get(i), cpu.get(i)) {
            (Some(g), Some(c)) => !(same(&g.0, &c.0) && same(&g.1, &c.1)),
            _ => true,
        })
        .collect()
}

fn folder_loader(root: &Path, output: Output) -> LoaderBuilder {
    Loader::builder(ImageFolder::new(root).unwrap())
        .batch_size(8)
        .image_size(32)
        .train_transforms()
        .shuffle(7)
        .output(output)
        .prefetch(2)
        .batches_in_flight(3)
}

#[test]
fn every_output_on_both_device_kinds_equals_the_cpu_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    image_folder(dir.path(), 4, 21);
    let (host, device) = (NormalizeAt::Host, NormalizeAt::Device);
    let imagenet = Output::imagenet();
    let cases = [
        Output::U8Nhwc,
        imagenet.normalized_at(host),
        imagenet.normalized_at(device),
        imagenet.with_dtype(FloatType::BF16).normalized_at(device),
        imagenet.with_dtype(FloatType::F16).normalized_at(device),
        imagenet.with_dtype(FloatType::BF16).normalized_at(host),
    ];
    for output in cases {
        // The CPU reference normalizes on the host: the device's fused
        // normalize must give the same bits.
        let reference = folder_loader(dir.path(), output.normalized_at(host))
            .build()
            .unwrap();
        let cpu = run(reference, |_| {});
        for (kind, device) in devices() {
            let loader = on(folder_loader(dir.path(), output), &device)
                .build()
                .unwrap();
            let gpu = run(loader, |_| {});
            assert!(gpu == cpu, "{kind} {output:?}: differs from the CPU");
        }
    }
}

/// A shard of `n` pre-decoded `size x size` images (decoding is free, so
/// batches come as fast as memory copies and the copies are long).
fn pixel_shard(dir: &Path, n: usize, size: usize) -> SafetensorsShards {
    let path = dir.join("pixels.safetensors");
    let mut w = SafetensorsWriter::create_pixels(&path, size, size).unwrap();
    let mut x = 0x9e37_79b9_u32;
    let mut img = vec![0u8; size * size * 3];
    for i in 0..n {
        for p in img.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *p = (x >> 24) as u8;
        }
        let sample = ShardSample {
            key: "",
            ext: "rgb",
            bytes: &img,
            label: (i % 1000) as u32,
        };
        w.write(sample).unwrap();
    }
    w.finish().unwrap();
    SafetensorsShards::open([path]).unwrap()
}

/// About `ms` milliseconds of queued GPU work, never waited for.
fn gpu_work(device: &Device, ms: usize) {
    let a = Tensor::ones((2048, 2048), DType::F32, device).unwrap();
    let mut b = a.clone();
    for _ in 0..ms * 3 {
        b = (b.matmul(&a).unwrap() * (1.0 / 2048.0)).unwrap();
    }
    drop(b);
}

#[test]
fn large_batches_under_a_busy_consumer_arrive_intact() {
    let dir = tempfile::tempdir().unwrap();
    let size = 224;
    let _ = pixel_shard(dir.path(), 16 * 128, size);
    let build = |device: &Device, output: Output, prefetch: usize| {
        let source = SafetensorsShards::open([dir.path().join("pixels.safetensors")]).unwrap();
        let b = Loader::builder(source)
            .batch_size(128)
            .image_size(size)
            .eval_transforms()
            .shuffle(3)
            .output(output.normalized_at(NormalizeAt::Device))
            .prefetch(prefetch)
            .batches_in_flight(3);
        on(b, device).build().unwrap()
    };
    // Fresh devices with cudarc's tracking off: only the loader's events
    // order its work against the consumer's.
    let untracked = || {
        devices()
            .into_iter()
            .map(|(kind, device)| {
                if let Device::Cuda(d) = &device {
                    // SAFETY: it only affects slices created from now on, on
                    // this test's own context object; the test's own work on
                    // them runs on one stream per thread (the consumer's),
                    // and the loader orders its work with its own events,
                    // which is what this test checks.
                    unsafe { d.disable_event_tracking() };
                }
                (kind, device)
            })
            .collect::<Vec<_>>()
    };
    for output in [Output::U8Nhwc, Output::imagenet()] {
        let cpu = {
            let b = Loader::builder(
                SafetensorsShards::open([dir.path().join("pixels.safetensors")]).unwrap(),
            )
            .batch_size(128)
            .image_size(size)
            .eval_transforms()
            .shuffle(3)
            .output(output.normalized_at(NormalizeAt::Host));
            run_kept(b.build().unwrap(), |_| {})
        };
        for (kind, device) in untracked() {
            for prefetch in 1..=3 {
                // Progress on stderr (`--nocapture`): a mutant that runs
                // out of time shows where it was.
                let t = std::time::Instant::now();
                eprintln!("large batches: {kind} {output:?} prefetch {prefetch}...");
                let gpu = run_kept(build(&device, output, prefetch), |d| gpu_work(d, 20));
                let bad = differing(&gpu, &cpu);
                eprintln!(
                    "large batches: {kind} {output:?} prefetch {prefetch}: {} of {} differ ({:.1} s)",
                    bad.len(),
                    cpu.len(),
                    t.elapsed().as_secs_f64()
                );
                assert!(
                    bad.is_empty(),
                    "{kind} {output:?} prefetch {prefetch}: batches {bad:?} of {} differ",
                    cpu.len()
                );
            }
        }
    }
}

#[test]
fn autotune_resizes_the_pool_in_flight_and_every_buffer_stays_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let _ = pixel_shard(dir.path(), 64 * 32, 64);
    let source = || SafetensorsShards::open([dir.path().join("pixels.safetensors")]).unwrap();
    let base = |b: LoaderBuilder| b.batch_size(32).image_size(64).eval_transforms().shuffle(5);
    let cpu = run(base(Loader::builder(source())).build().unwrap(), |_| {});
    for (kind, device) in devices() {
        // AUTOTUNE everywhere (the defaults); a consumer that alternates
        // between starving and busy, so the tuner grows and reverts. Every
        // buffer the pool ever makes comes from the pinned allocator, and
        // the CUDA uploader refuses any other (the batch would be an error).
        let mut loader = on(base(Loader::builder(source())), &device)
            .build()
            .unwrap();
        let mut pinned = 0;
        for epoch in 0..6 {
            let mut seen = Vec::new();
            for (i, b) in loader.epoch(1).enumerate() {
                let b = b.unwrap();
                seen.push(observe(&b));
                if (i / 8 + epoch) % 2 == 1 {
                    gpu_work(&device, 5);
                    device.synchronize().unwrap();
                }
            }
            assert!(
                seen == cpu,
                "{kind} epoch {epoch}: batches differ from the CPU"
            );
            let now = loader.stats().pinned_buffers;
            assert!(
                now >= pinned.max(2),
                "{kind}: pinned buffers went from {pinned} to {now}"
            );
            pinned = now;
        }
        let history = loader.autotune_history();
        let peak = history
            .iter()
            .map(|s| s.in_flight)
            .max()
            .unwrap_or(2)
            .max(2);
        println!(
            "{kind}: {} tuning steps, in flight {:?}, {pinned} pinned buffers",
            history.len(),
            history.iter().map(|s| s.in_flight).collect::<Vec<_>>()
        );
        assert!(
            pinned <= peak,
            "{kind}: {pinned} pinned buffers for at most {peak} in flight"
        );
    }
}

#[test]
fn skipped_samples_dropped_epochs_and_held_batches_stay_correct() {
    let dir = tempfile::tempdir().unwrap();
    let paths = image_folder(dir.path(), 3, 12);
    std::fs::write(&paths[5], b"not an image").unwrap();
    let build = |device: &Device| {
        let b = folder_loader(
            dir.path(),
            Output::imagenet().normalized_at(NormalizeAt::Host),
        )
        .bad_samples(BadSamples::Skip);
        on(b, device).build().unwrap()
    };
    let cpu = run(build(&Device::Cpu), |_| {});
    for (kind, device) in devices() {
        let mut loader = build(&device);
        // Drop an epoch after two batches, then run a whole one.
        let early: Vec<_> = loader.epoch(1).take(2).map(|b| b.unwrap()).collect();
        let full = run(loader, |_| {});
        assert!(full == cpu, "{kind}: an epoch after a dropped one differs");
        // Batches held past the loader's drop are still whole.
        let held: Vec<(Vec<u32>, Vec<u32>)> = early.iter().map(observe).collect();
        assert!(
            held[..] == cpu[..2],
            "{kind}: batches held past the loader differ"
        );
    }
}

/// A user map of every field type candle's CUDA backend computes on (u8,
/// u32, i64, bf16, f16, f32, f64, a padded f32 field with its count), with
/// skipped samples: every field on both CUDA device kinds equals the CPU's,
/// read back after consumer-side ops on the consumer's stream in the
/// field's own type (`t + t`, an affine) and after casts to f32 and f64.
/// The schema's packed regions (pinned buffer and ring slot alike) and the
/// per-field copies are what this checks. i16 and i32, which candle has no
/// CUDA kernels for, are refused at `build()` with the field's name.
#[test]
fn a_user_map_of_every_field_type_equals_the_cpu() {
    use candle_wick::fields::{Field, FieldType};
    use candle_wick::map::{map_fn, Sample};
    use candle_wick::source::{MemorySource, Record};
    let records: Vec<Record> = (0..75)
        .map(|i| Record::encoded(format!("r{i}"), vec![i as u8; 7], i as u32))
        .collect();
    let fields = vec![
        Field::new("bytes", FieldType::U8, &[7]),
        Field::new("count", FieldType::U32, &[3]),
        Field::new("id", FieldType::I64, &[]),
        Field::new("half", FieldType::BF16, &[2, 2]),
        Field::new("ieee_half", FieldType::F16, &[2]),
        Field::new("wide", FieldType::F64, &[1]),
        Field::padded("boxes", FieldType::F32, &[5, 4], -1.0),
    ];
    let build = |device: &Device, fields: Vec<Field>| {
        let map = map_fn(fields, |s: &mut Sample<'_>| {
            let i = s.index();
            if i % 11 == 3 {
                return Err(candle_wick::Error::sample(s.key(), "skipped on purpose"));
            }
            s.take::<u8>(0)?.copy_from_slice(&s.record().bytes);
            s.take::<u32>(1)?
                .copy_from_slice(&[i as u32, 7, i as u32 * 3]);
            s.take::<i64>(2)?[0] = (i as i64) << 40;
            for (k, v) in s.take::<half::bf16>(3)?.iter_mut().enumerate() {
                *v = half::bf16::from_f32(i as f32 + k as f32 / 4.0);
            }
            for (k, v) in s.take::<half::f16>(4)?.iter_mut().enumerate() {
                *v = half::f16::from_f32(i as f32 / 8.0 + k as f32);
            }
            s.take::<f64>(5)?[0] = i as f64 / 3.0;
            let n = i % 6;
            for (k, v) in s.take::<f32>(6)?[..4 * n.min(5)].iter_mut().enumerate() {
                *v = (i * 100 + k) as f32;
            }
            s.set_len(6, n.min(5))
        });
        on(Loader::builder(MemorySource::new(records.clone())), device)
            .map(map)
            .batch_size(16)
            .bad_samples(BadSamples::Skip)
            .build()
    };
    // Every field, as the consumer would use it: `t + t` and an affine in
    // its own type, then casts to f32 and f64, each read back as f64 (the
    // values are exact in every type used).
    let read = |mut loader: Loader| -> Vec<Vec<f64>> {
        let mut out = Vec::new();
        for b in loader.epoch(0) {
            let b = b.unwrap();
            for (_, t) in b.fields() {
                let twice = (t + t).unwrap().affine(0.5, 0.0).unwrap();
                for dtype in [DType::F32, DType::F64] {
                    let v = twice.to_dtype(dtype).unwrap().to_dtype(DType::F64).unwrap();
                    out.push(v.flatten_all().unwrap().to_vec1::<f64>().unwrap());
                }
            }
        }
        out
    };
    let cpu = read(build(&Device::Cpu, fields.clone()).unwrap());
    for (kind, device) in devices() {
        assert!(
            read(build(&device, fields.clone()).unwrap()) == cpu,
            "{kind}: a field differs from the CPU"
        );
        for t in [FieldType::I16, FieldType::I32] {
            let mut with = fields.clone();
            with[1] = Field::new("count", t, &[3]);
            let err = match build(&device, with) {
                Ok(_) => panic!("{kind}: a {t:?} field was accepted on CUDA"),
                Err(e) => e.to_string(),
            };
            assert!(
                err.contains("\"count\"") && err.contains("i64"),
                "{kind} {t:?}: {err}"
            );
        }
    }
}
