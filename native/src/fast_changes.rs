//! The direct read's common records taken straight to changes (`spark.apply = native`,
//! `spark_jobs.fast_changes`): a range's Kafka records of one table whose key and value
//! start with the same schema, with version headers and no unchanged columns, parsed,
//! reduced to the newest change per key and converted as the Python path does
//! (`spark_jobs.parse`, `spark_jobs.reduce`, `spark_jobs.changes`, `spark_jobs.convert`).
//! A range holding any record this code is not sure of gives None, and the Python path
//! takes the whole range: what a record means is decided in one place only.
//!
//! The values are read in place (serde_json, borrowed where they hold no escape); only the
//! newest change of each key becomes Python objects.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::copy_rows::decimal_str;

/// How a column of the `after` image becomes its document value (`spark_jobs.convert`).
#[derive(Clone, Copy)]
enum Kind {
    /// Connect's Decimal of this scale: the base64 of the unscaled integer, as `str(Decimal)`.
    Decimal(usize),
    /// Days since the epoch, as an ISO date.
    Date,
    /// Since the epoch in this many units a second, as an ISO date and time.
    Timestamp(i64),
    /// Since midnight in this many units a second, as `HH:MM:SS.ffffff`.
    Time(i64),
}

/// Records this code is not sure of: the Python path takes the range.
struct Off;

type Sure<T> = Result<T, Off>;

/// FNV-1a: the column names and keys of one range, hashed in this process only.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// A JSON value of a row image, as read: a scalar, or something nested (not taken here).
enum Scalar<'a> {
    Null,
    // An integer is I64 when it fits, else U64.
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(Cow<'a, str>),
    Nested,
}

impl<'de> Deserialize<'de> for Scalar<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::I64(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar<'de>, E> {
                Ok(i64::try_from(v).map_or(Scalar::U64(v), Scalar::I64))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar<'de>, E> {
                Ok(Scalar::F64(v))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Scalar<'de>, E> {
                Ok(Scalar::Str(Cow::Owned(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Scalar<'de>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Nested)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Scalar<'de>, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Nested)
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON object's entries in order (a row image, a key payload).
struct Row<'a>(Vec<(Cow<'a, str>, Scalar<'a>)>);

impl<'de> Deserialize<'de> for Row<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Row<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Row<'de>, A::Error> {
                let mut out = Vec::with_capacity(a.size_hint().unwrap_or(16));
                while let Some(entry) = a.next_entry::<Cow<'de, str>, Scalar<'de>>()? {
                    out.push(entry);
                }
                Ok(Row(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The parts of an event this path reads; the others are kept as their raw JSON to check
/// (`checked`).
struct Event<'a> {
    op: Option<Cow<'a, str>>,
    after: Option<Option<Row<'a>>>,
    source: Option<&'a RawValue>,
    others: Vec<&'a RawValue>,
}

impl<'de> Deserialize<'de> for Event<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Event<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Debezium event")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Event<'de>, A::Error> {
                use serde::de::Error;
                let mut e = Event {
                    op: None,
                    after: None,
                    source: None,
                    others: Vec::new(),
                };
                while let Some(name) = a.next_key::<Cow<'de, str>>()? {
                    let twice = || A::Error::custom("a field twice");
                    match name.as_ref() {
                        "op" if e.op.is_none() => e.op = Some(a.next_value()?),
                        "after" if e.after.is_none() => e.after = Some(a.next_value()?),
                        "source" if e.source.is_none() => e.source = Some(a.next_value()?),
                        "op" | "after" | "source" => return Err(twice()),
                        _ => e.others.push(a.next_value()?),
                    }
                }
                Ok(e)
            }
        }
        d.deserialize_map(V)
    }
}

/// A value this path does not read, checked for what orjson refuses and serde_json's skip
/// may not see: a number beyond a double's range, an escape of a lone surrogate, a control
/// character in a string. Only a value that could hold one (an exponent after a digit, a
/// `\u`, a byte below 0x20) is parsed whole.
fn checked(raw: &RawValue) -> Sure<()> {
    let b = raw.get().as_bytes();
    let mut prev = b' ';
    let mut doubt = false;
    for &c in b {
        doubt |= c < 0x20
            || ((c | 0x20) == b'e' && (prev.is_ascii_digit() || prev == b'.'))
            || (c == b'u' && prev == b'\\');
        prev = c;
    }
    if doubt {
        serde_json::from_str::<serde_json::Value>(raw.get()).map_err(|_| Off)?;
    }
    Ok(())
}

