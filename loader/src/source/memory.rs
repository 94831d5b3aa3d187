//! An in-memory source for tests and small datasets.

use crate::contract::{check_index, Record, Source};
use crate::error::Result;

/// Records held in memory. Reading clones the record's bytes.
///
/// ```
/// use candle_wick::source::{MemorySource, Record};
/// use candle_wick::Source;
/// let src = MemorySource::new(vec![Record::encoded("a", vec![1, 2], 3)]);
/// assert_eq!(src.len(), 1);
/// assert_eq!(src.read(0).unwrap().label, 3);
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemorySource {
    records: Vec<Record>,
}

impl MemorySource {
    /// A source over `records`, in that order.
    pub fn new(records: Vec<Record>) -> Self {
        Self { records }
    }

    /// The records.
    pub fn records(&self) -> &[Record] {
        &self.records
    }
}

impl FromIterator<Record> for MemorySource {
    fn from_iter<I: IntoIterator<Item = Record>>(iter: I) -> Self {
        Self::new(iter.into_iter().collect())
    }
}

impl Source for MemorySource {
    fn len(&self) -> usize {
        self.records.len()
    }

    fn read(&self, index: usize) -> Result<Record> {
        check_index(index, self.records.len())?;
        Ok(self.records[index].clone())
    }

    fn key(&self, index: usize) -> String {
        self.records
            .get(index)
            .map_or_else(|| format!("#{index}"), |r| r.key.clone())
    }

    /// The records' keys and labels, in order.
    fn digest(&self) -> u32 {
        self.records.iter().fold(0, |crc, r| {
            let crc = crc32c::crc32c_append(crc, r.key.as_bytes());
            crc32c::crc32c_append(crc, &r.label.to_le_bytes())
        })
    }
}
