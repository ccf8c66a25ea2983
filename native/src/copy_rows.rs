//! PostgreSQL's side of a fold from `COPY … TO STDOUT` text: each line rendered as the
//! followers' document (its canonical text) and folded, for the columns whose way from COPY
//! text to the document is plain (`pgcdc.verify.copy_render` says which). A line this code
//! is not sure of (an escape, a value outside the layouts below, a placeholder's text) is
//! handed back whole, for the Python code that renders every row to take.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::{fold_row, folds_dict, key_hash, BUCKET_BITS};

/// How a column's COPY text becomes its document value.
#[derive(Clone, Copy)]
enum Kind {
    /// Not in the document (a column of a type the row images leave out).
    Skip,
    /// A JSON string of the text as it is (orjson's escapes).
    Text,
    /// An integer: its text, when that is an integer's only form.
    Int,
    /// `t` or `f`: true or false.
    Bool,
    /// numeric with this scale (Connect's Decimal): Python's `str(Decimal)` of the value, a
    /// JSON string.
    Decimal(usize),
    /// timestamptz already in UTC, as ZonedTimestamp with this many fraction digits.
    Zoned(usize),
}

struct Column {
    kind: Kind,
    /// A null in it is not null in the document (a NOT NULL column's fill).
    filled: bool,
    /// The field's name as JSON text.
    name: Vec<u8>,
}

#[pyclass(module = "pgcdc_native")]
pub struct CopyRows {
    columns: Vec<Column>,
    /// The document's columns in its canonical order.
    order: Vec<usize>,
    id_at: usize,
    placeholders: Vec<Vec<u8>>,
    folds: Vec<[u64; 4]>,
    rows: u64,
    fields: Vec<Option<(usize, usize)>>,
    text: Vec<u8>,
    /// The buckets whose rows `pick` gives (none until `choose`).
    chosen: Vec<bool>,
}

fn kind_of(name: &str, arg: i64) -> PyResult<Kind> {
    let size = || usize::try_from(arg).map_err(|_| PyValueError::new_err(format!("{name} {arg}")));
    Ok(match name {
        "skip" => Kind::Skip,
        "text" => Kind::Text,
        "int" => Kind::Int,
        "bool" => Kind::Bool,
        "decimal" => Kind::Decimal(size()?),
        "zoned" => Kind::Zoned(size()?),
        _ => return Err(PyValueError::new_err(format!("no column kind {name}"))),
    })
}

/// orjson's JSON string of `s` (valid UTF-8): `"` and `\` escaped, control characters as
/// `\b \t \n \f \r` or `\u00xx`, everything else as it is.
fn json_string(out: &mut Vec<u8>, s: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let mut from = 0;
    for (i, &c) in s.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&s[from..i]);
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(c >> 4) as usize]);
            out.push(HEX[(c & 15) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        from = i + 1;
    }
    out.extend_from_slice(&s[from..]);
    out.push(b'"');
}

fn digits(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(u8::is_ascii_digit)
}

/// An integer's text as PostgreSQL writes it (no sign but `-`, no leading zero), as is.
fn int(out: &mut Vec<u8>, s: &[u8]) -> bool {
    let d = s.strip_prefix(b"-").unwrap_or(s);
    if !digits(d) || (d[0] == b'0' && (d.len() > 1 || d.len() < s.len())) {
        return false;
    }
    out.extend_from_slice(s);
    true
}

/// The most digits of a decimal taken here: its bytes' base64 (the row's JSON) is then
/// shorter than any placeholder's text, which the converter would take for one.
const MAX_DIGITS: usize = 38;