/// `{"schema":…,"payload":` + JSON + `}`: the JSON, when `raw` starts with `prefix` (and is
/// UTF-8: the Python path reads other bytes with U+FFFD). Parsed as text, so that serde_json
/// does not check each string's UTF-8 again.
fn payload<'a>(raw: &'a [u8], prefix: &[u8]) -> Sure<&'a str> {
    if raw.len() <= prefix.len() || !raw.starts_with(prefix) || raw.last() != Some(&b'}') {
        return Err(Off);
    }
    std::str::from_utf8(&raw[prefix.len()..raw.len() - 1]).map_err(|_| Off)
}

/// `sinks.base.key_id` of a key payload: a single column's text, else the compact JSON
/// array of the values (integers, strings, booleans and nulls only here).
fn key_id(payload: &Row<'_>) -> Sure<String> {
    let values = &payload.0;
    if has_twice(values) {
        return Err(Off);
    }
    if let [(_, only)] = values.as_slice() {
        return match only {
            Scalar::Str(s) => Ok(s.to_string()),
            Scalar::Bool(b) => Ok(if *b { "true" } else { "false" }.to_string()),
            Scalar::I64(n) => Ok(n.to_string()),
            Scalar::U64(n) => Ok(n.to_string()),
            _ => Err(Off),
        };
    }
    if values.is_empty() {
        return Err(Off);
    }
    let mut out = String::from("[");
    for (i, (_, v)) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match v {
            Scalar::Str(s) => python_json_string(&mut out, s),
            Scalar::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Scalar::Null => out.push_str("null"),
            Scalar::I64(n) => out.push_str(&n.to_string()),
            Scalar::U64(n) => out.push_str(&n.to_string()),
            _ => return Err(Off),
        }
    }
    out.push(']');
    Ok(out)
}

/// Whether a name comes twice (orjson keeps the last value at the first place: not taken).
fn has_twice(entries: &[(Cow<'_, str>, Scalar<'_>)]) -> bool {
    entries
        .iter()
        .enumerate()
        .any(|(i, (a, _))| entries[..i].iter().any(|(b, _)| a == b))
}

/// The converted text of an integer in a converted column (`spark_jobs.convert`).
fn converted_int(kind: Kind, n: i64) -> Sure<String> {
    Ok(match kind {
        Kind::Date => iso_date(n)?,
        Kind::Timestamp(per_second) => {
            if n == i64::MAX || n == i64::MIN {
                return Err(Off); // the reader's cap: the converter refuses the value
            }
            let secs = n.div_euclid(per_second);
            let frac = n.rem_euclid(per_second);
            let micros = i128::from(frac) * 1_000_000 / i128::from(per_second);
            let date = iso_date(secs.div_euclid(86_400))?;
            let s = secs.rem_euclid(86_400);
            let mut t = format!("{date}T{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60);
            if micros != 0 {
                t.push_str(&format!(".{micros:06}"));
            }
            t
        }
        Kind::Time(per_second) => {
            if n < 0 {
                return Err(Off);
            }
            let micros = i128::from(n) * 1_000_000 / i128::from(per_second);
            let (secs, us) = (micros / 1_000_000, micros % 1_000_000);
            format!(
                "{:02}:{:02}:{:02}.{us:06}",
                secs / 3600,
                secs % 3600 / 60,
                secs % 60
            )
        }
        Kind::Decimal(_) => return Err(Off),
    })
}

/// One record on this path, before the reduction.
struct Change<'a> {
    offset: i64,
    key: String,
    lsn: i64,
    order: i64,
    /// The `after` image, or None for a delete.
    after: Option<Row<'a>>,
    ts_ms: Option<i64>,
}

/// A column of the row images: its name as a Python string and its converter, if any.
struct Column {
    name: Py<PyString>,
    kind: Option<Kind>,
    /// Its name, and its name as JSON (for `Rendered`).
    raw: String,
    quoted: String,
}

#[pyclass(module = "pgcdc_native")]
pub struct FastChanges {
    value_prefix: Vec<u8>,
    key_prefix: Vec<u8>,
    columns: FnvMap<String, Column>,
    placeholders: Vec<String>,
    commit_header: String,
    order_header: String,
    unchanged_header: String,
    /// The newest change of each key so far, in the order the keys first came.
    kept: Vec<Kept>,
    /// Each key's place in `kept`.
    places: FnvMap<String, usize>,
}

/// A key's newest change so far: its version (commit LSN, order, offset), and what `take`
/// makes of it.
struct Kept {
    version: (i64, i64, i64),
    key: Py<PyString>,
    doc: Doc,
    ts_ms: Option<i64>,
    /// What the followers write of the document (`Rendered`), or None.
    render: Py<PyAny>,
}

/// A kept change's document.
enum Doc {
    Delete,
    /// Its values, as a dict.
    Values(Py<PyAny>),
    /// Its JSON (`Rendered`'s first part) and how many columns it has: made a
    /// `sinks.base.WholeDocument`, read from its JSON only when asked.
    Json {
        source: Py<PyBytes>,
        columns: usize,
    },
}

