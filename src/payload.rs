//! Payload types that travel fast.
//!
//! serde encodes a `Vec<f64>` element by element: over a network, large numeric results
//! then cost far more to encode and decode than to send. [`Floats`] is a `Vec` of plain
//! numbers (`f64` by default; `f32` and the integers too) that goes to the wire as one
//! block of bytes: encoding is a copy, decoding is a copy.

use std::fmt;
use std::ops::{Deref, DerefMut};

use serde::de::{DeserializeOwned, Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A type that can travel as a master or worker result: the user's own serde type.
///
/// In-process nothing is serialized; the serde bounds are there so that the same job runs
/// unchanged across processes.
pub trait Payload: Serialize + DeserializeOwned + Send + Sync + Unpin + 'static {}

impl<T: Serialize + DeserializeOwned + Send + Sync + Unpin + 'static> Payload for T {}

/// A plain number [`Floats`] can hold: `f64`, `f32`, and the integers from 8 to 128 bits.
/// Sealed: its wire form is the number's little-endian bytes.
pub trait Element:
    bytemuck::Pod + Send + Sync + fmt::Debug + Serialize + DeserializeOwned + sealed::Sealed
{
    /// The type's name, for errors.
    const NAME: &'static str;

    /// This number with its bytes as the wire has them (little-endian).
    #[doc(hidden)]
    fn native_to_wire(self) -> Self;

    /// This number read from its bytes as the wire has them.
    #[doc(hidden)]
    fn wire_to_native(self) -> Self;

    /// The sum (integers wrap around).
    #[doc(hidden)]
    fn sum(self, other: Self) -> Self;

    /// The lesser of the two (for floats, as `f64::min`: a NaN gives way to a number).
    #[doc(hidden)]
    fn least(self, other: Self) -> Self;

    /// The greater of the two (for floats, as `f64::max`).
    #[doc(hidden)]
    fn greatest(self, other: Self) -> Self;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($sum:ident; $($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const NAME: &'static str = stringify!($t);
            fn native_to_wire(self) -> Self {
                <$t>::from_ne_bytes(self.to_le_bytes())
            }
            fn wire_to_native(self) -> Self {
                <$t>::from_le_bytes(self.to_ne_bytes())
            }
            fn sum(self, other: Self) -> Self {
                element!(@$sum self, other)
            }
            fn least(self, other: Self) -> Self {
                self.min(other)
            }
            fn greatest(self, other: Self) -> Self {
                self.max(other)
            }
        }
    )*};
    (@float $a:expr, $b:expr) => { $a + $b };
    (@int $a:expr, $b:expr) => { $a.wrapping_add($b) };
}

element!(float; f64, f32);
element!(int; i8, i16, i32, i64, i128, u8, u16, u32, u64, u128);

/// A `Vec` of plain numbers — `f64` unless said otherwise (`Floats<f32>`,
/// `Floats<u64>`, …) — that serializes as one block of little-endian bytes instead of
/// element by element. Use it for large numeric results (gradients, vectors of sums,
/// counts): in memory it is a `Vec<T>`; over TCP it moves at close to the speed of raw
/// bytes.
///
/// ```
/// use superstep::Floats;
/// let g = Floats::from(vec![0.5, -1.0, 2.25]);
/// let bytes = rmp_serde::to_vec(&g).unwrap();
/// assert!(bytes.len() < 3 * 8 + 8, "one block, no per-element markers");
/// let back: Floats = rmp_serde::from_slice(&bytes).unwrap();
/// assert_eq!(back, g);
/// assert_eq!(back.iter().sum::<f64>(), 1.75);
///
/// let counts: Floats<u32> = Floats::from(vec![3, 1, 4]);
/// let back: Floats<u32> = rmp_serde::from_slice(&rmp_serde::to_vec(&counts).unwrap()).unwrap();
/// assert_eq!(back.into_inner(), [3, 1, 4]);
/// ```
#[derive(Clone, Default, PartialEq)]
pub struct Floats<T: Element = f64>(pub Vec<T>);

impl<T: Element> Floats<T> {
    /// The values.
    pub fn into_inner(self) -> Vec<T> {
        self.0
    }
}

impl<T: Element> fmt::Debug for Floats<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Floats").field(&self.0).finish()
    }
}

impl<T: Element> Deref for Floats<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T: Element> DerefMut for Floats<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T: Element> AsRef<[T]> for Floats<T> {
    fn as_ref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Element> From<Vec<T>> for Floats<T> {
    fn from(v: Vec<T>) -> Self {
        Floats(v)
    }
}

impl<T: Element> From<Floats<T>> for Vec<T> {
    fn from(f: Floats<T>) -> Self {
        f.0
    }
}

impl<T: Element> FromIterator<T> for Floats<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Floats(iter.into_iter().collect())
    }
}

