//! Arrow values to record parts: images (bytes, or a struct with
//! `bytes`), text, integers and floats, each under the per-record limit.

use crate::contract::Value;
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, StructArray};
use arrow_schema::DataType;

/// A value over the per-record limit every format has
/// ([`MAX_FILE_BYTES`](crate::storage::local::MAX_FILE_BYTES)) is refused: a few bytes of
/// zstd can decode to gigabytes.
pub(super) fn check_value_size(len: usize) -> std::result::Result<(), String> {
    if len as u64 > crate::storage::local::MAX_FILE_BYTES {
        return Err(format!(
            "a value of {len} bytes, over the {}-byte limit of a record",
            crate::storage::local::MAX_FILE_BYTES
        ));
    }
    Ok(())
}

pub(super) fn column_names(schema: &arrow_schema::Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

pub(super) fn is_struct_with_bytes(schema: &arrow_schema::Schema, column: &str) -> bool {
    matches!(
        schema.field_with_name(column).map(|f| f.data_type()),
        Ok(DataType::Struct(fields)) if fields.iter().any(|f| f.name() == "bytes")
    )
}

/// The bytes of row `at` of an image column: a struct's `bytes` field or
/// a binary column.
pub(super) fn image_bytes(array: &dyn Array, at: usize) -> std::result::Result<&[u8], String> {
    let array: &dyn Array = match array.as_struct_opt() {
        Some(s) => struct_field(s, "bytes")?,
        None => array,
    };
    if array.is_null(at) {
        return Err("the image bytes are null (an image stored by path only)".into());
    }
    binary_at(array, at).ok_or_else(|| format!("of type {}, not bytes", array.data_type()))
}

pub(super) fn struct_field<'a>(
    s: &'a StructArray,
    name: &str,
) -> std::result::Result<&'a dyn Array, String> {
    s.column_by_name(name)
        .map(|a| a.as_ref())
        .ok_or_else(|| format!("a struct without a {name:?} field"))
}

pub(super) fn binary_at(array: &dyn Array, at: usize) -> Option<&[u8]> {
    match array.data_type() {
        DataType::Binary => Some(array.as_binary::<i32>().value(at)),
        DataType::LargeBinary => Some(array.as_binary::<i64>().value(at)),
        DataType::BinaryView => Some(array.as_binary_view().value(at)),
        DataType::FixedSizeBinary(_) => Some(array.as_fixed_size_binary().value(at)),
        _ => None,
    }
}

pub(super) fn text_at(array: &dyn Array, at: usize) -> Option<&str> {
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string::<i32>().value(at)),
        DataType::LargeUtf8 => Some(array.as_string::<i64>().value(at)),
        DataType::Utf8View => Some(array.as_string_view().value(at)),
        _ => None,
    }
}

pub(super) fn int_at(array: &dyn Array, at: usize) -> Option<i64> {
    Some(match array.data_type() {
        DataType::Int8 => array.as_primitive::<Int8Type>().value(at).into(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(at).into(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(at).into(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(at),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(at).into(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(at).into(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(at).into(),
        DataType::UInt64 => i64::try_from(array.as_primitive::<UInt64Type>().value(at)).ok()?,
        _ => return None,
    })
}

pub(super) fn float_at(array: &dyn Array, at: usize) -> Option<f32> {
    Some(match array.data_type() {
        DataType::Float32 => array.as_primitive::<Float32Type>().value(at),
        DataType::Float64 => array.as_primitive::<Float64Type>().value(at) as f32,
        _ => return None,
    })
}

/// Row `at` of any column as a record part.
pub(super) fn value(array: &ArrayRef, at: usize) -> std::result::Result<Value, String> {
    if let Some(s) = array.as_struct_opt() {
        // The Hub's Image and Audio features: the `bytes` field.
        return image_bytes(s, at).map(|b| Value::Bytes(b.to_vec()));
    }
    if array.is_null(at) {
        return Err("null".into());
    }
    if let Some(b) = binary_at(array.as_ref(), at) {
        return Ok(Value::Bytes(b.to_vec()));
    }
    if let Some(t) = text_at(array.as_ref(), at) {
        return Ok(Value::Text(t.to_string()));
    }
    if let Some(v) = int_at(array.as_ref(), at) {
        return Ok(Value::Int64(vec![v]));
    }
    if let Some(v) = float_at(array.as_ref(), at) {
        return Ok(Value::Float(vec![v]));
    }
    let list: Option<ArrayRef> = match array.data_type() {
        DataType::List(_) => Some(array.as_list::<i32>().value(at)),
        DataType::LargeList(_) => Some(array.as_list::<i64>().value(at)),
        DataType::FixedSizeList(..) => Some(array.as_fixed_size_list().value(at)),
        _ => None,
    };
    let Some(items) = list else {
        return Err(format!(
            "of type {}, which no part holds",
            array.data_type()
        ));
    };
    let n = items.len();
    if let Some(v) = (0..n)
        .map(|i| int_at(items.as_ref(), i))
        .collect::<Option<Vec<_>>>()
    {
        return Ok(Value::Int64(v));
    }
    if let Some(v) = (0..n)
        .map(|i| float_at(items.as_ref(), i))
        .collect::<Option<Vec<_>>>()
    {
        return Ok(Value::Float(v));
    }
    if let Some(v) = (0..n)
        .map(|i| binary_at(items.as_ref(), i).map(<[u8]>::to_vec))
        .collect::<Option<Vec<_>>>()
    {
        return Ok(Value::BytesList(v));
    }
    Err(format!(
        "a list of {}, which no part holds",
        items.data_type()
    ))
}