/// `object.__setattr__` without its Python call: a frozen dataclass's own `__setattr__`
/// refuses, the slot's descriptor takes it.
fn set_slot(
    obj: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    // SAFETY: three live objects of this thread, which holds the GIL.
    let done =
        unsafe { pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) };
    if done == 0 {
        Ok(())
    } else {
        Err(PyErr::fetch(obj.py()))
    }
}

impl FastChanges {
    /// Add one record (`add`): false when it is off this path.
    fn add_one(
        &mut self,
        py: Python<'_>,
        offset: i64,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        headers: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let Ok(key) = key.cast::<PyBytes>() else {
            return Ok(false);
        };
        let value = if value.is_none() {
            None
        } else {
            match value.cast::<PyBytes>() {
                Ok(v) => Some(v),
                Err(_) => return Ok(false),
            }
        };
        let Ok(c) = self.change(offset, key.as_bytes(), value.map(|v| v.as_bytes()), headers)
        else {
            return Ok(false);
        };
        let version = (c.lsn, c.order, c.offset);
        let place = self.places.get(c.key.as_str()).copied();
        if let Some(at) = place {
            if version < self.kept[at].version {
                return Ok(true); // an older change of a key: the newest is kept
            }
        }
        let none = py.None().into_bound(py);
        let (doc, render) = match c.after {
            None => (Doc::Delete, none),
            Some(after) => match self.document(py, &after, false)? {
                None => return Ok(false),
                Some((_, Some(texts))) => {
                    let (source, hash, digest) = rendered(py, &c.key, &texts)?;
                    let render = (source.clone(), hash, digest)
                        .into_pyobject(py)?
                        .into_any();
                    let columns = after.0.len();
                    (
                        Doc::Json {
                            source: source.unbind(),
                            columns,
                        },
                        render,
                    )
                }
                // A float that is not finite: orjson's to write, from the values.
                Some((_, None)) => match self.document(py, &after, true)? {
                    Some((Some(values), _)) => (Doc::Values(values.into_any().unbind()), none),
                    _ => return Ok(false),
                },
            },
        };
        let kept = Kept {
            version,
            key: PyString::new(py, &c.key).unbind(),
            doc,
            ts_ms: c.ts_ms,
            render: render.unbind(),
        };
        match place {
            Some(at) => self.kept[at] = kept,
            None => {
                self.places.insert(c.key, self.kept.len());
                self.kept.push(kept);
            }
        }
        Ok(true)
    }

