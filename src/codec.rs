//! The one encoding of the job's own types wherever they leave a process's memory: TCP
//! frames, checkpoints, `all_gather` messages, and the wire check of the in-memory
//! transport and the simulator.
//!
//! It is MessagePack with named fields (rmp-serde's struct-map form), which is
//! self-describing: the serde attributes users put on their types — `skip_serializing_if`,
//! `default`, `flatten`, untagged and internally tagged enums — decode as they would from
//! JSON. The positional form (a struct as an array of its fields) cannot carry them: a
//! skipped field shifts every field after it. The cost is each field's name once per
//! struct value; bulk numeric data should travel as [`Floats`](crate::Floats), one block of
//! bytes whatever the encoding. Decoding accepts both forms.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes `value` at the end of `out`.
pub(crate) fn write<T: Serialize + ?Sized>(
    out: &mut impl std::io::Write,
    value: &T,
) -> Result<(), rmp_serde::encode::Error> {
    rmp_serde::encode::write_named(out, value)
}

/// Encodes `value` in the positional form (a struct as an array of its fields), which
/// the decoder accepts as well: only for the crate's own types whose fields carry no serde
/// attributes (a piece's head on the wire, where the names would outweigh an 8-byte value).
#[cfg(feature = "tcp")]
pub(crate) fn write_positional<T: Serialize + ?Sized>(
    out: &mut impl std::io::Write,
    value: &T,
) -> Result<(), rmp_serde::encode::Error> {
    rmp_serde::encode::write(out, value)
}

/// Encodes `value`.
pub(crate) fn to_vec<T: Serialize + ?Sized>(
    value: &T,
) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    rmp_serde::to_vec_named(value)
}

/// How many bytes `value` encodes to (0 if it cannot be encoded), without keeping them:
/// a block of bytes ([`Floats`](crate::Floats)) is counted, not copied.
pub(crate) fn encoded_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match rmp_serde::encode::write_named(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => 0,
    }
}

/// The header MessagePack writes before a block of `len` bytes (`bin 8`, `16` or `32`, as
/// short as the length allows, as the encoder writes it): its bytes, and how many of them
/// are used. `None` for a block over 4 GiB, which has none.
pub(crate) fn bin_header(len: usize) -> Option<([u8; 5], usize)> {
    let mut head = [0u8; 5];
    let used = if len <= 0xff {
        head[..2].copy_from_slice(&[0xc4, len as u8]);
        2
    } else if len <= 0xffff {
        head[0] = 0xc5;
        head[1..3].copy_from_slice(&(len as u16).to_be_bytes());
        3
    } else {
        head[0] = 0xc6;
        head[1..5].copy_from_slice(&u32::try_from(len).ok()?.to_be_bytes());
        5
    };
    Some((head, used))
}

/// Where the bytes start in `encoded`, if it is exactly one block of bytes (a
/// [`Floats`](crate::Floats) encoded alone) and its header says its length.
pub(crate) fn bin_start(encoded: &[u8]) -> Option<usize> {
    let (len, at) = match *encoded.first()? {
        0xc4 => (usize::from(*encoded.get(1)?), 2),
        0xc5 => (
            usize::from(u16::from_be_bytes([*encoded.get(1)?, *encoded.get(2)?])),
            3,
        ),
        0xc6 => {
            let b: [u8; 4] = encoded.get(1..5)?.try_into().ok()?;
            (usize::try_from(u32::from_be_bytes(b)).ok()?, 5)
        }
        _ => return None,
    };
    (encoded.len().checked_sub(at)? == len).then_some(at)
}

/// Decodes a `T`; never panics on a peer's bytes (rmp-serde also bounds nesting depth).
pub(crate) fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, rmp_serde::decode::Error> {
    rmp_serde::from_slice(bytes)
}

/// Decodes `count` values written one after another over the whole of `bytes`, into a
/// vector made once for them (`count` said ahead, bounded by the bytes), not grown as
/// they come. The error is a value's, or says that the bytes hold fewer or more than
/// `count`.
pub(crate) fn from_slice_each<T: DeserializeOwned>(
    bytes: &[u8],
    count: usize,
) -> Result<Vec<T>, String> {
    // A head that says more than its bytes can hold makes no more than four times their
    // size before they run out.
    let most = (bytes.len() * 4 / std::mem::size_of::<T>().max(1)).max(1);
    let mut values = Vec::with_capacity(count.min(most));
    let mut rest = bytes;
    let mut de = rmp_serde::Deserializer::new(&mut rest);
    for i in 0..count {
        if de.get_ref().is_empty() {
            return Err(format!(
                "its bytes end after {i} of the {count} values it says it holds"
            ));
        }
        values.push(serde::Deserialize::deserialize(&mut de).map_err(|e| e.to_string())?);
    }
    drop(de);
    match rest.len() {
        0 => Ok(values),
        left => Err(format!(
            "{left} bytes left over after the {count} values it says it holds"
        )),
    }
}

