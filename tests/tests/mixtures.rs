//! Weighted mixtures through the loader: Megatron's rule equals
//! Megatron-Core's own `build_blending_indices` (its compiled helper,
//! tests/fixtures/megatron_writer.py); the default rule holds every prefix
//! within one sample of each quota (every global batch with a shuffle);
//! orders are deterministic and resume exactly; ranks get fair shares; a
//! weight schedule changes the counts from its epoch; a mixture of
//! Megatron corpora trains token-exact.

use candle_wick::fields::{Field, FieldType};
use candle_wick::map::TokenWindowsMap;
use candle_wick::source::{
    BlendRule, DocumentWindows, Megatron, MemorySource, Mixture, MixtureBuilder, Record,
};
use candle_wick::{Loader, LoaderBuilder, Source};

/// A member of `n` records keyed `name/i`.
fn member(name: &str, n: usize) -> MemorySource {
    MemorySource::new(
        (0..n)
            .map(|i| Record::encoded(format!("{name}/{i}"), vec![1], 0))
            .collect(),
    )
}

/// Members of `lens` samples with `weights`.
fn mixture(lens: &[usize], weights: &[f64], rule: BlendRule) -> Mixture {
    let mut b: MixtureBuilder = Mixture::builder().rule(rule);
    for (i, (&n, &w)) in lens.iter().zip(weights).enumerate() {
        b = b.add(member(&format!("m{i}"), n), w);
    }
    b.build().unwrap()
}

/// The member of each mixture index.
fn members_of(mix: &Mixture, lens: &[usize]) -> impl Fn(usize) -> usize {
    let mut offsets = vec![0];
    for n in lens {
        offsets.push(offsets.last().unwrap() + n);
    }
    assert_eq!(*offsets.last().unwrap(), mix.len());
    move |i| offsets.partition_point(|&o| o <= i) - 1
}

fn builder(mix: &Mixture) -> LoaderBuilder {
    Loader::builder(mix.clone()).batch_size(8)
}

/// The largest gap between a member's count and its quota over every
/// prefix of `picks` that `at` allows.
fn worst(picks: &[usize], weights: &[f64], at: impl Fn(usize) -> bool) -> f64 {
    let sum: f64 = weights.iter().sum();
    let mut taken = vec![0usize; weights.len()];
    let mut worst = 0f64;
    for (p, &d) in picks.iter().enumerate() {
        taken[d] += 1;
        if at(p + 1) {
            for (t, w) in taken.iter().zip(weights) {
                worst = worst.max((*t as f64 - w / sum * (p + 1) as f64).abs());
            }
        }
    }
    worst
}

const WEIGHT_SETS: [&[f64]; 5] = [
    &[0.5, 0.3, 0.2],
    &[1.0, 1.0],
    &[0.9, 0.05, 0.05],
    &[0.6, 0.3, 0.1],
    &[7.0, 1.0, 3.0, 0.5],
];

#[test]
fn megatrons_rule_is_megatrons_blend_to_the_sample() {
    for weights in WEIGHT_SETS {
        let lens: Vec<usize> = (0..weights.len()).map(|i| 150 + 37 * i).collect();
        let mix = mixture(&lens, weights, BlendRule::Megatron);
        let json = serde_json::to_string(weights).unwrap();
        let n = mix.len().to_string();
        let Some(out) = tests::python_fixture("megatron_writer.py", &["blend", &json, &n]) else {
            return;
        };
        let want: Vec<usize> = serde_json::from_str(&out).unwrap();
        let of = members_of(&mix, &lens);
        let loader = builder(&mix).build().unwrap();
        let got: Vec<usize> = loader.batches(0).concat().into_iter().map(of).collect();
        assert_eq!(got, want, "{weights:?}");
    }
}

#[test]
fn every_prefix_holds_its_quota_within_one() {
    for weights in WEIGHT_SETS {
        let lens: Vec<usize> = (0..weights.len()).map(|i| 300 + 91 * i).collect();
        let mix = mixture(&lens, weights, BlendRule::WithinOne);
        let of = members_of(&mix, &lens);
        for epoch in 0..3 {
            // Without a shuffle, the epoch is the greedy order: every prefix.
            let loader = builder(&mix).build().unwrap();
            let picks: Vec<usize> = loader
                .batches(epoch)
                .concat()
                .into_iter()
                .map(&of)
                .collect();
            assert_eq!(picks.len(), mix.len());
            assert!(worst(&picks, weights, |_| true) < 1.0, "{weights:?}");
            // With a shuffle on 3 ranks: every global batch boundary.
            let ranks: Vec<Vec<Vec<usize>>> = (0..3)
                .map(|r| {
                    builder(&mix)
                        .shuffle(11)
                        .shard(r, 3)
                        .build()
                        .unwrap()
                        .batches(epoch)
                })
                .collect();
            let mut global = Vec::new();
            let mut bounds = std::collections::HashSet::new();
            for k in 0..ranks[0].len() {
                for r in &ranks {
                    global.extend(r[k].iter().map(|&i| of(i)));
                }
                bounds.insert(global.len());
            }
            assert_eq!(global.len(), mix.len());
            let w = worst(&global, weights, |n| bounds.contains(&n));
            assert!(w < 1.0, "{weights:?} epoch {epoch}: {w}");
        }
    }
}