    /// The change of one record (its offset, key, value and headers: a list of (name,
    /// value) tuples, or None), or Off.
    fn change<'a>(
        &self,
        offset: i64,
        key: &'a [u8],
        value: Option<&'a [u8]>,
        headers: &Bound<'_, PyAny>,
    ) -> Sure<Change<'a>> {
        let key_row: Row<'_> =
            serde_json::from_str(payload(key, &self.key_prefix)?).map_err(|_| Off)?;
        let key = key_id(&key_row)?;
        // The version headers, each the first of its name.
        let (mut lsn, mut order) = (None, None);
        if !headers.is_none() {
            let headers = headers.cast::<PyList>().map_err(|_| Off)?;
            for h in headers.iter() {
                let h = h.cast::<PyTuple>().map_err(|_| Off)?;
                let name = h.get_item(0).map_err(|_| Off)?;
                let name = name.cast::<PyString>().map_err(|_| Off)?;
                let name = name.to_str().map_err(|_| Off)?;
                if name == self.commit_header {
                    if lsn.is_none() {
                        lsn = Some(header_long(&h.get_item(1).map_err(|_| Off)?)?);
                    }
                } else if name == self.order_header {
                    if order.is_none() {
                        order = Some(header_long(&h.get_item(1).map_err(|_| Off)?)?);
                    }
                } else if name == self.unchanged_header {
                    return Err(Off); // columns left unchanged: the Python path folds them
                }
            }
        }
        let lsn = lsn.ok_or(Off)?;
        let order = order.unwrap_or(0);
        let Some(value) = value else {
            return Ok(Change {
                offset,
                key,
                lsn,
                order,
                after: None,
                ts_ms: None,
            });
        };
        let event: Event<'a> =
            serde_json::from_str(payload(value, &self.value_prefix)?).map_err(|_| Off)?;
        for raw in &event.others {
            checked(raw)?;
        }
        let ts_ms = match event.source {
            Some(raw) if raw.get().starts_with('{') => {
                let source: Row<'_> = serde_json::from_str(raw.get()).map_err(|_| Off)?;
                if source.0.iter().any(|(_, v)| matches!(v, Scalar::Nested)) {
                    checked(raw)?; // what was read is checked; a nested value was skipped
                }
                if has_twice(&source.0) {
                    return Err(Off);
                }
                source
                    .0
                    .iter()
                    .find(|(n, _)| n == "ts_ms")
                    .and_then(|(_, v)| match v {
                        Scalar::I64(n) => Some(*n),
                        _ => None,
                    })
            }
            Some(raw) => {
                checked(raw)?;
                None
            }
            None => None,
        };
        let op = event.op.ok_or(Off)?;
        match (op.as_ref(), event.after) {
            ("t", _) => Err(Off),
            ("d", after) => {
                if let Some(Some(row)) = &after {
                    if row.0.iter().any(|(_, v)| matches!(v, Scalar::Nested)) {
                        return Err(Off); // not read: a nested value may hold what orjson refuses
                    }
                }
                Ok(Change {
                    offset,
                    key,
                    lsn,
                    order,
                    after: None,
                    ts_ms,
                })
            }
            (_, Some(Some(after))) => Ok(Change {
                offset,
                key,
                lsn,
                order,
                after: Some(after),
                ts_ms,
            }),
            _ => Err(Off),
        }
    }

    /// The document of an `after` image (`RowConverter` on a row with no unchanged column):
    /// with `values` as a dict (else None), and each value's JSON as orjson writes it (None
    /// when a float is not finite: orjson's to write); None when the row is not taken here.
    #[allow(clippy::type_complexity)]
    fn document<'py>(
        &self,
        py: Python<'py>,
        after: &Row<'_>,
        values: bool,
    ) -> PyResult<Option<(Option<Bound<'py, PyDict>>, Option<Texts<'_>>)>> {
        if has_twice(&after.0) {
            return Ok(None);
        }
        let none = py.None().into_bound(py);
        // A value as Python's, made only for the dict.
        macro_rules! value {
            ($e:expr) => {
                if values {
                    $e
                } else {
                    none.clone()
                }
            };
        }
        let doc = if values { Some(PyDict::new(py)) } else { None };
        // Each value's JSON as orjson writes it, beside the document (`Rendered`).
        let mut texts = Some(Texts {
            cols: Vec::with_capacity(after.0.len()),
            values: String::with_capacity(256),
        });
        let mut text = String::new();
        for (name, v) in &after.0 {
            let column = self.columns.get(name.as_ref());
            let kind = column.and_then(|c| c.kind);
            text.clear();
            let value = match (v, kind) {
                (Scalar::Null, _) => {
                    text.push_str("null");
                    none.clone()
                }
                (Scalar::Str(s), _) if self.placeholders.iter().any(|p| p == s.as_ref()) => {
                    return Ok(None)
                }
                (Scalar::Str(s), Some(Kind::Decimal(scale))) => {
                    match decimal_from_base64(s, scale) {
                        Ok(t) => {
                            python_json_string(&mut text, &t);
                            value!(PyString::new(py, &t).into_any())
                        }
                        Err(Off) => return Ok(None),
                    }
                }
                (Scalar::Str(s), _) => {
                    python_json_string(&mut text, s);
                    value!(PyString::new(py, s).into_any())
                }
                // A bool is an int to Python's converters: not taken here.
                (Scalar::Bool(_), Some(Kind::Date | Kind::Timestamp(_) | Kind::Time(_))) => {
                    return Ok(None)
                }
                (&Scalar::Bool(b), _) => {
                    text.push_str(if b { "true" } else { "false" });
                    value!(b.into_pyobject(py)?.to_owned().into_any())
                }
                (
                    &Scalar::I64(n),
                    Some(kind @ (Kind::Date | Kind::Timestamp(_) | Kind::Time(_))),
                ) => match converted_int(kind, n) {
                    Ok(t) => {
                        python_json_string(&mut text, &t);
                        value!(PyString::new(py, &t).into_any())
                    }
                    Err(Off) => return Ok(None),
                },
                (Scalar::U64(_), Some(Kind::Date | Kind::Timestamp(_) | Kind::Time(_))) => {
                    return Ok(None)
                }
                (&Scalar::I64(n), _) => {
                    text.push_str(&n.to_string());
                    value!(n.into_pyobject(py)?.into_any())
                }
                (&Scalar::U64(n), _) => {
                    text.push_str(&n.to_string());
                    value!(n.into_pyobject(py)?.into_any())
                }
                // serde_json reads `-0` as a float, orjson as the integer 0.
                (&Scalar::F64(f), _) if f == 0.0 && f.is_sign_negative() => return Ok(None),
                (&Scalar::F64(f), _) => {
                    if !json_float(&mut text, f) {
                        texts = None;
                    }
                    value!(f.into_pyobject(py)?.into_any())
                }
                (Scalar::Nested, _) => return Ok(None),
            };
            if let Some(t) = texts.as_mut() {
                let (raw, quoted) = match column {
                    Some(c) => (
                        Cow::Borrowed(c.raw.as_str()),
                        Cow::Borrowed(c.quoted.as_str()),
                    ),
                    None => {
                        let mut quoted = String::new();
                        python_json_string(&mut quoted, name);
                        (Cow::Owned(name.to_string()), Cow::Owned(quoted))
                    }
                };
                let start = t.values.len();
                t.values.push_str(&text);
                t.cols.push((raw, quoted, start, t.values.len()));
            }
            if let Some(doc) = doc.as_ref() {
                match column {
                    Some(c) => doc.set_item(c.name.bind(py), value)?,
                    None => doc.set_item(PyString::new(py, name), value)?,
                }
            }
        }
        Ok(Some((doc, texts)))
    }
}

