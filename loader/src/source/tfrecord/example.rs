//! The `tf.train.Example` proto: the subset wick reads (an image's bytes
//! and its class) and writes.

use crate::source::shards::Cause;
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

/// The image bytes and label of a serialized `tf.train.Example`.
pub(super) fn parse_example(
    data: &[u8],
    image_key: &str,
    label_key: &str,
) -> Result<(Vec<u8>, u32), Cause> {
    let mut ex = Example::decode(data).map_err(|e| Cause::new("not a tf.train.Example", e))?;
    let mut features = ex.features.take().map(|f| f.feature).unwrap_or_default();
    let image = match features.remove(image_key).and_then(|f| f.kind) {
        Some(Kind::BytesList(mut b)) if b.value.len() == 1 => b.value.remove(0),
        Some(Kind::BytesList(b)) => {
            return Err(format!(
                "feature {image_key:?} holds {} byte strings, not 1",
                b.value.len()
            )
            .into())
        }
        Some(_) => return Err(format!("feature {image_key:?} is not a bytes_list").into()),
        None => return Err(format!("no feature {image_key:?}").into()),
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
        None => return Err(format!("no feature {label_key:?}").into()),
    };
    Ok((image, label))
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
