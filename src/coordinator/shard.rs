//! Shards: what each worker reads. A row range, a list of whole files, or a byte range of
//! one large text file aligned to line boundaries, as Hadoop's input splits are.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a job reads, split into one [`Shard`] per worker by [`Input::split`] (the default
/// sharding; a [`Coordinator`](super::Coordinator) may shard otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Input {
    /// Rows `0..n`: a generated data set, a table read by key range.
    Rows(u64),
    /// Whole files, each read by one worker; each worker gets a run of consecutive files,
    /// so the workers' outputs in rank order follow the input's order.
    Files(Vec<PathBuf>),
    /// One text file of lines — CSV, JSONL, plain text — read in byte ranges that hold
    /// whole lines. With `header`, its first line is a header that no shard holds (every
    /// reader reads it from the file's start).
    Lines {
        /// The file.
        path: PathBuf,
        /// Whether the first line is a header.
        header: bool,
    },
}

impl Input {
    /// What this input is, for comparing it across processes: its kind, its paths and
    /// its length (`lines of /data/in.csv (9300000 bytes, with a header)`). Processes of a
    /// job that each shard their input must see the same one.
    pub fn describe(&self) -> String {
        let len = |path: &Path| match std::fs::metadata(path) {
            Ok(m) => format!("{} bytes", m.len()),
            Err(e) => format!("unreadable: {e}"),
        };
        match self {
            Input::Rows(n) => format!("rows 0..{n}"),
            Input::Files(files) => {
                let mut crc = crc32fast::Hasher::new();
                let mut bytes = 0u64;
                for file in files {
                    crc.update(file.as_os_str().as_encoded_bytes());
                    let size = std::fs::metadata(file).map_or(u64::MAX, |m| m.len());
                    crc.update(&size.to_le_bytes());
                    bytes = bytes.saturating_add(size.min(u64::MAX / 2));
                }
                format!(
                    "{} files of {bytes} bytes in all (paths and sizes crc32 {:08x})",
                    files.len(),
                    crc.finalize()
                )
            }
            Input::Lines { path, header } => format!(
                "lines of {} ({}{})",
                path.display(),
                len(path),
                if *header { ", with a header" } else { "" }
            ),
        }
    }

    /// One shard per worker (some may be empty).
    pub fn split(&self, workers: usize) -> Result<Vec<Shard>, io::Error> {
        Ok(match self {
            Input::Rows(n) => split_rows(*n, workers)
                .into_iter()
                .map(Shard::Rows)
                .collect(),
            Input::Files(files) => split_files(files, workers)
                .into_iter()
                .map(Shard::Files)
                .collect(),
            Input::Lines { path, header } => split_lines(path, *header, workers)?
                .into_iter()
                .map(Shard::Lines)
                .collect(),
        })
    }
}

/// One worker's part of the input ([`WorkerContext::shard`](crate::WorkerContext::shard)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shard {
    /// A range of row numbers.
    Rows(Range<u64>),
    /// Whole files.
    Files(Vec<PathBuf>),
    /// Whole lines of a text file ([`LineRange::open`] reads them).
    Lines(LineRange),
}

/// Splits rows `0..n` into `workers` contiguous ranges whose sizes differ by at most one.
pub fn split_rows(n: u64, workers: usize) -> Vec<Range<u64>> {
    let workers = workers.max(1) as u64;
    let (each, extra) = (n / workers, n % workers);
    let mut start = 0;
    (0..workers)
        .map(|i| {
            let len = each + u64::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

/// Splits `files` into `workers` runs of consecutive files whose counts differ by at most
/// one.
pub fn split_files(files: &[PathBuf], workers: usize) -> Vec<Vec<PathBuf>> {
    split_rows(files.len() as u64, workers)
        .into_iter()
        .map(|r| files[r.start as usize..r.end as usize].to_vec())
        .collect()
}

/// Whole lines of a text file: the bytes `start..end`, which begin at a line's start (or
/// are empty) and end after a line's newline or at the end of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineRange {
    /// The file.
    pub path: PathBuf,
    /// The first byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Whether the file's first line is a header (never inside a range).
    pub header: bool,
}

impl LineRange {
    /// The number of bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the range holds no line.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// A reader of the range's lines.
    pub fn open(&self) -> io::Result<LineReader> {
        let mut file = File::open(&self.path)?;
        let header = if self.header {
            let mut first = Vec::new();
            BufReader::new(&mut file).read_until(b'\n', &mut first)?;
            Some(trim_newline(&first).to_vec())
        } else {
            None
        };
        file.seek(SeekFrom::Start(self.start))?;
        Ok(LineReader {
            inner: BufReader::with_capacity(64 << 10, file.take(self.len())),
            offset: self.start,
            header,
        })
    }
}

/// Splits a text file into `workers` ranges of whole lines, of about equal size: each
/// nominal boundary `i × len / workers` moves forward to the next line's start. Every line
/// is in exactly one range — the one holding its first byte —, whatever its endings (LF or
/// CRLF), its characters (a newline byte never occurs inside a multi-byte UTF-8
/// character), or its length (a line longer than a range leaves the ranges it covers
/// empty). With `header`, the first line is in none.
///
/// A CSV record must not hold a newline inside a quoted field: like Hadoop's text input,
/// the split works on lines (`RowSource` rejects a line whose quote
/// is not closed on it).
pub fn split_lines(path: &Path, header: bool, workers: usize) -> io::Result<Vec<LineRange>> {
    let workers = workers.max(1) as u64;
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let first = if header {
        // The line after the one starting at 0.
        next_line_start(&mut file, 1, len)?
    } else {
        0
    };
    let mut bounds = vec![first];
    for i in 1..workers {
        let nominal = (u128::from(len) * u128::from(i) / u128::from(workers)) as u64;
        let previous = *bounds.last().expect("bounds start with the first");
        let bound = if nominal <= previous {
            previous
        } else {
            next_line_start(&mut file, nominal, len)?
        };
        bounds.push(bound);
    }
    bounds.push(len);
    Ok(bounds
        .windows(2)
        .map(|w| LineRange {
            path: path.to_path_buf(),
            start: w[0],
            end: w[1],
            header,
        })
        .collect())
}

/// The start of the first line that begins at or after `at`: `at` itself when the byte
/// before it is a newline (or `at` is 0), else just past the next newline (or `len`).
fn next_line_start(file: &mut File, at: u64, len: u64) -> io::Result<u64> {
    if at == 0 || at >= len {
        return Ok(at.min(len));
    }
    file.seek(SeekFrom::Start(at - 1))?;
    let mut reader = BufReader::with_capacity(64 << 10, &mut *file);
    let mut position = at - 1;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(len);
        }
        if let Some(i) = memchr::memchr(b'\n', buf) {
            return Ok(position + i as u64 + 1);
        }
        let n = buf.len();
        position += n as u64;
        reader.consume(n);
    }
}