/// A finite float as orjson writes it: the shortest text that reads back as the same float,
/// in the layout of dtolnay's formatters (zmij here, serde_json's), with a `+` in a positive
/// exponent (`1e+16`, `1.5e-7`, `0.00001`, `100.0`); false (nothing written) for one that is
/// not finite, which this path leaves to orjson.
fn json_float(out: &mut String, f: f64) -> bool {
    if !f.is_finite() {
        return false;
    }
    let mut buf = zmij::Buffer::new();
    let text = buf.format_finite(f);
    match text.find('e') {
        Some(at) if !matches!(text.as_bytes().get(at + 1), Some(b'-' | b'+')) => {
            out.push_str(&text[..=at]);
            out.push('+');
            out.push_str(&text[at + 1..]);
        }
        _ => out.push_str(text),
    }
    true
}

/// A document's columns as orjson writes them: each column's name, its name's JSON and
/// where its value's JSON is in `values`.
struct Texts<'s> {
    cols: Vec<(Cow<'s, str>, Cow<'s, str>, usize, usize)>,
    values: String,
}

/// A buffer of a size known ahead, filled in order (a Python `bytes` made in place).
struct Fill<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Fill<'_> {
    fn put(&mut self, data: &[u8]) {
        self.buf[self.at..self.at + data.len()].copy_from_slice(data);
        self.at += data.len();
    }

    /// `data` framed as a RESP bulk string (`$<length>\r\n<data>\r\n`), as redis-py packs
    /// an argument (`sinks.cache_resp.BULK`): [`bulk_len`] bytes.
    fn bulk_string(&mut self, data: &[u8]) {
        self.put(b"$");
        // The length's digits, written in place (no string made for them).
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut n = data.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.put(&digits[at..]);
        self.put(b"\r\n");
        self.put(data);
        self.put(b"\r\n");
    }
}

/// The size of `n` bytes framed as a RESP bulk string.
fn bulk_len(n: usize) -> usize {
    let mut digits = 1;
    let mut m = n / 10;
    while m > 0 {
        digits += 1;
        m /= 10;
    }
    1 + digits + 2 + n + 2
}

/// `make` filling a `bytes` of `len` bytes; an error if it did not fill it exactly.
fn bytes_of<'py>(
    py: Python<'py>,
    len: usize,
    make: impl FnOnce(&mut Fill<'_>),
) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, len, |buf| {
        let mut fill = Fill { buf, at: 0 };
        make(&mut fill);
        if fill.at == len {
            Ok(())
        } else {
            Err(PyValueError::new_err("a rendered document's size was misjudged"))
        }
    })
}

