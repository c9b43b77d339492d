//! Rows: reading CSV and JSONL lines into the user's types, with a count of what was read,
//! written and rejected, and a policy for malformed rows.

use std::io;
use std::marker::PhantomData;
use std::path::PathBuf;

use serde::de::DeserializeOwned;

use super::shard::{LineCounter, LineRange, LineReader};
use super::{MalformedRows, Rejected, RowCounts};

/// Why a row could not be read.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum RowError {
    /// The file could not be read.
    #[error("reading {file}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// A malformed row, under [`MalformedRows::Fail`].
    #[error("malformed row at {0}")]
    Malformed(Rejected),
}

crate::error::debug_as_sentence!(RowError);

/// The format of a file of rows, one per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFormat {
    /// Comma-separated values; the range's file has a header line naming the fields.
    Csv,
    /// One JSON value per line.
    Jsonl,
}

/// The rows of a [`LineRange`], deserialized into `T`, as an iterator. Malformed rows — not
/// UTF-8, not valid JSON, the wrong number of fields, a field of the wrong type — are
/// handled by the [`MalformedRows`] policy; [`counts`](RowSource::counts) says how many
/// were read and rejected. Empty lines are skipped.
#[derive(Debug)]
pub struct RowSource<T> {
    lines: Lines,
    path: PathBuf,
    policy: MalformedRows,
    counts: RowCounts,
    counter: LineCounter,
    _row: PhantomData<fn() -> T>,
}

/// A row's file offset, and the row or why it is malformed.
type Parsed<T> = (u64, Result<T, String>);

/// Where the rows come from: whole lines of the range, whatever the format, so a row is
/// always one line — a malformed one (an unclosed quote included) is that line alone.
#[derive(Debug)]
struct Lines {
    reader: LineReader,
    line: Vec<u8>,
    format: Format,
}

/// How a line is parsed.
#[derive(Debug)]
enum Format {
    Csv(Box<CsvLine>),
    Jsonl,
}

impl<T: DeserializeOwned> RowSource<T> {
    /// Opens `range` as rows of `format`. CSV needs the file's header (a range of an input
    /// with `header: true`).
    pub fn open(
        range: &LineRange,
        format: RowFormat,
        policy: MalformedRows,
    ) -> Result<Self, RowError> {
        let reader = range.open().map_err(|source| RowError::Io {
            file: range.path.clone(),
            source,
        })?;
        let header_error = |reason: String| {
            RowError::Malformed(Rejected {
                file: range.path.clone(),
                line: 1,
                reason,
            })
        };
        let format = match format {
            RowFormat::Jsonl => Format::Jsonl,
            RowFormat::Csv => {
                let header = reader.header().ok_or_else(|| {
                    header_error(
                        "CSV rows need the file's header (a range with header = true)".into(),
                    )
                })?;
                let headers = csv::ReaderBuilder::new()
                    .has_headers(false)
                    .from_reader(header)
                    .records()
                    .next()
                    .unwrap_or_else(|| Ok(csv::StringRecord::new()))
                    .map_err(|e| header_error(format!("the header: {e}")))?;
                Format::Csv(Box::new(CsvLine::new(headers)))
            }
        };
        let lines = Lines {
            reader,
            line: Vec::new(),
            format,
        };
        Ok(RowSource {
            lines,
            path: range.path.clone(),
            policy,
            counts: RowCounts::default(),
            counter: LineCounter::new(range.path.clone()),
            _row: PhantomData,
        })
    }

    /// The file offset up to which the range has been read.
    pub fn offset(&self) -> u64 {
        self.lines.reader.offset()
    }

    /// What was read and rejected so far.
    pub fn counts(&self) -> &RowCounts {
        &self.counts
    }

    /// The counts, when done reading.
    pub fn into_counts(self) -> RowCounts {
        self.counts
    }

