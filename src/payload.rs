//! Payload types that travel fast.
//!
//! serde encodes a `Vec<f64>` element by element: over a network, large numeric results
//! then cost far more to encode and decode than to send. [`Floats`] is a `Vec<f64>` that
//! goes to the wire as one block of bytes: encoding is a copy, decoding is a copy.

use std::fmt;
use std::ops::{Deref, DerefMut};

use serde::de::{Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `Vec<f64>` that serializes as one block of little-endian bytes instead of element by
/// element. Use it for large numeric results (gradients, vectors of sums): in memory it is
/// a `Vec<f64>`; over TCP it moves at close to the speed of raw bytes.
///
/// ```
/// use superstep::Floats;
/// let g = Floats::from(vec![0.5, -1.0, 2.25]);
/// let bytes = rmp_serde::to_vec(&g).unwrap();
/// assert!(bytes.len() < 3 * 8 + 8, "one block, no per-element markers");
/// let back: Floats = rmp_serde::from_slice(&bytes).unwrap();
/// assert_eq!(back, g);
/// assert_eq!(back.iter().sum::<f64>(), 1.75);
/// ```
#[derive(Clone, Default, PartialEq)]
pub struct Floats(pub Vec<f64>);

impl Floats {
    /// The values.
    pub fn into_inner(self) -> Vec<f64> {
        self.0
    }
}

impl fmt::Debug for Floats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Floats").field(&self.0).finish()
    }
}

impl Deref for Floats {
    type Target = Vec<f64>;
    fn deref(&self) -> &Vec<f64> {
        &self.0
    }
}

impl DerefMut for Floats {
    fn deref_mut(&mut self) -> &mut Vec<f64> {
        &mut self.0
    }
}

impl AsRef<[f64]> for Floats {
    fn as_ref(&self) -> &[f64] {
        &self.0
    }
}

impl From<Vec<f64>> for Floats {
    fn from(v: Vec<f64>) -> Self {
        Floats(v)
    }
}

impl From<Floats> for Vec<f64> {
    fn from(f: Floats) -> Self {
        f.0
    }
}

impl FromIterator<f64> for Floats {
    fn from_iter<I: IntoIterator<Item = f64>>(iter: I) -> Self {
        Floats(iter.into_iter().collect())
    }
}

impl Serialize for Floats {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[cfg(target_endian = "little")]
        {
            serializer.serialize_bytes(bytemuck::cast_slice(&self.0))
        }
        #[cfg(not(target_endian = "little"))]
        {
            let bytes: Vec<u8> = self.0.iter().flat_map(|x| x.to_le_bytes()).collect();
            serializer.serialize_bytes(&bytes)
        }
    }
}

struct FloatsVisitor;

impl<'de> Visitor<'de> for FloatsVisitor {
    type Value = Floats;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a block of little-endian f64 bytes")
    }

    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Floats, E> {
        if bytes.len() % 8 != 0 {
            return Err(E::custom(format!(
                "{} bytes is not a whole number of f64s",
                bytes.len()
            )));
        }
        Ok(Floats(
            bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8")))
                .collect(),
        ))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Floats, E> {
        self.visit_bytes(&bytes)
    }

    // Formats without a bytes type hand over a sequence of numbers.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Floats, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(x) = seq.next_element::<f64>()? {
            v.push(x);
        }
        Ok(Floats(v))
    }
}

impl<'de> Deserialize<'de> for Floats {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_bytes(FloatsVisitor)
            .map_err(|e| D::Error::custom(format!("Floats: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip_bit_for_bit_and_odd_byte_counts_are_refused() {
        let v = Floats(vec![
            0.0,
            -0.0,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::NAN,
            1e-300,
        ]);
        let back: Floats = rmp_serde::from_slice(&rmp_serde::to_vec(&v).unwrap()).unwrap();
        let bits = |f: &Floats| f.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&v));
        let odd = rmp_serde::to_vec(&serde_bytes_like(&[1, 2, 3])).unwrap();
        assert!(rmp_serde::from_slice::<Floats>(&odd).is_err());
    }

    fn serde_bytes_like(b: &[u8]) -> impl Serialize + '_ {
        struct B<'a>(&'a [u8]);
        impl Serialize for B<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        B(b)
    }
}