/// What the followers write of a document with the id `key` (`sinks.base.Rendered`): the
/// document as `orjson.dumps` writes it; the Redis follower's hash fields (each column's name
/// then its value's JSON, each framed as a RESP bulk string: `sinks.cache`); and the row digest
/// the search follower keeps beside it (`pgcdc.core.row_digest.stored`, as `orjson.dumps`
/// writes it), of the document with its fields in sorted order (`row_digest.canonical`).
#[allow(clippy::type_complexity)]
fn rendered<'py>(
    py: Python<'py>,
    key: &str,
    texts: &Texts<'_>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let cols = &texts.cols;
    let value = |at: usize| &texts.values.as_bytes()[cols[at].2..cols[at].3];
    // Each made in place in its `bytes`, its size reckoned first: no copy of the document.
    let size = 2
        + cols.len().saturating_sub(1)
        + (0..cols.len())
            .map(|i| cols[i].1.len() + 1 + value(i).len())
            .sum::<usize>();
    let source = bytes_of(py, size, |out| {
        out.put(b"{");
        for (i, (_, name, _, _)) in cols.iter().enumerate() {
            if i > 0 {
                out.put(b",");
            }
            out.put(name.as_bytes());
            out.put(b":");
            out.put(value(i));
        }
        out.put(b"}");
    })?;
    let hash_size = (0..cols.len())
        .map(|i| bulk_len(cols[i].0.len()) + bulk_len(value(i).len()))
        .sum::<usize>();
    let hash = bytes_of(py, hash_size, |out| {
        for (i, (raw, _, _, _)) in cols.iter().enumerate() {
            out.bulk_string(raw.as_bytes());
            out.bulk_string(value(i));
        }
    })?;
    // Sorted as orjson's OPT_SORT_KEYS sorts: by the names themselves (their UTF-8 bytes,
    // which order as their code points, as Python's sorted() does); hashed a piece at a time.
    let mut order: Vec<usize> = (0..cols.len()).collect();
    order.sort_unstable_by(|&a, &b| cols[a].0.cmp(&cols[b].0));
    let mut canonical: Vec<&[u8]> = Vec::with_capacity(4 * cols.len() + 2);
    canonical.push(b"{");
    for (i, &at) in order.iter().enumerate() {
        if i > 0 {
            canonical.push(b",");
        }
        canonical.push(cols[at].1.as_bytes());
        canonical.push(b":");
        canonical.push(value(at));
    }
    canonical.push(b"}");
    let (h1, h2, h3) = crate::digest_parts_of(key.as_bytes(), &canonical);
    let b = crate::key_hash(key.as_bytes());
    let digest = format!("{{\"b\":{b},\"h1\":{h1},\"h2\":{h2},\"h3\":{h3}}}");
    Ok((source, hash, PyBytes::new(py, digest.as_bytes())))
}

#[pymethods]
impl FastChanges {
    /// `columns`: the row image's columns, each with the kind and argument of its converter
    /// (`("", 0)` for none); `headers`: the names of the commit LSN, order and
    /// unchanged-columns headers.
    #[new]
    fn new(
        py: Python<'_>,
        value_prefix: Vec<u8>,
        key_prefix: Vec<u8>,
        columns: Vec<(String, String, i64)>,
        placeholders: Vec<String>,
        headers: (String, String, String),
    ) -> PyResult<Self> {
        let mut by_name = FnvMap::default();
        for (name, kind, arg) in columns {
            let kind = if kind.is_empty() {
                None
            } else {
                Some(kind_of(&kind, arg)?)
            };
            let py_name = PyString::intern(py, &name).unbind();
            let mut quoted = String::new();
            python_json_string(&mut quoted, &name);
            by_name.insert(
                name.clone(),
                Column {
                    name: py_name,
                    kind,
                    raw: name,
                    quoted,
                },
            );
        }
        Ok(Self {
            value_prefix,
            key_prefix,
            columns: by_name,
            placeholders,
            commit_header: headers.0,
            order_header: headers.1,
            unchanged_header: headers.2,
            kept: Vec::new(),
            places: FnvMap::default(),
        })
    }

