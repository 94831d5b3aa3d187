//! Exact resume: a loader stopped at any batch and rebuilt from its saved
//! state (through JSON, with another worker count and prefetch depth)
//! yields exactly the batches the uninterrupted run yields from there, for
//! every source kind: in the random-access mode (an image folder and a
//! file list with random crops, TFRecord, WebDataset and safetensors
//! shards, random token windows, memory records through a user map that
//! draws from its random stream) and the streaming mode (TFRecord,
//! WebDataset and safetensors shards through interleave + shuffle
//! buffer); a state saved by a loader with another source or other
//! settings is refused, naming what differs.

use candle_core::DType;
use candle_wick::fields::{Field, FieldType};
use candle_wick::map::TokenWindowsMap;
use candle_wick::map::{map_fn, Sample};
use candle_wick::source::{
    FileList, ImageFolder, MemorySource, Record, SafetensorsShards, TfRecord, TokenFile,
    TokenSource, WebDataset, WindowOrder,
};
use candle_wick::write::{convert, ConvertOptions, ShardFormat};
use candle_wick::{Error, Loader, LoaderBuilder, LoaderState, Output, Transforms};
use std::path::{Path, PathBuf};

/// Epochs every run covers.
const EPOCHS: u64 = 2;

/// One delivered batch: its epoch position, source indices and every
/// field's values (as f64 bits), so equal signatures are equal batches.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    epoch: u64,
    index: usize,
    indices: Vec<usize>,
    values: Vec<u64>,
}

fn seen(epoch: u64, b: &candle_wick::Batch) -> Seen {
    let values = b
        .fields()
        .flat_map(|(_, t)| {
            t.flatten_all()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        })
        .map(f64::to_bits)
        .collect();
    Seen {
        epoch,
        index: b.index,
        indices: b.indices.clone(),
        values,
    }
}

/// Everything `loader` yields from its position to the end of epoch
/// `EPOCHS - 1`, through `next_epoch`; stops after `limit` batches,
/// returning the state `Batch::state` gave for the last one.
fn take(loader: &mut Loader, limit: usize) -> (Vec<Seen>, Option<LoaderState>) {
    let mut out = Vec::new();
    let mut last = None;
    while loader.state().epoch < EPOCHS && out.len() < limit {
        let epoch = loader.state().epoch;
        let mut batches = loader.next_epoch();
        while out.len() < limit {
            let Some(b) = batches.next() else { break };
            let b = b.unwrap();
            out.push(seen(epoch, &b));
            last = Some(b.state());
        }
    }
    (out, last)
}

/// For `cuts` cut points drawn from `seed`: a run cut there and resumed in
/// a new loader (another worker count and prefetch depth, the state
/// through JSON) yields the uninterrupted run's batches.
fn resumes_exactly(name: &str, make: impl Fn(usize, usize) -> LoaderBuilder, seed: u64) {
    let mut full = make(2, 2).build().unwrap();
    let (reference, _) = take(&mut full, usize::MAX);
    assert_eq!(
        full.state().epoch,
        EPOCHS,
        "{name}: the full run ends past the last epoch"
    );
    assert!(reference.len() >= 6, "{name}: too few batches to cut");
    drop(full);
    let mut rng = seed;
    let mut next = |n: usize| {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (rng >> 33) as usize % n
    };
    // The first batch, the last, and random ones between.
    let mut cuts = vec![0, reference.len() - 1];
    cuts.extend((0..3).map(|_| next(reference.len())));
    for cut in cuts {
        let (w1, p1, w2, p2) = (1 + next(4), 1 + next(3), 1 + next(4), 1 + next(3));
        let mut first = make(w1, p1).build().unwrap();
        let (before, via_batch) = take(&mut first, cut);
        // The loader's state after the epoch was dropped mid-way, and the
        // last batch's own state, agree.
        let state = first.state();
        if let Some(b) = via_batch {
            assert_eq!(b, state, "{name}: Batch::state and Loader::state at {cut}");
        }
        drop(first);
        let json = serde_json::to_string(&state).unwrap();
        let state: LoaderState = serde_json::from_str(&json).unwrap();
        let mut second = make(w2, p2).resume(state).build().unwrap();
        let (after, _) = take(&mut second, usize::MAX);
        let mut joined = before;
        joined.extend(after);
        assert!(
            joined == reference,
            "{name}: cut after {cut} batches ({w1} workers, prefetch {p1} -> {w2} workers, \
             prefetch {p2}): the resumed run differs from the uninterrupted one"
        );
    }
}

