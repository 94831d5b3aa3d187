//! Parquet files as a source, as the Hugging Face Hub stores nearly every
//! dataset: row `i` of the files in order is sample `i`.
//!
//! - **Opening** reads each file's footer only (two ranged reads): the
//!   length, the row groups and the schema come from the footers. Files
//!   that a manifest beside them lists (`wick index`) open from it: the
//!   first file's footer is read at open, the others' when they are
//!   first read.
//! - **Row groups** are the unit of reading: a row group's projected
//!   column chunks are fetched together (concurrent ranged requests from
//!   object storage, never the whole file) and decoded into Arrow arrays
//!   once, kept in a bounded cache of decoded row groups (counted in the
//!   loader's RAM budget).
//! - **Block shuffle**: the loader takes each epoch's order from the
//!   source ([`Source::begin_epoch`]): the row groups permuted from
//!   `(seed, epoch)`, the rows shuffled within windows of
//!   [`ParquetOptions::shuffle_window`] row groups, so an epoch decodes
//!   each row group about once; without a seed, the stored order. A pure
//!   function of the seed and epoch: resume is exact.
//! - **Projection**: only the columns the map reads are decoded: the
//!   image column's `bytes` (the Hub's `Image` feature is a struct
//!   `{bytes, path}`; a plain binary column works too), the label column,
//!   and the record parts the map asks for ([`Parts`]), any column by name.
//! - **Labels**: an integer column, or a string column mapped through the
//!   `ClassLabel` names of the file's `huggingface` metadata
//!   ([`Parquet::classes`]).
//! - **Filters** ([`RowFilter`]): row groups whose statistics exclude the
//!   filter are never read; the filter column of the rest is read once at
//!   open, and a row group's decode skips the pages without a kept row
//!   (the page index).

mod columns;
mod hub;
mod io;
mod meta;

pub use hub::{hub_files, HubFiles, HubLayout, HubOptions};

use crate::contract::{check_index, reads_through, EpochOrder, Parts, Record, Source, Value};
use crate::error::{Error, Result};
use crate::formats::shards::manifest::{self, IndexedWith, Lazy, Listed};
use crate::formats::{DatasetKind, Format};
use crate::order::blocks::BlockShuffle;
use crate::read::jobs::Jobs;
use crate::rng::{keyed_rng, Purpose};
use arrow_array::{Array, ArrayRef, RecordBatch};
use columns::{check_value_size, column_names, image_bytes, int_at, text_at, value};
use io::{Reads, RowGroupCache};
use meta::{open_file, FileMeta, Group};
use rand::seq::SliceRandom;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A filter on rows, applied when a [`Parquet`] source is opened.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RowFilter {
    /// Rows whose integer column `column` lies in `range`.
    IntRange {
        /// The column.
        column: String,
        /// The values kept.
        range: RangeInclusive<i64>,
    },
    /// Rows whose string column `column` is one of `values`.
    TextIn {
        /// The column.
        column: String,
        /// The values kept.
        values: Vec<String>,
    },
}

impl RowFilter {
    fn column(&self) -> &str {
        match self {
            RowFilter::IntRange { column, .. } | RowFilter::TextIn { column, .. } => column,
        }
    }
}

/// How a [`Parquet`] source reads its files.
#[derive(Debug, Clone, PartialEq)]
pub struct ParquetOptions {
    /// The image column: a struct with a `bytes` field (the Hub's `Image`
    /// feature) or a binary column. Default `image`; `None`: no image
    /// (records carry only parts).
    pub image_column: Option<String>,
    /// The class column: integers, or strings mapped through the
    /// `ClassLabel` names. Default `label`; a file without the column named
    /// is an error that lists its columns (name another, such as
    /// `labels` or `fine_label`); `None`: unlabelled, every label 0.
    pub label_column: Option<String>,
    /// Row groups whose rows are shuffled together. Default 16.
    pub shuffle_window: usize,
    /// Decoded row groups kept in memory. Default 0: two shuffle windows,
    /// three for files in a store (the window read, the one before whose
    /// last rows are still being read, and the next one read ahead).
    pub cached_row_groups: usize,
    /// Bytes of decoded row groups kept in memory at most, those being
    /// decoded (read ahead) counted at the size their footer gives; a row
    /// group larger on its own is an error naming it (write smaller row
    /// groups, or raise this). Default 0: a quarter of the default RAM
    /// budget (so a sixteenth of the memory available at open).
    pub cache_bytes: u64,
    /// Rows kept. Default: all.
    pub filter: Option<RowFilter>,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        Self {
            image_column: Some("image".into()),
            label_column: Some("label".into()),
            shuffle_window: 16,
            cached_row_groups: 0,
            cache_bytes: 0,
            filter: None,
        }
    }
}