    /// Read a part of the range (`spark_jobs.parse.KafkaRecord` tuples, in offset order),
    /// each record's change kept when it is its key's newest so far by (commit LSN, order,
    /// offset); false when any record is off this path (the object is then of no more use).
    fn add(&mut self, py: Python<'_>, records: &Bound<'_, PyList>) -> PyResult<bool> {
        for rec in records.iter() {
            let Ok(rec) = rec.cast_into::<PyTuple>() else {
                return Ok(false);
            };
            let (Ok(offset), Ok(key), Ok(value), Ok(headers)) = (
                rec.get_item(2),
                rec.get_item(3),
                rec.get_item(4),
                rec.get_item(5),
            ) else {
                return Ok(false);
            };
            let Ok(offset) = offset.extract::<i64>() else {
                return Ok(false);
            };
            if !self.add_one(py, offset, &key, &value, &headers)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Read consumed messages (`confluent_kafka.Message`, as `Consumer.consume` lists them)
    /// of the range `topic`/`partition` up to offset `end` (excluded), from `msgs[at]`, as
    /// `spark_jobs.kafka_direct.read_range` reads them (a message of another partition, or
    /// without an offset, is passed over) and `add` adds records. Returns (the index of the
    /// next message, what stopped it, the offset after the last record added or -1):
    /// `0` every message was read; `1` the range's end was reached (its last offset or one
    /// past it: nothing after it is read); `2` the message at the index is off this path (the
    /// object is then of no more use); `3` the message at the index carries an error, which
    /// the caller reads (the partition's end, or a failure).
    fn add_messages(
        &mut self,
        py: Python<'_>,
        msgs: &Bound<'_, PyList>,
        at: usize,
        topic: &str,
        partition: i64,
        end: i64,
    ) -> PyResult<(usize, u8, i64)> {
        let names = intern_names(py);
        let mut added_to = -1;
        let n = msgs.len();
        let mut i = at;
        while i < n {
            let m = msgs.get_item(i)?;
            if !m.call_method0(&names.error)?.is_none() {
                return Ok((i, 3, added_to));
            }
            let offset = m.call_method0(&names.offset)?;
            if offset.is_none() {
                i += 1;
                continue;
            }
            let offset: i64 = offset.extract()?;
            let topic_of = m.call_method0(&names.topic)?;
            let same = m.call_method0(&names.partition)?.extract::<i64>().ok() == Some(partition)
                && topic_of
                    .cast::<PyString>()
                    .is_ok_and(|t| t.to_str().is_ok_and(|t| t == topic));
            if !same {
                i += 1;
                continue;
            }
            if offset >= end {
                return Ok((i, 1, added_to));
            }
            let key = m.call_method0(&names.key)?;
            let value = m.call_method0(&names.value)?;
            let headers = m.call_method0(&names.headers)?;
            if !self.add_one(py, offset, &key, &value, &headers)? {
                return Ok((i, 2, added_to));
            }
            added_to = offset + 1;
            i += 1;
            if offset == end - 1 {
                return Ok((i, 1, added_to));
            }
        }
        Ok((i, 0, added_to))
    }

    /// The changes kept, one a key in the order the keys first came, made as
    /// `sinks.base.Change` (`cls`, made by `new`: `object.__new__`) of `table` and its value
    /// `schema`, each with the Kafka position of its record (`topic`, `partition`, its
    /// offset), and the newest `source.ts_ms` among them (0 for none); then none is kept, as
    /// if new. A change is made as `Change(table, key, lsn, order, None)` makes a delete and
    /// `Change(table, key, lsn, order, doc, empty, True, rendered, schema)` a whole document
    /// (`empty`: no unchanged column), its fields set with no Python call: the frozen
    /// dataclass's `__init__` (about 1 µs), a tuple a change and the Python loop over them
    /// cost `native_range` 2.5-3.5 µs a record more (30,000 records). `__post_init__` checks
    /// nothing this path has not (the LSN and order are digits).
    #[allow(clippy::too_many_arguments)]
    fn take<'py>(
        &mut self,
        py: Python<'py>,
        new: &Bound<'py, PyAny>,
        cls: &Bound<'py, PyAny>,
        whole_cls: &Bound<'py, PyAny>,
        table: &Bound<'py, PyAny>,
        schema: &Bound<'py, PyAny>,
        empty: &Bound<'py, PyAny>,
        topic: &Bound<'py, PyAny>,
        partition: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, i64)> {
        let names = [
            pyo3::intern!(py, "table"),
            pyo3::intern!(py, "key"),
            pyo3::intern!(py, "commit_lsn"),
            pyo3::intern!(py, "order"),
            pyo3::intern!(py, "doc"),
            pyo3::intern!(py, "unchanged"),
            pyo3::intern!(py, "split"),
            pyo3::intern!(py, "rendered"),
            pyo3::intern!(py, "schema"),
        ];
        let none = py.None().into_bound(py);
        let yes = true.into_pyobject(py)?.to_owned().into_any();
        let no = false.into_pyobject(py)?.to_owned().into_any();
        let changes = PyList::empty(py);
        let wheres = PyList::empty(py);
        let mut newest = 0i64;
        for k in self.kept.drain(..) {
            let (lsn, order, offset) = k.version;
            if lsn < 0 || order < 0 {
                return Err(PyValueError::new_err(format!(
                    "commit_lsn {lsn}, order {order}"
                )));
            }
            let obj = new.call1((cls,))?;
            let doc = match k.doc {
                Doc::Delete => none.clone(),
                Doc::Values(values) => values.into_bound(py),
                Doc::Json { source, columns } => {
                    let doc = new.call1((whole_cls,))?;
                    set_slot(&doc, pyo3::intern!(py, "json"), source.bind(py))?;
                    set_slot(
                        &doc,
                        pyo3::intern!(py, "columns"),
                        &columns.into_pyobject(py)?.into_any(),
                    )?;
                    set_slot(&doc, pyo3::intern!(py, "_values"), &none)?;
                    doc
                }
            };
            let whole = !doc.is_none();
            let values: [Bound<'py, PyAny>; 9] = [
                table.clone(),
                k.key.into_bound(py).into_any(),
                lsn.into_pyobject(py)?.into_any(),
                order.into_pyobject(py)?.into_any(),
                doc,
                empty.clone(),
                if whole { yes.clone() } else { no.clone() },
                if whole {
                    k.render.into_bound(py)
                } else {
                    none.clone()
                },
                if whole { schema.clone() } else { none.clone() },
            ];
            for (name, value) in names.iter().zip(values.iter()) {
                set_slot(&obj, name, value)?;
            }
            changes.append(obj)?;
            wheres.append((topic, partition, offset))?;
            if let Some(ts) = k.ts_ms {
                newest = newest.max(ts);
            }
        }
        self.places.clear();
        Ok((changes, wheres, newest))
    }
}

fn kind_of(name: &str, arg: i64) -> PyResult<Kind> {
    Ok(match name {
        "decimal" => Kind::Decimal(
            usize::try_from(arg).map_err(|_| PyValueError::new_err(format!("scale {arg}")))?,
        ),
        "date" => Kind::Date,
        "timestamp" if arg > 0 => Kind::Timestamp(arg),
        "time" if arg > 0 => Kind::Time(arg),
        _ => {
            return Err(PyValueError::new_err(format!(
                "no column kind {name} ({arg})"
            )))
        }
    })
}

/// The names of `confluent_kafka.Message`'s methods that `add_messages` calls, interned once
/// a process.
struct MessageNames {
    error: Py<PyString>,
    offset: Py<PyString>,
    partition: Py<PyString>,
    topic: Py<PyString>,
    key: Py<PyString>,
    value: Py<PyString>,
    headers: Py<PyString>,
}

static MESSAGE_NAMES: pyo3::sync::PyOnceLock<MessageNames> = pyo3::sync::PyOnceLock::new();

fn intern_names(py: Python<'_>) -> &MessageNames {
    MESSAGE_NAMES.get_or_init(py, || {
        let name = |s: &str| PyString::intern(py, s).unbind();
        MessageNames {
            error: name("error"),
            offset: name("offset"),
            partition: name("partition"),
            topic: name("topic"),
            key: name("key"),
            value: name("value"),
            headers: name("headers"),
        }
    })
}

/// A header's text as a long: ASCII digits only (what the Python path takes; anything else
/// it dead-letters or cannot order).
fn header_long(v: &Bound<'_, PyAny>) -> Sure<i64> {
    let b = v.cast::<PyBytes>().map_err(|_| Off)?.as_bytes();
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return Err(Off);
    }
    std::str::from_utf8(b)
        .map_err(|_| Off)?
        .parse::<i64>()
        .map_err(|_| Off)
}