/// 21 images in 3 classes.
fn folder(dir: &Path) -> PathBuf {
    let root = dir.join("folder");
    if !root.exists() {
        tests::image_folder(&root, 3, 7);
    }
    root
}

fn images(src: impl candle_wick::Source, workers: usize, prefetch: usize) -> LoaderBuilder {
    Loader::builder(src)
        .batch_size(4)
        .image_size(16)
        .transforms(Transforms::train())
        .output(Output::U8Nhwc)
        .shuffle(7)
        .workers(workers)
        .prefetch(prefetch)
}

fn shards(dir: &Path, format: ShardFormat) -> Vec<PathBuf> {
    let src = ImageFolder::new(folder(dir)).unwrap();
    let out = dir.join(format!("{format:?}"));
    let opts = ConvertOptions {
        format,
        shard_size: 4,
        threads: 2,
        ..Default::default()
    };
    convert(&src, &out, &opts, &|_| {}).unwrap()
}

#[test]
fn an_image_folder_resumes_exactly_at_any_batch() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path());
    resumes_exactly(
        "image folder",
        |w, p| images(ImageFolder::new(&root).unwrap(), w, p),
        1,
    );
}

#[test]
fn random_token_windows_resume_exactly_at_any_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    let tokens: Vec<u8> = (0..3000u32)
        .flat_map(|i| ((i * 7919 % 50_000) as u16).to_le_bytes())
        .collect();
    std::fs::write(&path, tokens).unwrap();
    let src = TokenSource::new(
        vec![TokenFile::open(&path).unwrap()],
        32,
        WindowOrder::Random,
    )
    .unwrap();
    resumes_exactly(
        "token windows",
        |w, p| {
            Loader::builder(src.clone())
                .map(TokenWindowsMap::new(&src))
                .batch_size(5)
                .shuffle(3)
                .workers(w)
                .prefetch(p)
        },
        2,
    );
}

#[test]
fn streamed_tfrecord_shards_resume_exactly_at_any_batch() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path(), ShardFormat::TfRecord);
    resumes_exactly(
        "tfrecord stream",
        |w, p| {
            images(TfRecord::open(&paths).unwrap(), w, p)
                .interleave(2, 2)
                .shuffle_buffer(5)
        },
        3,
    );
}

#[test]
fn streamed_webdataset_shards_resume_exactly_at_any_batch() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path(), ShardFormat::WebDataset);
    resumes_exactly(
        "webdataset stream",
        |w, p| {
            images(WebDataset::open(&paths).unwrap(), w, p)
                .interleave(3, 1)
                .shuffle_buffer(6)
        },
        4,
    );
}

#[test]
fn a_file_list_resumes_exactly_at_any_batch() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path());
    let mut csv = String::from("path,label\n");
    for (i, p) in tests::image_folder(&root, 3, 7).iter().enumerate() {
        csv.push_str(&format!("{},{}\n", p.display(), i % 3));
    }
    let list = dir.path().join("train.csv");
    std::fs::write(&list, csv).unwrap();
    resumes_exactly(
        "file list",
        |w, p| images(FileList::new(&list).unwrap(), w, p),
        5,
    );
}

#[test]
fn shards_read_at_random_resume_exactly_at_any_batch() {
    let dir = tempfile::tempdir().unwrap();
    let tf = shards(dir.path(), ShardFormat::TfRecord);
    resumes_exactly(
        "tfrecord",
        |w, p| images(TfRecord::open(&tf).unwrap(), w, p),
        6,
    );
    let wds = shards(dir.path(), ShardFormat::WebDataset);
    resumes_exactly(
        "webdataset",
        |w, p| images(WebDataset::open(&wds).unwrap(), w, p),
        7,
    );
    let st = shards(dir.path(), ShardFormat::SafetensorsEncoded);
    resumes_exactly(
        "safetensors",
        |w, p| images(SafetensorsShards::open(&st).unwrap(), w, p),
        8,
    );
}

#[test]
fn streamed_safetensors_shards_resume_exactly_at_any_batch() {
    let dir = tempfile::tempdir().unwrap();
    let st = shards(dir.path(), ShardFormat::SafetensorsEncoded);
    resumes_exactly(
        "safetensors stream",
        |w, p| {
            images(SafetensorsShards::open(&st).unwrap(), w, p)
                .interleave(2, 1)
                .shuffle_buffer(4)
        },
        9,
    );
}

