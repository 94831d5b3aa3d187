//! The `tf.train.Example` proto: the subset wick reads (an image's bytes
//! and its class) and writes.

use crate::contract::{Parts, Value};
use crate::error::Cause;
use prost::Message;
use std::collections::HashMap;

/// The `tf.train.Example` proto, the subset wick reads and writes.
#[derive(Clone, PartialEq, prost::Message)]
struct Example {
    #[prost(message, optional, tag = "1")]
    features: Option<Features>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Features {
    #[prost(map = "string, message", tag = "1")]
    feature: HashMap<String, Feature>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Feature {
    #[prost(oneof = "Kind", tags = "1, 2, 3")]
    kind: Option<Kind>,
}

// The variant names are the proto's field names.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(message, tag = "1")]
    BytesList(BytesList),
    #[prost(message, tag = "2")]
    FloatList(FloatList),
    #[prost(message, tag = "3")]
    Int64List(Int64List),
}

#[derive(Clone, PartialEq, prost::Message)]
struct BytesList {
    #[prost(bytes = "vec", repeated, tag = "1")]
    value: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FloatList {
    #[prost(float, repeated, tag = "1")]
    value: Vec<f32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Int64List {
    #[prost(int64, repeated, tag = "1")]
    value: Vec<i64>,
}

/// A record's named parts ([`crate::source::Record::parts`]).
type NamedParts = Vec<(String, Value)>;

/// A serialized `tf.train.Example`: its image bytes and label, and the
/// features `parts` asks for as named parts. Under [`Parts::Default`] the
/// image and label features must be there; a map that asks for parts may
/// read records without them (empty bytes, label 0).
pub(super) fn parse_example(
    data: &[u8],
    image_key: &str,
    label_key: &str,
    parts: &Parts,
) -> Result<(Vec<u8>, u32, NamedParts), Cause> {
    let mut ex = Example::decode(data).map_err(|e| Cause::new("not a tf.train.Example", e))?;
    let mut features = ex.features.take().map(|f| f.feature).unwrap_or_default();
    let required = *parts == Parts::Default;
    let image = match features.get(image_key).and_then(|f| f.kind.as_ref()) {
        Some(Kind::BytesList(b)) if b.value.len() == 1 => b.value[0].clone(),
        Some(Kind::BytesList(b)) => {
            return Err(format!(
                "feature {image_key:?} holds {} byte strings, not 1",
                b.value.len()
            )
            .into())
        }
        Some(_) => return Err(format!("feature {image_key:?} is not a bytes_list").into()),
        None if required => return Err(format!("no feature {image_key:?}").into()),
        None => Vec::new(),
    };
    let label = match features.get(label_key).and_then(|f| f.kind.as_ref()) {
        Some(Kind::Int64List(l)) if l.value.len() == 1 => u32::try_from(l.value[0])
            .map_err(|_| Cause::from(format!("label {} is not a class index", l.value[0])))?,
        Some(Kind::Int64List(l)) => {
            return Err(format!(
                "feature {label_key:?} holds {} values, not 1",
                l.value.len()
            )
            .into())
        }
        Some(_) => return Err(format!("feature {label_key:?} is not an int64_list").into()),
        None if required => return Err(format!("no feature {label_key:?}").into()),
        None => 0,
    };
    let mut named: Vec<(String, Value)> = features
        .drain()
        .filter(|(name, _)| parts.wants(name))
        .filter_map(|(name, f)| {
            let value = match f.kind? {
                Kind::BytesList(mut b) if b.value.len() == 1 => Value::Bytes(b.value.remove(0)),
                Kind::BytesList(b) => Value::BytesList(b.value),
                Kind::FloatList(f) => Value::Float(f.value),
                Kind::Int64List(i) => Value::Int64(i.value),
            };
            Some((name, value))
        })
        .collect();
    // A map's order, not the hash map's.
    named.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((image, label, named))
}

/// Serializes a `tf.train.Example` with an image and a label, under the
/// given feature keys.
pub(crate) fn example_bytes(image: &[u8], label: i64, image_key: &str, label_key: &str) -> Vec<u8> {
    let mut feature = HashMap::new();
    feature.insert(
        image_key.to_string(),
        Feature {
            kind: Some(Kind::BytesList(BytesList {
                value: vec![image.to_vec()],
            })),
        },
    );
    feature.insert(
        label_key.to_string(),
        Feature {
            kind: Some(Kind::Int64List(Int64List { value: vec![label] })),
        },
    );
    Example {
        features: Some(Features { feature }),
    }
    .encode_to_vec()
}
