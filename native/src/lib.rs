//! pgcdc's native parts: loops that cost Python too much per row. Each has a Python twin that
//! gives the same answers (the tests compare them); pgcdc uses this module when it is
//! installed and the Python code when it is not.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use sha1::{Digest, Sha1};

mod cache_calls;
mod copy_rows;
mod fast_changes;
mod resp;
mod search_bulk;

use resp::{parse, Reply};

/// A rendered change's commit LSN when it is of the common case the native writers take
/// (`CacheCalls`, `SearchBulk`): of `table`, with no unchanged-TOAST columns, its LSN an
/// unsigned 64-bit integer; None sends it the general way.
pub(crate) fn common_commit_lsn(c: &Bound<'_, PyAny>, table: &str) -> PyResult<Option<u64>> {
    let py = c.py();
    let of = c.getattr(pyo3::intern!(py, "table"))?;
    if of.cast::<PyString>().ok().and_then(|t| t.to_str().ok()) != Some(table) {
        return Ok(None);
    }
    if c.getattr(pyo3::intern!(py, "unchanged"))?.len()? != 0 {
        return Ok(None);
    }
    Ok(c.getattr(pyo3::intern!(py, "commit_lsn"))?.extract::<u64>().ok())
}

pub(crate) const BUCKET_BITS: u32 = 15;
const PART: u64 = (1 << 20) - 1;
/// A byte no JSON text holds: marks a row that can never fold like PostgreSQL's.
const MARK: u8 = 0xff;

/// The first 32 bits of the SHA-1 of a row's id: `pgcdc.core.row_digest.key_hash`.
fn key_hash(id: &[u8]) -> u32 {
    u32::from_be_bytes(Sha1::digest(id)[..4].try_into().unwrap())
}

/// The three 20-bit parts of a row's digest (the SHA-1 of its id, a NUL and its text).
fn digest_parts(id: &[u8], text: &[u8]) -> (u64, u64, u64) {
    digest_parts_of(id, &[text])
}

/// [`digest_parts`] of the text made of `pieces`, one after the other.
fn digest_parts_of(id: &[u8], pieces: &[&[u8]]) -> (u64, u64, u64) {
    let mut h = Sha1::new();
    h.update(id);
    h.update([0u8]);
    for piece in pieces {
        h.update(piece);
    }
    let x = u64::from_be_bytes(h.finalize()[..8].try_into().unwrap());
    (x >> 44, (x >> 24) & PART, (x >> 4) & PART)
}

/// A row's bucket and its digest's three 20-bit parts, as `pgcdc.core.row_digest.folded_text`.
fn folded_text(id: &[u8], text: &[u8]) -> (usize, u64, u64, u64) {
    let (h1, h2, h3) = digest_parts(id, text);
    ((key_hash(id) >> (32 - BUCKET_BITS)) as usize, h1, h2, h3)
}

fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// One table's rows as Redis holds them, folded as they are read: the client of a pipelined
/// `SCAN` + `HGETALL` conversation (`pgcdc.verify.cache_fold`) whose replies are parsed, put
/// together as the row's canonical text (the sorted columns' JSON texts in a JSON object, as
/// the Lua script of `cache_fold` does) and hashed here.
#[pyclass(module = "pgcdc_native")]
struct CacheFold {
    prefix_len: usize,
    names: Vec<Vec<u8>>,
    pre: Vec<Vec<u8>>,
    pattern: Vec<u8>,
    count: Vec<u8>,
    chosen: Option<Vec<bool>>,
    buf: Vec<u8>,
    pos: usize,
    keys: std::collections::VecDeque<Vec<u8>>,
    folds: Vec<[u64; 4]>,
    digests: Vec<(Vec<u8>, u64)>,
    text: Vec<u8>,
    vals: Vec<Option<(usize, usize)>>,
}

