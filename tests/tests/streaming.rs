//! The streaming mode (interleave + shuffle buffer + shard shuffle) is
//! deterministic, covers every record once per epoch, resumes, and splits
//! shards across ranks; and `convert` writes shards that read back as the
//! source they came from.

use candle_wick::__bench::decode_rgb_into;
use candle_wick::source::{ImageFolder, SafetensorsShards, TfRecord, WebDataset};
use candle_wick::write::{convert, ConvertOptions, ShardFormat};
use candle_wick::{Loader, Output, Size, Source, Transforms};
use std::path::Path;

/// 21 images in 3 classes written as 6 TFRecord shards of up to 4 records.
fn shards(dir: &Path) -> Vec<std::path::PathBuf> {
    tests::image_folder(&dir.join("folder"), 3, 7);
    let src = ImageFolder::new(dir.join("folder")).unwrap();
    let opts = ConvertOptions {
        shard_size: 4,
        threads: 2,
        ..Default::default()
    };
    convert(&src, &dir.join("tf"), &opts, &|_| {}).unwrap()
}

/// `(indices, labels, image bytes)` of every batch of `epoch`.
fn run(
    paths: &[std::path::PathBuf],
    workers: usize,
    rank: usize,
    world: usize,
    epoch: u64,
    start: usize,
) -> Vec<(Vec<usize>, Vec<u32>, Vec<u8>)> {
    let mut loader = Loader::builder(TfRecord::open(paths).unwrap())
        .batch_size(4)
        .image_size(16)
        .transforms(Transforms::train())
        .output(Output::U8Nhwc)
        .shuffle(7)
        .interleave(2, 2)
        .shuffle_buffer(5)
        .workers(workers)
        .shard(rank, world)
        .build()
        .unwrap();
    let out = loader
        .epoch_from(epoch, start)
        .map(|b| {
            let b = b.unwrap();
            let px = tests::pixels(&b);
            let labels = tests::labels(&b);
            (b.indices, labels, px)
        })
        .collect();
    out
}

#[test]
fn stream_epochs_are_deterministic_complete_and_resumable() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path());
    assert_eq!(paths.len(), 6);
    let e1 = run(&paths, 1, 0, 1, 1, 0);
    assert_eq!(
        e1,
        run(&paths, 3, 0, 1, 1, 0),
        "same batches for any worker count"
    );
    let mut seen: Vec<usize> = e1.iter().flat_map(|b| b.0.clone()).collect();
    assert_eq!(seen.len(), 21);
    seen.sort();
    assert_eq!(seen, (0..21).collect::<Vec<_>>(), "every record once");
    let e2 = run(&paths, 2, 0, 1, 2, 0);
    assert_ne!(e1[0].0, e2[0].0, "a new order every epoch");
    assert_eq!(
        run(&paths, 2, 0, 1, 1, 3),
        e1[3..].to_vec(),
        "resume at batch 3"
    );
}

#[test]
fn stream_ranks_get_whole_disjoint_shards_and_equal_batch_counts() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path());
    let src = TfRecord::open(&paths).unwrap();
    let shard_of = |i: usize| {
        src.shards()
            .iter()
            .position(|s| (s.first..s.first + s.records).contains(&i))
            .unwrap()
    };
    for epoch in 0..3 {
        let r0 = run(&paths, 2, 0, 2, epoch, 0);
        let r1 = run(&paths, 2, 1, 2, epoch, 0);
        assert_eq!(r0.len(), r1.len(), "epoch {epoch}");
        let s0: Vec<usize> = r0
            .iter()
            .flat_map(|b| b.0.iter().map(|&i| shard_of(i)))
            .collect();
        let s1: Vec<usize> = r1
            .iter()
            .flat_map(|b| b.0.iter().map(|&i| shard_of(i)))
            .collect();
        assert!(
            s0.iter().all(|s| !s1.contains(s)),
            "epoch {epoch}: shards overlap"
        );
    }
}

