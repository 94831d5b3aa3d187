//! The language-model map: a token window's input and target, copied
//! from the memory-mapped token file straight into the batch's slots.

use super::{Map, Sample};
use crate::error::Result;
use crate::fields::{Field, FieldType};
use crate::source::TokenSource;

/// Writes fields `input` and `target` (`u32 [seq_len]` each) of a
/// [`TokenSource`]'s window: tokens `start..start + seq_len` and
/// `start + 1..start + 1 + seq_len`, widened from the file's `u16`.
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
        let t = self.source.seq_len();
        vec![
            Field::new("input", FieldType::U32, &[t]),
            Field::new("target", FieldType::U32, &[t]),
        ]
    }

    fn map(&self, s: &mut Sample<'_>) -> Result<()> {
        let w = self.source.window(s.seed(), s.epoch(), s.index())?;
        let file = &self.source.files()[w.file];
        let (input, target) = (s.take::<u32>(0)?, s.take::<u32>(1)?);
        file.read_into(w.token, input)?;
        file.read_into(w.token + 1, target)
    }
}
