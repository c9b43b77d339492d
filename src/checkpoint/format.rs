//! The checkpoint file format, the same for a file, an object and a worker's copy: a
//! header — the magic `SSCKPT`, the format (2 bytes), a CRC-32 of the body (4), the body's
//! length (8), little-endian — then the body, the [`Checkpoint`] encoded as the wire
//! encodes (MessagePack). Its name, as a file or an object, is
//! `checkpoint-<iteration>.ssck`, the iteration zero-padded so that names sort as
//! iterations do.

use std::path::Path;

use super::{Checkpoint, CheckpointError};
use crate::ids::Iteration;

/// The first bytes of every checkpoint file.
const MAGIC: &[u8; 6] = b"SSCKPT";
/// The layout of the file after the magic; bumped when it changes.
const FORMAT: u16 = 1;
/// Magic, format, checksum, body length.
pub(super) const HEADER: usize = 6 + 2 + 4 + 8;
const PREFIX: &str = "checkpoint-";
const SUFFIX: &str = ".ssck";

/// The name of the checkpoint of `iteration`, as a file or an object:
/// `checkpoint-<iteration>.ssck`, the iteration zero-padded so that names sort as
/// iterations do.
pub(crate) fn file_name(iteration: Iteration) -> String {
    format!("{PREFIX}{iteration:020}{SUFFIX}")
}

/// The iteration of a checkpoint's file or object name; `None` for another name.
pub(crate) fn iteration_of(name: &str) -> Option<Iteration> {
    name.strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)?
        .parse()
        .ok()
}

/// A checkpoint as its file holds it: a header (magic, format, checksum, length) and the
/// encoded body.
pub(crate) fn encode(checkpoint: &Checkpoint) -> Result<Vec<u8>, CheckpointError> {
    let body =
        crate::codec::to_vec(checkpoint).map_err(|e| CheckpointError::Encode(e.to_string()))?;
    let mut bytes = Vec::with_capacity(HEADER + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT.to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&body);
    Ok(bytes)
}

/// A checkpoint from its file's bytes (`path` names them in errors), its header and
/// checksum checked.
pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < HEADER {
        return Err(corrupt(format!(
            "{} bytes, shorter than the {HEADER}-byte header",
            bytes.len()
        )));
    }
    let (header, body) = bytes.split_at(HEADER);
    if &header[..6] != MAGIC {
        return Err(corrupt("not a checkpoint file (wrong magic)".into()));
    }
    let format = u16::from_le_bytes([header[6], header[7]]);
    if format != FORMAT {
        return Err(corrupt(format!(
            "format {format}, this version reads format {FORMAT}"
        )));
    }
    let crc = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    if len != body.len() as u64 {
        return Err(corrupt(format!(
            "the header says {len} bytes of body, the file has {}",
            body.len()
        )));
    }
    let actual = crc32fast::hash(body);
    if actual != crc {
        return Err(corrupt(format!(
            "checksum {actual:08x}, the header says {crc:08x}"
        )));
    }
    crate::codec::from_slice(body).map_err(|e| corrupt(format!("undecodable body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::super::tests::checkpoint;
    use super::*;

    #[test]
    fn a_checkpoint_round_trips_through_its_bytes() {
        let bytes = encode(&checkpoint(7)).unwrap();
        assert_eq!(&bytes[..6], MAGIC);
        let len = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
        assert_eq!(
            len as usize,
            bytes.len() - HEADER,
            "the header gives the body's length"
        );
        assert_eq!(decode(Path::new("x"), &bytes).unwrap(), checkpoint(7));
    }

    #[test]
    fn another_files_bytes_are_refused_naming_the_file() {
        let mut bytes = encode(&checkpoint(7)).unwrap();
        bytes[0] = b'X';
        let err = decode(Path::new("/ckpt/other"), &bytes).unwrap_err();
        assert!(err.to_string().contains("wrong magic"), "{err}");
        assert!(err.to_string().contains("/ckpt/other"), "{err}");
    }

    #[test]
    fn names_sort_as_iterations_do_and_other_names_are_not_checkpoints() {
        let names: Vec<String> = [2, 10, 100].into_iter().map(file_name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(iteration_of(&file_name(42)), Some(42));
        for other in [
            "checkpoint-x.ssck",
            "checkpoint-1.tmp",
            ".checkpoint-1.ssck",
            "notes",
        ] {
            assert_eq!(iteration_of(other), None, "{other}");
        }
    }

    #[test]
    fn a_checkpoint_from_a_newer_format_is_refused_not_misread() {
        let mut bytes = encode(&checkpoint(1)).unwrap();
        bytes[6] = 9;
        let err = decode(Path::new("x"), &bytes).unwrap_err();
        assert!(err.to_string().contains("format 9"), "{err}");
    }
}
