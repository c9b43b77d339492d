//! Where a graph's edges come from: a function every worker calls, or edge-list files each
//! worker reads its shard of.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use super::VertexId;
use crate::coordinator::{Input, Shard};
use crate::error::GraphError;

/// An edge's value as an edge list's third field holds it: `()` for a graph without
/// values (a third field is then ignored), a number for weights.
pub trait EdgeValue: Sized {
    /// The value of the line's third field (`None` when the line has two).
    fn parse(field: Option<&str>) -> Result<Self, String>;
}

impl EdgeValue for () {
    fn parse(_: Option<&str>) -> Result<Self, String> {
        Ok(())
    }
}

macro_rules! edge_numbers {
    ($($t:ty),*) => {$(
        impl EdgeValue for $t {
            fn parse(field: Option<&str>) -> Result<Self, String> {
                let field = field.ok_or_else(|| {
                    format!("no third field: the edge's value, a {}", stringify!($t))
                })?;
                field
                    .parse()
                    .map_err(|e| format!("the edge's value {field:?} is not a {}: {e}", stringify!($t)))
            }
        }
    )*};
}
edge_numbers!(f64, f32, u64, u32, i64, i32);

/// Calls its argument once for each edge `(source, target, value)`.
pub(crate) type Generate<I, E> = Arc<dyn Fn(&mut dyn FnMut(I, I, E)) + Send + Sync>;

/// Where a graph's edges come from.
pub(crate) enum Source<I, E> {
    /// Every worker calls the function and keeps the edges of its vertices.
    Generated(Generate<I, E>),
    /// Edge-list files, sharded as the job's input: each worker reads its shard and sends
    /// each edge to the rank that owns its source.
    Files {
        input: Input,
        parse: fn(Option<&str>) -> Result<E, String>,
    },
}

impl<I, E> Clone for Source<I, E> {
    fn clone(&self) -> Self {
        match self {
            Source::Generated(generate) => Source::Generated(Arc::clone(generate)),
            Source::Files { input, parse } => Source::Files {
                input: input.clone(),
                parse: *parse,
            },
        }
    }
}

/// The edges of one shard of an edge list, in the order of its lines.
pub(crate) fn read_shard<I: VertexId, E>(
    shard: Option<&Shard>,
    parse: fn(Option<&str>) -> Result<E, String>,
) -> Result<Vec<(I, I, E)>, GraphError> {
    let mut edges = Vec::new();
    let mut line = Vec::new();
    match shard {
        Some(Shard::Files(files)) => {
            for path in files {
                let unreadable = |e: std::io::Error| unreadable(path, e);
                let mut reader = BufReader::with_capacity(
                    64 << 10,
                    std::fs::File::open(path).map_err(unreadable)?,
                );
                let mut number = 0;
                loop {
                    line.clear();
                    if reader.read_until(b'\n', &mut line).map_err(unreadable)? == 0 {
                        break;
                    }
                    number += 1;
                    if let Some(edge) =
                        edge(&line, parse).map_err(|why| malformed(path, number, why))?
                    {
                        edges.push(edge);
                    }
                }
            }
        }
        Some(Shard::Lines(range)) => {
            let path = &range.path;
            let mut reader = range.open().map_err(|e| unreadable(path, e))?;
            while let Some(at) = reader
                .next_line(&mut line)
                .map_err(|e| unreadable(path, e))?
            {
                if let Some(edge) = edge(&line, parse).map_err(|why| {
                    let number = line_of(path, at).unwrap_or(0);
                    malformed(path, number, why)
                })? {
                    edges.push(edge);
                }
            }
        }
        Some(Shard::Rows(range)) => {
            return Err(GraphError::Unreadable {
                path: format!("rows {range:?}").into(),
                why: "an edge list is read from files (Input::Files or Input::Lines), not rows"
                    .into(),
            })
        }
        None => {}
    }
    Ok(edges)
}