/// numeric text with exactly `scale` digits after its point (none, and no point, for scale
/// 0), as `str(Decimal(f"{unscaled}E{-scale}"))`: the converter's form of Connect's Decimal.
fn decimal(out: &mut Vec<u8>, s: &[u8], scale: usize) -> bool {
    let (neg, body) = match s.strip_prefix(b"-") {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (whole, frac): (&[u8], &[u8]) = if scale == 0 {
        (body, b"")
    } else {
        match body.iter().position(|&c| c == b'.') {
            Some(dot) if dot > 0 => (&body[..dot], &body[dot + 1..]),
            _ => return false,
        }
    };
    if !digits(whole) || frac.len() != scale || (scale > 0 && !digits(frac)) {
        return false;
    }
    // The unscaled integer's digits, without leading zeros ("0" for zero, which has no sign).
    let mut num: Vec<u8> = whole.iter().chain(frac).copied().collect();
    let lead = num.iter().take_while(|&&c| c == b'0').count().min(num.len() - 1);
    num.drain(..lead);
    if num.len() > MAX_DIGITS {
        return false;
    }
    out.push(b'"');
    decimal_str(out, neg, &num, scale);
    out.push(b'"');
    true
}

/// `str(Decimal(f"{unscaled}E{-scale}"))` of the unscaled integer whose digits are `num`
/// (no leading zero but the one of zero), negative when `neg`: _pydecimal's __str__, plain
/// when the exponent is <= 0 and the point falls after the sixth place past it, else
/// scientific with one digit before the point.
pub(crate) fn decimal_str(out: &mut Vec<u8>, neg: bool, num: &[u8], scale: usize) {
    let zero = num == b"0";
    let exp = -(scale as i64);
    let left = exp + num.len() as i64;
    let dot = if left > -6 { left } else { 1 };
    if neg && !zero {
        out.push(b'-');
    }
    if dot <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-dot) as usize));
        out.extend_from_slice(num);
    } else if dot as usize >= num.len() {
        out.extend_from_slice(num); // exp is <= 0: no zeros to add
    } else {
        out.extend_from_slice(&num[..dot as usize]);
        out.push(b'.');
        out.extend_from_slice(&num[dot as usize..]);
    }
    if left != dot {
        out.extend_from_slice(format!("E{:+}", left - dot).as_bytes());
    }
}

/// timestamptz text already in UTC (`YYYY-MM-DD HH:MM:SS[.f…]+00`, the session's TimeZone)
/// as ZonedTimestamp: `schemas.convert.timestamptz_converter`'s layouts, the others left.
fn zoned(out: &mut Vec<u8>, s: &[u8], width: usize) -> bool {
    let n = s.len();
    if !s.is_ascii() || n < 22 || !s.ends_with(b"+00") || s[4] != b'-' || s[10] != b' ' {
        return false;
    }
    out.push(b'"');
    out.extend_from_slice(&s[..10]);
    out.push(b'T');
    out.extend_from_slice(&s[11..19]);
    let frac = if n > 22 { &s[20..n - 3] } else { b"" };
    if width > 0 {
        out.push(b'.');
        let take = frac.len().min(width);
        out.extend_from_slice(&frac[..take]);
        out.extend(std::iter::repeat_n(b'0', width - take));
    } else if !frac.is_empty() {
        out.push(b'.');
        out.extend_from_slice(frac);
    }
    out.extend_from_slice(b"Z\"");
    true
}

impl CopyRows {
    /// The line's document id and canonical text (in `self.text`), or None for a line left
    /// to Python.
    fn render(&mut self, line: &[u8]) -> Option<(usize, usize)> {
        if line.contains(&b'\\') {
            // An escape, or a null: only a field that is `\N` whole is taken here.
            if line.split(|&c| c == b'\t').any(|f| f.contains(&b'\\') && f != b"\\N") {
                return None;
            }
        }
        if std::str::from_utf8(line).is_err() {
            return None;
        }
        self.fields.clear();
        let mut start = 0;
        for (i, &c) in line.iter().enumerate() {
            if c == b'\t' {
                self.fields.push(field(line, start, i));
                start = i + 1;
            }
        }
        self.fields.push(field(line, start, line.len()));
        if self.fields.len() != self.columns.len() {
            return None;
        }
        let id = self.fields[self.id_at]?;
        self.text.clear();
        for (n, &i) in self.order.iter().enumerate() {
            let col = &self.columns[i];
            self.text.push(if n == 0 { b'{' } else { b',' });
            self.text.extend_from_slice(&col.name);
            self.text.push(b':');
            let Some((a, b)) = self.fields[i] else {
                if col.filled {
                    return None;
                }
                self.text.extend_from_slice(b"null");
                continue;
            };
            let v = &line[a..b];
            let done = match col.kind {
                Kind::Skip => true,
                Kind::Text => {
                    if self.placeholders.iter().any(|p| p == v) {
                        return None;
                    }
                    json_string(&mut self.text, v);
                    true
                }
                Kind::Int => int(&mut self.text, v),
                Kind::Bool => match v {
                    b"t" => {
                        self.text.extend_from_slice(b"true");
                        true
                    }
                    b"f" => {
                        self.text.extend_from_slice(b"false");
                        true
                    }
                    _ => false,
                },
                Kind::Decimal(scale) => decimal(&mut self.text, v, scale),
                Kind::Zoned(width) => zoned(&mut self.text, v, width),
            };
            if !done {
                return None;
            }
        }
        if self.order.is_empty() {
            self.text.push(b'{');
        }
        self.text.push(b'}');
        Some(id)
    }
}

