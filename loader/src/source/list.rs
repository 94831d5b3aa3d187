//! CSV/TSV lists of `path,label`, the way many datasets ship their splits.

use super::{labeled_key, read_labeled, Record, Source};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Header names that mark the first row of a list as a header.
const HEADER_NAMES: &[&str] = &[
    "path",
    "file",
    "filename",
    "file_name",
    "filepath",
    "image",
    "image_path",
    "img",
];

/// A dataset given as a CSV or TSV file of `path,label` rows.
///
/// - Paths are relative to the list file's folder (absolute paths are kept).
/// - The delimiter is a tab for `.tsv` files or when the first line holds a
///   tab, else a comma. Quoted fields follow RFC 4180; columns after the
///   second are ignored.
/// - A first row whose path column is a usual header name (`path`, `file`,
///   `filename`, `image`, ...) is a header and is skipped.
/// - Labels are class indices when every label is a non-negative integer;
///   otherwise they are class names, sorted to give the indices (see
///   [`FileList::classes`]).
/// - Files are not opened here: a missing file is an error naming it when it
///   is read.
#[derive(Debug, Clone)]
pub struct FileList {
    path: PathBuf,
    classes: Vec<String>,
    samples: Vec<(PathBuf, u32)>,
}

impl FileList {
    /// Parses the list at `path`.
    pub fn new(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let text = std::fs::read(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let first_line = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
        let is_tsv = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("tsv"))
            || first_line.contains(&b'\t');
        let mut reader = csv::ReaderBuilder::new()
            .delimiter(if is_tsv { b'\t' } else { b',' })
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(text.as_slice());

        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut rows: Vec<(PathBuf, String, u64)> = Vec::new();
        for (i, row) in reader.records().enumerate() {
            let row = row.map_err(|e| Error::FileList {
                path: path.clone(),
                line: e.position().map_or(i as u64 + 1, |p| p.line()),
                reason: e.to_string(),
            })?;
            let line = row.position().map_or(i as u64 + 1, |p| p.line());
            if i == 0
                && row
                    .get(0)
                    .is_some_and(|f| HEADER_NAMES.iter().any(|h| f.eq_ignore_ascii_case(h)))
            {
                continue;
            }
            let (Some(file), Some(label)) = (row.get(0), row.get(1)) else {
                return Err(Error::FileList {
                    path: path.clone(),
                    line,
                    reason: "expected two columns: path and label".into(),
                });
            };
            if file.is_empty() {
                return Err(Error::FileList {
                    path: path.clone(),
                    line,
                    reason: "empty path".into(),
                });
            }
            rows.push((base.join(file), label.to_string(), line));
        }
        if rows.is_empty() {
            return Err(Error::Dataset {
                path,
                reason: "the list has no samples".into(),
            });
        }

        let numeric = rows.iter().all(|(_, l, _)| l.parse::<u32>().is_ok());
        let (classes, samples) = if numeric {
            let samples: Vec<_> = rows
                .into_iter()
                .map(|(p, l, _)| (p, l.parse::<u32>().unwrap_or_default()))
                .collect();
            let n = samples.iter().map(|(_, l)| *l).max().map_or(0, |m| m + 1);
            ((0..n).map(|i| i.to_string()).collect(), samples)
        } else {
            let mut names = BTreeMap::new();
            for (_, l, line) in &rows {
                if l.is_empty() {
                    return Err(Error::FileList {
                        path,
                        line: *line,
                        reason: "empty label".into(),
                    });
                }
                names.insert(l.clone(), 0u32);
            }
            for (i, v) in names.values_mut().enumerate() {
                *v = i as u32;
            }
            let samples = rows
                .into_iter()
                .map(|(p, l, _)| {
                    let label = names[&l];
                    (p, label)
                })
                .collect();
            (names.into_keys().collect(), samples)
        };
        Ok(Self {
            path,
            classes,
            samples,
        })
    }

    /// Class names: the sorted label names, or `"0".."n-1"` for numeric labels.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Every sample's resolved path and label, in list order.
    pub fn samples(&self) -> &[(PathBuf, u32)] {
        &self.samples
    }

    /// The list file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Source for FileList {
    fn len(&self) -> usize {
        self.samples.len()
    }

    fn read(&self, index: usize) -> Result<Record> {
        read_labeled(&self.samples, index, Vec::new())
    }

    fn read_reusing(&self, index: usize, bytes: Vec<u8>) -> Result<Record> {
        read_labeled(&self.samples, index, bytes)
    }

    fn key(&self, index: usize) -> String {
        labeled_key(&self.samples, index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_csv_with_header_and_numeric_labels() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("train.csv");
        std::fs::write(&list, "path,label\nimgs/a.jpg,3\n\"imgs/b,c.jpg\",0\n").unwrap();
        let fl = FileList::new(&list).unwrap();
        assert_eq!(fl.len(), 2);
        assert_eq!(fl.samples()[0], (dir.path().join("imgs/a.jpg"), 3));
        assert_eq!(fl.samples()[1], (dir.path().join("imgs/b,c.jpg"), 0));
        assert_eq!(fl.classes().len(), 4);
    }

    #[test]
    fn parses_tsv_with_class_names() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("val.txt");
        std::fs::write(&list, "x/1.png\tzebra\nx/2.png\tant\n\nx/3.png\tzebra\n").unwrap();
        let fl = FileList::new(&list).unwrap();
        assert_eq!(fl.classes(), ["ant", "zebra"]);
        let labels: Vec<_> = fl.samples().iter().map(|s| s.1).collect();
        assert_eq!(labels, [1, 0, 1]);
    }

    #[test]
    fn missing_label_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("bad.csv");
        std::fs::write(&list, "a.jpg,1\nb.jpg\n").unwrap();
        let err = FileList::new(&list).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("bad.csv"), "{err}");
    }
}