#[test]
fn a_user_map_drawing_random_numbers_resumes_exactly_at_any_batch() {
    let records: Vec<Record> = (0..30u32)
        .map(|i| Record::encoded(format!("r{i}"), i.to_le_bytes().to_vec(), i % 4))
        .collect();
    resumes_exactly(
        "memory + user map",
        |w, p| {
            let map = map_fn(
                vec![Field::new("x", FieldType::F32, &[3])],
                |s: &mut Sample<'_>| {
                    use rand::Rng;
                    let base = f32::from(s.record().bytes[0]);
                    let mut rng = s.rng();
                    let noise: [f32; 3] = std::array::from_fn(|_| rng.random::<f32>());
                    let x = s.take::<f32>(0)?;
                    for (x, n) in x.iter_mut().zip(noise) {
                        *x = base + n;
                    }
                    Ok(())
                },
            );
            Loader::builder(MemorySource::new(records.clone()))
                .map(map)
                .batch_size(4)
                .shuffle(11)
                .workers(w)
                .prefetch(p)
        },
        10,
    );
}

#[test]
fn a_state_from_another_source_or_other_settings_is_refused_naming_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path());
    let mut loader = images(ImageFolder::new(&root).unwrap(), 1, 1)
        .build()
        .unwrap();
    let state = {
        let mut epoch = loader.next_epoch();
        epoch.next().unwrap().unwrap().state()
    };
    assert_eq!((state.epoch, state.batch, state.samples), (0, 1, 4));
    let refused = |b: LoaderBuilder| match b.resume(state.clone()).build() {
        Err(Error::StateMismatch { differences }) => differences.join("; "),
        Err(e) => panic!("refused with another error: {e}"),
        Ok(_) => panic!("a mismatched state was accepted"),
    };
    let src = || ImageFolder::new(&root).unwrap();
    let msg = refused(images(src(), 1, 1).batch_size(8));
    assert_eq!(msg, "batch size: the state has 4, this loader 8");
    let msg = refused(images(src(), 1, 1).shuffle(8));
    assert_eq!(
        msg,
        "seed: the state has 7, this loader 8; shuffle: the state has shuffle(7), this loader \
         shuffle(8)"
    );
    // The shuffle seed alone (the augmentation seed kept).
    let msg = refused(images(src(), 1, 1).shuffle(8).seed(7));
    assert_eq!(
        msg,
        "shuffle: the state has shuffle(7), this loader shuffle(8)"
    );
    // Random access resumes on another world size (elastic resume:
    // tests/tests/ranks_processes.rs): not a mismatch.
    images(src(), 1, 1)
        .shard(1, 2)
        .resume(state.clone())
        .build()
        .unwrap();
    let msg = refused(images(src(), 1, 1).image_size(24));
    assert!(msg.starts_with("fields: the state has"), "{msg}");
    assert!(msg.contains("; map: the state has"), "{msg}");
    let msg = refused(images(src(), 1, 1).transforms(Transforms::eval(16)));
    assert!(
        msg.starts_with("map: the state has RandomResizedCrop"),
        "{msg}"
    );
    // One image fewer: another source.
    let few = dir.path().join("few");
    tests::image_folder(&few, 3, 6);
    let msg = refused(images(ImageFolder::new(&few).unwrap(), 1, 1));
    assert!(
        msg.starts_with("source length: the state has 21, this loader 18; source checksum"),
        "{msg}"
    );
    let shards = shards(dir.path(), ShardFormat::TfRecord);
    let msg = refused(
        images(TfRecord::open(&shards).unwrap(), 1, 1)
            .interleave(2, 2)
            .shuffle_buffer(5),
    );
    assert!(
        msg.contains("mode: the state has random access, this loader streaming"),
        "{msg}"
    );
    assert!(msg.contains("source shard table checksum"), "{msg}");
    // Worker count, prefetch and batches in flight are free to change.
    let mut other = images(src(), 3, 2)
        .batches_in_flight(4)
        .resume(state.clone())
        .build()
        .unwrap();
    assert_eq!(other.state(), state);
    assert_eq!(other.next_epoch().len(), 5, "batches 1..6 of epoch 0");
}