impl CacheFold {
    fn compact(&mut self) {
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    fn scan_command(&self, out: &mut Vec<u8>, cursor: &[u8]) {
        command(out, &[b"SCAN", cursor, b"MATCH", &self.pattern, b"COUNT", &self.count]);
    }

    /// The row's canonical text from its `HGETALL` reply, in `self.text`.
    fn row_text(&mut self, reply: &Reply, base: &[u8]) {
        self.text.clear();
        let n = self.names.len();
        let pairs = match reply {
            Reply::Array(items) | Reply::Map(items) if items.len() % 2 == 0 => items,
            Reply::Null => {
                // a key gone between SCAN and HGETALL: every field missing
                return self.put_together(base, &[], 0);
            }
            _ => {
                self.text.push(MARK); // an error (no hash), or no array
                return;
            }
        };
        let fields = pairs.len() / 2;
        let mut got: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(fields);
        for i in 0..fields {
            match (&pairs[2 * i], &pairs[2 * i + 1]) {
                (Reply::Bulk(ks, ke), Reply::Bulk(vs, ve)) => got.push((*ks, *ke, *vs, *ve)),
                _ => {
                    self.text.push(MARK);
                    return;
                }
            }
        }
        if n == 0 {
            self.text.extend_from_slice(b"{}");
            if fields != 0 {
                self.text.push(MARK);
            }
            return;
        }
        self.put_together(base, &got, fields)
    }

    fn put_together(&mut self, base: &[u8], got: &[(usize, usize, usize, usize)], fields: usize) {
        let n = self.names.len();
        self.vals.clear();
        self.vals.resize(n, None);
        for &(ks, ke, vs, ve) in got {
            let name = &base[ks..ke];
            if let Ok(i) = self.names.binary_search_by(|x| x.as_slice().cmp(name)) {
                self.vals[i] = Some((vs, ve));
            }
        }
        if n == 0 {
            self.text.extend_from_slice(b"{}");
            return;
        }
        for i in 0..n {
            self.text.extend_from_slice(&self.pre[i]);
            match self.vals[i] {
                Some((vs, ve)) => self.text.extend_from_slice(&base[vs..ve]),
                None => self.text.push(MARK),
            }
        }
        self.text.push(b'}');
        if fields != n {
            self.text.push(MARK);
        }
    }
}

#[pymethods]
impl CacheFold {
    /// `prefix_len`: bytes of the row keys' prefix (`<key prefix>:<table>:`) before the id;
    /// `names`: the table's columns, sorted; `name_texts`: each name as JSON text; `pattern`
    /// and `count`: the `SCAN` arguments; `buckets`: a byte a bucket, `1` for the buckets
    /// whose rows are wanted one by one (their digests), or `None` to fold every row.
    #[new]
    #[pyo3(signature = (prefix_len, names, name_texts, pattern, count, buckets=None))]
    fn new(
        prefix_len: usize,
        names: Vec<Vec<u8>>,
        name_texts: Vec<Vec<u8>>,
        pattern: Vec<u8>,
        count: usize,
        buckets: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        if names.len() != name_texts.len() || !names.windows(2).all(|w| w[0] < w[1]) {
            return Err(PyValueError::new_err("names must be sorted, one JSON text each"));
        }
        let pre = name_texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut p = vec![if i == 0 { b'{' } else { b',' }];
                p.extend_from_slice(t);
                p.push(b':');
                p
            })
            .collect();
        let chosen = match buckets {
            None => None,
            Some(map) if map.len() == 1 << BUCKET_BITS => {
                Some(map.iter().map(|&c| c == b'1').collect())
            }
            Some(_) => return Err(PyValueError::new_err("a byte a bucket")),
        };
        Ok(CacheFold {
            prefix_len,
            names,
            pre,
            pattern,
            count: count.to_string().into_bytes(),
            chosen,
            buf: Vec::new(),
            pos: 0,
            keys: Default::default(),
            folds: vec![[0; 4]; 1 << BUCKET_BITS],
            digests: Vec::new(),
            text: Vec::new(),
            vals: Vec::new(),
        })
    }

    /// The first request: `SCAN 0 …`.
    fn first<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let mut out = Vec::new();
        self.scan_command(&mut out, b"0");
        PyBytes::new(py, &out)
    }

    /// Bytes read from the connection.
    fn feed(&mut self, data: &[u8]) {
        self.compact();
        self.buf.extend_from_slice(data);
    }

    /// The next `SCAN` reply, once whole: `(request, scans, rows, keys)`, the next request to
    /// send (the next `SCAN`, unless the cursor came back to 0, then an `HGETALL` for each
    /// key it gave: empty when nothing is left to ask), whether it holds a `SCAN`, how many
    /// `HGETALL` it holds, and how many keys the reply gave; `None` until the reply is
    /// whole. A reply that is an error raises `ValueError` with its text.
    fn scan<'py>(&mut self, py: Python<'py>) -> PyResult<Option<(Bound<'py, PyBytes>, bool, usize)>> {
        let Some((reply, end)) = parse(&self.buf, self.pos).map_err(PyValueError::new_err)? else {
            return Ok(None);
        };
        let base = &self.buf;
        let (cursor, keys) = match &reply {
            Reply::Array(items) if items.len() == 2 => match (&items[0], &items[1]) {
                (Reply::Bulk(cs, ce), Reply::Array(keys)) => {
                    let mut got = Vec::with_capacity(keys.len());
                    for k in keys {
                        match k {
                            Reply::Bulk(s, e) => got.push(base[*s..*e].to_vec()),
                            _ => return Err(PyValueError::new_err("SCAN gave a key that is no string")),
                        }
                    }
                    (base[*cs..*ce].to_vec(), got)
                }
                _ => return Err(PyValueError::new_err("SCAN's reply is no cursor and keys")),
            },
            Reply::Error(s, e) => {
                return Err(PyValueError::new_err(String::from_utf8_lossy(&base[*s..*e]).into_owned()))
            }
            _ => return Err(PyValueError::new_err("SCAN's reply is no cursor and keys")),
        };
        self.pos = end;
        let mut out = Vec::new();
        let more = cursor.as_slice() != b"0";
        if more {
            self.scan_command(&mut out, &cursor);
        }
        let n = keys.len();
        for k in keys {
            command(&mut out, &[b"HGETALL", &k]);
            self.keys.push_back(k);
        }
        Ok(Some((PyBytes::new(py, &out), more, n)))
    }

    /// Parses, puts together, hashes and folds up to `n` `HGETALL` replies held whole;
    /// answers how many it took.
    fn rows(&mut self, py: Python<'_>, n: usize) -> PyResult<usize> {
        py.detach(|| {
            let mut done = 0;
            while done < n {
                let Some((reply, end)) = parse(&self.buf, self.pos).map_err(PyValueError::new_err)? else {
                    break;
                };
                let Some(key) = self.keys.pop_front() else {
                    return Err(PyValueError::new_err("a reply no HGETALL asked for"));
                };
                let buf = std::mem::take(&mut self.buf);
                self.row_text(&reply, &buf);
                self.buf = buf;
                self.pos = end;
                let id = key.get(self.prefix_len..).unwrap_or(b"");
                match &self.chosen {
                    None => fold_row(&mut self.folds, id, &self.text),
                    Some(chosen) => {
                        let (b, h1, h2, h3) = folded_text(id, &self.text);
                        if chosen[b] {
                            self.digests.push((id.to_vec(), (h1 << 40) | (h2 << 20) | h3));
                        }
                    }
                }
                done += 1;
            }
            Ok(done)
        })
    }

    /// Bucket → `[rows, part 1, part 2, part 3]` of the rows folded (buckets with rows).
    fn folds<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        folds_dict(py, &self.folds)
    }

    /// `(id, 60-bit digest)` of each row read in the chosen buckets.
    fn digests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for (id, d) in &self.digests {
            out.append((PyBytes::new(py, id), *d))?;
        }
        Ok(out)
    }
}

