//! Golden values: a fixed state and source give these batches, in this
//! build and every later one, or the state is refused (its order
//! algorithms' version, `ORDER_VERSION`, changed). A change of the
//! permutation, the ranks' shares, the streaming plan, token windows or
//! the per-sample random streams (a `rand` upgrade, say) fails here:
//! change `ORDER_VERSION` with it, then these values.

use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Sample, TokenWindowsMap};
use candle_wick::source::{MemorySource, Record, TokenFile, TokenSource, WindowOrder};
use candle_wick::{Loader, LoaderBuilder, LoaderState};

/// A record per index; the map writes its label and a draw from the
/// sample's random stream.
fn memory() -> LoaderBuilder {
    let records = (0..10u32)
        .map(|i| Record::encoded(format!("r{i}"), vec![i as u8], i))
        .collect();
    let map = map_fn(
        vec![Field::new("v", FieldType::U32, &[2])],
        |s: &mut Sample<'_>| {
            use rand::Rng;
            let draw = s.rng().random_range(0..1000u32);
            let label = s.record().label;
            s.take::<u32>(0)?.copy_from_slice(&[label, draw]);
            Ok(())
        },
    );
    Loader::builder(MemorySource::new(records))
        .map(map)
        .batch_size(3)
        .shuffle(42)
        .workers(1)
}