/// Parquet files as a source of records (module docs). Sample `i` is the
/// `i`-th kept row of the files in order; its key is `file#row`.
///
/// ```no_run
/// use candle_wick::source::{Parquet, ParquetOptions};
/// # fn main() -> candle_wick::Result<()> {
/// let train = Parquet::open(["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"])?;
/// println!("{} rows, classes {:?}", candle_wick::Source::len(&train), train.classes());
/// let loader = candle_wick::Loader::builder(train).shuffle(0).build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Parquet {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    files: Vec<PFile>,
    /// The first file's schema, which every file must have.
    schema: arrow_schema::SchemaRef,
    groups: Vec<Group>,
    /// The first sample of each group, then the total.
    starts: Vec<usize>,
    opts: ParquetOptions,
    classes: Option<Vec<String>>,
    cache: RowGroupCache,
    reads: Arc<Reads>,
    /// Whether the files are in a store (their chunks fetched ahead).
    remote: bool,
    /// The row groups in the order of the last epoch order given out.
    plan: Mutex<Plan>,
    /// Row groups read ahead, on at most [`AHEAD_THREADS`] threads.
    ahead: Jobs,
}

/// One Parquet file: its size and its row groups' rows, from its footer
/// or from what a manifest lists of it, and its footer, read at open or,
/// for a file a manifest lists, when it is first read.
#[derive(Debug)]
struct PFile {
    path: PathBuf,
    size: u64,
    rows: Vec<u64>,
    meta: Lazy<FileMeta>,
}

/// The manifest's name for the format.
pub(crate) const MANIFEST_FORMAT: &str = "parquet";

/// What a manifest lists of Parquet file `path`: read from its footer
/// (what `wick index` writes).
pub(crate) fn listed(path: &Path) -> Result<Listed> {
    let fm = open_file(path, &Arc::new(Reads::default()))?;
    fm.check_counts()?;
    let rows = row_counts(&fm);
    Ok(Listed {
        name: manifest::split(path).1,
        size: fm.file.size(),
        version: fm.file.version(),
        records: rows.iter().sum(),
        index_bytes: 0,
        index_crc: 0,
        damage: Vec::new(),
        row_groups: rows,
    })
}

/// The rows of each row group of `fm`, from its footer.
fn row_counts(fm: &FileMeta) -> Vec<u64> {
    let groups = fm.meta.metadata().row_groups();
    groups.iter().map(|g| g.num_rows().max(0) as u64).collect()
}

/// Threads reading row groups ahead, at most.
const AHEAD_THREADS: usize = 8;

/// Row groups in the order an epoch reads them.
#[derive(Debug, Default)]
struct Plan {
    groups: Vec<usize>,
    /// Each group's position in `groups`.
    position: Vec<usize>,
    /// Positions below this were read ahead (or read).
    started: usize,
    /// The next epoch (seed, epoch), whose first window is read ahead
    /// once this epoch's last window is read (then `None`).
    following: Option<(Option<u64>, u64)>,
    /// The epoch (seed, epoch) it is the order of.
    epoch: Option<(Option<u64>, u64)>,
}

impl Plan {
    fn new(groups: Vec<usize>, following: Option<(Option<u64>, u64)>) -> Self {
        let mut position = vec![0; groups.len()];
        for (i, &g) in groups.iter().enumerate() {
            position[g] = i;
        }
        Self {
            groups,
            position,
            started: 0,
            following,
            epoch: None,
        }
    }
}