fn trim_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Reads the lines of a [`LineRange`], without their line ending (`\n` or `\r\n`).
#[derive(Debug)]
pub struct LineReader {
    inner: BufReader<std::io::Take<File>>,
    offset: u64,
    header: Option<Vec<u8>>,
}

impl LineReader {
    /// The file's header line, if the range says it has one.
    pub fn header(&self) -> Option<&[u8]> {
        self.header.as_deref()
    }

    /// The file offset of the next line to read: how far the range has been read.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads the next line into `line` (cleared first); returns the byte offset of its start
    /// in the file, or `None` at the end of the range.
    pub fn next_line(&mut self, line: &mut Vec<u8>) -> io::Result<Option<u64>> {
        line.clear();
        let n = self.inner.read_until(b'\n', line)?;
        if n == 0 {
            return Ok(None);
        }
        let at = self.offset;
        self.offset += n as u64;
        let kept = trim_newline(line).len();
        line.truncate(kept);
        Ok(Some(at))
    }
}

impl Read for LineReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.offset += n as u64;
        Ok(n)
    }
}

/// Counts lines up to a byte offset, for naming the line of a bad row: scans forward from
/// the last offset asked, so a worker pays for the scan only when a row is bad, and once.
#[cfg(feature = "pipeline")]
#[derive(Debug)]
pub(crate) struct LineCounter {
    path: PathBuf,
    /// The offset counted to, and the number of newlines before it.
    at: u64,
    newlines: u64,
}

#[cfg(feature = "pipeline")]
impl LineCounter {
    pub(crate) fn new(path: PathBuf) -> Self {
        LineCounter {
            path,
            at: 0,
            newlines: 0,
        }
    }

    /// The 1-based line number of the line starting at `offset`.
    pub(crate) fn line_at(&mut self, offset: u64) -> io::Result<u64> {
        if offset < self.at {
            self.at = 0;
            self.newlines = 0;
        }
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(self.at))?;
        let mut reader = BufReader::with_capacity(64 << 10, file.take(offset - self.at));
        loop {
            let buf = reader.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            self.newlines += memchr::memchr_iter(b'\n', buf).count() as u64;
            let n = buf.len();
            reader.consume(n);
        }
        self.at = offset;
        Ok(self.newlines + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(ranges: &[LineRange]) -> Vec<Vec<String>> {
        ranges
            .iter()
            .map(|r| {
                let mut reader = r.open().unwrap();
                let mut line = Vec::new();
                let mut out = Vec::new();
                while reader.next_line(&mut line).unwrap().is_some() {
                    out.push(String::from_utf8(line.clone()).unwrap());
                }
                out
            })
            .collect()
    }

    #[test]
    fn rows_and_files_split_evenly_and_in_order() {
        assert_eq!(split_rows(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(split_rows(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
        let files: Vec<PathBuf> = (0..5).map(|i| PathBuf::from(format!("f{i}"))).collect();
        let split = split_files(&files, 2);
        assert_eq!(split[0], files[..3].to_vec());
        assert_eq!(split[1], files[3..].to_vec());
    }

    #[test]
    fn line_ranges_hold_whole_lines_with_crlf_utf8_long_lines_and_no_final_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.csv");
        let long = "x".repeat(200);
        std::fs::write(
            &path,
            format!("id,name\r\n1,héllo\r\n2,{long}\n3,wörld\n4,last"),
        )
        .unwrap();
        for workers in 1..12 {
            let ranges = split_lines(&path, true, workers).unwrap();
            assert_eq!(ranges.len(), workers);
            let all: Vec<String> = lines_of(&ranges).into_iter().flatten().collect();
            assert_eq!(
                all,
                vec![
                    "1,héllo".to_string(),
                    format!("2,{long}"),
                    "3,wörld".into(),
                    "4,last".into()
                ],
                "{workers} workers"
            );
            assert_eq!(ranges[0].open().unwrap().header(), Some(&b"id,name"[..]));
        }
    }

    #[cfg(feature = "pipeline")]
    #[test]
    fn the_line_of_an_offset_is_counted_forward() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        std::fs::write(&path, "a\nb\nc\nd\n").unwrap();
        let mut counter = LineCounter::new(path);
        assert_eq!(counter.line_at(4).unwrap(), 3);
        assert_eq!(counter.line_at(6).unwrap(), 4);
        assert_eq!(counter.line_at(0).unwrap(), 1);
    }
}