impl<T: Element> Serialize for Floats<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // A text format (JSON, say) writes bytes as a list of numbers, which would read
        // back as one element per byte: it gets the numbers themselves.
        if serializer.is_human_readable() {
            return self.0.serialize(serializer);
        }
        if cfg!(target_endian = "little") {
            serializer.serialize_bytes(bytemuck::cast_slice(&self.0))
        } else {
            let wire: Vec<T> = self.0.iter().map(|x| x.native_to_wire()).collect();
            serializer.serialize_bytes(bytemuck::cast_slice(&wire))
        }
    }
}

struct FloatsVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Element> Visitor<'de> for FloatsVisitor<T> {
    type Value = Floats<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a block of little-endian {} bytes", T::NAME)
    }

    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Floats<T>, E> {
        let size = std::mem::size_of::<T>();
        if bytes.len() % size != 0 {
            return Err(E::custom(format!(
                "{} bytes is not a whole number of {}s",
                bytes.len(),
                T::NAME
            )));
        }
        // One copy, into a buffer aligned for `T`, whatever the bytes' alignment.
        let mut values: Vec<T> = bytemuck::pod_collect_to_vec(bytes);
        if cfg!(target_endian = "big") {
            values.iter_mut().for_each(|x| *x = x.wire_to_native());
        }
        Ok(Floats(values))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Floats<T>, E> {
        self.visit_bytes(&bytes)
    }

    // Formats without a bytes type hand over a sequence of numbers.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Floats<T>, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(x) = seq.next_element::<T>()? {
            v.push(x);
        }
        Ok(Floats(v))
    }
}

impl<'de, T: Element> Deserialize<'de> for Floats<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_bytes(FloatsVisitor(std::marker::PhantomData))
            .map_err(|e| D::Error::custom(format!("Floats<{}>: {e}", T::NAME)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Element>(v: &Floats<T>) -> Floats<T> {
        rmp_serde::from_slice(&rmp_serde::to_vec(v).unwrap()).unwrap()
    }

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
        let back = round_trip(&v);
        let bits = |f: &Floats| f.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&v));
        let odd = rmp_serde::to_vec(&serde_bytes_like(&[1, 2, 3])).unwrap();
        let err = rmp_serde::from_slice::<Floats>(&odd).unwrap_err();
        assert!(
            err.to_string()
                .contains("Floats<f64>: 3 bytes is not a whole number of f64s"),
            "{err}"
        );
    }

    #[test]
    fn every_element_type_round_trips_as_one_block_of_little_endian_bytes() {
        let f32s = Floats(vec![1.5f32, -0.0, f32::MAX, f32::NAN]);
        let bits = |f: &Floats<f32>| f.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&round_trip(&f32s)), bits(&f32s));
        let u64s = Floats(vec![0u64, 1, u64::MAX, 0x0102_0304_0506_0708]);
        assert_eq!(round_trip(&u64s), u64s);
        let i16s = Floats(vec![-1i16, i16::MIN, i16::MAX, 258]);
        assert_eq!(round_trip(&i16s), i16s);
        let u8s: Floats<u8> = (0..=255).collect();
        assert_eq!(round_trip(&u8s), u8s);
        let i128s = Floats(vec![i128::MIN, -7, i128::MAX]);
        assert_eq!(round_trip(&i128s), i128s);
        // The wire holds the bytes little-endian, whatever the machine.
        let bytes = rmp_serde::to_vec(&Floats(vec![258u16])).unwrap();
        assert_eq!(&bytes[bytes.len() - 2..], &[2, 1]);
        // Fewer bytes than a whole element is refused, naming the type.
        let short = rmp_serde::to_vec(&serde_bytes_like(&[1, 2, 3, 4, 5])).unwrap();
        let err = rmp_serde::from_slice::<Floats<u32>>(&short).unwrap_err();
        assert!(err.to_string().contains("whole number of u32s"), "{err}");
    }

    #[test]
    fn a_text_format_writes_and_reads_the_numbers_themselves() {
        let v = Floats(vec![1u32, 2, 3]);
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(text, "[1,2,3]");
        assert_eq!(serde_json::from_str::<Floats<u32>>(&text).unwrap(), v);
        let f = Floats(vec![0.5, -2.0]);
        let back: Floats = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
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
