//! The search follower's bulk bodies for a batch of rendered documents: `sinks.search`'s
//! `SearchSink._rendered_bodies` (its Python twin), each document's lines written once,
//! straight into its request's body.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// A string's JSON as `orjson.dumps` writes it (`"`, `\` and the control characters
/// escaped, the short escapes where JSON has them, the others as `\u00xx`).
fn json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[from..i]);
        if escape.is_empty() {
            out.extend_from_slice(format!("\\u{:04x}", b).as_bytes());
        } else {
            out.extend_from_slice(escape);
        }
        from = i + 1;
    }
    out.extend_from_slice(&bytes[from..]);
    out.push(b'"');
}

/// How a table's rendered documents go into one index (`SearchSink._apply_rendered`): the
/// index and delete actions' lines before and after the id's JSON and version
/// (`sinks.search_requests.action_parts`), whether each source carries the row digest, what
/// puts the digest in an empty and in another source, the highest version OpenSearch takes,
/// the longest id, and the bytes a request carries at most.
#[pyclass(module = "pgcdc_native", frozen)]
pub struct SearchBulk {
    table: String,
    put: (Vec<u8>, Vec<u8>),
    remove: (Vec<u8>, Vec<u8>),
    digest: Option<(Vec<u8>, Vec<u8>)>,
    max_version: u64,
    max_id: usize,
    most: usize,
}

impl SearchBulk {
    /// The lines of change `c` added to `out`, or false when it is not the common case.
    fn line(&self, c: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> PyResult<bool> {
        let py = c.py();
        let Some(version) = crate::common_commit_lsn(c, &self.table)? else {
            return Ok(false);
        };
        if version > self.max_version {
            return Ok(false);
        }
        let key = c.getattr(pyo3::intern!(py, "key"))?;
        let Some(key) = key.cast::<PyString>().ok().and_then(|k| k.to_str().ok()) else {
            return Ok(false); // no UTF-8 form: the general way refuses it
        };
        if key.is_empty() || key.len() > self.max_id {
            return Ok(false);
        }
        let rendered = c.getattr(pyo3::intern!(py, "rendered"))?;
        let source = if rendered.is_none() {
            if !c.getattr(pyo3::intern!(py, "doc"))?.is_none() {
                return Ok(false);
            }
            None
        } else {
            let Ok(rendered) = rendered.cast_into::<PyTuple>() else {
                return Ok(false);
            };
            let (Ok(source), Ok(digest)) = (
                rendered.get_item(0)?.cast_into::<PyBytes>(),
                rendered.get_item(2)?.cast_into::<PyBytes>(),
            ) else {
                return Ok(false);
            };
            Some((source, digest))
        };
        let (head, tail) = if source.is_some() { &self.put } else { &self.remove };
        out.extend_from_slice(head);
        json_string(out, key);
        out.extend_from_slice(b",\"version\":");
        out.extend_from_slice(version.to_string().as_bytes());
        out.extend_from_slice(b",\"version_type\":\"external_gte\"");
        out.extend_from_slice(tail);
        if let Some((source, digest)) = source {
            let source = source.as_bytes();
            match (&self.digest, source.len()) {
                (Some((first, after)), n) if n >= 2 => {
                    out.extend_from_slice(&source[..n - 1]);
                    out.extend_from_slice(if n == 2 { first } else { after });
                    out.extend_from_slice(digest.as_bytes());
                    out.push(b'}');
                }
                (Some(_), _) => return Ok(false),
                (None, _) => out.extend_from_slice(source),
            }
            out.push(b'\n');
        }
        Ok(true)
    }
}

#[pymethods]
impl SearchBulk {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        table: String,
        put: (Vec<u8>, Vec<u8>),
        remove: (Vec<u8>, Vec<u8>),
        digest: Option<(Vec<u8>, Vec<u8>)>,
        max_version: u64,
        max_id: usize,
        most: usize,
    ) -> Self {
        SearchBulk { table, put, remove, digest, max_version, max_id, most }
    }

    /// The bulk bodies of `changes` (one change a key of this table, each a whole document
    /// rendered with it or a delete), each of at most `most` bytes of documents (one larger
    /// document alone); None when a change is not that.
    fn bodies<'py>(
        &self,
        py: Python<'py>,
        changes: &Bound<'py, PyList>,
    ) -> PyResult<Option<Vec<Bound<'py, PyBytes>>>> {
        let mut bodies = Vec::new();
        let mut body: Vec<u8> = Vec::new();
        for c in changes.iter() {
            let start = body.len();
            if !self.line(&c, &mut body)? {
                return Ok(None);
            }
            if start > 0 && body.len() > self.most {
                // The line goes to the next body.
                let line = body.split_off(start);
                bodies.push(PyBytes::new(py, &body));
                body = line;
            }
        }
        if !body.is_empty() {
            bodies.push(PyBytes::new(py, &body));
        }
        Ok(Some(bodies))
    }
}