impl Parquet {
    /// Opens the Parquet files `paths` (local paths or URLs) with the
    /// default options.
    pub fn open(paths: impl IntoIterator<Item = impl AsRef<Path>>) -> Result<Self> {
        Self::open_with(paths, ParquetOptions::default())
    }

    /// Opens the Parquet files `paths` with `opts`. An error names a file
    /// that is not Parquet, lacks a column the options name, or whose
    /// schema differs from the first file's. Files that a manifest in
    /// their folder lists (`wick index`, [`crate::write::index`]) are
    /// opened from it, without a `filter`: the first file's footer is read
    /// now, each other's when a row of it is first read (an error naming
    /// the file then, when it is not as listed or has another schema).
    pub fn open_with(
        paths: impl IntoIterator<Item = impl AsRef<Path>>,
        opts: ParquetOptions,
    ) -> Result<Self> {
        let reads = Arc::new(Reads::default());
        let paths = crate::formats::shards::owned(paths);
        if paths.is_empty() {
            return Err(Error::InvalidConfig("no Parquet file to open".into()));
        }
        if opts.shuffle_window == 0 {
            return Err(Error::InvalidConfig(
                "shuffle_window must be at least 1 row group".into(),
            ));
        }
        // Files a manifest lists are read when first read, but the first
        // (its schema, columns and classes); a filter reads every file's
        // statistics, and the filter column, at open.
        let listed = match opts.filter {
            None => manifest::lookup(&paths, MANIFEST_FORMAT, &IndexedWith::default())?,
            Some(_) => vec![None; paths.len()],
        };
        // The first file's footer, as its manifest lists it (no HEAD).
        let mut first_listed = match &listed[0] {
            Some((manifest, l)) => {
                let file = io::ParquetFile::open_listed(&paths[0], (manifest, l), reads.clone())?;
                Some(meta::footer(Arc::new(file))?)
            }
            None => None,
        };
        // The footers of the files no manifest lists, read at once (16
        // files at a time when remote): one file after another, a Hub
        // dataset of 41,000 files took ~1 h of round trips.
        let now = manifest::unlisted(&paths, &listed);
        let mut opened =
            crate::formats::shards::open_each(&now, |p| open_file(p, &reads)).into_iter();
        let mut files: Vec<PFile> = Vec::with_capacity(paths.len());
        let mut schema: Option<arrow_schema::SchemaRef> = None;
        for (i, (path, listed)) in paths.into_iter().zip(listed).enumerate() {
            if i > 0 && listed.is_some() {
                let (size, rows) = listed
                    .as_ref()
                    .map(|(_, l)| (l.size, l.row_groups.clone()))
                    .expect("listed");
                files.push(PFile {
                    path,
                    size,
                    rows,
                    meta: Lazy::new(None, listed),
                });
                continue;
            }
            let fm = match first_listed.take() {
                Some(fm) => fm,
                None => opened.next().expect("a footer a file read at open")?,
            };
            let first = schema.get_or_insert_with(|| fm.meta.schema().clone());
            same_schema(&fm, first)?;
            fm.check_counts()?;
            let rows = row_counts(&fm);
            if let Some((manifest, l)) = &listed {
                check_listed(&fm, &rows, (manifest, l))?;
            }
            files.push(PFile {
                path,
                size: fm.file.size(),
                rows,
                meta: Lazy::new(Some(fm), listed),
            });
        }
        let schema = schema.expect("the first file's footer is read");
        let first = files[0]
            .meta
            .get()
            .expect("the first file's footer is read");
        for column in [&opts.image_column, &opts.label_column]
            .into_iter()
            .flatten()
        {
            if schema.field_with_name(column).is_err() {
                let which = if Some(column) == opts.label_column.as_ref() {
                    " (name the class column in ParquetOptions::label_column, or None for \
                     unlabelled data)"
                } else {
                    ""
                };
                return Err(first.file.error(
                    &format!("has no column {column:?}{which}"),
                    std::io::Error::other(format!("its columns: {:?}", column_names(&schema))),
                ));
            }
        }
        let classes = first.classes(opts.label_column.as_deref());
        let mut groups = Vec::new();
        for (f, pf) in files.iter().enumerate() {
            for (rg, &rows) in pf.rows.iter().enumerate() {
                let kept = match (&opts.filter, pf.meta.get()) {
                    (Some(filter), Some(fm)) => fm.filter(rg, filter)?,
                    _ => None,
                };
                let count = kept.as_ref().map_or(rows as usize, Vec::len);
                if count > 0 {
                    groups.push(Group {
                        file: f,
                        row_group: rg,
                        rows: kept,
                        count,
                    });
                }
            }
        }
        let mut starts = vec![0usize];
        for g in &groups {
            let total = starts.last().copied().unwrap_or(0).checked_add(g.count);
            starts.push(total.ok_or_else(|| {
                Error::InvalidConfig("the Parquet files hold more rows than can be counted".into())
            })?);
        }
        let remote = crate::storage::is_url(&files[0].path);
        let capacity = match opts.cached_row_groups {
            0 if remote => 3 * opts.shuffle_window,
            0 => 2 * opts.shuffle_window,
            n => n,
        };
        let cache_bytes = match opts.cache_bytes {
            0 => crate::tune::default_budget() / 4,
            n => n,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                plan: Mutex::new(Plan::new((0..groups.len()).collect(), None)),
                ahead: Jobs::new("wick-parquet-ahead", AHEAD_THREADS),
                files,
                schema,
                groups,
                starts,
                cache: RowGroupCache::new(capacity, cache_bytes),
                remote,
                opts,
                classes,
                reads,
            }),
        })
    }

    /// The class names, from the label column's `ClassLabel` in the
    /// first file's `huggingface` metadata, when it has them.
    pub fn classes(&self) -> Option<&[String]> {
        self.inner.classes.as_deref()
    }

    /// Row groups, over every file (those the filter leaves out not
    /// counted).
    pub fn row_groups(&self) -> usize {
        self.inner.groups.len()
    }

    /// Bytes read from the files so far (footers, column chunks).
    pub fn bytes_read(&self) -> u64 {
        self.inner.reads.bytes.load(Ordering::Relaxed)
    }

    /// The column names of the files.
    pub fn columns(&self) -> Vec<String> {
        column_names(&self.inner.schema)
    }

    /// Starts recording each range read (for the tests: which bytes of
    /// which file a decode touches).
    #[doc(hidden)]
    pub fn __record_reads(&self) -> Vec<(PathBuf, std::ops::Range<u64>)> {
        self.inner.reads.record.store(true, Ordering::Relaxed);
        std::mem::take(&mut *crate::sync::lock(&self.inner.reads.ranges))
    }

    /// The byte ranges of column `column`'s chunks (for the tests).
    #[doc(hidden)]
    pub fn __column_ranges(&self, column: &str) -> Vec<(PathBuf, std::ops::Range<u64>)> {
        let mut out = Vec::new();
        for f in (0..self.inner.files.len()).filter_map(|f| self.file(f).ok()) {
            for rg in f.meta.metadata().row_groups() {
                for c in rg.columns() {
                    if c.column_path().parts().first().map(String::as_str) == Some(column) {
                        let (start, len) = c.byte_range();
                        out.push((f.file.path.clone(), start..start + len));
                    }
                }
            }
        }
        out
    }

    /// File `f`'s footer: read at open, or, for a file a manifest lists,
    /// on its first read, checked against the listing (its size, version
    /// and row groups) and the first file's schema.
    fn file(&self, f: usize) -> Result<&FileMeta> {
        let pf = &self.inner.files[f];
        pf.meta.load(|manifest, listed| {
            let reads = self.inner.reads.clone();
            let file = io::ParquetFile::open_listed(&pf.path, (manifest, listed), reads)?;
            let fm = meta::footer(Arc::new(file))?;
            same_schema(&fm, &self.inner.schema)?;
            fm.check_counts()?;
            check_listed(&fm, &row_counts(&fm), (manifest, listed))?;
            Ok(fm)
        })
    }

    /// The group of sample `index` and the row's offset in its row group.
    fn locate(&self, index: usize) -> Result<(usize, usize)> {
        check_index(index, self.len())?;
        let g = self.inner.starts.partition_point(|&s| s <= index) - 1;
        let k = index - self.inner.starts[g];
        let group = &self.inner.groups[g];
        let row = group.rows.as_ref().map_or(k, |r| r[k] as usize);
        Ok((g, row))
    }

    /// The columns read for `parts`: the image's, the label's, the parts'.
    fn projection(&self, parts: &Parts) -> Vec<String> {
        let schema = &self.inner.schema;
        let mut cols: Vec<String> = Vec::new();
        let mut add = |c: &str| {
            if schema.field_with_name(c).is_ok() && !cols.iter().any(|x| x == c) {
                cols.push(c.to_string());
            }
        };
        if let Some(c) = &self.inner.opts.image_column {
            add(c);
        }
        if let Some(c) = &self.inner.opts.label_column {
            add(c);
        }
        match parts {
            Parts::Default => {}
            Parts::Named(names) => names.iter().for_each(|n| add(n)),
            Parts::All => schema.fields().iter().for_each(|f| add(f.name())),
        }
        cols
    }

    /// Group `g` decoded, with the columns `cols` (from the cache).
    fn decoded(&self, g: usize, cols: &[String]) -> Result<Arc<RecordBatch>> {
        let id = crc32c::crc32c(cols.join("\0").as_bytes()) as u64;
        if self.inner.remote {
            self.read_ahead(g, id, cols);
        }
        self.cached(g, id, cols)
    }

    /// Group `g` with the columns `cols` (projection `id`) from the cache,
    /// fetched and decoded into it unless held.
    fn cached(&self, g: usize, id: u64, cols: &[String]) -> Result<Arc<RecordBatch>> {
        let group = &self.inner.groups[g];
        let key = (group.file, group.row_group, id);
        let file = self.file(group.file)?;
        let image = self.inner.opts.image_column.as_deref();
        let estimate = file.decoded_size(group.row_group, cols, image);
        let limit = self.inner.cache.max_bytes();
        if estimate > limit {
            return Err(file.file.error(
                &format!(
                    "row group {} decodes to {estimate} bytes (its footer says), over the \
                     row-group cache's {limit}: write smaller row groups or raise \
                     ParquetOptions::cache_bytes",
                    group.row_group
                ),
                std::io::Error::other("row group too large"),
            ));
        }
        self.inner.cache.get(key, estimate, || {
            file.decode(
                group.row_group,
                cols,
                image,
                group.rows.as_deref(),
                group.count,
            )
        })
    }

    /// The row groups in epoch `epoch`'s order: permuted from `(seed,
    /// epoch)`, or stored order without a seed.
    fn group_order(&self, seed: Option<u64>, epoch: u64) -> Vec<usize> {
        let mut groups: Vec<usize> = (0..self.inner.groups.len()).collect();
        if let Some(seed) = seed {
            groups.shuffle(&mut keyed_rng(seed, epoch, Purpose::BlockShuffle, 0));
        }
        groups
    }

    /// From a store: reading group `g` starts fetching and decoding (on at
    /// most [`AHEAD_THREADS`] threads) the groups after it in the epoch's
    /// order through the end of the next shuffle window, so a window's
    /// groups are ready when its rows are read instead of all fetched at
    /// its start; reading the epoch's last window starts the next epoch's
    /// first (its order is a function of the seed), so an epoch does not
    /// open on a wait for a whole window. A read from the middle of an
    /// epoch (a resume) starts at its own window: nothing before it is
    /// fetched. Groups that would not fit the cache's bytes beside those
    /// held are left for their read. An error is left for the read that
    /// needs the group (it fetches again and reports it).
    fn read_ahead(&self, g: usize, id: u64, cols: &[String]) {
        let window = self.inner.opts.shuffle_window.max(1);
        let mut plan = crate::sync::lock(&self.inner.plan);
        let Some(&at) = plan.position.get(g) else {
            return;
        };
        let len = plan.groups.len();
        let until = ((at / window + 2) * window).min(len);
        let mut next = Vec::new();
        let from = plan.started.max(at / window * window);
        if until > from {
            // The rest of this window (read in shuffled order) and the next.
            next.extend(plan.groups[from..until].iter().filter(|&&n| n != g));
            plan.started = until;
        }
        if at / window == (len - 1) / window {
            if let Some((seed, epoch)) = plan.following.take() {
                let first = self.group_order(seed, epoch);
                next.extend(first.into_iter().take(window).filter(|&n| n != g));
            }
        }
        drop(plan);
        let image = self.inner.opts.image_column.as_deref();
        for n in next {
            let group = &self.inner.groups[n];
            if self.inner.cache.contains((group.file, group.row_group, id)) {
                continue;
            }
            // A file's footer read here when a manifest listed it (an
            // error is left for the read that needs the group).
            let Ok(file) = self.file(group.file) else {
                break;
            };
            let estimate = file.decoded_size(group.row_group, cols, image);
            if !self.inner.cache.has_room(estimate) {
                break;
            }
            let (me, cols) = (self.clone(), cols.to_vec());
            self.inner.ahead.push(move || drop(me.cached(n, id, &cols)));
        }
    }

    /// Row `row` of decoded group `batch` (rows of a filtered group are
    /// its kept rows, in order) as a record.
    fn record(
        &self,
        index: usize,
        (g, row): (usize, usize),
        parts: &Parts,
        mut bytes: Vec<u8>,
    ) -> Result<Record> {
        let cols = self.projection(parts);
        let batch = self.decoded(g, &cols)?;
        let group = &self.inner.groups[g];
        // A filtered row group decodes its kept rows only.
        let at = match &group.rows {
            Some(rows) => rows.partition_point(|&r| (r as usize) < row),
            None => row,
        };
        let key = self.key(index);
        let bad = |reason: String| Error::Transform {
            key: key.clone(),
            reason,
            source: None,
        };
        bytes.clear();
        if let Some(c) = &self.inner.opts.image_column {
            let array = batch
                .column_by_name(c)
                .ok_or_else(|| bad(format!("no column {c:?}")))?;
            let b = image_bytes(array.as_ref(), at)
                .map_err(|why| bad(format!("column {c:?}: {why}")))?;
            check_value_size(b.len()).map_err(|why| bad(format!("column {c:?}: {why}")))?;
            bytes.extend_from_slice(b);
        }
        let label = match self.inner.opts.label_column.as_deref() {
            Some(c) => match batch.column_by_name(c) {
                Some(array) => self
                    .label(array, at)
                    .map_err(|why| bad(format!("label column {c:?}: {why}")))?,
                None => 0,
            },
            None => 0,
        };
        let mut record = Record::encoded(key.clone(), bytes, label);
        for name in &cols {
            if parts.wants(name) {
                let array = batch.column_by_name(name).ok_or_else(|| {
                    bad(format!(
                        "column {name:?} is missing from the decoded row group"
                    ))
                })?;
                let v = value(array, at).map_err(|why| bad(format!("column {name:?}: {why}")))?;
                if let Value::Bytes(b) = &v {
                    check_value_size(b.len())
                        .map_err(|why| bad(format!("column {name:?}: {why}")))?;
                }
                record = record.with_part(name.clone(), v);
            }
        }
        Ok(record)
    }

    fn label(&self, array: &ArrayRef, at: usize) -> std::result::Result<u32, String> {
        if array.is_null(at) {
            return Err("the label is null".into());
        }
        if let Some(text) = text_at(array, at) {
            let names = self.inner.classes.as_ref().ok_or_else(|| {
                format!("label {text:?} is text, and the file has no ClassLabel names")
            })?;
            return names
                .iter()
                .position(|n| n == text)
                .map(|i| i as u32)
                .ok_or_else(|| format!("label {text:?} is not one of the ClassLabel names"));
        }
        let v = int_at(array, at)
            .ok_or_else(|| format!("of type {}, not integers or text", array.data_type()))?;
        u32::try_from(v).map_err(|_| format!("label {v} is not a class index"))
    }
}