/// Rows folded by bucket as they are given (id and canonical text each): the inner loop of
/// PostgreSQL's side of a fold, `pgcdc.core.row_digest.fold_into` of `folded_text`.
#[pyclass(module = "pgcdc_native")]
struct Folder {
    folds: Vec<[u64; 4]>,
}

#[pymethods]
impl Folder {
    #[new]
    fn new() -> Self {
        Folder { folds: vec![[0; 4]; 1 << BUCKET_BITS] }
    }

    /// Folds one row: its id's bytes and its canonical text.
    fn add(&mut self, id: &[u8], text: &[u8]) {
        fold_row(&mut self.folds, id, text);
    }

    /// Bucket → `[rows, part 1, part 2, part 3]` (buckets with rows).
    fn folds<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        folds_dict(py, &self.folds)
    }
}

/// Folds one row (its id and canonical text) into its bucket.
fn fold_row(folds: &mut [[u64; 4]], id: &[u8], text: &[u8]) {
    let (b, h1, h2, h3) = folded_text(id, text);
    let f = &mut folds[b];
    f[0] += 1;
    f[1] += h1;
    f[2] += h2;
    f[3] += h3;
}

fn folds_dict<'py>(py: Python<'py>, folds: &[[u64; 4]]) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (b, f) in folds.iter().enumerate() {
        if f[0] > 0 {
            out.set_item(b, PyList::new(py, f.iter())?)?;
        }
    }
    Ok(out)
}

/// `pgcdc.core.row_digest.folded_text`, for the tests that hold both to one answer.
#[pyfunction]
fn folded(id: &[u8], text: &[u8]) -> (usize, u64, u64, u64) {
    folded_text(id, text)
}

/// `pgcdc.core.row_digest.stored`'s numbers of a row given as its id's bytes and canonical
/// text: the id's 32-bit key hash and the digest's three 20-bit parts (what the search
/// follower keeps beside each document).
#[pyfunction]
fn stored(id: &[u8], text: &[u8]) -> (u32, u64, u64, u64) {
    let (h1, h2, h3) = digest_parts(id, text);
    (key_hash(id), h1, h2, h3)
}

/// What the module offers, as a number: `pgcdc.core.native.INTERFACE` must be the same, or
/// pgcdc does not use it (a module built from older sources would lack what it calls).
const INTERFACE: u32 = 8;

#[pymodule]
fn pgcdc_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("INTERFACE", INTERFACE)?;
    m.add_class::<CacheFold>()?;
    m.add_class::<cache_calls::CacheCalls>()?;
    m.add_class::<search_bulk::SearchBulk>()?;
    m.add_class::<Folder>()?;
    m.add_class::<copy_rows::CopyRows>()?;
    m.add_class::<fast_changes::FastChanges>()?;
    m.add_function(wrap_pyfunction!(folded, m)?)?;
    m.add_function(wrap_pyfunction!(stored, m)?)?;
    Ok(())
}
