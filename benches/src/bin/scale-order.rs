//! What ordering a huge epoch costs one rank: `scale-order N RANK WORLD
//! [RESUME_WORLD] [--mixture]` builds a shuffled loader over an arithmetic
//! source of `N` samples (a record is its index, read from no file, so the
//! time and memory measured are the order's and the loader's; with
//! `--mixture`, a mixture of three such sources of 50, 30 and 20% of `N`
//! weighted 0.5 / 0.3 / 0.2, whose epoch order the mixture places), as
//! rank `RANK` of
//! `WORLD`, batch 32, and takes its first batch of epoch 3. With
//! `RESUME_WORLD`, it then saves the state after that batch, as the job
//! would, and resumes it elastically on `RESUME_WORLD` ranks (rank
//! `RANK % RESUME_WORLD`), taking that loader's first batch too.
//!
//! Prints `first_batch_s` (build + plan + first batch, from the start of
//! the process), `resume_first_batch_s` and `peak_rss_mb` (`VmHWM`).

use benches::peak_rss_mb;
use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Sample};
use candle_wick::source::{Mixture, Record};
use candle_wick::{Loader, Source};
use std::time::Instant;

/// `n` records, record `i` holding `i` as 8 little-endian bytes.
struct Counting(usize);

impl Source for Counting {
    fn len(&self) -> usize {
        self.0
    }

    fn read(&self, index: usize) -> candle_wick::Result<Record> {
        Ok(Record::encoded(
            format!("#{index}"),
            (index as u64).to_le_bytes().to_vec(),
            0,
        ))
    }

    fn digest(&self) -> u32 {
        self.0 as u32
    }
}

fn builder(n: usize, rank: usize, world: usize, mixture: bool) -> candle_wick::LoaderBuilder {
    let map = map_fn(
        vec![Field::new("index", FieldType::U32, &[2])],
        |s: &mut Sample<'_>| {
            let b = &s.record().bytes;
            let i = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
            s.take::<u32>(0)?
                .copy_from_slice(&[(i >> 32) as u32, i as u32]);
            Ok(())
        },
    );
    let source: Box<dyn Source> = if mixture {
        let (a, b) = (n / 2, n * 3 / 10);
        Box::new(
            Mixture::builder()
                .add(Counting(a), 0.5)
                .add(Counting(b), 0.3)
                .add(Counting(n - a - b), 0.2)
                .build()
                .expect("three members of positive weight"),
        )
    } else {
        Box::new(Counting(n))
    };
    Loader::builder(source)
        .map(map)
        .batch_size(32)
        .shuffle(1234)
        .workers(1)
        .shard(rank, world)
}

fn first_indices(batch: &candle_wick::Batch) -> Vec<u64> {
    let v = batch
        .get("index")
        .expect("the index field")
        .to_vec2::<u32>()
        .expect("u32 pairs");
    v.iter()
        .map(|p| (u64::from(p[0]) << 32) | u64::from(p[1]))
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let all: Vec<String> = std::env::args().skip(1).collect();
    let mixture = all.iter().any(|a| a == "--mixture");
    let args: Vec<&String> = all.iter().filter(|a| *a != "--mixture").collect();
    let arg = |i: usize| -> Option<usize> { args.get(i)?.replace('_', "").parse().ok() };
    let (Some(n), Some(rank), Some(world)) = (arg(0), arg(1), arg(2)) else {
        return Err("usage: scale-order N RANK WORLD [RESUME_WORLD] [--mixture]".into());
    };
    let mut loader = builder(n, rank, world, mixture).build()?;
    let mut epoch = loader.epoch(3);
    let batches = epoch.len();
    let first = epoch.next().ok_or("an epoch with no batch")??;
    let got = first_indices(&first);
    drop(first);
    println!(
        "samples {n} rank {rank}/{world}: {batches} batches of this rank in the epoch, \
         first batch {:?}...",
        &got[..4.min(got.len())]
    );
    println!("first_batch_s {:.3}", start.elapsed().as_secs_f64());
    drop(epoch);
    if let Some(resume_world) = arg(3) {
        // The job's state after its first batch of epoch 3 (every rank's
        // is the same), resumed elastically on another world size.
        let mut state = loader.state();
        state.epoch = 3;
        state.batch = 1;
        state.samples = (32 * world) as u64;
        drop(loader);
        let t = Instant::now();
        let mut resumed = builder(n, rank % resume_world, resume_world, mixture)
            .resume(state)
            .build()?;
        let mut epoch = resumed.next_epoch();
        let left = epoch.len();
        let b = epoch.next().ok_or("nothing left of the epoch")??;
        println!(
            "resumed on {resume_world} ranks: {left} batches left, first {:?}...",
            &first_indices(&b)[..4]
        );
        println!("resume_first_batch_s {:.3}", t.elapsed().as_secs_f64());
    }
    println!("peak_rss_mb {:.1}", peak_rss_mb());
    Ok(())
}