/// A string as Python's `json.dumps(…, ensure_ascii=False)` writes it. Only ASCII bytes are
/// escaped, and no byte of a character beyond ASCII is one, so the runs between them are
/// copied whole.
fn python_json_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push('"');
    let mut from = 0;
    for (i, &c) in s.as_bytes().iter().enumerate() {
        let escaped = match c {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[from..i]);
        if escaped.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(c >> 4)]));
            out.push(char::from(HEX[usize::from(c & 0xf)]));
        } else {
            out.push_str(escaped);
        }
        from = i + 1;
    }
    out.push_str(&s[from..]);
    out.push('"');
}

/// (year, month, day) of days since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// 0001-01-01 and 9999-12-31 in days since the epoch: what Python's date takes.
const FIRST_DAY: i64 = -719_162;
const LAST_DAY: i64 = 2_932_896;

fn iso_date(days: i64) -> Sure<String> {
    if !(FIRST_DAY..=LAST_DAY).contains(&days) {
        return Err(Off);
    }
    let (y, m, d) = civil(days);
    Ok(format!("{y:04}-{m:02}-{d:02}"))
}

/// The base64 alphabet's value of a character.
fn b64_value(c: u8) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    } as u32)
}

/// Strict base64 (padded, standard alphabet); anything else is not taken here.
fn base64_bytes(s: &str) -> Sure<Vec<u8>> {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return Err(Off);
    }
    let pad = b.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return Err(Off);
    }
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (i, quad) in b.chunks(4).enumerate() {
        let last = i == b.len() / 4 - 1;
        let mut n = 0u32;
        let mut got = 0;
        for &c in quad {
            if c == b'=' && last {
                n <<= 6;
                continue;
            }
            n = (n << 6) | b64_value(c).ok_or(Off)?;
            got += 1;
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let take = if last { got - 1 } else { 3 };
        if last && (got < 2 || got + pad != 4) {
            return Err(Off);
        }
        out.extend_from_slice(&bytes[..take]);
    }
    Ok(out)
}

/// `spark_jobs.convert._decimal_from_bytes`: the big-endian two's-complement integer of
/// the base64's bytes, at `scale` (16 bytes at most here).
fn decimal_from_base64(b64: &str, scale: usize) -> Sure<String> {
    let bytes = base64_bytes(b64)?;
    if bytes.is_empty() || bytes.len() > 16 {
        return Err(Off);
    }
    let mut n: i128 = if bytes[0] & 0x80 != 0 { -1 } else { 0 };
    for &b in &bytes {
        n = (n << 8) | i128::from(b);
    }
    let digits = n.unsigned_abs().to_string();
    let mut out = Vec::new();
    decimal_str(&mut out, n < 0, digits.as_bytes(), scale);
    String::from_utf8(out).map_err(|_| Off)
}
