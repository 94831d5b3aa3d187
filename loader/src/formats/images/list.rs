//! CSV/TSV lists of `path,label`, the way many datasets ship their splits.

use super::{labeled_key, read_labeled};
use crate::contract::{Parts, Record, Source, Value};
use crate::error::{Error, Result};
use crate::formats::{the_one, DatasetKind, Format};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most classes numeric labels may name (class indices `0..2^20`): a
/// larger index is a typo or an identifier, and would size the class list.
const MAX_CLASSES: u32 = 1 << 20;

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

/// `scheme://authority` of a URL.
fn scheme_authority(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    let end = url[after..].find('/').map_or(url.len(), |i| after + i);
    &url[..end]
}

/// The authority of a URL (`user:pass@host:port`).
fn authority(url: &str) -> &str {
    let s = scheme_authority(url);
    s.find("://").map_or(s, |i| &s[i + 3..])
}

/// A dataset given as a CSV or TSV file of `path,label` rows.
///
/// - Paths are relative to the list file's folder (absolute paths are kept).
///   A list read from a URL is untrusted: its entries must stay in its
///   store (relative paths, or URLs of the same bucket or host); an
///   absolute local path or another store's URL is an error naming the
///   line, unless the list is opened with [`FileList::trusting`]. No entry
///   may carry a user, password or query string (they would be printed
///   with every key, and are never sent).
/// - The delimiter is a tab for `.tsv` files or when the first line holds a
///   tab, else a comma. Quoted fields follow RFC 4180; columns after the
///   second are ignored.
/// - A first row whose path column is a usual header name (`path`, `file`,
///   `filename`, `image`, ...) is a header and is skipped, and so is a first
///   row whose label is not an integer when every other label is one
///   (`image_name,label`).
/// - Labels are class indices (below 2^20) when every label is a
///   non-negative integer, class names (sorted to give the indices, see
///   [`FileList::classes`]) when none is; a list mixing the two is an error
///   naming the lines, since reading the indices as names would silently
///   relabel every sample ("10" sorts before "2").
/// - Files are not opened here: a missing file is an error naming it when it
///   is read.
#[derive(Debug, Clone)]
pub struct FileList {
    path: PathBuf,
    classes: Vec<String>,
    samples: Vec<(PathBuf, u32)>,
    /// The names of the columns after path and label: the header's, or
    /// `col2`, `col3`, ... without one.
    columns: Vec<String>,
    /// Each sample's columns after path and label, as written.
    extra: Vec<Vec<String>>,
}

impl FileList {
    /// Parses the list at `path`.
    pub fn new(path: impl AsRef<Path>) -> Result<Self> {
        Self::parse(path.as_ref(), false)
    }

    /// Parses the list at `path`, a URL whose entries may name any local
    /// path or URL (a list you wrote yourself).
    pub fn trusting(path: impl AsRef<Path>) -> Result<Self> {
        Self::parse(path.as_ref(), true)
    }