#[test]
fn convert_round_trips_every_format() {
    let dir = tempfile::tempdir().unwrap();
    tests::image_folder(&dir.path().join("folder"), 2, 5);
    let src = ImageFolder::new(dir.path().join("folder")).unwrap();
    let formats = [
        ShardFormat::TfRecord,
        ShardFormat::WebDataset,
        ShardFormat::SafetensorsEncoded,
    ];
    for format in formats {
        let out = dir.path().join(format!("{format:?}"));
        let opts = ConvertOptions {
            format,
            shard_size: 3,
            ..Default::default()
        };
        let paths = convert(&src, &out, &opts, &|_| {}).unwrap();
        assert_eq!(paths.len(), 4);
        let back: Box<dyn Source> = match format {
            ShardFormat::TfRecord => Box::new(TfRecord::open(&paths).unwrap()),
            ShardFormat::WebDataset => Box::new(WebDataset::open(&paths).unwrap()),
            _ => Box::new(SafetensorsShards::open(&paths).unwrap()),
        };
        assert_eq!(back.len(), 10);
        for i in 0..10 {
            let (a, b) = (src.read(i).unwrap(), back.read(i).unwrap());
            assert_eq!(
                (&a.bytes, a.label),
                (&b.bytes, b.label),
                "{format:?} #{i}: bytes copied as-is"
            );
        }
    }
    // Pre-resized: longer side at most 20, aspect ratio kept.
    let opts = ConvertOptions {
        format: ShardFormat::TfRecord,
        max_side: Some(20),
        ..Default::default()
    };
    let paths = convert(&src, &dir.path().join("small"), &opts, &|_| {}).unwrap();
    let small = TfRecord::open(&paths).unwrap();
    let mut px = Vec::new();
    for i in 0..10 {
        let (a, b) = (src.read(i).unwrap(), small.read(i).unwrap());
        let Size {
            width: w0,
            height: h0,
        } = decode_rgb_into(&a.key, &a.bytes, &mut px).unwrap();
        let Size {
            width: w1,
            height: h1,
        } = decode_rgb_into(&b.key, &b.bytes, &mut px).unwrap();
        let s = 20.0 / w0.max(h0) as f64;
        let want = (
            (w0 as f64 * s).round() as usize,
            (h0 as f64 * s).round() as usize,
        );
        assert_eq!((w1, h1), want, "#{i}: {w0}x{h0}");
        assert_eq!(a.label, b.label);
    }
    // Pixels: fixed squares, no decode on read.
    let opts = ConvertOptions {
        format: ShardFormat::SafetensorsPixels { size: 16 },
        ..Default::default()
    };
    let paths = convert(&src, &dir.path().join("px"), &opts, &|_| {}).unwrap();
    let px_src = SafetensorsShards::open(&paths).unwrap();
    let r = px_src.read(4).unwrap();
    assert_eq!(
        (r.rgb_size, r.bytes.len(), r.label),
        (
            Some(Size::new(16, 16)),
            16 * 16 * 3,
            src.read(4).unwrap().label
        )
    );
}

/// Four shards of 25 records that count their reads.
struct CountingShards {
    shards: Vec<candle_wick::source::ShardInfo>,
    reads: std::sync::atomic::AtomicUsize,
}

impl Source for CountingShards {
    fn len(&self) -> usize {
        100
    }

    fn read(&self, index: usize) -> candle_wick::Result<candle_wick::source::Record> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(candle_wick::source::Record::encoded(
            format!("#{index}"),
            Vec::new(),
            index as u32,
        ))
    }

    fn shards(&self) -> &[candle_wick::source::ShardInfo] {
        &self.shards
    }
}

/// A streamed epoch resumed at batch `start` reads only the records of the
/// batches it delivers (the shuffle buffer's replay before the resume
/// point reads nothing), and delivers exactly the uninterrupted epoch's
/// rest. The records before the point were all read again before.
#[test]
fn a_resumed_stream_reads_only_what_it_delivers() {
    use candle_wick::fields::{Field, FieldType};
    use candle_wick::map::{map_fn, Sample};
    let source = std::sync::Arc::new(CountingShards {
        shards: tests::fake_shards(4, 25),
        reads: Default::default(),
    });
    let loader = || {
        let map = map_fn(
            vec![Field::new("i", FieldType::U32, &[1])],
            |s: &mut Sample<'_>| {
                let label = s.record().label;
                s.take::<u32>(0)?.copy_from_slice(&[label]);
                Ok(())
            },
        );
        Loader::builder(source.clone())
            .map(map)
            .batch_size(5)
            .shuffle(3)
            .interleave(2, 3)
            .shuffle_buffer(16)
            .workers(1)
            .build()
            .unwrap()
    };
    let reads = || source.reads.load(std::sync::atomic::Ordering::Relaxed);
    let whole: Vec<Vec<usize>> = loader().epoch(2).map(|b| b.unwrap().indices).collect();
    assert_eq!(whole.len(), 20);
    let before = reads();
    let rest: Vec<Vec<usize>> = loader()
        .epoch_from(2, 12)
        .map(|b| b.unwrap().indices)
        .collect();
    assert_eq!(rest, whole[12..], "the uninterrupted epoch's rest");
    assert_eq!(
        reads() - before,
        8 * 5,
        "a resume at batch 12 of 20 reads the 40 records it delivers"
    );
}
