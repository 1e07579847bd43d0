//! Serving traces: CSV with the columns `TIMESTAMP`, `ContextTokens`,
//! `GeneratedTokens` (Azure LLM inference traces 2023, `data/README.md`).

use std::path::Path;

use crate::error::{ReplayError, Result};

/// The chat trace (19,366 requests), embedded: `--trace conv` (default).
pub const CONV_CSV: &str = include_str!("../data/azure-llm-2023-conv.csv");
/// The code-completion trace (8,819 requests), embedded: `--trace code`.
pub const CODE_CSV: &str = include_str!("../data/azure-llm-2023-code.csv");

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRequest {
    /// Index of the request in file order (0 = first data row); also the
    /// key of its generated Q/K/V.
    pub id: usize,
    /// 1-based line of the row in the file.
    pub line: usize,
    /// Arrival time, seconds since the first request of the file.
    pub arrival_s: f64,
    /// Prompt length, tokens (≥ 1).
    pub context_tokens: u32,
    /// Output length, tokens (≥ 1).
    pub generated_tokens: u32,
}

/// A parsed trace, requests in arrival order (stable for equal timestamps).
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Where it came from: `conv`, `code` (embedded) or the path given.
    pub name: String,
    /// Requests sorted by arrival.
    pub requests: Vec<TraceRequest>,
}

impl Trace {
    /// Loads `spec`: `conv` or `code` (the embedded traces), else a path to a CSV.
    ///
    /// # Errors
    /// [`ReplayError::TraceIo`] when the file cannot be read;
    /// [`ReplayError::Trace`] naming the file and line of malformed input.
    pub fn load(spec: &str) -> Result<Self> {
        match spec {
            "conv" => Self::parse("conv (embedded azure-llm-2023-conv.csv)", CONV_CSV),
            "code" => Self::parse("code (embedded azure-llm-2023-code.csv)", CODE_CSV),
            path => {
                let text =
                    std::fs::read_to_string(Path::new(path)).map_err(|e| ReplayError::TraceIo {
                        file: path.to_string(),
                        detail: e.to_string(),
                    })?;
                Self::parse(path, &text)
            }
        }
    }

    /// Parses CSV text. The header names the three columns (any order, extra
    /// columns ignored); rows hold a timestamp (`YYYY-MM-DD HH:MM:SS[.frac]`
    /// or plain seconds) and two positive integers. Line ends may be `\n` or
    /// `\r\n`, the last line may lack one, blank lines are skipped.
    ///
    /// # Errors
    /// [`ReplayError::Trace`] with `file` = `name` and the 1-based line.
    pub fn parse(name: &str, text: &str) -> Result<Self> {
        let err = |line: usize, detail: String| ReplayError::Trace {
            file: name.to_string(),
            line,
            detail,
        };
        let mut lines = text.split('\n').enumerate().map(|(i, l)| {
            let l = l.strip_suffix('\r').unwrap_or(l);
            (i + 1, l)
        });
        let (hline, header) = lines
            .by_ref()
            .find(|(_, l)| !l.trim().is_empty())
            .ok_or_else(|| err(1, "empty file: expected a header line".into()))?;
        let header = header.strip_prefix('\u{feff}').unwrap_or(header);
        let cols: Vec<&str> = header.split(',').map(str::trim).collect();
        let find = |want: &str| {
            cols.iter()
                .position(|c| c.eq_ignore_ascii_case(want))
                .ok_or_else(|| {
                    err(
                        hline,
                        format!(
                            "header has no `{want}` column (expected TIMESTAMP, ContextTokens, GeneratedTokens; found {header:?})"
                        ),
                    )
                })
        };
        let (c_ts, c_ctx, c_gen) = (
            find("TIMESTAMP")?,
            find("ContextTokens")?,
            find("GeneratedTokens")?,
        );
        let mut requests = Vec::new();
        let mut first: Option<f64> = None;
        for (line, l) in lines {
            if l.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = l.split(',').map(str::trim).collect();
            if fields.len() != cols.len() {
                return Err(err(
                    line,
                    format!(
                        "expected {} comma-separated fields, found {}: {l:?}",
                        cols.len(),
                        fields.len()
                    ),
                ));
            }
            let ts = parse_timestamp(fields[c_ts])
                .ok_or_else(|| err(line, format!("bad TIMESTAMP {:?}", fields[c_ts])))?;
            let count = |col: usize, what: &str| -> Result<u32> {
                match fields[col].parse::<u32>() {
                    Ok(v) if v >= 1 => Ok(v),
                    Ok(_) => Err(err(line, format!("{what} must be ≥ 1, found 0"))),
                    Err(_) => Err(err(
                        line,
                        format!("{what} {:?} is not a positive integer", fields[col]),
                    )),
                }
            };
            let context_tokens = count(c_ctx, "ContextTokens")?;
            let generated_tokens = count(c_gen, "GeneratedTokens")?;
            let t0 = *first.get_or_insert(ts);
            requests.push(TraceRequest {
                id: requests.len(),
                line,
                arrival_s: ts - t0,
                context_tokens,
                generated_tokens,
            });
        }
        if requests.is_empty() {
            return Err(err(hline, "the trace has a header but no request".into()));
        }
        requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        Ok(Self {
            name: name.to_string(),
            requests,
        })
    }
}