    fn parse(path: &Path, trusted: bool) -> Result<Self> {
        let path = path.to_path_buf();
        // Local or remote (a URL); a list over 1 GiB is refused.
        let text = crate::storage::read_whole(&path, Vec::new(), 1 << 30)?;
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
        let mut header_skipped = false;
        let mut header: Vec<String> = Vec::new();
        let mut extra: Vec<Vec<String>> = Vec::new();
        for (i, row) in reader.records().enumerate() {
            let row = row.map_err(|e| Error::FileList {
                path: path.clone(),
                line: e.position().map_or(i as u64 + 1, |p| p.line()),
                reason: "not a CSV/TSV row".into(),
                source: Some(Box::new(e)),
            })?;
            let line = row.position().map_or(i as u64 + 1, |p| p.line());
            if i == 0
                && row
                    .get(0)
                    .is_some_and(|f| HEADER_NAMES.iter().any(|h| f.eq_ignore_ascii_case(h)))
            {
                header_skipped = true;
                header = row.iter().skip(2).map(str::to_string).collect();
                continue;
            }
            let (Some(file), Some(label)) = (row.get(0), row.get(1)) else {
                return Err(Error::FileList {
                    path: path.clone(),
                    line,
                    reason: "expected two columns: path and label".into(),
                    source: None,
                });
            };
            if file.is_empty() {
                return Err(Error::FileList {
                    path: path.clone(),
                    line,
                    reason: "empty path".into(),
                    source: None,
                });
            }
            // An entry may be a URL of its own; else it is relative to the list.
            let refuse = |reason: String| Error::FileList {
                path: path.clone(),
                line,
                reason,
                source: None,
            };
            let entry_is_url = crate::storage::is_url(Path::new(file));
            if entry_is_url && (file.contains('?') || authority(file).contains('@')) {
                return Err(refuse(
                    "an entry with a user, password or query string in its URL (give \
                     credentials with storage::configure or the environment)"
                        .into(),
                ));
            }
            if crate::storage::is_url(&path) && !trusted {
                let list = crate::storage::url_of(&path);
                let escapes = if entry_is_url {
                    scheme_authority(file) != scheme_authority(list)
                } else {
                    Path::new(file).is_absolute()
                };
                if escapes {
                    return Err(refuse(format!(
                        "{:?} is outside the list's store: a list read from a URL names \
                         objects beside it (open it with FileList::trusting to allow any path)",
                        crate::error::redact(file)
                    )));
                }
            }
            let file = if entry_is_url {
                PathBuf::from(file)
            } else {
                base.join(file)
            };
            rows.push((file, label.to_string(), line));
            extra.push(row.iter().skip(2).map(str::to_string).collect());
        }
        let is_index = |l: &str| l.parse::<u32>().is_ok();
        // A header with other names (`image_name,label`): the first row's
        // label alone is not an index.
        if !header_skipped
            && rows.len() > 1
            && !is_index(&rows[0].1)
            && rows[1..].iter().all(|(_, l, _)| is_index(l))
        {
            rows.remove(0);
            header = extra.remove(0);
        }
        if rows.is_empty() {
            return Err(Error::Dataset {
                path,
                reason: "the list has no samples".into(),
                source: None,
            });
        }
        let indices = rows.iter().filter(|(_, l, _)| is_index(l)).count();
        if indices > 0 && indices < rows.len() {
            let named = rows
                .iter()
                .find(|(_, l, _)| !is_index(l))
                .expect("one is named");
            let index = rows
                .iter()
                .find(|(_, l, _)| is_index(l))
                .expect("one is an index");
            return Err(Error::FileList {
                path,
                line: named.2,
                reason: format!(
                    "label {:?} is a class name but line {} has the class index {}: use class \
                     indices throughout or class names throughout",
                    named.1, index.2, index.1
                ),
                source: None,
            });
        }
        let numeric = indices == rows.len();
        if numeric {
            if let Some((_, l, line)) = rows
                .iter()
                .find(|(_, l, _)| l.parse::<u32>().is_ok_and(|v| v >= MAX_CLASSES))
            {
                return Err(Error::FileList {
                    path,
                    line: *line,
                    reason: format!(
                        "class index {l} is not below the limit of {MAX_CLASSES} classes (an \
                         identifier? write it as a class name, e.g. with a prefix)"
                    ),
                    source: None,
                });
            }
        }
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
                        source: None,
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
        let width = extra.iter().map(Vec::len).max().unwrap_or(0);
        let columns = (0..width)
            .map(|c| {
                header
                    .get(c)
                    .filter(|h| !h.is_empty())
                    .cloned()
                    .unwrap_or_else(|| format!("col{}", c + 2))
            })
            .collect();
        Ok(Self {
            path,
            classes,
            samples,
            columns,
            extra,
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

/// File lists in the format table: any file that is no shard (these
/// endings tell a list under a URL).
pub(crate) const FORMAT: Format = Format::single(
    DatasetKind::FileList,
    "a file list",
    &[".csv", ".tsv", ".txt"],
    |paths| Ok(Box::new(FileList::new(the_one(paths, "a file list")?)?)),
);

impl Source for FileList {
    fn wants_read_ahead(&self) -> bool {
        crate::storage::is_url(&self.path)
            || self.samples.iter().any(|(p, _)| crate::storage::is_url(p))
    }

    fn len(&self) -> usize {
        self.samples.len()
    }

    fn digest(&self) -> u32 {
        let root = self.path.parent().unwrap_or(Path::new(""));
        super::labeled_digest(&self.samples, root)
    }

    fn read(&self, index: usize) -> Result<Record> {
        read_labeled(&self.samples, index, Vec::new())
    }

    fn read_reusing(&self, index: usize, bytes: Vec<u8>) -> Result<Record> {
        read_labeled(&self.samples, index, bytes)
    }

    /// The columns after path and label, as [`Value::Text`] named by the
    /// header (or `col2`, `col3`, ...); a short row's missing columns are
    /// absent.
    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let mut record = self.read_reusing(index, bytes)?;
        for (name, value) in self.columns.iter().zip(&self.extra[index]) {
            if parts.wants(name) {
                record
                    .parts
                    .push((name.clone(), Value::Text(value.clone())));
            }
        }
        Ok(record)
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

    fn list(text: &str) -> (tempfile::TempDir, Result<FileList>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list.csv");
        std::fs::write(&path, text).unwrap();
        let fl = FileList::new(&path);
        (dir, fl)
    }

    #[test]
    fn a_huge_class_index_is_an_error_not_an_allocation() {
        for label in ["4000000000", "4294967295", "1048576"] {
            let (_dir, fl) = list(&format!("a.jpg,{label}\nb.jpg,1\n"));
            let err = fl.expect_err(label).to_string();
            assert!(err.contains("line 1") && err.contains("class"), "{err}");
        }
        let (_dir, fl) = list("a.jpg,1048575\n");
        assert_eq!(fl.unwrap().classes().len(), 1 << 20);
    }

    #[test]
    fn an_unknown_header_above_numeric_labels_is_skipped() {
        let rows: String = (0..=10).map(|i| format!("{i}.jpg,{i}\n")).collect();
        let (_dir, fl) = list(&format!("image_name,label\n{rows}"));
        let fl = fl.unwrap();
        let labels: Vec<u32> = fl.samples().iter().map(|s| s.1).collect();
        assert_eq!(
            labels,
            (0..=10).collect::<Vec<u32>>(),
            "numeric labels keep their values"
        );
        assert_eq!(fl.classes().len(), 11);
    }

    #[test]
    fn mixed_numeric_and_named_labels_are_an_error_naming_the_lines() {
        let (_dir, fl) = list("a.jpg,10\nb.jpg,2\nc.jpg,cat\nd.jpg,3\n");
        let err = fl.unwrap_err().to_string();
        assert!(err.contains("line 3") && err.contains("cat"), "{err}");
        // Names throughout are names, sorted.
        let (_dir, fl) = list("a.jpg,zebra\nb.jpg,ant\n");
        assert_eq!(fl.unwrap().classes(), ["ant", "zebra"]);
    }
}
