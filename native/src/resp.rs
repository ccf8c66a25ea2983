//! A reply of Redis's protocol (RESP2, and the RESP3 types a reply to `SCAN` or `HGETALL` may
//! take), parsed in place: strings are spans of the buffer.

pub enum Reply {
    /// A bulk or simple string: its span.
    Bulk(usize, usize),
    /// An error: its text's span.
    Error(usize, usize),
    Int,
    Null,
    Array(Vec<Reply>),
    /// A RESP3 map: keys and values, one after the other.
    Map(Vec<Reply>),
}

/// The end of the line starting at `at` (the index of its `\r`), if the buffer holds it.
fn line(buf: &[u8], at: usize) -> Option<usize> {
    let rest = buf.get(at..)?;
    let i = rest.iter().position(|&c| c == b'\r')?;
    if at + i + 1 < buf.len() {
        Some(at + i)
    } else {
        None
    }
}

fn number(buf: &[u8], s: usize, e: usize) -> Result<i64, String> {
    std::str::from_utf8(&buf[s..e])
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| "a length that is no number".to_string())
}

/// Arrays a reply to `SCAN` or `HGETALL` nests: two. Deeper is no such reply (and a server
/// sending thousands would otherwise exhaust the stack).
const MAX_DEPTH: usize = 8;
const MAX_BULK: i64 = 1 << 32;

/// The reply starting at `at` and where it ends, `None` if the buffer does not hold it whole,
/// an error if the bytes are no reply.
pub fn parse(buf: &[u8], at: usize) -> Result<Option<(Reply, usize)>, String> {
    parse_at(buf, at, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Reply, usize)>, String> {
    let Some(&kind) = buf.get(at) else { return Ok(None) };
    let Some(eol) = line(buf, at + 1) else { return Ok(None) };
    let next = eol + 2;
    match kind {
        b'+' => Ok(Some((Reply::Bulk(at + 1, eol), next))),
        b'-' => Ok(Some((Reply::Error(at + 1, eol), next))),
        b':' => Ok(Some((Reply::Int, next))),
        b'_' => Ok(Some((Reply::Null, next))),
        b'$' => {
            let len = number(buf, at + 1, eol)?;
            if len < 0 {
                return Ok(Some((Reply::Null, next)));
            }
            // A string past 4 GiB is none Redis gives (its strings stop at 512 MB unless
            // proto-max-bulk-len says more): no reply, rather than a wait for it.
            if len > MAX_BULK {
                return Err("a string longer than any Redis holds".to_string());
            }
            let end = next + len as usize;
            if end + 2 > buf.len() {
                return Ok(None);
            }
            Ok(Some((Reply::Bulk(next, end), end + 2)))
        }
        b'*' | b'%' => {
            let n = number(buf, at + 1, eol)?;
            if n < 0 {
                return Ok(Some((Reply::Null, next)));
            }
            if depth >= MAX_DEPTH {
                return Err("arrays nested deeper than any reply to SCAN or HGETALL".to_string());
            }
            let items = usize::try_from(n)
                .ok()
                .and_then(|n| if kind == b'%' { n.checked_mul(2) } else { Some(n) })
                .ok_or_else(|| "an array longer than any buffer".to_string())?;
            // Each item takes 3 bytes at the least: until the buffer holds that much, the
            // reply is not whole (and nothing is allocated for a count no reply has).
            if items.saturating_mul(3) > buf.len() - next {
                return Ok(None);
            }
            let mut out = Vec::with_capacity(items);
            let mut pos = next;
            for _ in 0..items {
                match parse_at(buf, pos, depth + 1)? {
                    None => return Ok(None),
                    Some((r, end)) => {
                        out.push(r);
                        pos = end;
                    }
                }
            }
            Ok(Some((if kind == b'%' { Reply::Map(out) } else { Reply::Array(out) }, pos)))
        }
        other => Err(format!("a reply of type {:?}, which this reader does not know", other as char)),
    }
}
