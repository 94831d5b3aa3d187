//! Language-model pretraining fed by wick: token windows from memory-mapped
//! token files in the two layouts LLM trainers write — a raw `u16`
//! `train.bin` (nanoGPT, llama2.c) and an llm.c shard (256 x i32 header,
//! then `u16` tokens) — batched as `input` / `target` u32 `[B, T]`, and a
//! bigram model trained on them for a few steps on the CPU.
//!
//! ```text
//! cargo run --release -p candle-wick --example lm_tokens
//! ```
//!
//! The token files are written to a temporary directory from a small
//! random Markov chain, so the loss has something to learn. The example
//! checks that every window is the file's slice at its offset, that the
//! target is the input shifted by one, and that a non-overlapping epoch
//! uses every token as an input exactly once.

use candle_core::{DType, Device, Module};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use candle_wick::map::TokenWindowsMap;
use candle_wick::source::{TokenFile, TokenSource, WindowOrder};
use candle_wick::{Loader, Result};
use std::path::Path;

const VOCAB: usize = 96;
const SEQ: usize = 64;
const BATCH: usize = 16;

/// `n` tokens of a Markov chain where each token is followed by one of
/// four successors.
fn chain(n: usize, seed: u64) -> Vec<u16> {
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut t = 0usize;
    (0..n)
        .map(|_| {
            t = (t * 7 + 1 + (next() % 4) as usize * 13) % VOCAB;
            t as u16
        })
        .collect()
}

fn write_files(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let raw = dir.join("train.bin");
    let tokens = chain(20_000, 3);
    std::fs::write(
        &raw,
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<_>>(),
    )?;
    let llmc = dir.join("fineweb_train_000001.bin");
    let tokens = chain(13_001, 5);
    let mut header = [0i32; 256];
    header[0] = 20240520;
    header[1] = 1;
    header[2] = tokens.len() as i32;
    let mut bytes: Vec<u8> = header.iter().flat_map(|h| h.to_le_bytes()).collect();
    bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    std::fs::write(&llmc, bytes)?;
    Ok(vec![raw, llmc])
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let paths = write_files(dir.path())?;
    // ANCHOR: source
    let files = paths
        .iter()
        .map(TokenFile::open)
        .collect::<Result<Vec<_>>>()?;
    let source = TokenSource::new(files, SEQ, WindowOrder::NonOverlapping)?;
    let mut loader = Loader::builder(source.clone())
        .map(TokenWindowsMap::new(&source))
        .batch_size(BATCH)
        .shuffle(1337)
        .build()?;
    // ANCHOR_END: source

    // Every window is its file's slice; the target is the input shifted;
    // one epoch uses every token (but each file's last) as an input once.
    let mut used: Vec<Vec<u32>> = source.files().iter().map(|f| vec![0; f.len()]).collect();
    for batch in loader.epoch(0) {
        let batch = batch?;
        let input = batch.get("input")?.to_vec2::<u32>()?;
        let target = batch.get("target")?.to_vec2::<u32>()?;
        for (row, &index) in batch.indices.iter().enumerate() {
            let w = source.window(1337, 0, index)?;
            let file = &source.files()[w.file];
            let mut want = vec![0u32; SEQ + 1];
            file.read_into(w.token, &mut want)?;
            if input[row] != want[..SEQ] || target[row] != want[1..] {
                return Err(format!("window {index} is not the file's slice").into());
            }
            for c in &mut used[w.file][w.token..w.token + SEQ] {
                *c += 1;
            }
        }
    }
    for (f, counts) in used.iter().enumerate() {
        let whole = (counts.len() - 1) / SEQ * SEQ;
        if counts[..whole].iter().any(|&c| c != 1) || counts[whole..].iter().any(|&c| c != 0) {
            return Err(format!("file {f}: a token was not used exactly once").into());
        }
    }
    println!(
        "{} windows of {SEQ}+1 tokens over {} files: every window is its file's slice, every \
         target the input shifted by one, every token an input once",
        candle_wick::Source::len(&source),
        paths.len()
    );

    // A bigram model: logits of the next token from the current one.
    let dev = Device::Cpu;
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::F32, &dev);
    let emb = candle_nn::embedding(VOCAB, VOCAB, vb.pp("bigram"))?;
    let mut opt = candle_nn::AdamW::new_lr(vars.all_vars(), 5e-2)?;
    let mut losses = Vec::new();
    for epoch in 0..3 {
        for batch in loader.epoch(epoch) {
            let batch = batch?;
            let logits = emb.forward(batch.get("input")?)?.reshape(((), VOCAB))?;
            let target = batch.get("target")?.flatten_all()?;
            let loss = candle_nn::loss::cross_entropy(&logits, &target)?;
            opt.backward_step(&loss)?;
            losses.push(loss.to_scalar::<f32>()?);
        }
        println!("epoch {epoch}: loss {:.3}", losses.last().expect("a batch"));
    }
    let (first, last) = (losses[0], *losses.last().expect("trained"));
    // Four successors per token: the best possible loss is ln 4.
    println!(
        "loss {first:.3} -> {last:.3} over {} steps (ln {VOCAB} = {:.3}, ln 4 = {:.3})",
        losses.len(),
        (VOCAB as f32).ln(),
        4f32.ln()
    );
    if last >= first {
        return Err("the loss did not fall".into());
    }
    Ok(())
}
