//! Language-model pretraining on Megatron indexed datasets fed by wick:
//! one corpus or a weighted mixture of several, local, in object storage
//! (`s3://`, `gs://`, `az://`, `https://`) or in the local Hugging Face
//! cache, as windows of `--seq-len + 1` tokens packed across documents
//! (Megatron's GPT dataset), batched as `input` / `target` u32 `[B, T]`,
//! and a small next-token model trained on them on the CPU.
//!
//! ```text
//! cargo run --release -p candle-wick --example megatron_lm -- \
//!     data/web_text_document=0.7 data/code_text_document=0.3 --seq-len 128
//! cargo run --release -p candle-wick --example megatron_lm -- --hf-dataset org/corpus
//! ```
//!
//! Each DATA is a prefix (`PREFIX.bin` + `PREFIX.idx`, as Megatron's
//! `tools/preprocess_data.py` writes them), either file, or a folder of
//! prefixes; `=WEIGHT` mixes several (Megatron's blend weights; each prefix
//! of an epoch keeps every corpus within one sample of its quota).
//! Options: `--seq-len T` (128), `--batch B` (8), `--steps N` (200),
//! `--eos TOKEN` (put between packed documents), `--vocab V` (default: the
//! token type's range, capped at 65,536), `--hf-dataset org/name` (a
//! dataset repository of Megatron files in the Hugging Face cache, read
//! offline).

use candle_core::{DType, Device, Module, D};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use candle_wick::map::TokenWindowsMap;
use candle_wick::source::{
    cached_snapshot, detect, hf_hub_cache, DatasetKind, DocumentWindows, Megatron, Mixture,
};
use candle_wick::{Loader, LoaderBuilder};
use std::path::PathBuf;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    data: Vec<(PathBuf, f64)>,
    seq_len: usize,
    batch: usize,
    steps: usize,
    eos: Option<u32>,
    vocab: Option<usize>,
}

fn args() -> Res<Args> {
    let mut a = Args {
        data: Vec::new(),
        seq_len: 128,
        batch: 8,
        steps: 200,
        eos: None,
        vocab: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--seq-len" => a.seq_len = value("--seq-len")?.parse()?,
            "--batch" => a.batch = value("--batch")?.parse()?,
            "--steps" => a.steps = value("--steps")?.parse()?,
            "--eos" => a.eos = Some(value("--eos")?.parse()?),
            "--vocab" => a.vocab = Some(value("--vocab")?.parse()?),
            "--hf-dataset" => {
                let repo = value("--hf-dataset")?;
                let cache = hf_hub_cache().ok_or("no Hugging Face cache (set HF_HUB_CACHE)")?;
                a.data.push((cached_snapshot(&cache, &repo, "main")?, 1.0));
            }
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}").into()),
            data => {
                let (path, weight) = match data.rsplit_once('=') {
                    Some((p, w)) => (p, w.parse::<f64>()?),
                    None => (data, 1.0),
                };
                a.data.push((PathBuf::from(path), weight));
            }
        }
    }
    if a.data.is_empty() {
        return Err("give a Megatron dataset: PREFIX[=WEIGHT]... or --hf-dataset org/name".into());
    }
    Ok(a)
}

/// The Megatron dataset at `path` (its prefixes, when a folder).
fn corpus(path: &std::path::Path, a: &Args) -> Res<Megatron> {
    let found = detect(path)?;
    if found.kind != DatasetKind::Megatron {
        return Err(format!(
            "{} holds {}, not Megatron data",
            path.display(),
            found.kind.name()
        )
        .into());
    }
    let m = Megatron::open(
        found.paths,
        a.seq_len,
        DocumentWindows::Packed { eos: a.eos },
    )?;
    println!(
        "{}: {} documents, {} tokens ({:?}), {} windows",
        path.display(),
        m.documents(),
        m.tokens(),
        m.token_types(),
        candle_wick::Source::len(&m)
    );
    Ok(m)
}

fn main() -> Res<()> {
    let a = args()?;
    let corpora = a
        .data
        .iter()
        .map(|(p, _)| corpus(p, &a))
        .collect::<Res<Vec<_>>>()?;
    let widest = corpora
        .iter()
        .flat_map(|m| m.token_types())
        .map(|t| t.size())
        .max()
        .unwrap_or(2);
    let vocab = a.vocab.unwrap_or(if widest == 1 { 256 } else { 65_536 });
    // ANCHOR: source
    let builder: LoaderBuilder = if corpora.len() == 1 {
        let m = corpora[0].clone();
        Loader::builder(m.clone()).map(TokenWindowsMap::megatron(&m))
    } else {
        let mut mix = Mixture::builder();
        for (m, (_, w)) in corpora.iter().zip(&a.data) {
            mix = mix.add(m.clone(), *w);
        }
        let mix = mix.build()?;
        println!(
            "mixture: {} windows an epoch, {:?} from each",
            candle_wick::Source::len(&mix),
            mix.counts(0)
        );
        Loader::builder(mix).map(TokenWindowsMap::from_records(a.seq_len, None))
    };
    let mut loader = builder.batch_size(a.batch).shuffle(1234).build()?;
    // ANCHOR_END: source

    // Next-token logits from the current token through a 64-wide bottleneck.
    let dev = Device::Cpu;
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::F32, &dev);
    let emb = candle_nn::embedding(vocab, 64, vb.pp("emb"))?;
    let head = candle_nn::linear(64, vocab, vb.pp("head"))?;
    let mut opt = candle_nn::AdamW::new_lr(vars.all_vars(), 1e-2)?;
    let (mut step, mut first, mut last) = (0, None, 0.0);
    let t = std::time::Instant::now();
    'train: for epoch in 0.. {
        for batch in loader.epoch(epoch) {
            let batch = batch?;
            let input = batch.get("input")?;
            let target = batch.get("target")?.flatten_all()?;
            if input.max_keepdim(D::Minus1)?.max(0)?.to_vec1::<u32>()?[0] as usize >= vocab {
                return Err(format!("a token is past --vocab {vocab}").into());
            }
            let logits = head.forward(&emb.forward(input)?)?.reshape(((), vocab))?;
            let loss = candle_nn::loss::cross_entropy(&logits, &target)?;
            opt.backward_step(&loss)?;
            last = loss.to_scalar::<f32>()?;
            first.get_or_insert(last);
            step += 1;
            if step % 50 == 0 {
                println!("step {step} (epoch {epoch}): loss {last:.3}");
            }
            if step == a.steps {
                break 'train;
            }
        }
    }
    let first = first.unwrap_or(last);
    println!(
        "loss {first:.3} -> {last:.3} over {step} steps of {}x{} tokens ({:.0} tokens/s with the model); ln {vocab} = {:.3}",
        a.batch,
        a.seq_len,
        (step * a.batch * a.seq_len) as f64 / t.elapsed().as_secs_f64(),
        (vocab as f32).ln()
    );
    println!("loader: {}", loader.stats().verdict);
    Ok(())
}
