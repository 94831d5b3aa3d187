//! The language-model map: a token window, copied from the memory-mapped
//! token file straight into the batch's slot.

use super::{Map, Sample};
use crate::error::Result;
use crate::fields::{Field, FieldType, View};
use crate::source::TokenSource;

/// Writes field `tokens` (`u32 [seq_len + 1]`) of a [`TokenSource`]'s
/// window, widened from the file's `u16`; the batch gives `input` (tokens
/// `0..seq_len`) and `target` (tokens `1..seq_len + 1`) as
/// [views](crate::fields::View) of it, `u32 [batch, seq_len]` each, so a
/// window is converted and written once (as llm.c's loader points inputs
/// and targets into one buffer). The views are strided (rows `seq_len + 1`
/// apart): candle's ops take them as they are or copy them
/// (`Tensor::contiguous`) where they must.
#[derive(Debug, Clone)]
pub struct TokenWindowsMap {
    source: TokenSource,
}

impl TokenWindowsMap {
    /// The map of `source`'s windows (give the loader the same source).
    pub fn new(source: &TokenSource) -> Self {
        Self {
            source: source.clone(),
        }
    }
}

impl Map for TokenWindowsMap {
    fn fields(&self) -> Vec<Field> {
        vec![Field::new(
            "tokens",
            FieldType::U32,
            &[self.source.seq_len() + 1],
        )]
    }

    fn views(&self) -> Vec<View> {
        let t = self.source.seq_len();
        vec![
            View::new("input", "tokens", 0..t),
            View::new("target", "tokens", 1..t + 1),
        ]
    }

    /// Starts loading the next window's tokens while this one is copied:
    /// windows are read in shuffled order, so the hardware prefetcher
    /// cannot see the next one coming (1.4x the copy rate in a two-thread
    /// experiment on the bench's token file).
    fn prefetch(&self, seed: u64, epoch: u64, index: usize) {
        if let Ok(w) = self.source.window(seed, epoch, index) {
            self.source.files()[w.file].prefetch(w.token, self.source.seq_len() + 1);
        }
    }

    fn map(&self, s: &mut Sample<'_>) -> Result<()> {
        let w = self.source.window(s.seed(), s.epoch(), s.index())?;
        let file = &self.source.files()[w.file];
        file.read_into(w.token, s.take::<u32>(0)?)
    }
}