/// Seconds since 1970-01-01 of `YYYY-MM-DD HH:MM:SS[.frac]` (also with a
/// `T` separator), or a plain non-negative number of seconds.
pub fn parse_timestamp(s: &str) -> Option<f64> {
    if let Ok(x) = s.parse::<f64>() {
        return (x.is_finite() && x >= 0.0).then_some(x);
    }
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-');
    let (y, m, day) = (
        d.next()?.parse::<i64>().ok()?,
        d.next()?.parse::<u32>().ok()?,
        d.next()?.parse::<u32>().ok()?,
    );
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let time = time.trim_end_matches('Z');
    let mut t = time.split(':');
    let (hh, mm, ss) = (
        t.next()?.parse::<u32>().ok()?,
        t.next()?.parse::<u32>().ok()?,
        t.next()?,
    );
    if t.next().is_some() || hh > 23 || mm > 59 {
        return None;
    }
    if !ss.bytes().all(|b| b.is_ascii_digit() || b == b'.') || ss.starts_with('.') {
        return None;
    }
    let sec: f64 = ss.parse().ok()?;
    if !(0.0..61.0).contains(&sec) {
        return None;
    }
    let days = days_from_civil(y, m, day);
    Some(days as f64 * 86_400.0 + f64::from(hh * 3600 + mm * 60) + sec)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_of(e: ReplayError) -> (String, usize) {
        match e {
            ReplayError::Trace { file, line, .. } => (file, line),
            other => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn embedded_traces_parse_with_documented_counts() {
        let conv = Trace::load("conv").unwrap();
        assert_eq!(conv.requests.len(), 19_366);
        let code = Trace::load("code").unwrap();
        assert_eq!(code.requests.len(), 8_819);
        let r = conv.requests[0];
        assert_eq!((r.context_tokens, r.generated_tokens, r.line), (374, 44, 2));
        assert_eq!(r.arrival_s, 0.0);
        assert!(conv
            .requests
            .windows(2)
            .all(|w| w[0].arrival_s <= w[1].arrival_s));
    }

    #[test]
    fn crlf_lf_and_no_final_newline() {
        let a = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.5,10,2\r\n2023-11-16 18:15:47.5,20,3";
        let b = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,10,2\n2023-11-16 18:15:47.5,20,3\n";
        let (ta, tb) = (Trace::parse("a", a).unwrap(), Trace::parse("b", b).unwrap());
        assert_eq!(ta.requests, tb.requests);
        assert_eq!(ta.requests.len(), 2);
        assert!((ta.requests[1].arrival_s - 1.0).abs() < 1e-9);
    }

    #[test]
    fn malformed_line_is_named() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,2\n2023-11-16 18:15:47,abc,3\n";
        let e = Trace::parse("t.csv", text).unwrap_err();
        assert!(e.to_string().starts_with("t.csv:3:"), "{e}");
        assert_eq!(line_of(e), ("t.csv".into(), 3));
        // Wrong field count, zero tokens, bad timestamp, missing column.
        let cases = [
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10\n",
                2,
            ),
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\r\n1,10,2\r\n2,0,2",
                3,
            ),
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:15:46,10,2\n",
                2,
            ),
            ("TIMESTAMP,Context,GeneratedTokens\n1,2,3\n", 1),
            ("TIMESTAMP,ContextTokens,GeneratedTokens\n", 1),
            ("", 1),
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n\n4,5,-6\n",
                4,
            ),
        ];
        for (text, want) in cases {
            let e = Trace::parse("x.csv", text).unwrap_err();
            assert_eq!(line_of(e).1, want, "{text:?}");
        }
    }

    #[test]
    fn missing_file_is_named() {
        let e = Trace::load("/nonexistent/trace.csv").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/trace.csv"), "{e}");
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0.0));
        assert_eq!(parse_timestamp("1970-01-02T00:00:01.5"), Some(86_401.5));
        assert_eq!(parse_timestamp("12.25"), Some(12.25));
        assert_eq!(
            parse_timestamp("2023-11-16 18:15:46.6805900").map(|x| x > 1.7e9),
            Some(true)
        );
        for bad in [
            "",
            "-1",
            "2023-11-16",
            "2023-11-16 25:00:00",
            "2023-11-16 1:2:x",
            "nan",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn unsorted_input_is_sorted_stably() {
        let t = "TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n3,2,1\n5,3,1\n";
        let tr = Trace::parse("u", t).unwrap();
        let ctx: Vec<u32> = tr.requests.iter().map(|r| r.context_tokens).collect();
        assert_eq!(ctx, [2, 1, 3]);
        assert_eq!(tr.requests[0].id, 1);
    }
}
