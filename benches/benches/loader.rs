//! End-to-end loader throughput on 500 ImageNet-like JPEGs (~400x350, q90),
//! RandomResizedCrop 224 + flip, u8 output: the loader with 1 and 2 workers
//! against the same read+decode+transform code in a plain sequential loop
//! (parallel efficiency) and in a bare rayon `par_iter` on 2 threads with no
//! pool, queue or prefetch (the pipeline's own overhead).

use candle_wick::__bench::Slot;
use candle_wick::source::ImageFolder;
use candle_wick::Source;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

const COUNT: usize = 500;

fn bench_loader(c: &mut Criterion) {
    let dir = benches::imagenet_like(&benches::data_root(), COUNT).expect("bench dataset");
    let mut group = c.benchmark_group("loader_rrc224_u8");
    group.throughput(Throughput::Elements(COUNT as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.warm_up_time(Duration::from_secs(2));

    for workers in [1, 2] {
        let mut l = benches::rrc_u8_loader(&dir, workers);
        let mut epoch = 0;
        group.bench_function(format!("loader_workers_{workers}"), |b| {
            b.iter(|| {
                let mut n = 0;
                for batch in l.epoch(epoch) {
                    n += batch.expect("batch").len();
                }
                epoch += 1;
                assert_eq!(n, COUNT);
            })
        });
    }

    // The same per-sample work with no pool, queues or prefetch.
    let l = benches::rrc_u8_loader(&dir, 1);
    let source = ImageFolder::new(&dir).expect("bench folder");
    let transform = l.transform().expect("the built-in image map").clone();
    let mut slot = vec![0u8; transform.slot_len()];
    let mut epoch = 0;
    group.bench_function("sequential_loop", |b| {
        b.iter(|| {
            for i in 0..source.len() {
                let r = source.read(i).expect("read");
                transform
                    .apply(&r.key, &r.bytes, epoch, i, Slot::U8(&mut slot))
                    .expect("transform");
            }
            epoch += 1;
        })
    });

    let bare = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("rayon pool");
    let mut epoch = 0;
    group.bench_function("bare_par_iter_2_threads", |b| {
        b.iter(|| {
            benches::bare_par_iter(&bare, &source, &transform, epoch);
            epoch += 1;
        })
    });
    let mut epoch = 0;
    group.bench_function("bare_par_iter_into_batches", |b| {
        b.iter(|| {
            let batches = benches::bare_par_iter_into_batches(&bare, &source, &transform, epoch);
            epoch += 1;
            batches
        })
    });
    group.finish();
}

criterion_group!(benches, bench_loader);
criterion_main!(benches);