/// The spans of `data`'s lines, each without its newline (a last line may have none).
fn line_spans(data: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= data.len() {
            return None;
        }
        let end = data[start..].iter().position(|&c| c == b'\n').map_or(data.len(), |p| start + p);
        let span = (start, end);
        start = end + 1;
        Some(span)
    })
}

/// A field's span, or None for `\N` (null).
fn field(line: &[u8], a: usize, b: usize) -> Option<(usize, usize)> {
    if &line[a..b] == b"\\N" {
        None
    } else {
        Some((a, b))
    }
}

#[pymethods]
impl CopyRows {
    /// `columns`: each column of the COPY, in its order, as (kind, its number, name as JSON
    /// text, whether a null is filled); `order`: the document's columns (indexes) in its
    /// canonical order; `id_at`: the column whose text is the document id; `placeholders`:
    /// the texts a follower takes for a value left unchanged (a row holding one is left).
    #[new]
    fn new(
        columns: Vec<(String, i64, Vec<u8>, bool)>,
        order: Vec<usize>,
        id_at: usize,
        placeholders: Vec<Vec<u8>>,
    ) -> PyResult<Self> {
        let columns = columns
            .into_iter()
            .map(|(kind, arg, name, filled)| Ok(Column { kind: kind_of(&kind, arg)?, filled, name }))
            .collect::<PyResult<Vec<_>>>()?;
        if id_at >= columns.len() || order.iter().any(|&i| i >= columns.len()) {
            return Err(PyValueError::new_err("a column index past the columns"));
        }
        let order = order.into_iter().filter(|&i| !matches!(columns[i].kind, Kind::Skip)).collect();
        Ok(CopyRows {
            columns,
            order,
            id_at,
            placeholders,
            folds: vec![[0; 4]; 1 << BUCKET_BITS],
            rows: 0,
            fields: Vec::new(),
            text: Vec::new(),
            chosen: vec![false; 1 << BUCKET_BITS],
        })
    }

    /// Folds each line of `data` (COPY's lines, each ending in a newline) this code renders;
    /// answers the others, without their newlines, in their order.
    fn add<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let left = py.detach(|| {
            let mut left = Vec::new();
            for (start, end) in line_spans(data) {
                let line = &data[start..end];
                match self.render(line) {
                    Some((a, b)) => {
                        fold_row(&mut self.folds, &line[a..b], &self.text);
                        self.rows += 1;
                    }
                    None => left.push((start, end)),
                }
            }
            left
        });
        Ok(left.into_iter().map(|(a, b)| PyBytes::new(py, &data[a..b])).collect())
    }

    /// The buckets whose rows `pick` gives.
    fn choose(&mut self, buckets: Vec<usize>) -> PyResult<()> {
        self.chosen.fill(false);
        for b in buckets {
            *self
                .chosen
                .get_mut(b)
                .ok_or_else(|| PyValueError::new_err(format!("no bucket {b}")))? = true;
        }
        Ok(())
    }

    /// `(id, canonical text)` of each line of `data` this code renders whose id falls in a
    /// chosen bucket, and the lines it does not render (all of them, whatever their bucket),
    /// without their newlines, in their order.
    #[allow(clippy::type_complexity)]
    fn pick<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
    ) -> (Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>, Vec<Bound<'py, PyBytes>>) {
        let mut taken = Vec::new();
        let mut left = Vec::new();
        for (start, end) in line_spans(data) {
            let line = &data[start..end];
            match self.render(line) {
                Some((a, b)) => {
                    let id = &line[a..b];
                    if self.chosen[(key_hash(id) >> (32 - BUCKET_BITS)) as usize] {
                        taken.push((PyBytes::new(py, id), PyBytes::new(py, &self.text)));
                    }
                }
                None => left.push(PyBytes::new(py, line)),
            }
        }
        (taken, left)
    }

    /// One line's `(id, canonical text)`, or None when it is left to Python (for the tests
    /// that hold this to the Python rendering).
    fn render_line<'py>(
        &mut self,
        py: Python<'py>,
        line: &[u8],
    ) -> Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let (a, b) = self.render(line)?;
        Some((PyBytes::new(py, &line[a..b]), PyBytes::new(py, &self.text)))
    }

    /// How many rows were folded here.
    #[getter]
    fn rows(&self) -> u64 {
        self.rows
    }

    /// Bucket → `[rows, part 1, part 2, part 3]` of the rows folded here.
    fn folds<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        folds_dict(py, &self.folds)
    }
}