fn values(l: &mut Loader) -> Vec<Vec<u32>> {
    l.next_epoch()
        .map(|b| {
            let b = b.unwrap();
            b.get("v")
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<u32>()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_fixed_state_gives_the_same_batches_in_every_version() {
    let saved = memory().shard(1, 2).build().unwrap().state();
    let json = serde_json::to_string(&saved).unwrap();
    assert_eq!(json, GOLDEN_STATE, "the state's format or identity changed");
    let state: LoaderState = serde_json::from_str(GOLDEN_STATE).unwrap();
    let mut state = state;
    state.epoch = 3;
    state.batch = 1;
    // Rank 1's last batch: after 6 samples of the two ranks' first batches.
    state.samples = 6;
    let mut l = memory().shard(1, 2).resume(state).build().unwrap();
    assert_eq!(values(&mut l), GOLDEN_BATCHES);
}

#[test]
fn the_permutation_and_token_windows_are_pinned() {
    let l = memory().shard(0, 1).build().unwrap();
    assert_eq!(l.batches(0), GOLDEN_ORDER_EPOCH_0);
    assert_eq!(l.batches(5), GOLDEN_ORDER_EPOCH_5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.bin");
    let bytes: Vec<u8> = (0..1000u16).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    let src = TokenSource::new(
        vec![TokenFile::open(&path).unwrap()],
        16,
        WindowOrder::Random,
    )
    .unwrap();
    let mut l = Loader::builder(src.clone())
        .map(TokenWindowsMap::new(&src))
        .batch_size(4)
        .shuffle(9)
        .workers(1)
        .shard(0, 1)
        .build()
        .unwrap();
    // The first token of each window is its offset.
    let firsts: Vec<u32> = l
        .epoch(1)
        .take(2)
        .flat_map(|b| {
            let t = b.unwrap().get("tokens").unwrap().to_vec2::<u32>().unwrap();
            t.into_iter().map(|w| w[0]).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(firsts, GOLDEN_TOKEN_WINDOWS);
}

/// The permutation over a billion positions, where no table of them could
/// be built per epoch: rank 17's windows of a billion-window epoch shared
/// by 100 million ranks (ten each), with `NonOverlapping` windows of one
/// token over one file of 10^9 + 1 tokens (no file is read: the plan is
/// arithmetic).
#[test]
fn the_permutation_of_a_billion_is_pinned() {
    use candle_wick::source::TokenWindows;
    let w = TokenWindows::new(
        vec![1_000_000_001],
        1,
        WindowOrder::NonOverlapping,
        9,
        (17, 100_000_000),
    )
    .unwrap();
    let tokens: Vec<usize> = w.plan(4).iter().map(|s| s.token).collect();
    assert_eq!(tokens, GOLDEN_BILLION);
}

/// A source of `n` samples with nothing to read: a mixture's order is
/// planned without a read.
struct Blank(usize);

impl candle_wick::Source for Blank {
    fn len(&self) -> usize {
        self.0
    }
    fn read(&self, index: usize) -> candle_wick::Result<Record> {
        Err(candle_wick::Error::InvalidConfig(format!("blank {index}")))
    }
}

/// A mixture's order, position by position, over a billion samples: the
/// placement and each member's draws are arithmetic (no table of the
/// epoch is built: one would be 8 GB), and pinned.
#[test]
fn a_mixture_of_a_billion_is_pinned() {
    use candle_wick::source::Mixture;
    let mix = Mixture::builder()
        .add(Blank(600_000_000), 0.5)
        .add(Blank(300_000_000), 0.3)
        .add(Blank(100_000_000), 0.2)
        .build()
        .unwrap();
    let order = candle_wick::Source::begin_epoch(&mix, Some(9), 3).unwrap();
    assert_eq!(order.len(), 1_000_000_000);
    let at: Vec<usize> = [0, 1, 2, 65_535, 65_536, 500_000_017, 999_999_999]
        .iter()
        .map(|&p| order.at(p))
        .collect();
    assert_eq!(at, GOLDEN_MIXTURE_BILLION);
    // Small mixtures too: the first batches of epoch 1, seeded.
    let small = Mixture::builder()
        .add(Blank(7), 0.6)
        .add(Blank(5), 0.4)
        .build()
        .unwrap();
    let l = Loader::builder(small)
        .batch_size(4)
        .shuffle(3)
        .build()
        .unwrap();
    assert_eq!(l.batches(1), GOLDEN_MIXTURE_EPOCH_1);
}

const GOLDEN_STATE: &str = concat!(
    r#"{"version":3,"epoch":0,"batch":0,"samples":0,"identity":{"order_version":"wick-order-5","#,
    r#""seed":42,"shuffle_seed":42,"batch_size":3,"remainder":"split","world_size":2,"#,
    r#""mode":"random access","source_len":10,"source_shards":0,"source_digest":3646669912,"#,
    r#""max_pixels":89478485,"bad_samples":"Fail","fields":["v U32 [2]"],"map":null}}"#
);
/// Rank 1's last batch of epoch 3 (label, draw per sample).
const GOLDEN_BATCHES: &[&[u32]] = &[&[1, 812, 8, 670]];
const GOLDEN_ORDER_EPOCH_0: &[&[usize]] = &[&[0, 1, 4], &[7, 6, 8], &[9, 2, 3], &[5]];
const GOLDEN_ORDER_EPOCH_5: &[&[usize]] = &[&[5, 2, 6], &[9, 3, 0], &[7, 8, 1], &[4]];
const GOLDEN_BILLION: &[usize] = &[
    335303205, 746861028, 459584521, 23446120, 196742360, 106138953, 93092785, 859889794,
    189664537, 592929399,
];
/// The first two batches of epoch 1: each window's first token (its offset).
const GOLDEN_TOKEN_WINDOWS: &[u32] = &[614, 951, 140, 248, 445, 751, 866, 752];
/// Positions 0, 1, 2, 65,535, 65,536, 500,000,017 and 999,999,999 of the
/// billion-sample mixture's epoch 3.
const GOLDEN_MIXTURE_BILLION: &[usize] = &[
    453246208, 899835903, 467947147, 818484734, 8128760, 989738096, 371716416,
];
/// The small mixture's epoch 1.
const GOLDEN_MIXTURE_EPOCH_1: &[&[usize]] = &[&[4, 8, 7, 6], &[11, 5, 3, 0], &[9, 10, 1, 2]];