/// An error naming `fm`'s file when its schema is not `first` (the first
/// file's).
fn same_schema(fm: &FileMeta, first: &arrow_schema::SchemaRef) -> Result<()> {
    if fm.meta.schema().fields() == first.fields() {
        return Ok(());
    }
    Err(fm.file.error(
        "has another schema than the first file",
        std::io::Error::other(format!("{:?} against {:?}", fm.meta.schema(), first)),
    ))
}

/// An error naming `fm`'s file when its row groups' rows (`rows`, from
/// its footer) are not those `manifest` lists (`listed`).
fn check_listed(fm: &FileMeta, rows: &[u64], (manifest, listed): (&Path, &Listed)) -> Result<()> {
    if rows == listed.row_groups.as_slice() {
        return Ok(());
    }
    let what = format!(
        "its footer gives row groups of {rows:?} rows, not the {:?} the manifest lists",
        listed.row_groups
    );
    Err(manifest::changed(&fm.file.path, manifest, &what))
}

/// Parquet files in the format table.
pub(crate) const FORMAT: Format = Format::shards(
    DatasetKind::Parquet,
    "Parquet files",
    &[".parquet"],
    |paths| Ok(Box::new(Parquet::open(paths)?)),
);

impl Source for Parquet {
    fn len(&self) -> usize {
        *self.inner.starts.last().expect("the total")
    }