fn unreadable(path: &Path, e: std::io::Error) -> GraphError {
    GraphError::Unreadable {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

fn malformed(path: &Path, line: u64, why: String) -> GraphError {
    GraphError::MalformedEdge {
        path: path.to_path_buf(),
        line,
        why,
    }
}

/// The 1-based number of the line that starts at byte `offset` of `path`: counted only
/// for a line that is wrong.
fn line_of(path: &Path, offset: u64) -> std::io::Result<u64> {
    let mut reader = BufReader::new(std::fs::File::open(path)?.take(offset));
    let mut newlines = 0;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(newlines + 1);
        }
        newlines += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        let n = buf.len();
        reader.consume(n);
    }
}

/// The edge a line holds: `source target [value]`, separated by spaces, tabs or a comma;
/// `None` for a comment (a line that is empty, or starts with `#` or `%`).
fn edge<I: VertexId, E>(
    line: &[u8],
    parse: fn(Option<&str>) -> Result<E, String>,
) -> Result<Option<(I, I, E)>, String> {
    let line = std::str::from_utf8(line).map_err(|e| format!("not UTF-8: {e}"))?;
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') || line.starts_with('%') {
        return Ok(None);
    }
    let mut fields = line
        .split(|c: char| c.is_ascii_whitespace() || c == ',')
        .filter(|f| !f.is_empty());
    let mut id = |which: &str| -> Result<I, String> {
        let field = fields
            .next()
            .ok_or_else(|| format!("no {which}: a line is `source target [value]`"))?;
        let id: u64 = field
            .parse()
            .map_err(|_| format!("the {which} {field:?} is not a vertex id (a whole number)"))?;
        I::from_u64(id).ok_or_else(|| {
            format!(
                "the {which} {id} does not fit the program's vertex id type {}",
                std::any::type_name::<I>()
            )
        })
    };
    let (from, to) = (id("source")?, id("target")?);
    let value = parse(fields.next())?;
    Ok(Some((from, to, value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_two_ids_and_a_value_and_comments_are_no_edges() {
        let parse = <f64 as EdgeValue>::parse;
        assert_eq!(edge::<u32, f64>(b"1 2 0.5", parse), Ok(Some((1, 2, 0.5))));
        assert_eq!(edge::<u32, f64>(b"1,2,0.5\r", parse), Ok(Some((1, 2, 0.5))));
        assert_eq!(
            edge::<u64, ()>(b"7\t8", <() as EdgeValue>::parse),
            Ok(Some((7, 8, ())))
        );
        for comment in [&b"# FromNodeId ToNodeId"[..], b"", b"  ", b"%%MatrixMarket"] {
            assert_eq!(edge::<u32, ()>(comment, <() as EdgeValue>::parse), Ok(None));
        }
        let wrong = |line: &[u8]| edge::<u32, f64>(line, parse).unwrap_err();
        assert!(wrong(b"1").contains("no target"), "{}", wrong(b"1"));
        assert!(wrong(b"1 x 2").contains("the target \"x\" is not a vertex id"));
        assert!(wrong(b"1 2").contains("no third field"));
        assert!(wrong(b"1 2 heavy").contains("\"heavy\" is not a f64"));
        assert!(wrong(b"1 5000000000 1").contains("does not fit the program's vertex id type u32"));
    }

    #[test]
    fn a_wrong_line_is_named_by_its_file_and_number_whichever_shard_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edges.txt");
        std::fs::write(&path, "# a comment\n0 1\n1 2\n2 three\n3 0\n").unwrap();
        let parse = <() as EdgeValue>::parse;
        let whole = Shard::Files(vec![path.clone()]);
        let err = read_shard::<u32, ()>(Some(&whole), parse).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}, line 4: the target \"three\" is not a vertex id (a whole number)",
                path.display()
            )
        );
        for shard in crate::coordinator::split_lines(&path, false, 3).unwrap() {
            let read = read_shard::<u32, ()>(Some(&Shard::Lines(shard.clone())), parse);
            if (shard.start..shard.end).contains(&20) {
                assert!(
                    matches!(read, Err(GraphError::MalformedEdge { line: 4, .. })),
                    "{read:?}"
                );
            } else {
                assert!(read.is_ok(), "{read:?}");
            }
        }
    }
}