/// `value` as the receiving side of a wire would see it: encoded, then decoded. The error
/// says which of the two failed.
pub(crate) fn round_trip<T: Serialize + DeserializeOwned>(value: &T) -> Result<T, String> {
    let bytes = to_vec(value).map_err(|e| format!("it could not be encoded: {e}"))?;
    from_slice(&bytes).map_err(|e| format!("its encoding could not be decoded: {e}"))
}

/// A message that did not survive the wire: which way it went, the type it was to be read
/// as, and what the encoder or decoder said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undecodable {
    pub(crate) direction: String,
    pub(crate) type_name: String,
    pub(crate) message: String,
}

impl Undecodable {
    /// A message `direction` that did not read as a `T`, for `message`.
    #[cfg(any(feature = "tcp", feature = "sim"))]
    pub(crate) fn of<T>(direction: String, message: String) -> Self {
        Undecodable {
            direction,
            type_name: std::any::type_name::<T>().to_string(),
            message,
        }
    }

    /// The job's failure for it, where it came from `peer`.
    pub(crate) fn sent_by(self, peer: impl Into<String>) -> crate::error::JobError {
        crate::error::JobError::Decode {
            direction: self.direction,
            type_name: self.type_name,
            peer: peer.into(),
            message: self.message,
        }
    }
}

/// `msg` as the receiving side of a wire gets it, sent `direction`: encoded and decoded.
#[cfg(feature = "sim")]
pub(crate) fn through_wire<T: Serialize + DeserializeOwned>(
    msg: T,
    direction: impl FnOnce() -> String,
) -> Result<T, Undecodable> {
    round_trip(&msg).map_err(|message| Undecodable::of::<T>(direction(), message))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use super::*;

    /// A result type with the serde attributes users reach for.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Stats {
        count: u64,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        note: Option<String>,
        #[serde(flatten)]
        extra: BTreeMap<String, f64>,
        shape: Shape,
        tagged: Tagged,
        last: u8,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(untagged)]
    enum Shape {
        Point { x: f64 },
        Label(String),
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "kind")]
    enum Tagged {
        Sum { total: i64 },
        Empty,
    }

    #[test]
    fn serde_attributes_survive_the_encoding() {
        for note in [None, Some("x".to_string())] {
            let value = Stats {
                count: 3,
                note,
                extra: BTreeMap::from([("a".into(), 1.5)]),
                shape: Shape::Point { x: 2.0 },
                tagged: Tagged::Sum { total: -4 },
                last: 7,
            };
            assert_eq!(round_trip(&value).unwrap(), value);
        }
        let labelled = Stats {
            count: 0,
            note: None,
            extra: BTreeMap::new(),
            shape: Shape::Label("l".into()),
            tagged: Tagged::Empty,
            last: 0,
        };
        assert_eq!(round_trip(&labelled).unwrap(), labelled);
    }

    #[test]
    fn the_positional_form_still_decodes() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Plain {
            a: u32,
            b: String,
        }
        let value = Plain {
            a: 1,
            b: "b".into(),
        };
        let positional = rmp_serde::to_vec(&value).unwrap();
        assert_eq!(from_slice::<Plain>(&positional).unwrap(), value);
    }

    #[test]
    fn a_block_header_is_the_encoders_and_reads_back_where_its_bytes_start() {
        for n in [0usize, 1, 255, 256, 65_535, 65_536, 200_000] {
            let block = crate::Floats(vec![7u8; n]);
            let encoded = to_vec(&block).unwrap();
            let (head, used) = bin_header(n).unwrap();
            assert_eq!(&encoded[..used], &head[..used], "{n} bytes");
            assert_eq!(bin_start(&encoded), Some(used), "{n} bytes");
            // One byte more or less than the header says is not one block.
            assert_eq!(bin_start(&encoded[..encoded.len() - 1]), None, "{n} bytes");
            let mut longer = encoded.clone();
            longer.push(0);
            assert_eq!(bin_start(&longer), None, "{n} bytes");
        }
        // Not a block at all: a list of numbers, nothing.
        assert_eq!(bin_start(&to_vec(&vec![1.0f64, 2.0]).unwrap()), None);
        assert_eq!(bin_start(&[]), None);
        assert_eq!(bin_start(&[0xc5, 0x01]), None);
    }
}
