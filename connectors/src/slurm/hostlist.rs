//! Slurm hostlist expressions: `ls-n[1-3,5]`, `rack[1-2]-gpu[01-04]`,
//! `a1,b[2-3]`.
//!
//! Slurm sends node lists of jobs and partitions in this compressed form; the
//! events carry them expanded. Expansion is bounded: a malformed or hostile
//! expression (`n[0-999999999]`) is an error, not an allocation.

use super::error::{Error, Result};

/// Upper bound of names one expression may expand to.
pub const NAMES_MAX: usize = 1_000_000;

/// Expands a hostlist expression into node names, in Slurm's order.
///
/// Empty strings and Slurm's placeholders `(null)` and `None` expand to
/// nothing.
pub fn expand(expr: &str) -> Result<Vec<String>> {
    let expr = expr.trim();
    let mut out = Vec::new();
    if expr.is_empty() || expr == "(null)" || expr == "None" {
        return Ok(out);
    }
    for term in split_top_level(expr).map_err(|d| err(expr, d))? {
        let term = term.trim();
        if term.is_empty() {
            continue;
        }
        expand_term(term, &mut out, expr)?;
    }
    Ok(out)
}

fn err(expr: &str, detail: impl Into<String>) -> Error {
    Error::Hostlist {
        expr: expr.chars().take(200).collect(),
        detail: detail.into(),
    }
}

/// Splits at commas that are not inside brackets.
fn split_top_level(s: &str) -> std::result::Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err("nested '['".to_owned());
                }
                depth += 1;
            }
            ']' => {
                if depth == 0 {
                    return Err("']' without '['".to_owned());
                }
                depth -= 1;
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("'[' without ']'".to_owned());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

/// Expands one term (no top-level comma); several bracket groups give the
/// cartesian product, left group outermost, as Slurm does.
fn expand_term(term: &str, out: &mut Vec<String>, whole: &str) -> Result<()> {
    let Some(open) = term.find('[') else {
        push(out, term.to_owned(), whole)?;
        return Ok(());
    };
    let close = term[open..]
        .find(']')
        .map(|i| open + i)
        .ok_or_else(|| err(whole, "'[' without ']'"))?;
    let prefix = &term[..open];
    let rest = &term[close + 1..];
    for range in term[open + 1..close].split(',') {
        let range = range.trim();
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (range, range),
        };
        let width = lo.len();
        let parse = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err(whole, format!("bad range {range:?}")));
            }
            s.parse::<u64>()
                .map_err(|_| err(whole, format!("bad range {range:?}")))
        };
        let (a, b) = (parse(lo)?, parse(hi)?);
        if a > b {
            return Err(err(whole, format!("descending range {range:?}")));
        }
        if b - a >= NAMES_MAX as u64 || out.len() as u64 + (b - a) >= NAMES_MAX as u64 {
            return Err(err(
                whole,
                format!("expands to more than {NAMES_MAX} names"),
            ));
        }
        for n in a..=b {
            let name = format!("{prefix}{n:0width$}");
            if rest.contains('[') {
                expand_term(&format!("{name}{rest}"), out, whole)?;
            } else {
                push(out, name + rest, whole)?;
            }
        }
    }
    Ok(())
}

fn push(out: &mut Vec<String>, name: String, whole: &str) -> Result<()> {
    if out.len() >= NAMES_MAX {
        return Err(err(
            whole,
            format!("expands to more than {NAMES_MAX} names"),
        ));
    }
    out.push(name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_like_slurm() {
        let cases: &[(&str, &[&str])] = &[
            ("", &[]),
            ("(null)", &[]),
            ("ls-n1", &["ls-n1"]),
            ("ls-n[1-3,5]", &["ls-n1", "ls-n2", "ls-n3", "ls-n5"]),
            ("gpu[08-10]", &["gpu08", "gpu09", "gpu10"]),
            ("a1,b[2-3]", &["a1", "b2", "b3"]),
            ("r[1-2]-n[1-2]", &["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
            ("n[7]x", &["n7x"]),
            ("ls-n[1-4]", &["ls-n1", "ls-n2", "ls-n3", "ls-n4"]),
        ];
        for (expr, want) in cases {
            assert_eq!(expand(expr).unwrap(), *want, "{expr}");
        }
    }

    #[test]
    fn rejects_malformed_and_huge() {
        for bad in [
            "n[1-",
            "n]1",
            "n[a-b]",
            "n[3-1]",
            "n[1-2[3]]",
            "n[0-99999999999]",
        ] {
            let e = expand(bad).unwrap_err();
            assert!(matches!(e, Error::Hostlist { .. }), "{bad}: {e}");
            assert!(!e.retryable());
        }
    }
}
