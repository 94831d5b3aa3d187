//! The batch schema: the fields a map writes for every sample, each with a
//! name, an element type and a per-sample shape. A leaf: the pool's
//! buffers, the slots the workers write and the uploader's tensors are all
//! laid out from it.

use crate::error::{Error, Result};
use candle_core::DType;

/// The element type of a batch field: the candle dtypes a loader can fill.
///
/// candle has no `u16` tensor, so there is no `u16` field: a map that
/// reads 16-bit tokens widens them into a [`FieldType::U32`] field (as
/// the token example does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FieldType {
    /// `u8`.
    U8,
    /// `u32`.
    U32,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// bfloat16.
    BF16,
    /// IEEE half precision.
    F16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl FieldType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        DType::from(self).size_in_bytes()
    }

    /// Whether candle's CUDA backend can operate on a tensor of this type:
    /// `Err` says what to use instead. candle-core 0.11's CUDA kernels
    /// (candle-kernels `cast.cu`, `binary.cu`, `reduce.cu`) cover u8, u32,
    /// i64, bf16, f16, f32 and f64; for i16 and i32 there is no cast
    /// (`to_dtype` fails with "named symbol not found", and
    /// `cuda_backend/mod.rs` `to_dtype` refuses them as targets), no binary
    /// op and no reduction, so a batch field of either would be a tensor
    /// candle cannot use. bf16 kernels need compute capability 8.0 or newer.
    pub fn cuda_support(self) -> std::result::Result<(), &'static str> {
        match self {
            FieldType::I16 => Err("i64 (or f32, which holds every i16 exactly)"),
            FieldType::I32 => Err("i64 (or f64, which holds every i32 exactly)"),
            _ => Ok(()),
        }
    }
}

impl From<FieldType> for DType {
    fn from(t: FieldType) -> Self {
        match t {
            FieldType::U8 => DType::U8,
            FieldType::U32 => DType::U32,
            FieldType::I16 => DType::I16,
            FieldType::I32 => DType::I32,
            FieldType::I64 => DType::I64,
            FieldType::BF16 => DType::BF16,
            FieldType::F16 => DType::F16,
            FieldType::F32 => DType::F32,
            FieldType::F64 => DType::F64,
        }
    }
}

/// A Rust element type a field can hold (`u8`, `u32`, `i16`, `i32`, `i64`,
/// `half::bf16`, `half::f16`, `f32`, `f64`): what
/// [`Sample::take`](crate::map::Sample::take) hands a map a field as.
pub trait Element:
    candle_core::WithDType + bytemuck::Pod + std::fmt::Debug + private::Sealed + Send + Sync + 'static
{
    /// The field type of this element.
    const TYPE: FieldType;
}

mod private {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $f:ident),*) => {$(
        impl private::Sealed for $t {}
        impl Element for $t {
            const TYPE: FieldType = FieldType::$f;
        }
    )*};
}
element!(u8 => U8, u32 => U32, i16 => I16, i32 => I32, i64 => I64,
    half::bf16 => BF16, half::f16 => F16, f32 => F32, f64 => F64);

/// One field of a batch: a tensor `[batch, ..shape]` of `dtype`.
///
/// A **padded** field ([`Field::padded`]) holds up to `shape[0]` items per
/// sample: the map says how many it wrote
/// ([`Sample::set_len`](crate::map::Sample::set_len)), the loader fills the
/// rest with the pad value and writes the count into a `u32 [batch]` field
/// named `<name>_len`, which the schema gains after the padded field.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The name a batch gives the tensor by ([`crate::Batch::get`]).
    pub name: String,
    /// The element type.
    pub dtype: FieldType,
    /// The per-sample shape (empty for one value per sample).
    pub shape: Vec<usize>,
    /// For a padded field, the value written after the last item.
    pub pad: Option<f64>,
}

impl Field {
    /// A field of a fixed per-sample `shape` (`&[]` for one value).
    pub fn new(name: impl Into<String>, dtype: FieldType, shape: &[usize]) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            pad: None,
        }
    }

    /// A variable-length field: up to `shape[0]` items of `shape[1..]` per
    /// sample, padded with `pad`, plus its `<name>_len` count field.
    pub fn padded(name: impl Into<String>, dtype: FieldType, shape: &[usize], pad: f64) -> Self {
        Self {
            pad: Some(pad),
            ..Self::new(name, dtype, shape)
        }
    }

    /// Elements of one sample.
    pub fn sample_elems(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements of one item of a padded field (`shape[1..]`).
    pub(crate) fn item_elems(&self) -> usize {
        self.shape.iter().skip(1).product()
    }
}

