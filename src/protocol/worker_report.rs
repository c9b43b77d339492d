//! What a worker reports when it stops: the rows it read, wrote and rejected, and what
//! it attached for the job's coordinator. Plain data that crosses the wire in a worker's
//! `Done`; the job's coordinator reads it, the job's report totals it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ids::Rank;

/// The most rejected rows a worker records one by one; past it they are only counted.
pub const MAX_RECORDED_REJECTS: usize = 1_000;

/// A row that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejected {
    /// The file.
    pub file: PathBuf,
    /// Its 1-based line number.
    pub line: u64,
    /// Why it was rejected.
    pub reason: String,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.reason)
    }
}

/// How many rows a worker (or the job) read, wrote and rejected, and the rejected ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowCounts {
    /// Rows read (rejected ones included).
    pub read: u64,
    /// Rows written.
    pub written: u64,
    /// Rows rejected as malformed.
    pub rejected: u64,
    /// The rejected rows, up to [`MAX_RECORDED_REJECTS`] per worker; `rejected` counts
    /// them all.
    pub rejects: Vec<Rejected>,
}

impl RowCounts {
    /// Adds `other`'s counts and records.
    pub fn add(&mut self, other: &RowCounts) {
        self.read += other.read;
        self.written += other.written;
        self.rejected += other.rejected;
        self.rejects.extend(other.rejects.iter().cloned());
    }

    /// Counts a rejected row, recording it while there is room.
    pub fn reject(&mut self, rejected: Rejected) {
        self.rejected += 1;
        if self.rejects.len() < MAX_RECORDED_REJECTS {
            self.rejects.push(rejected);
        }
    }
}

/// What one worker reported when it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// The worker's rank.
    pub rank: Rank,
    /// The rows it read, wrote and rejected.
    pub rows: RowCounts,
    /// What it attached, in the order it attached them
    /// ([`WorkerContext::attach`](crate::WorkerContext::attach)): for example the files it
    /// wrote, for `on_finish` to commit in one transaction. Read them with
    /// [`attached`](Self::attached).
    pub attachments: Vec<Attachment>,
}

impl WorkerReport {
    /// Every attachment of this report, decoded as `T`; an error names the attachment that
    /// is not a `T`.
    ///
    /// ```
    /// use superstep::coordinator::{Attachment, WorkerReport};
    ///
    /// let report = WorkerReport {
    ///     rank: 2,
    ///     attachments: vec![Attachment::new(&"part-2.csv").unwrap()],
    ///     ..WorkerReport::default()
    /// };
    /// assert_eq!(report.attached::<String>().unwrap(), ["part-2.csv"]);
    /// ```
    pub fn attached<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>, AttachmentError> {
        self.attachments
            .iter()
            .enumerate()
            .map(|(index, a)| {
                a.decode().map_err(|e| AttachmentError {
                    rank: Some(self.rank),
                    index: Some(index),
                    message: e.message,
                })
            })
            .collect()
    }
}

/// One value a worker attached to its report, encoded so that it crosses processes alike:
/// what it is, is up to the job (a path, a file's manifest, a catalog entry).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Attachment(Vec<u8>);

// On the wire as bytes (MessagePack `bin`), not as a list of numbers.
impl serde::Serialize for Attachment {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Attachment {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Attachment;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an attachment's bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Attachment, E> {
                Ok(Attachment(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Attachment, E> {
                Ok(Attachment(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Attachment, A::Error> {
                let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element::<u8>()? {
                    bytes.push(b);
                }
                Ok(Attachment(bytes))
            }
        }
        deserializer.deserialize_byte_buf(Bytes)
    }
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Attachment({} bytes)", self.0.len())
    }
}

impl Attachment {
    /// `value`, encoded.
    pub fn new<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, AttachmentError> {
        crate::codec::to_vec(value)
            .map(Attachment)
            .map_err(|e| AttachmentError {
                rank: None,
                index: None,
                message: format!("cannot encode it: {e}"),
            })
    }

    /// The value, decoded as `T`.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, AttachmentError> {
        crate::codec::from_slice(&self.0).map_err(|e| AttachmentError {
            rank: None,
            index: None,
            message: format!("cannot decode it as a {}: {e}", std::any::type_name::<T>()),
        })
    }

    /// Its encoded size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it encodes nothing at all (no value encodes so).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An attachment that could not be encoded, or read as the type asked for.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub struct AttachmentError {
    /// The rank of the worker that attached it, when known.
    pub rank: Option<Rank>,
    /// Its place among that worker's attachments, from 0, when known.
    pub index: Option<usize>,
    /// What was wrong.
    pub message: String,
}

crate::error::debug_as_sentence!(AttachmentError);

impl std::fmt::Display for AttachmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.rank, self.index) {
            (Some(rank), Some(index)) => write!(f, "worker {rank}'s attachment {index}: "),
            (Some(rank), None) => write!(f, "worker {rank}'s attachment: "),
            (None, Some(index)) => write!(f, "attachment {index}: "),
            (None, None) => Ok(()),
        }?;
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ToMaster;

    #[test]
    fn an_attachment_crosses_the_wire_as_bytes_and_garbage_is_an_error_not_a_panic() {
        let files: Vec<String> = (0..50).map(|i| format!("part-{i:05}.csv")).collect();
        let report = ToMaster::<u64>::Done {
            attempt: 1,
            awaits_word: false,
            rows: RowCounts::default(),
            attachments: vec![Attachment::new(&files).unwrap()],
        };
        let wire = crate::codec::to_vec(&report).unwrap();
        // Verbatim in the message (MessagePack `bin`), not a number per byte.
        let bytes = &Attachment::new(&files).unwrap().0;
        assert!(wire.windows(bytes.len()).any(|w| w == bytes.as_slice()));
        let high = Attachment::new(&[0xf0u8; 64][..]).unwrap();
        let wire = crate::codec::to_vec(&high).unwrap();
        assert!(
            wire.len() <= high.len() + 2,
            "{} bytes for {}",
            wire.len(),
            high.len()
        );
        let back = crate::codec::round_trip(&report).unwrap();
        let ToMaster::Done { attachments, .. } = back else {
            panic!("not a Done");
        };
        assert_eq!(attachments[0].decode::<Vec<String>>().unwrap(), files);
        let garbage = Attachment(vec![0xc1, 0xff, 0x00]);
        let error = garbage.decode::<Vec<String>>().unwrap_err();
        assert!(error.message.contains("cannot decode it as a"), "{error}");
    }
}
