//! What a Parquet source knows of each file: its footer, parsed and
//! checked, and per row group the rows a filter keeps, the byte ranges of
//! the columns read, and decoding them.

use super::columns::{column_names, int_at, is_struct_with_bytes, text_at};
use super::io::{ParquetFile, Reads};
use super::RowFilter;
use crate::error::Result;
use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
use std::path::Path;
use std::sync::Arc;

/// One row group's rows in the dataset.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) file: usize,
    pub(super) row_group: usize,
    /// The kept rows' offsets in the row group (`None`: every row).
    pub(super) rows: Option<Vec<u32>>,
    /// Rows kept.
    pub(super) count: usize,
}

#[derive(Debug)]
pub(super) struct FileMeta {
    pub(super) file: Arc<ParquetFile>,
    pub(super) meta: ArrowReaderMetadata,
}

impl FileMeta {
    /// `ClassLabel` names of `column` from the `huggingface` metadata.
    pub(super) fn classes(&self, column: Option<&str>) -> Option<Vec<String>> {
        let column = column?;
        // `datasets` writes it as a key of the footer; other Arrow writers
        // keep it in the Arrow schema's metadata only.
        let footer = self
            .meta
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|k| k.key == "huggingface"))
            .and_then(|k| k.value.clone());
        let json = footer.or_else(|| self.meta.schema().metadata().get("huggingface").cloned())?;
        let v: serde_json::Value = serde_json::from_str(&json).ok()?;
        let feature = &v["info"]["features"][column];
        let names = feature["names"].as_array()?;
        names.iter().map(|n| n.as_str().map(String::from)).collect()
    }

    /// The rows of row group `rg` that `filter` keeps (`None`: all):
    /// nothing read when the statistics say no row or every row matches.
    pub(super) fn filter(&self, rg: usize, filter: &RowFilter) -> Result<Option<Vec<u32>>> {
        let meta = self.meta.metadata().row_group(rg);
        let rows = meta.num_rows() as usize;
        let column = filter.column();
        let idx = meta
            .columns()
            .iter()
            .position(|c| c.column_path().string() == column)
            .ok_or_else(|| {
                self.file.error(
                    &format!("has no column {column:?} to filter on"),
                    std::io::Error::other(format!(
                        "its columns: {:?}",
                        column_names(self.meta.schema())
                    )),
                )
            })?;
        if let (RowFilter::IntRange { range, .. }, Some(stats)) =
            (filter, meta.column(idx).statistics())
        {
            let bounds = match stats {
                parquet::file::statistics::Statistics::Int32(s) => s
                    .min_opt()
                    .zip(s.max_opt())
                    .map(|(a, b)| (i64::from(*a), i64::from(*b))),
                parquet::file::statistics::Statistics::Int64(s) => {
                    s.min_opt().zip(s.max_opt()).map(|(a, b)| (*a, *b))
                }
                _ => None,
            };
            if let Some((lo, hi)) = bounds {
                if hi < *range.start() || lo > *range.end() {
                    return Ok(Some(Vec::new()));
                }
                if lo >= *range.start() && hi <= *range.end() && stats.null_count_opt() == Some(0) {
                    return Ok(None);
                }
            }
        }
        let batch = self.decode(rg, &[column.to_string()], None, None, rows)?;
        let array = batch.column(0);
        let keep = |i: usize| -> bool {
            if array.is_null(i) {
                return false;
            }
            match filter {
                RowFilter::IntRange { range, .. } => {
                    int_at(array, i).is_some_and(|v| range.contains(&v))
                }
                RowFilter::TextIn { values, .. } => {
                    text_at(array, i).is_some_and(|t| values.iter().any(|v| v == t))
                }
            }
        };
        let kept: Vec<u32> = (0..rows).filter(|&i| keep(i)).map(|i| i as u32).collect();
        Ok(if kept.len() == rows { None } else { Some(kept) })
    }

    /// Decodes row group `rg`'s columns `cols` (the image column's `bytes`
    /// field only), its rows `rows` only when given (pages without one
    /// skipped).
    /// The projection of `cols` (the image struct's `bytes` leaf for
    /// `image`) and the byte ranges of its column chunks in row group `rg`.
    pub(super) fn chunk_ranges(
        &self,
        rg: usize,
        cols: &[String],
        image: Option<&str>,
    ) -> (ProjectionMask, Vec<std::ops::Range<u64>>) {
        let schema = self.meta.parquet_schema();
        let names: Vec<String> = cols
            .iter()
            .map(|c| match image {
                Some(i) if i == c && is_struct_with_bytes(self.meta.schema(), c) => {
                    format!("{c}.bytes")
                }
                _ => c.clone(),
            })
            .collect();
        let mask = ProjectionMask::columns(schema, names.iter().map(String::as_str));
        let meta = self.meta.metadata().row_group(rg);
        let ranges: Vec<std::ops::Range<u64>> = meta
            .columns()
            .iter()
            .enumerate()
            .filter(|(i, _)| mask.leaf_included(*i))
            .map(|(_, c)| {
                let (start, len) = c.byte_range();
                start..start + len
            })
            .collect();
        (mask, ranges)
    }

    /// The decoded size of row group `rg`'s columns `cols`, as its footer
    /// gives it (uncompressed bytes).
    pub(super) fn decoded_size(&self, rg: usize, cols: &[String], image: Option<&str>) -> u64 {
        let (mask, _) = self.chunk_ranges(rg, cols, image);
        self.meta
            .metadata()
            .row_group(rg)
            .columns()
            .iter()
            .enumerate()
            .filter(|(i, _)| mask.leaf_included(*i))
            .map(|(_, c)| c.uncompressed_size().max(0) as u64)
            .fold(0u64, u64::saturating_add)
    }

    /// Refuses a footer whose counts cannot be true: a negative count,
    /// row groups that do not add up to the file's rows, column chunks
    /// outside the file, or more rows than its bytes can hold (a row
    /// takes at least a bit of some column: 8 rows a byte of its
    /// compressed column chunks, and 4,096 rows for any row group).
    pub(super) fn check_counts(&self) -> Result<()> {
        let meta = self.meta.metadata();
        let lie = |why: String| {
            self.file.error(
                "has a footer that cannot be true",
                std::io::Error::other(why),
            )
        };
        let mut sum = 0i64;
        for (rg, g) in meta.row_groups().iter().enumerate() {
            let rows = g.num_rows();
            let mut compressed = 0u64;
            for c in g.columns() {
                let (start, len) = c.byte_range();
                if start
                    .checked_add(len)
                    .is_none_or(|end| end > self.file.size())
                {
                    return Err(lie(format!(
                        "row group {rg}: a column chunk at {start}+{len} bytes ends past the \
                         file's {} bytes",
                        self.file.size()
                    )));
                }
                compressed += len;
            }
            let most = compressed.saturating_mul(8).saturating_add(4096);
            if rows < 0 || rows as u64 > most {
                return Err(lie(format!(
                    "row group {rg} claims {rows} rows in {compressed} bytes of column chunks"
                )));
            }
            sum = sum.saturating_add(rows);
        }
        let total = meta.file_metadata().num_rows();
        if total != sum {
            return Err(lie(format!(
                "the file claims {total} rows, its row groups {sum}"
            )));
        }
        Ok(())
    }

    /// Row group `rg` decoded with the columns `cols` (the rows `rows` of
    /// it when filtered): `expected` rows, else an error (a footer that
    /// lied about its rows).
    pub(super) fn decode(
        &self,
        rg: usize,
        cols: &[String],
        image: Option<&str>,
        rows: Option<&[u32]>,
        expected: usize,
    ) -> Result<RecordBatch> {
        let (mask, ranges) = self.chunk_ranges(rg, cols, image);
        let chunks = self.file.fetch(ranges)?;
        let meta = self.meta.metadata().row_group(rg);
        let total = meta.num_rows() as usize;
        let mut builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(chunks, self.meta.clone())
                .with_row_groups(vec![rg])
                .with_projection(mask)
                .with_batch_size(total.max(1));
        if let Some(rows) = rows {
            builder = builder.with_row_selection(selection(rows, total));
        }
        let what = format!("cannot decode row group {rg}");
        let reader = builder.build().map_err(|e| self.file.error(&what, e))?;
        let batches: Vec<RecordBatch> = reader
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| self.file.error(&what, e))?;
        // One batch: the batch size is the row group's rows.
        let n = batches.len();
        let batch = batches
            .into_iter()
            .next()
            .filter(|_| n == 1)
            .ok_or_else(|| {
                self.file.error(
                    &what,
                    std::io::Error::other(format!("{n} batches, not one")),
                )
            })?;
        if batch.num_rows() != expected {
            return Err(self.file.error(
                &what,
                std::io::Error::other(format!(
                    "{} rows decoded, its footer claims {expected}",
                    batch.num_rows()
                )),
            ));
        }
        Ok(batch)
    }
}

