//! The Redis follower's script calls for a batch of rendered rows: `sinks.cache`'s
//! `CacheSink._rendered_calls` (its Python twin), packed here straight into each pipeline's
//! bytes.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// The highest order a version holds (10 digits).
const MAX_ORDER: u64 = 9_999_999_999;

/// A row of the batch: its key, version, op, how many ARGV follow its first four, and what
/// follows them (a whole row's hash fields or its framed JSON; nothing for a delete).
struct Row<'py> {
    key: Bound<'py, PyString>,
    lsn: u64,
    order: u64,
    op: u8,
    follow: usize,
    framed: Option<Bound<'py, PyBytes>>,
}

/// How many decimal digits `n` has.
fn digits(n: usize) -> usize {
    let mut d = 1;
    let mut m = n;
    while m >= 10 {
        m /= 10;
        d += 1;
    }
    d
}

fn bulk_head(out: &mut Vec<u8>, len: usize) {
    out.push(b'$');
    out.extend_from_slice(len.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The layout of one table's rendered rows (`CacheSink._rendered_layout`): its row keys'
/// prefix (`<prefix>:<table>:`), what its version keys hold before and after the key
/// (`<prefix>:__v__:{<prefix>:<table>:` and `}:<table>:`), whether rows are hashes, the
/// command's head (EVALSHA and the script's SHA-1, framed), the two TTLs framed, the bytes of
/// rows a pipeline carries at most, and the rows a call.
#[pyclass(module = "pgcdc_native", frozen)]
pub struct CacheCalls {
    table: String,
    row: Vec<u8>,
    before: Vec<u8>,
    after: Vec<u8>,
    hash: bool,
    head: Vec<u8>,
    ttls: Vec<u8>,
    most: usize,
    per_call: usize,
}

impl CacheCalls {
    /// The row of change `c`, or None when it is not the common case.
    fn row<'py>(&self, c: &Bound<'py, PyAny>) -> PyResult<Option<Row<'py>>> {
        let py = c.py();
        let Some(lsn) = crate::common_commit_lsn(c, &self.table)? else {
            return Ok(None);
        };
        let Ok(order) = c.getattr(pyo3::intern!(py, "order"))?.extract::<u64>() else {
            return Ok(None);
        };
        if order > MAX_ORDER {
            return Ok(None);
        }
        let Ok(key) = c.getattr(pyo3::intern!(py, "key"))?.cast_into::<PyString>() else {
            return Ok(None);
        };
        match key.to_str() {
            Ok(k) if !k.contains(['{', '}']) => {}
            _ => return Ok(None), // a brace, or no UTF-8 form: the general way's
        }
        let rendered = c.getattr(pyo3::intern!(py, "rendered"))?;
        if rendered.is_none() {
            if !c.getattr(pyo3::intern!(py, "doc"))?.is_none() {
                return Ok(None);
            }
            return Ok(Some(Row { key, lsn, order, op: b'd', follow: 0, framed: None }));
        }
        let Ok(rendered) = rendered.cast_into::<PyTuple>() else {
            return Ok(None);
        };
        let (op, follow, part) = if self.hash {
            let columns = c.getattr(pyo3::intern!(py, "doc"))?.len()?;
            (b'h', 2 * columns, 1)
        } else {
            (b'j', 1, 0)
        };
        let Ok(framed) = rendered.get_item(part)?.cast_into::<PyBytes>() else {
            return Ok(None);
        };
        Ok(Some(Row { key, lsn, order, op, follow, framed: Some(framed) }))
    }

    /// What a row weighs in a pipeline: its framed KEYS and ARGV, as the Python twin
    /// weighs them.
    fn weight(&self, r: &Row<'_>, key: usize) -> usize {
        let row = self.row.len() + key;
        let version = self.before.len() + self.after.len() + 2 * key;
        let keys = 1 + digits(row) + 2 + row + 2 + 1 + digits(version) + 2 + version + 2;
        let count = digits(r.follow);
        let argv = 7 + 5 + 30 + 2 + 7 + 1 + digits(count) + 2 + count + 2;
        keys + argv + self.framed_len(r)
    }

    fn framed_len(&self, r: &Row<'_>) -> usize {
        match (&r.framed, self.hash) {
            (None, _) => 0,
            (Some(f), true) => f.as_bytes().len(),
            (Some(f), false) => {
                let n = f.as_bytes().len();
                1 + digits(n) + 2 + n + 2
            }
        }
    }

    fn write_call(&self, out: &mut Vec<u8>, rows: &[Row<'_>], keys: &[&str]) {
        let follow: usize = rows.iter().map(|r| r.follow).sum();
        out.extend_from_slice(format!("*{}\r\n", 5 + 6 * rows.len() + follow).as_bytes());
        out.extend_from_slice(&self.head);
        let count = (2 * rows.len()).to_string();
        bulk_head(out, count.len());
        out.extend_from_slice(count.as_bytes());
        out.extend_from_slice(b"\r\n");
        for k in keys {
            let k = k.as_bytes();
            bulk_head(out, self.row.len() + k.len());
            out.extend_from_slice(&self.row);
            out.extend_from_slice(k);
            out.extend_from_slice(b"\r\n");
            bulk_head(out, self.before.len() + self.after.len() + 2 * k.len());
            out.extend_from_slice(&self.before);
            out.extend_from_slice(k);
            out.extend_from_slice(&self.after);
            out.extend_from_slice(k);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(&self.ttls);
        for r in rows {
            out.extend_from_slice(b"$1\r\n");
            out.push(r.op);
            out.extend_from_slice(format!("\r\n$30\r\n{:020}{:010}\r\n$1\r\n*\r\n", r.lsn, r.order).as_bytes());
            let count = r.follow.to_string();
            bulk_head(out, count.len());
            out.extend_from_slice(count.as_bytes());
            out.extend_from_slice(b"\r\n");
            match (&r.framed, self.hash) {
                (None, _) => {}
                (Some(f), true) => out.extend_from_slice(f.as_bytes()),
                (Some(f), false) => {
                    let f = f.as_bytes();
                    bulk_head(out, f.len());
                    out.extend_from_slice(f);
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
    }
}

#[pymethods]
impl CacheCalls {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        table: String,
        row: Vec<u8>,
        before: Vec<u8>,
        after: Vec<u8>,
        hash: bool,
        head: Vec<u8>,
        ttls: Vec<u8>,
        most: usize,
        per_call: usize,
    ) -> Self {
        CacheCalls { table, row, before, after, hash, head, ttls, most, per_call: per_call.max(1) }
    }

    /// The script calls of `changes` (one change a key of this table, each a whole document
    /// rendered with it or a delete) in pipelines: each pipeline's calls' rows (from `start`
    /// to `end`) and its bytes; None when a change is not that.
    #[allow(clippy::type_complexity)]
    fn calls<'py>(
        &self,
        py: Python<'py>,
        changes: &Bound<'py, PyList>,
    ) -> PyResult<Option<Vec<(Vec<(usize, usize)>, Bound<'py, PyBytes>)>>> {
        let mut rows = Vec::with_capacity(changes.len());
        for c in changes.iter() {
            match self.row(&c)? {
                Some(r) => rows.push(r),
                None => return Ok(None),
            }
        }
        let keys: Vec<&str> = rows.iter().map(|r| r.key.to_str()).collect::<PyResult<_>>()?;
        // Where calls and pipelines end, as the Python twin cuts them.
        let mut pipelines: Vec<Vec<(usize, usize)>> = vec![];
        let mut calls: Vec<(usize, usize)> = vec![];
        let (mut start, mut size) = (0usize, 0usize);
        for (i, r) in rows.iter().enumerate() {
            let n = self.weight(r, keys[i].len());
            if size > 0 && size + n > self.most {
                calls.push((start, i));
                pipelines.push(std::mem::take(&mut calls));
                start = i;
                size = 0;
            } else if i - start == self.per_call {
                calls.push((start, i));
                start = i;
            }
            size += n;
        }
        calls.push((start, rows.len()));
        pipelines.push(calls);
        let mut out = Vec::with_capacity(pipelines.len());
        let mut buf = Vec::new();
        for calls in pipelines {
            buf.clear();
            for &(s, e) in &calls {
                self.write_call(&mut buf, &rows[s..e], &keys[s..e]);
            }
            out.push((calls, PyBytes::new(py, &buf)));
        }
        Ok(Some(out))
    }
}