#[test]
fn orders_are_deterministic_resume_exactly_and_follow_the_schedule() {
    let lens = [40, 100, 25];
    let mix = Mixture::builder()
        .add(member("a", lens[0]), 0.5)
        .add(member("b", lens[1]), 0.3)
        .add(member("c", lens[2]), 0.2)
        .schedule(2, &[0.0, 0.5, 0.5])
        .build()
        .unwrap();
    let of = members_of(&mix, &lens);
    let batches = |seed| builder(&mix).shuffle(seed).build().unwrap().batches(1);
    assert_eq!(batches(3), batches(3));
    assert_ne!(batches(3), batches(4));
    // The counts each epoch (each within one of its quota), and the
    // schedule from epoch 2.
    for (epoch, weights) in [(0, [0.5, 0.3, 0.2]), (2, [0.0, 0.5, 0.5])] {
        let counts = mix.counts(epoch);
        assert_eq!(counts.iter().sum::<usize>(), mix.len());
        for (c, w) in counts.iter().zip(weights) {
            assert!((*c as f64 - w * mix.len() as f64).abs() < 1.0, "{counts:?}");
        }
    }
    assert_eq!(mix.counts(1), mix.counts(0));
    assert_eq!(mix.counts(2)[0], 0);
    let loader = builder(&mix).shuffle(3).build().unwrap();
    for (epoch, want) in [(1, mix.counts(1)), (2, mix.counts(2)), (3, mix.counts(3))] {
        let mut got = vec![0; 3];
        for i in loader.batches(epoch).concat() {
            got[of(i)] += 1;
        }
        assert_eq!(got, want, "epoch {epoch}");
    }
    // A resumed epoch yields the rest of the uninterrupted one, through
    // the loader's workers (records read and mapped).
    let run = |loader: &mut Loader, epoch| -> Vec<Vec<usize>> {
        loader.epoch(epoch).map(|b| b.unwrap().indices).collect()
    };
    let images = || {
        builder(&mix)
            .shuffle(3)
            .remainder(candle_wick::Remainder::Drop)
    };
    // The members' records are not images: a map of their keys.
    let map = || {
        let key = Field::new("key", FieldType::U32, &[]);
        candle_wick::map::map_fn(vec![key], |s| {
            s.take::<u32>(0)?[0] = s.key().bytes().map(u32::from).sum();
            Ok(())
        })
    };
    let mut full = images().map(map()).build().unwrap();
    let whole = run(&mut full, 2);
    let mut first = images().map(map()).build().unwrap();
    let state = {
        let mut e = first.epoch(2);
        e.next().unwrap().unwrap();
        e.next().unwrap().unwrap().state()
    };
    let mut resumed = images().map(map()).resume(state).build().unwrap();
    let rest: Vec<Vec<usize>> = resumed.next_epoch().map(|b| b.unwrap().indices).collect();
    assert_eq!(rest, whole[2..]);
}

#[test]
fn ranks_get_fair_shares_even_of_a_periodic_blend() {
    // Without the shuffle across ranks, 0.5 / 0.5 alternates a b a b:
    // rank 0 of 2 with an odd batch would get 2 a for every b.
    let lens = [600, 600];
    let mix = mixture(&lens, &[0.5, 0.5], BlendRule::WithinOne);
    let of = members_of(&mix, &lens);
    for seed in [1, 2, 3] {
        for r in 0..2 {
            let loader = Loader::builder(mix.clone())
                .batch_size(3)
                .shuffle(seed)
                .shard(r, 2)
                .build()
                .unwrap();
            let picks: Vec<usize> = loader.batches(0).concat().into_iter().map(&of).collect();
            let a = picks.iter().filter(|&&d| d == 0).count() as f64 / picks.len() as f64;
            // 600 samples: a fair share is 0.5 +- 0.02 (one standard
            // deviation of a hypergeometric draw here is about 0.012).
            assert!((a - 0.5).abs() < 0.05, "seed {seed} rank {r}: {a}");
        }
    }
}

#[test]
fn a_mixture_of_megatron_corpora_trains_token_exact() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, base: u32, docs: usize| {
        let d: Vec<Vec<Vec<u32>>> = (0..docs)
            .map(|i| vec![(0..(10 + i % 17) as u32).map(|t| base + t).collect()])
            .collect();
        let json = dir.path().join(format!("{name}.json"));
        std::fs::write(&json, serde_json::to_string(&d).unwrap()).unwrap();
        let prefix = dir.path().join(name);
        let args = [
            "write",
            prefix.to_str().unwrap(),
            "uint16",
            json.to_str().unwrap(),
        ];
        tests::python_fixture("megatron_writer.py", &args).map(|_| prefix)
    };
    let Some(web) = write("web", 1000, 40) else {
        return;
    };
    let code = write("code", 5000, 15).unwrap();
    let seq = 8;
    let open = |p| Megatron::open([p], seq, DocumentWindows::Packed { eos: None }).unwrap();
    let (web, code) = (open(&web), open(&code));
    let mix = Mixture::builder()
        .add(web.clone(), 0.25)
        .add(code.clone(), 0.75)
        .build()
        .unwrap();
    let mut loader = Loader::builder(mix.clone())
        .map(TokenWindowsMap::from_records(seq, None))
        .batch_size(5)
        .shuffle(2)
        .build()
        .unwrap();
    let mut from = [0, 0];
    for b in loader.epoch(0) {
        let b = b.unwrap();
        let rows = b.get("tokens").unwrap().to_vec2::<u32>().unwrap();
        for (&i, row) in b.indices.iter().zip(rows) {
            let (src, j) = if i < web.len() {
                (&web, i)
            } else {
                (&code, i - web.len())
            };
            from[usize::from(i >= web.len())] += 1;
            let mut want = vec![0; seq + 1];
            src.read_window(j, &mut want).unwrap();
            assert_eq!(row, want, "mixture index {i}");
        }
    }
    assert_eq!(from, [mix.counts(0)[0], mix.counts(0)[1]]);
    assert!(from[1] > 2 * from[0]);
}
