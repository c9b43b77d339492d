//! The values a collective runs on, as the exchange sees them (`Buffer`), and how their
//! parts cross between processes (`Carried`): elements folded by an `ReduceOp` (`Elements`,
//! whose parts travel as one block of bytes, copied once each way), and values of any
//! serde type folded whole by the user's fold (`Whole`).

use std::ops::Range;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ids::ReduceOp;
use crate::payload::{Element, Floats};
use crate::protocol::{Buffer, Carried};

/// [`Carried::encode`] of a part encoded as it is.
pub(crate) fn encode_as_is<P: Serialize>(part: &P) -> Result<Bytes, String> {
    crate::codec::to_vec(part)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

/// [`Carried::decode`] of a part encoded as it is.
pub(crate) fn decode_as_is<P: DeserializeOwned>(bytes: &[u8]) -> Result<P, String> {
    crate::codec::from_slice(bytes).map_err(|e| e.to_string())
}

/// The elements of a value to combine in place: borrowed (`&mut [T]`), or owned (a
/// `Vec<T>`, for a broadcast received).
pub(super) struct Elements<V, T> {
    pub(super) values: V,
    op: ReduceOp,
    /// Whether parts are made encoded (see [`Chunk`]).
    encoded: bool,
    _element: std::marker::PhantomData<T>,
}

impl<V: AsMut<[T]>, T: Element> Elements<V, T> {
    pub(super) fn new(values: V, op: ReduceOp) -> Self {
        Elements {
            values,
            op,
            encoded: false,
            _element: std::marker::PhantomData,
        }
    }
}

/// A range of elements as it travels: the elements themselves (handed over in one
/// process), or — between processes — their encoding, a block of bytes whose elements
/// start at `at`. An encoded part is written straight from the value, and read straight
/// into it from the frame it came in: one copy each way.
pub(super) enum Chunk<T> {
    Values(Vec<T>),
    Encoded { bytes: Bytes, at: usize },
}

impl<T: Element> Chunk<T> {
    /// The part's elements, encoded from `values`: little-endian bytes after
    /// MessagePack's header, as [`Floats`] encodes them.
    fn encode(values: &[T]) -> Self {
        let raw: &[u8] = bytemuck::cast_slice(values);
        let Some((head, at)) = crate::codec::bin_header(raw.len()) else {
            return Chunk::Values(values.to_vec());
        };
        let mut bytes = Vec::with_capacity(at + raw.len());
        bytes.extend_from_slice(&head[..at]);
        if cfg!(target_endian = "little") {
            bytes.extend_from_slice(raw);
        } else {
            for x in values {
                bytes.extend_from_slice(bytemuck::bytes_of(&x.native_to_wire()));
            }
        }
        Chunk::Encoded {
            bytes: bytes.into(),
            at,
        }
    }
}

impl<V: AsRef<[T]> + AsMut<[T]>, T: Element> Buffer for Elements<V, T> {
    type Part = Chunk<T>;

    fn len(&self) -> usize {
        self.values.as_ref().len()
    }

    fn part(&self, range: Range<usize>) -> Chunk<T> {
        let values = &self.values.as_ref()[range];
        if self.encoded {
            Chunk::encode(values)
        } else {
            Chunk::Values(values.to_vec())
        }
    }

    fn part_len(part: &Chunk<T>) -> usize {
        match part {
            Chunk::Values(v) => v.len(),
            Chunk::Encoded { bytes, at } => (bytes.len() - at) / std::mem::size_of::<T>(),
        }
    }

    fn put(&mut self, range: Range<usize>, part: Chunk<T>) {
        let own = &mut self.values.as_mut()[range];
        match part {
            Chunk::Values(v) => own.copy_from_slice(&v),
            Chunk::Encoded { bytes, at } => {
                // A copy of the bytes, whatever their alignment in the frame.
                bytemuck::cast_slice_mut::<T, u8>(own).copy_from_slice(&bytes[at..]);
                if cfg!(target_endian = "big") {
                    own.iter_mut().for_each(|x| *x = x.wire_to_native());
                }
            }
        }
    }

    fn fold(&mut self, range: Range<usize>, part: Chunk<T>, part_first: bool) {
        let own = &mut self.values.as_mut()[range];
        match part {
            Chunk::Values(v) => fold_into(own, v.into_iter(), self.op, part_first),
            Chunk::Encoded { bytes, at } => {
                let got = bytes[at..]
                    .chunks_exact(std::mem::size_of::<T>())
                    .map(|b| bytemuck::pod_read_unaligned::<T>(b).wire_to_native());
                fold_into(own, got, self.op, part_first)
            }
        }
    }
}

/// Folds `got` into `own` element by element, `got` first when `got_first`: one loop per
/// op and order, so that each compiles to a tight loop (the fold of a chain's every hop,
/// and the master's `combine_by`).
#[inline]
pub(crate) fn fold_into<T: Element>(
    own: &mut [T],
    got: impl Iterator<Item = T>,
    op: ReduceOp,
    got_first: bool,
) {
    fn each<T: Copy>(own: &mut [T], got: impl Iterator<Item = T>, f: impl Fn(T, T) -> T) {
        for (o, g) in own.iter_mut().zip(got) {
            *o = f(*o, g);
        }
    }
    match (op, got_first) {
        (ReduceOp::Sum, true) => each(own, got, |o, g| g.sum(o)),
        (ReduceOp::Sum, false) => each(own, got, |o, g| o.sum(g)),
        (ReduceOp::Min, true) => each(own, got, |o, g| g.least(o)),
        (ReduceOp::Min, false) => each(own, got, |o, g| o.least(g)),
        (ReduceOp::Max, true) => each(own, got, |o, g| g.greatest(o)),
        (ReduceOp::Max, false) => each(own, got, |o, g| o.greatest(g)),
    }
}

impl<V: AsRef<[T]> + AsMut<[T]>, T: Element> Carried for Elements<V, T> {
    fn travel_encoded(&mut self) {
        self.encoded = true;
    }

    fn encode(part: Chunk<T>) -> Result<Bytes, String> {
        match part {
            Chunk::Encoded { bytes, .. } => Ok(bytes),
            Chunk::Values(v) => encode_as_is(&Floats(v)),
        }
    }

    fn decode(bytes: Bytes) -> Result<Chunk<T>, String> {
        let Some(at) = crate::codec::bin_start(&bytes) else {
            // Not one block: whatever else `Floats` reads (a list of numbers).
            return decode_as_is::<Floats<T>>(&bytes).map(|f| Chunk::Values(f.0));
        };
        let size = std::mem::size_of::<T>();
        if (bytes.len() - at) % size != 0 {
            return Err(format!(
                "{} bytes is not a whole number of {}s",
                bytes.len() - at,
                T::NAME
            ));
        }
        Ok(Chunk::Encoded { bytes, at })
    }
}

/// One value of any type, folded whole by the user's fold.
pub(super) struct Whole<T, F> {
    pub(super) value: Vec<T>,
    pub(super) fold: F,
}

impl<T: Clone, F: Fn(&mut T, T)> Buffer for Whole<T, F> {
    type Part = Vec<T>;

    fn len(&self) -> usize {
        self.value.len()
    }

    fn part(&self, range: Range<usize>) -> Vec<T> {
        self.value[range].to_vec()
    }

    fn part_len(part: &Vec<T>) -> usize {
        part.len()
    }

    fn put(&mut self, range: Range<usize>, part: Vec<T>) {
        for (own, got) in self.value[range].iter_mut().zip(part) {
            *own = got;
        }
    }

    fn fold(&mut self, range: Range<usize>, part: Vec<T>, part_first: bool) {
        for (own, got) in self.value[range].iter_mut().zip(part) {
            if part_first {
                let mine = std::mem::replace(own, got);
                (self.fold)(own, mine);
            } else {
                (self.fold)(own, got);
            }
        }
    }
}

impl<T: Clone + Serialize + DeserializeOwned, F: Fn(&mut T, T)> Carried for Whole<T, F> {
    fn what() -> String {
        format!("its value of type {}", std::any::type_name::<T>())
    }

    fn encode(part: Vec<T>) -> Result<Bytes, String> {
        encode_as_is(&part)
    }

    fn decode(bytes: Bytes) -> Result<Vec<T>, String> {
        decode_as_is(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part made to travel encoded reaches a rank's value as the elements themselves:
    /// put and folded straight from the bytes, at any alignment in the frame.
    #[test]
    fn an_encoded_part_is_put_and_folded_as_its_elements_from_any_alignment() {
        let sent = [1.5f64, -2.25, 1e300, f64::MIN_POSITIVE, 0.0, 7.0];
        let mut from = Elements::new(sent.to_vec(), ReduceOp::Sum);
        from.travel_encoded();
        let part = from.part(1..5);
        let bytes = <Elements<Vec<f64>, f64>>::encode(part).unwrap();
        // The encoding `Floats` has: any peer decodes it as one.
        let floats: Floats<f64> = crate::codec::from_slice(&bytes).unwrap();
        assert_eq!(floats.0, sent[1..5]);
        for offset in 0..8 {
            // The bytes as they lie `offset` bytes into a frame.
            let mut frame = vec![0xaa; offset];
            frame.extend_from_slice(&bytes);
            let bytes = Bytes::from(frame).slice(offset..);
            let got = <Elements<Vec<f64>, f64>>::decode(bytes.clone()).unwrap();
            assert_eq!(<Elements<Vec<f64>, f64>>::part_len(&got), 4);
            let mut into = Elements::new(vec![0.0; 6], ReduceOp::Sum);
            into.put(2..6, got);
            assert_eq!(into.values[..2], [0.0, 0.0]);
            assert_eq!(into.values[2..], sent[1..5], "offset {offset}");
            let got = <Elements<Vec<f64>, f64>>::decode(bytes).unwrap();
            let mut into = Elements::new(vec![1.0; 4], ReduceOp::Sum);
            into.fold(0..4, got, true);
            let expected: Vec<f64> = sent[1..5].iter().map(|x| x + 1.0).collect();
            assert_eq!(into.values, expected, "offset {offset}");
        }
    }

    /// What does not decode as elements is refused with what was wrong; a list of numbers
    /// (as a non-binary encoder writes `Floats`) is read as its elements.
    #[test]
    fn an_encoded_part_that_is_no_whole_number_of_elements_is_refused() {
        type F = Elements<Vec<f64>, f64>;
        let odd = crate::codec::to_vec(&Floats(vec![0u8; 12])).unwrap();
        let err = F::decode(Bytes::from(odd)).err().unwrap();
        assert_eq!(err, "12 bytes is not a whole number of f64s");
        let list = crate::codec::to_vec(&vec![1.0f64, 2.0]).unwrap();
        let got = F::decode(Bytes::from(list)).unwrap();
        let mut into = Elements::new(vec![0.0; 2], ReduceOp::Sum);
        into.put(0..2, got);
        assert_eq!(into.values, [1.0, 2.0]);
        assert!(F::decode(Bytes::from_static(&[0xc1])).is_err());
    }
}