/// A batch tensor that is a slice of another field's, not stored: samples'
/// elements `start..start + len` along the field's first per-sample axis,
/// `[batch, len, ..]`, sharing the field's memory (a strided view: rows
/// `shape[0]` elements apart). The token map's `input` and `target` are two
/// views of one `tokens` field of `seq_len + 1` tokens a window, as llm.c's
/// loader points both into one buffer: each window is written once.
/// An op that needs a contiguous tensor copies it (`Tensor::contiguous`).
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The name a batch gives the tensor by ([`crate::Batch::get`]).
    pub name: String,
    /// The field it is a slice of.
    pub of: String,
    /// First element of the slice along the field's first per-sample axis.
    pub start: usize,
    /// Elements in the slice.
    pub len: usize,
}

impl View {
    /// Elements `range` of field `of` along its first per-sample axis.
    pub fn new(
        name: impl Into<String>,
        of: impl Into<String>,
        range: std::ops::Range<usize>,
    ) -> Self {
        Self {
            name: name.into(),
            of: of.into(),
            start: range.start,
            len: range.end.saturating_sub(range.start),
        }
    }
}

/// A [`View`] checked against the schema: the index of its field.
#[derive(Debug, Clone)]
pub(crate) struct ViewLayout {
    pub(crate) view: View,
    pub(crate) of: usize,
}

/// Where a field lives in a batch buffer.
#[derive(Debug, Clone)]
pub(crate) struct FieldLayout {
    pub(crate) field: Field,
    /// Bytes of one sample.
    pub(crate) sample_bytes: usize,
    /// Byte offset of the field's region in a packed (page-locked) buffer.
    pub(crate) offset: usize,
    /// For a padded field: the index of its `_len` field.
    pub(crate) len_field: Option<usize>,
    /// Whether this is a padded field's `_len` field (the loader writes it).
    pub(crate) by_loader: bool,
}

/// Region alignment in a packed buffer: enough for every element type and
/// for fast device copies.
const ALIGN: usize = 256;

/// A validated schema, laid out for batches of `batch` samples.
#[derive(Debug, Clone)]
pub(crate) struct Schema {
    pub(crate) batch: usize,
    pub(crate) fields: Vec<FieldLayout>,
    /// Bytes of a packed buffer holding every region.
    pub(crate) packed_bytes: usize,
    /// Whether a field is padded (the workers then pad after the map).
    pub(crate) padded: bool,
    /// Views of the fields, after them in a batch's tensors.
    pub(crate) views: Vec<ViewLayout>,
}

