//! The language-model map: a token window, copied from the memory-mapped
//! token file straight into the batch's slot.

use super::{Map, Sample};
use crate::contract::{Parts, Value};
use crate::error::{Error, Result};
use crate::fields::{Field, FieldType, View};
use crate::formats::tokens::{DocumentWindows, Megatron, TokenSource};

/// Writes field `tokens` (`u32 [seq_len + 1]`) of a token window, widened
/// from the file's type; the batch gives `input` (tokens `0..seq_len`) and
/// `target` (tokens `1..seq_len + 1`) as [views](crate::fields::View) of
/// it, `u32 [batch, seq_len]` each, so a window is converted and written
/// once (as llm.c's loader points inputs and targets into one buffer). The
/// views are strided (rows `seq_len + 1` apart): candle's ops take them as
/// they are or copy them (`Tensor::contiguous`) where they must.
///
/// Windows that may be shorter ([`DocumentWindows::WithinDocument`], or
/// records with a pad token) make `tokens` a padded field: the rest of a
/// short window is the pad token, and `tokens_len` (`u32 [batch]`) says how
/// many tokens are real.
#[derive(Debug, Clone)]
pub struct TokenWindowsMap {
    windows: Windows,
}

#[derive(Debug, Clone)]
enum Windows {
    /// Read by index from a token source's maps.
    Files(TokenSource),
    /// Read by index from a Megatron dataset's map.
    Megatron(Megatron),
    /// Copied from each record's `tokens` part.
    Records { seq_len: usize, pad: Option<u32> },
}

impl TokenWindowsMap {
    /// The map of `source`'s windows (give the loader the same source).
    pub fn new(source: &TokenSource) -> Self {
        Self {
            windows: Windows::Files(source.clone()),
        }
    }

    /// The map of a Megatron dataset's windows (give the loader the same
    /// dataset).
    pub fn megatron(dataset: &Megatron) -> Self {
        Self {
            windows: Windows::Megatron(dataset.clone()),
        }
    }

    /// The map of records that carry their window as a `tokens` part
    /// ([`Value::Tokens`]): what a [`Mixture`](crate::source::Mixture) of
    /// token sources gives, whose indices are not any one source's. Each
    /// window holds `seq_len + 1` tokens; with `pad: Some(t)` a window may
    /// hold fewer (padded with `t`, counted in `tokens_len`), without it a
    /// window of another length is an error naming the record.
    pub fn from_records(seq_len: usize, pad: Option<u32>) -> Self {
        Self {
            windows: Windows::Records { seq_len, pad },
        }
    }

    fn seq_len(&self) -> usize {
        match &self.windows {
            Windows::Files(s) => s.seq_len(),
            Windows::Megatron(m) => m.seq_len(),
            Windows::Records { seq_len, .. } => *seq_len,
        }
    }

    /// The pad token, when windows may be short.
    fn pad(&self) -> Option<u32> {
        match &self.windows {
            Windows::Files(_) => None,
            Windows::Megatron(m) => match m.windows() {
                DocumentWindows::WithinDocument { pad } => Some(pad),
                _ => None,
            },
            Windows::Records { pad, .. } => *pad,
        }
    }
}

impl Map for TokenWindowsMap {
    fn fields(&self) -> Vec<Field> {
        let shape = [self.seq_len() + 1];
        vec![match self.pad() {
            Some(pad) => Field::padded("tokens", FieldType::U32, &shape, f64::from(pad)),
            None => Field::new("tokens", FieldType::U32, &shape),
        }]
    }

    fn parts(&self) -> Parts {
        match self.windows {
            Windows::Records { .. } => Parts::Named(vec!["tokens".into()]),
            _ => Parts::Default,
        }
    }

    fn views(&self) -> Vec<View> {
        let t = self.seq_len();
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
        match &self.windows {
            Windows::Files(source) => {
                if let Ok(w) = source.window(seed, epoch, index) {
                    source.files()[w.file].prefetch(w.token, source.seq_len() + 1);
                }
            }
            Windows::Megatron(m) => m.prefetch(index),
            Windows::Records { .. } => {}
        }
    }

    fn map(&self, s: &mut Sample<'_>) -> Result<()> {
        match &self.windows {
            Windows::Files(source) => {
                let w = source.window(s.seed(), s.epoch(), s.index())?;
                let file = &source.files()[w.file];
                file.read_into(w.token, s.take::<u32>(0)?)
            }
            Windows::Megatron(m) => {
                let n = m.read_window(s.index(), s.take::<u32>(0)?)?;
                if self.pad().is_some() {
                    s.set_len(0, n)?;
                }
                Ok(())
            }
            Windows::Records { seq_len, pad } => {
                let record = s.record();
                let tokens = match record.require("tokens")? {
                    Value::Tokens(t) => t,
                    other => {
                        return Err(Error::Transform {
                            key: record.key.clone(),
                            reason: format!("part \"tokens\" is {}, not tokens", other.kind()),
                            source: None,
                        })
                    }
                };
                let full = seq_len + 1;
                let fits = match pad {
                    Some(_) => tokens.len() <= full,
                    None => tokens.len() == full,
                };
                if !fits {
                    return Err(Error::Transform {
                        key: record.key.clone(),
                        reason: format!(
                            "the window holds {} tokens; the map writes {}{full}",
                            tokens.len(),
                            if pad.is_some() { "at most " } else { "" }
                        ),
                        source: None,
                    });
                }
                s.take::<u32>(0)?[..tokens.len()].copy_from_slice(tokens);
                if pad.is_some() {
                    s.set_len(0, tokens.len())?;
                }
                Ok(())
            }
        }
    }
}