    /// The next non-empty row: its file offset and what parsing it gave.
    fn next_row(&mut self) -> Option<io::Result<Parsed<T>>> {
        let Lines {
            reader,
            line,
            format,
        } = &mut self.lines;
        loop {
            match reader.next_line(line) {
                Ok(Some(_)) if line.is_empty() => continue,
                Ok(Some(offset)) => {
                    let parsed = match format {
                        Format::Jsonl => serde_json::from_slice(line).map_err(|e| e.to_string()),
                        Format::Csv(csv) => csv.parse(line),
                    };
                    return Some(Ok((offset, parsed)));
                }
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// Parses one CSV line (its terminator removed) into a record: a quoted field may hold
/// commas and doubled quotes, but not a line break, so a quote left open is that line's
/// fault and never swallows the lines after it.
#[derive(Debug)]
struct CsvLine {
    core: csv_core::Reader,
    headers: csv::StringRecord,
    fields: Vec<u8>,
    ends: Vec<usize>,
}

impl CsvLine {
    fn new(headers: csv::StringRecord) -> Self {
        CsvLine {
            // Only `\n` ends a record: a `\r` inside a line is a byte like any other.
            core: csv_core::ReaderBuilder::new()
                .terminator(csv_core::Terminator::Any(b'\n'))
                .build(),
            headers,
            fields: vec![0; 256],
            ends: vec![0; 16],
        }
    }

    fn parse<T: DeserializeOwned>(&mut self, line: &[u8]) -> Result<T, String> {
        self.core.reset();
        let (mut input, mut out, mut nends) = (line, 0, 0);
        let mut terminated = false;
        loop {
            let (result, nin, nout, nend) =
                self.core
                    .read_record(input, &mut self.fields[out..], &mut self.ends[nends..]);
            input = &input[nin..];
            out += nout;
            nends += nend;
            match result {
                csv_core::ReadRecordResult::OutputFull => {
                    let len = self.fields.len();
                    self.fields.resize(len * 2, 0);
                }
                csv_core::ReadRecordResult::OutputEndsFull => {
                    let len = self.ends.len();
                    self.ends.resize(len * 2, 0);
                }
                // The line is all in: the terminator ends the record, unless a quote is open.
                csv_core::ReadRecordResult::InputEmpty if !terminated => {
                    terminated = true;
                    input = b"\n";
                }
                csv_core::ReadRecordResult::InputEmpty => {
                    return Err("a quoted field is not closed on its line".into())
                }
                csv_core::ReadRecordResult::Record | csv_core::ReadRecordResult::End => break,
            }
        }
        // Field ends are relative to the output the record was read into, in order.
        let mut record = csv::ByteRecord::with_capacity(out, nends);
        let mut start = 0;
        for &end in &self.ends[..nends] {
            record.push_field(&self.fields[start..end]);
            start = end;
        }
        parse_record(record, &self.headers)
    }
}

/// One CSV record as a `T`, or why not.
fn parse_record<T: DeserializeOwned>(
    record: csv::ByteRecord,
    headers: &csv::StringRecord,
) -> Result<T, String> {
    let record =
        csv::StringRecord::from_byte_record(record).map_err(|_| "not UTF-8".to_string())?;
    if record.len() != headers.len() {
        return Err(format!(
            "{} fields where the header has {}",
            record.len(),
            headers.len()
        ));
    }
    record
        .deserialize(Some(headers))
        .map_err(|e| match e.kind() {
            csv::ErrorKind::Deserialize { err, .. } => err.to_string(),
            _ => e.to_string(),
        })
}

impl<T: DeserializeOwned> Iterator for RowSource<T> {
    type Item = Result<T, RowError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (offset, parsed) = match self.next_row()? {
                Ok(row) => row,
                Err(source) => {
                    return Some(Err(RowError::Io {
                        file: self.path.clone(),
                        source,
                    }))
                }
            };
            self.counts.read += 1;
            let reason = match parsed {
                Ok(row) => return Some(Ok(row)),
                Err(reason) => reason,
            };
            let line = match self.counter.line_at(offset) {
                Ok(line) => line,
                Err(source) => {
                    return Some(Err(RowError::Io {
                        file: self.path.clone(),
                        source,
                    }))
                }
            };
            let rejected = Rejected {
                file: self.path.clone(),
                line,
                reason,
            };
            match self.policy {
                MalformedRows::Fail => return Some(Err(RowError::Malformed(rejected))),
                MalformedRows::Skip => {
                    tracing::debug!(%rejected, "skipped a malformed row");
                    self.counts.reject(rejected);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::shard::split_lines;
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Row {
        id: u32,
        name: String,
    }

    #[test]
    fn malformed_rows_are_skipped_and_recorded_with_file_and_line_or_fail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.csv");
        let mut bytes = b"id,name\n1,a\nx,b\n3,c,extra\n4,d\n".to_vec();
        bytes.extend_from_slice(b"5,\xff\n\n6,f\n");
        std::fs::write(&path, bytes).unwrap();
        let range = split_lines(&path, true, 1).unwrap().remove(0);
        let mut skipped =
            RowSource::<Row>::open(&range, RowFormat::Csv, MalformedRows::Skip).unwrap();
        let ids: Vec<u32> = skipped.by_ref().map(|r| r.unwrap().id).collect();
        assert_eq!(ids, vec![1, 4, 6]);
        let counts = skipped.into_counts();
        assert_eq!((counts.read, counts.rejected), (6, 3));
        let lines: Vec<u64> = counts.rejects.iter().map(|r| r.line).collect();
        assert_eq!(lines, vec![3, 4, 6]);
        assert!(counts.rejects[1]
            .reason
            .contains("3 fields where the header has 2"));
        assert!(
            counts.rejects[2].reason.contains("UTF-8"),
            "{:?}",
            counts.rejects[2]
        );

        let mut failing =
            RowSource::<Row>::open(&range, RowFormat::Csv, MalformedRows::Fail).unwrap();
        assert_eq!(
            failing.next().unwrap().unwrap(),
            Row {
                id: 1,
                name: "a".into()
            }
        );
        let error = failing.next().unwrap().unwrap_err().to_string();
        assert!(error.contains("in.csv:3: "), "{error}");
    }

    #[test]
    fn a_csv_row_is_one_line_an_unclosed_quote_rejects_that_line_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.csv");
        std::fs::write(
            &path,
            "id,name\r\n1,\"a, \"\"b\"\"\"\r\n\r\nx,b\r\n2,\"bob\n3,carl\r\n4,\"d\rd\"\n",
        )
        .unwrap();
        let range = split_lines(&path, true, 1).unwrap().remove(0);
        let mut rows = RowSource::<Row>::open(&range, RowFormat::Csv, MalformedRows::Skip).unwrap();
        let read: Vec<Row> = rows.by_ref().map(Result::unwrap).collect();
        let names: Vec<(u32, &str)> = read.iter().map(|r| (r.id, r.name.as_str())).collect();
        assert_eq!(names, vec![(1, "a, \"b\""), (3, "carl"), (4, "d\rd")]);
        let counts = rows.into_counts();
        assert_eq!((counts.read, counts.rejected), (5, 2));
        let lines: Vec<(u64, &str)> = counts
            .rejects
            .iter()
            .map(|r| (r.line, r.reason.as_str()))
            .collect();
        assert_eq!(lines[0].0, 4, "after a CRLF line and an empty one");
        assert_eq!(
            lines[1],
            (5, "a quoted field is not closed on its line"),
            "{lines:?}"
        );
    }

    #[test]
    fn jsonl_rows_are_read_and_bad_json_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(
            &path,
            "{\"id\":1,\"name\":\"a\"}\r\n{\"id\":2\n{\"id\":3,\"name\":\"c\"}",
        )
        .unwrap();
        let range = split_lines(&path, false, 1).unwrap().remove(0);
        let mut rows =
            RowSource::<Row>::open(&range, RowFormat::Jsonl, MalformedRows::Skip).unwrap();
        let ids: Vec<u32> = rows.by_ref().map(|r| r.unwrap().id).collect();
        assert_eq!(ids, vec![1, 3]);
        assert_eq!(rows.counts().rejects[0].line, 2);
    }
}
