//! Parquet files as the Hugging Face Hub stores an image dataset: an
//! `image` struct column `{bytes, path}` (the `datasets` `Image` feature),
//! a `label` column (`ClassLabel` with names, or plain integers), the
//! features in the `huggingface` schema metadata, snappy pages, row groups
//! of a chosen size.

use super::{ShardSample, ShardWriter};
use crate::error::{Error, Result};
use arrow_array::builder::{BinaryBuilder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch, StructArray};
use arrow_schema::{DataType, Field, Fields, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Writes one Parquet file of image samples in the Hub's layout.
pub struct ParquetWriter {
    path: PathBuf,
    writer: ArrowWriter<std::io::BufWriter<std::fs::File>>,
    schema: Arc<Schema>,
    row_group: usize,
    bytes: BinaryBuilder,
    names: StringBuilder,
    labels: Int64Builder,
    pending: usize,
    written: usize,
}

impl std::fmt::Debug for ParquetWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetWriter")
            .field("path", &self.path)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

fn image_fields() -> Fields {
    Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ])
}

/// The `huggingface` metadata `datasets` reads the features from.
fn features(classes: Option<&[String]>) -> String {
    let label = match classes {
        Some(names) => serde_json::json!({"names": names, "_type": "ClassLabel"}),
        None => serde_json::json!({"dtype": "int64", "_type": "Value"}),
    };
    serde_json::json!({"info": {"features": {
        "image": {"_type": "Image"},
        "label": label,
    }}})
    .to_string()
}

impl ParquetWriter {
    /// Creates `path`, with row groups of `row_group` rows and the label
    /// column a `ClassLabel` of `classes` when given.
    pub fn create(
        path: impl AsRef<Path>,
        row_group: usize,
        classes: Option<&[String]>,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if row_group == 0 {
            return Err(Error::InvalidConfig(
                "row groups need at least 1 row".into(),
            ));
        }
        let hf = features(classes);
        let metadata: std::collections::HashMap<String, String> =
            [("huggingface".to_string(), hf.clone())].into();
        let schema = Arc::new(Schema::new_with_metadata(
            vec![
                Field::new("image", DataType::Struct(image_fields()), true),
                Field::new("label", DataType::Int64, true),
            ],
            metadata,
        ));
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(row_group))
            // A key of the footer too, as pyarrow writes it for `datasets`
            // (readers that do not parse the Arrow schema find it there).
            .set_key_value_metadata(Some(vec![KeyValue::new("huggingface".into(), hf)]))
            .build();
        let file = super::create_file(&path)?;
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|e| {
            Error::Dataset {
                path: path.clone(),
                reason: "cannot start the Parquet file".into(),
                source: Some(Box::new(e)),
            }
        })?;
        Ok(Self {
            path,
            writer,
            schema,
            row_group,
            bytes: BinaryBuilder::new(),
            names: StringBuilder::new(),
            labels: Int64Builder::new(),
            pending: 0,
            written: 0,
        })
    }

    fn error(&self, e: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Dataset {
            path: self.path.clone(),
            reason: "cannot write the Parquet file".into(),
            source: Some(Box::new(e)),
        }
    }

    /// Writes the rows gathered as one row group.
    fn flush_group(&mut self) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        let image = StructArray::new(
            image_fields(),
            vec![
                Arc::new(self.bytes.finish()) as ArrayRef,
                Arc::new(self.names.finish()) as ArrayRef,
            ],
            None,
        );
        let batch = RecordBatch::try_new(
            self.schema.clone(),
            vec![Arc::new(image), Arc::new(self.labels.finish())],
        )
        .map_err(|e| self.error(e))?;
        self.writer.write(&batch).map_err(|e| self.error(e))?;
        self.writer.flush().map_err(|e| self.error(e))?;
        self.pending = 0;
        Ok(())
    }
}

impl ShardWriter for ParquetWriter {
    fn write(&mut self, s: ShardSample<'_>) -> Result<()> {
        self.bytes.append_value(s.bytes);
        self.names.append_value(format!("{}.{}", s.key, s.ext));
        self.labels.append_value(i64::from(s.label));
        self.pending += 1;
        self.written += 1;
        if self.pending == self.row_group {
            self.flush_group()?;
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.written
    }

    fn finish(mut self) -> Result<()> {
        self.flush_group()?;
        let path = self.path.clone();
        self.writer.close().map_err(|e| Error::Dataset {
            path,
            reason: "cannot finish the Parquet file".into(),
            source: Some(Box::new(e)),
        })?;
        Ok(())
    }
}