    reads_through!(read_parts);

    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let at = self.locate(index)?;
        self.record(index, at, parts, bytes)
    }

    fn key(&self, index: usize) -> String {
        match self.locate(index) {
            Ok((g, row)) => {
                let group = &self.inner.groups[g];
                let file = &self.inner.files[group.file];
                let before: u64 = file.rows[..group.row_group].iter().sum();
                format!("{}#{}", file.path.display(), before as usize + row)
            }
            Err(_) => format!("#{index}"),
        }
    }

    /// Each file's name, size and row groups, the columns read and the
    /// filter.
    fn digest(&self) -> u32 {
        let inner = &*self.inner;
        let mut text = format!(
            "parquet {:?} {:?} window {} filter {:?}",
            inner.opts.image_column,
            inner.opts.label_column,
            inner.opts.shuffle_window,
            inner.opts.filter
        );
        for f in &inner.files {
            let name = f.path.file_name().map(|n| n.to_string_lossy().into_owned());
            text.push_str(&format!(" {name:?}:{}:{}", f.size, f.rows.len()));
        }
        crc32c::crc32c(text.as_bytes())
    }

    /// `false` even for files in a store: the source reads ahead itself,
    /// by row group (`Parquet::read_ahead`), which the loader's
    /// read-ahead of records would only duplicate (measured: 0.83 of the
    /// local images/s through it from `file://` URLs, where the network
    /// costs nothing).
    fn wants_read_ahead(&self) -> bool {
        false
    }

    fn memory(&self) -> u64 {
        self.inner.cache.memory()
    }

    /// The block shuffle: row groups permuted, rows shuffled within each
    /// window of `shuffle_window` row groups, computed position by
    /// position (a few words a row group, nothing a row).
    fn begin_epoch(&self, seed: Option<u64>, epoch: u64) -> Option<Arc<dyn EpochOrder>> {
        let groups = self.group_order(seed, epoch);
        let following = epoch.checked_add(1).map(|next| (seed, next));
        {
            // Asked again for the epoch under way (`Loader::batches`, a
            // resume, a second loader): its reads ahead go on.
            let mut plan = crate::sync::lock(&self.inner.plan);
            if plan.epoch != Some((seed, epoch)) {
                *plan = Plan::new(groups.clone(), following);
                plan.epoch = Some((seed, epoch));
            }
        }
        Some(Arc::new(BlockShuffle::new(
            &self.inner.starts,
            groups,
            self.inner.opts.shuffle_window,
            seed,
            epoch,
            Purpose::BlockShuffle,
        )))
    }
}