/// Opens `path`'s footer (and page index, when it has one).
pub(super) fn open_file(path: &Path, reads: &Arc<Reads>) -> Result<FileMeta> {
    footer(Arc::new(ParquetFile::open(path, reads.clone())?))
}

/// The footer of `file`, read and checked.
pub(super) fn footer(file: Arc<ParquetFile>) -> Result<FileMeta> {
    if file.size() < 12 {
        return Err(file.error(
            "is not a Parquet file",
            std::io::Error::other(format!("{} bytes: shorter than a footer", file.size())),
        ));
    }
    let metadata = ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Optional)
        .parse_and_finish(&*file)
        .map_err(|e| file.error("is not a readable Parquet file (its footer)", e))?;
    let options = ArrowReaderOptions::new();
    let meta = ArrowReaderMetadata::try_new(Arc::new(metadata), options)
        .map_err(|e| file.error("has a schema Arrow cannot read", e))?;
    Ok(FileMeta { file, meta })
}

/// Rows `rows` (sorted offsets) of a row group of `total` rows.
pub(super) fn selection(rows: &[u32], total: usize) -> RowSelection {
    let mut selectors = Vec::new();
    let mut at = 0usize;
    for &r in rows {
        let r = r as usize;
        if r > at {
            selectors.push(RowSelector::skip(r - at));
        }
        selectors.push(RowSelector::select(1));
        at = r + 1;
    }
    if total > at {
        selectors.push(RowSelector::skip(total - at));
    }
    selectors.into()
}