impl Schema {
    /// Lays `fields` out for `batch` samples: names unique and non-empty,
    /// every padded field with a leading dimension and its `_len` field
    /// added after it.
    pub(crate) fn new(fields: &[Field], batch: usize) -> Result<Self> {
        if fields.is_empty() {
            return Err(Error::InvalidConfig(
                "a map must write at least one field".into(),
            ));
        }
        let mut all: Vec<(Field, Option<usize>)> = Vec::new();
        for f in fields {
            if f.name.is_empty() {
                return Err(Error::InvalidConfig("a field needs a name".into()));
            }
            if f.shape.contains(&0) {
                return Err(Error::InvalidConfig(format!(
                    "field {:?} of shape {:?} holds nothing",
                    f.name, f.shape
                )));
            }
            if f.pad.is_some() && f.shape.is_empty() {
                return Err(Error::InvalidConfig(format!(
                    "padded field {:?} needs a maximum item count as its first dimension, \
                     got shape {:?}",
                    f.name, f.shape
                )));
            }
            let at = all.len();
            all.push((f.clone(), None));
            if f.pad.is_some() {
                all[at].1 = Some(at + 1);
                all.push((
                    Field::new(format!("{}_len", f.name), FieldType::U32, &[]),
                    None,
                ));
            }
        }
        for (i, (f, _)) in all.iter().enumerate() {
            if all[..i].iter().any(|(g, _)| g.name == f.name) {
                return Err(Error::InvalidConfig(format!(
                    "two fields are named {:?}",
                    f.name
                )));
            }
        }
        let mut offset = 0usize;
        let mut out = Vec::with_capacity(all.len());
        for (field, len_field) in all {
            let sample_bytes = field
                .sample_elems()
                .checked_mul(field.dtype.size())
                .filter(|&b| b.checked_mul(batch).is_some_and(|t| t < 1 << 40))
                .ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "field {:?} of shape {:?} is too large",
                        field.name, field.shape
                    ))
                })?;
            let region = (sample_bytes * batch).next_multiple_of(ALIGN);
            out.push(FieldLayout {
                field,
                sample_bytes,
                offset,
                len_field,
                by_loader: false,
            });
            offset += region;
        }
        for l in out.iter().filter_map(|f| f.len_field).collect::<Vec<_>>() {
            out[l].by_loader = true;
        }
        Ok(Self {
            batch,
            padded: out.iter().any(|f| f.len_field.is_some()),
            fields: out,
            packed_bytes: offset.max(ALIGN),
            views: Vec::new(),
        })
    }

    /// Adds `views`: each named apart from every field and view, of a
    /// field with a per-sample axis (fixed, or padded: the view then
    /// holds the pad where the field does; never a `_len` count), inside
    /// it and not empty.
    pub(crate) fn with_views(mut self, views: &[View]) -> Result<Self> {
        for v in views {
            let bad = |why: String| Error::InvalidConfig(format!("view {:?}: {why}", v.name));
            if v.name.is_empty() || self.index(&v.name).is_some() || self.view(&v.name).is_some() {
                return Err(bad("needs a name no field or other view has".into()));
            }
            let of = self
                .index(&v.of)
                .ok_or_else(|| bad(format!("no field {:?}", v.of)))?;
            let f = &self.fields[of];
            let axis = f.field.shape.first().copied();
            if f.by_loader {
                return Err(bad(format!(
                    "field {:?} is a count the loader writes",
                    v.of
                )));
            }
            match axis {
                Some(n) if v.len > 0 && v.start + v.len <= n => {}
                _ => {
                    return Err(bad(format!(
                        "elements {}..{} are not inside field {:?} of shape {:?}",
                        v.start,
                        v.start + v.len,
                        v.of,
                        f.field.shape
                    )))
                }
            }
            self.views.push(ViewLayout {
                view: v.clone(),
                of,
            });
        }
        Ok(self)
    }

    /// The index of the view named `name`.
    pub(crate) fn view(&self, name: &str) -> Option<usize> {
        self.views.iter().position(|v| v.view.name == name)
    }

    /// Host bytes of one full batch.
    pub(crate) fn batch_bytes(&self) -> usize {
        self.fields
            .iter()
            .map(|f| f.sample_bytes * self.batch)
            .sum()
    }

    /// The index of the field named `name`.
    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.field.name == name)
    }

    /// Refuses a field `device` cannot operate on (see
    /// [`FieldType::cuda_support`]), naming it and what to use instead.
    pub(crate) fn check_device(&self, device: &candle_core::Device) -> Result<()> {
        if !device.is_cuda() {
            return Ok(());
        }
        for f in &self.fields {
            if let Err(instead) = f.field.dtype.cuda_support() {
                return Err(Error::InvalidConfig(format!(
                    "field {:?} is {:?}, which candle's CUDA backend cannot cast or compute \
                     on (no kernels for it); declare it as {instead}",
                    f.field.name, f.field.dtype
                )));
            }
        }
        Ok(())
    }

    /// The names of the fields, then of the views, in a batch's order.
    pub(crate) fn names(&self) -> Vec<String> {
        let fields = self.fields.iter().map(|f| f.field.name.clone());
        fields
            .chain(self.views.iter().map(|v| v.view.name.clone()))
            .collect()
    }

    /// The position of `name` among a batch's tensors (fields, then views).
    pub(crate) fn tensor(&self, name: &str) -> Option<usize> {
        self.index(name)
            .or_else(|| self.view(name).map(|v| self.fields.len() + v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_types_candle_can_use_on_cuda_pass_the_device_check() {
        let ok = [
            FieldType::U8,
            FieldType::U32,
            FieldType::I64,
            FieldType::BF16,
            FieldType::F16,
            FieldType::F32,
            FieldType::F64,
        ];
        assert!(ok.iter().all(|t| t.cuda_support().is_ok()));
        for t in [FieldType::I16, FieldType::I32] {
            let instead = t.cuda_support().unwrap_err();
            assert!(instead.starts_with("i64"), "{t:?}: {instead}");
        }
        // On the CPU every type is fine.
        let s = Schema::new(&[Field::new("small", FieldType::I16, &[3])], 4).unwrap();
        s.check_device(&candle_core::Device::Cpu).unwrap();
    }

    #[test]
    fn a_schema_lays_out_regions_and_adds_length_fields() {
        let s = Schema::new(
            &[
                Field::new("image", FieldType::U8, &[4, 4, 3]),
                Field::padded("boxes", FieldType::F32, &[8, 4], -1.0),
                Field::new("label", FieldType::I64, &[]),
            ],
            3,
        )
        .unwrap();
        assert_eq!(
            s.names(),
            ["image", "boxes", "boxes_len", "label"].map(String::from)
        );
        assert_eq!(s.fields[1].len_field, Some(2));
        assert_eq!(s.fields[1].sample_bytes, 8 * 4 * 4);
        assert!(s.fields.iter().all(|f| f.offset % ALIGN == 0));
        assert_eq!(s.batch_bytes(), 3 * (48 + 128 + 4 + 8));
        assert_eq!(s.index("label"), Some(3));
    }

    #[test]
    fn bad_schemas_are_refused() {
        let dup = [
            Field::new("x", FieldType::U8, &[1]),
            Field::new("x", FieldType::U8, &[1]),
        ];
        assert!(Schema::new(&dup, 1).is_err());
        // The length field's name is taken.
        let clash = [
            Field::padded("t", FieldType::U32, &[4], 0.0),
            Field::new("t_len", FieldType::U32, &[]),
        ];
        assert!(Schema::new(&clash, 1).is_err());
        assert!(Schema::new(&[Field::padded("t", FieldType::U32, &[], 0.0)], 1).is_err());
        assert!(Schema::new(&[], 1).is_err());
        let huge = [Field::new("h", FieldType::F64, &[1 << 30, 1 << 20])];
        assert!(Schema::new(&huge, 2).is_err());
    }

    #[test]
    fn views_follow_the_fields_and_must_lie_inside_one() {
        let fields = [
            Field::new("tokens", FieldType::U32, &[9]),
            Field::padded("boxes", FieldType::F32, &[4, 4], 0.0),
            Field::new("label", FieldType::U32, &[]),
        ];
        let schema = || Schema::new(&fields, 2).unwrap();
        let s = schema()
            .with_views(&[
                View::new("input", "tokens", 0..8),
                View::new("target", "tokens", 1..9),
            ])
            .unwrap();
        assert_eq!(
            s.names(),
            ["tokens", "boxes", "boxes_len", "label", "input", "target"].map(String::from)
        );
        assert_eq!((s.tensor("label"), s.tensor("target")), (Some(3), Some(5)));
        assert_eq!(s.views[1].of, 0);
        assert_eq!(
            s.batch_bytes(),
            schema().batch_bytes(),
            "views take no memory"
        );
        let refused = |v: View| {
            let e = schema().with_views(&[v]).unwrap_err().to_string();
            assert!(e.contains("view"), "{e}");
        };
        refused(View::new("tokens", "tokens", 0..1)); // a field's name
        refused(View::new("v", "missing", 0..1));
        refused(View::new("v", "tokens", 2..10)); // past the axis
        refused(View::new("v", "tokens", 3..3)); // empty
                                                 // A padded field's items (the pad included) may be viewed.
        assert!(schema()
            .with_views(&[View::new("v", "boxes", 0..2)])
            .is_ok());
        refused(View::new("v", "boxes_len", 0..1)); // a count
        refused(View::new("v", "label", 0..1)); // no per-sample axis
        let twice = [
            View::new("v", "tokens", 0..1),
            View::new("v", "tokens", 1..2),
        ];
        assert!(schema().with_views(&twice).is_err());
    }
}
