//! Slurm hostlist expressions: `ls-n[1-3,5]`, `rack[1-2]-gpu[01-04]`,
//! `a1,b[2-3]`, `a[1-2] b1`.
//!
//! Slurm sends node lists of jobs and partitions in this compressed form; the
//! events carry them expanded. Expansion is bounded before anything is
//! produced: an expression is sized first (its names, and the bytes of those
//! names) against a [`Budget`], and one over it is an error, not an
//! allocation. A few hundred bytes could otherwise ask for gigabytes
//! (`n[0-999999]` and a long literal tail), or for seconds of work (the same
//! expression on many lines).

use std::fmt::Write as _;

use super::error::{Error, Result};

/// Upper bound of the names one answer (a whole `scontrol show` output, a
/// whole slurmrestd listing) may expand to, over all its expressions: ten
/// partitions of 50,000 nodes, the largest cluster lockstep is sized for,
/// or ten jobs on each of its nodes. Sorting them is most of the cost: half
/// a million names out of order take 0.5 s in the fuzzer's instrumented
/// build, a million over 1 s.
pub const NAMES_MAX: u64 = 500_000;

/// Upper bound of the bytes of those names: half a million names of 32
/// bytes fit; as many of several hundred do not.
pub const BYTES_MAX: u64 = 16 << 20;

/// What is left to expand of one answer's [`NAMES_MAX`] and [`BYTES_MAX`].
#[derive(Debug, Clone)]
pub struct Budget {
    names: u64,
    bytes: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            names: NAMES_MAX,
            bytes: BYTES_MAX,
        }
    }
}

/// Expands a hostlist expression into node names, in Slurm's order, within
/// a budget of its own.
pub fn expand(expr: &str) -> Result<Vec<String>> {
    expand_within(expr, &mut Budget::default())
}

/// Expands a hostlist expression into node names, in Slurm's order, and
/// takes them from `budget`; an expression over what is left expands to
/// nothing and is an error.
///
/// Names are separated by commas and whitespace outside brackets, as
/// `scontrol show hostnames` reads them. Empty strings and Slurm's
/// placeholders `(null)` and `None` expand to nothing.
pub fn expand_within(expr: &str, budget: &mut Budget) -> Result<Vec<String>> {
    let expr = expr.trim();
    if expr.is_empty() || expr == "(null)" || expr == "None" {
        return Ok(Vec::new());
    }
    let terms = split_top_level(expr)
        .map_err(|d| err(expr, d))?
        .into_iter()
        .map(|t| Term::parse(t).map_err(|d| err(expr, d)))
        .collect::<Result<Vec<_>>>()?;
    let (mut names, mut bytes) = (0u64, 0u64);
    for term in &terms {
        names = names.saturating_add(term.names());
        bytes = bytes.saturating_add(term.bytes_at_most());
    }
    if names > budget.names {
        return Err(err(
            expr,
            format!(
                "expands to {names} names, over the {} left of {NAMES_MAX} for one answer",
                budget.names
            ),
        ));
    }
    if bytes > budget.bytes {
        return Err(err(
            expr,
            format!(
                "expands to over {} bytes of names, what is left of {BYTES_MAX} for one answer",
                budget.bytes
            ),
        ));
    }
    budget.names -= names;
    budget.bytes -= bytes;
    // Within the budget just checked: the cast cannot truncate.
    let mut out = Vec::with_capacity(names as usize);
    let mut name = String::new();
    for term in &terms {
        term.produce(&mut name, &mut out);
    }
    Ok(out)
}

/// [`expand_within`], sorted and without repeats: a set of nodes.
pub fn expand_set_within(expr: &str, budget: &mut Budget) -> Result<Vec<String>> {
    let mut names = expand_within(expr, budget)?;
    // The stable sort finds the sorted runs an expansion is made of (`n1`
    // .. `n9`, `n10` .. `n99`): a million names sort in half the time
    // `sort_unstable` takes.
    names.sort();
    names.dedup();
    Ok(names)
}

fn err(expr: &str, detail: impl Into<String>) -> Error {
    Error::Hostlist {
        expr: expr.chars().take(200).collect(),
        detail: detail.into(),
    }
}

/// Splits at commas and whitespace that are not inside brackets, dropping
/// empty parts.
fn split_top_level(s: &str) -> std::result::Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut inside = false;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' if inside => return Err("nested '['".to_owned()),
            '[' => inside = true,
            ']' if !inside => return Err("']' without '['".to_owned()),
            ']' => inside = false,
            c if !inside && (c == ',' || c.is_ascii_whitespace()) => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if inside {
        return Err("'[' without ']'".to_owned());
    }
    parts.push(&s[start..]);
    parts.retain(|p| !p.is_empty());
    Ok(parts)
}

/// `lo-hi`, numbers zero-padded to `width` (the digits of `lo`, as Slurm
/// pads `gpu[08-10]`).
#[derive(Debug, Clone, Copy)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    fn len(self) -> u64 {
        self.hi - self.lo + 1
    }

    /// The longest number this range writes.
    fn digits_at_most(self) -> u64 {
        let digits = self.hi.checked_ilog10().unwrap_or(0) as usize + 1;
        digits.max(self.width) as u64
    }
}

/// One name, or several through bracket groups: `literals[0] group[0]
/// literals[1] group[1] ... literals[n]`, the cartesian product of the
/// groups with the left one outermost, as Slurm expands it.
#[derive(Debug)]
struct Term<'a> {
    literals: Vec<&'a str>,
    groups: Vec<Vec<Range>>,
}

impl<'a> Term<'a> {
    fn parse(term: &'a str) -> std::result::Result<Self, String> {
        let mut literals = Vec::new();
        let mut groups = Vec::new();
        let mut rest = term;
        while let Some(open) = rest.find('[') {
            // Brackets balance: `split_top_level` checked them.
            let close = open + rest[open..].find(']').ok_or("'[' without ']'")?;
            literals.push(&rest[..open]);
            groups.push(
                rest[open + 1..close]
                    .split(',')
                    .map(parse_range)
                    .collect::<std::result::Result<Vec<_>, _>>()?,
            );
            rest = &rest[close + 1..];
        }
        literals.push(rest);
        Ok(Self { literals, groups })
    }

    /// How many names the term expands to (saturating).
    fn names(&self) -> u64 {
        self.groups.iter().fold(1u64, |n, group| {
            n.saturating_mul(group.iter().fold(0u64, |m, r| m.saturating_add(r.len())))
        })
    }

    /// An upper bound of the bytes of its names: their number times the
    /// longest (saturating).
    fn bytes_at_most(&self) -> u64 {
        let literals: u64 = self.literals.iter().map(|l| l.len() as u64).sum();
        let numbers: u64 = self
            .groups
            .iter()
            .map(|group| group.iter().map(|r| r.digits_at_most()).max().unwrap_or(0))
            .sum();
        self.names().saturating_mul(literals + numbers)
    }

    /// Appends its names to `out`, counting through the groups like an
    /// odometer (no recursion: a term may hold thousands of groups).
    fn produce(&self, name: &mut String, out: &mut Vec<String>) {
        // Per group: which range, and the number within it. Every group has
        // a range and every range a number (`parse_range`).
        let mut at: Vec<(usize, u64)> = self.groups.iter().map(|g| (0, g[0].lo)).collect();
        loop {
            name.clear();
            for ((literal, group), &(r, n)) in self.literals.iter().zip(&self.groups).zip(&at) {
                name.push_str(literal);
                // Writing to a String cannot fail.
                let _ = write!(name, "{n:0width$}", width = group[r].width);
            }
            name.push_str(self.literals[self.groups.len()]);
            // An exact-size copy: the names are kept, the buffer reused.
            out.push(name.as_str().to_owned());
            // The rightmost group turns first; past the leftmost, done.
            let mut g = self.groups.len();
            loop {
                let Some(prev) = g.checked_sub(1) else {
                    return;
                };
                g = prev;
                let group = &self.groups[g];
                let (r, n) = &mut at[g];
                if *n < group[*r].hi {
                    *n += 1;
                    break;
                }
                if *r + 1 < group.len() {
                    *r += 1;
                    *n = group[*r].lo;
                    break;
                }
                *r = 0;
                *n = group[0].lo;
            }
        }
    }
}

fn parse_range(range: &str) -> std::result::Result<Range, String> {
    let range = range.trim();
    let (lo, hi) = match range.split_once('-') {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (range, range),
    };
    let number = |s: &str| {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad range {range:?}"));
        }
        s.parse::<u64>().map_err(|_| format!("bad range {range:?}"))
    };
    let (a, b) = (number(lo)?, number(hi)?);
    if a > b {
        return Err(format!("descending range {range:?}"));
    }
    Ok(Range {
        lo: a,
        hi: b,
        width: lo.len(),
    })
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
            (
                "n[1-2,4]-[9-10]",
                &["n1-9", "n1-10", "n2-9", "n2-10", "n4-9", "n4-10"],
            ),
            // Whitespace separates names as commas do, as
            // `scontrol show hostnames 'a[1-2] b[1-2]'` reads it.
            ("a[1-2] b[1-2]", &["a1", "a2", "b1", "b2"]),
            ("a[1-2]\tb1,,  c", &["a1", "a2", "b1", "c"]),
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
            "n[]",
            "n[1-2 ]x[",
        ] {
            let e = expand(bad).unwrap_err();
            assert!(matches!(e, Error::Hostlist { .. }), "{bad}: {e}");
            assert!(!e.retryable());
        }
    }

    #[test]
    fn is_sized_before_it_expands() {
        // Each group is small; their product is not.
        let e = expand("n[1-1000]-[1-501]").unwrap_err().to_string();
        assert!(e.contains("501000 names"), "{e}");
        // Few names, and each of them long.
        let long = format!("n[0-499999]{}", "x".repeat(40));
        let e = expand(&long).unwrap_err().to_string();
        assert!(e.contains("bytes of names"), "{e}");
        // Bounds hold through saturation, not overflow.
        let e = expand(&"[0-9999999999]".repeat(4)).unwrap_err().to_string();
        assert!(e.contains(&format!("{} names", u64::MAX)), "{e}");
        // The largest cluster lockstep is sized for, in one expression.
        assert_eq!(expand("gpu[00001-50000]").unwrap().len(), 50_000);
    }

    #[test]
    fn one_budget_bounds_a_whole_answer() {
        let mut budget = Budget::default();
        for _ in 0..2 {
            assert_eq!(
                expand_within("n[1-200000]", &mut budget).unwrap().len(),
                200_000
            );
        }
        let e = expand_within("n[1-200000]", &mut budget)
            .unwrap_err()
            .to_string();
        assert!(e.contains("over the 100000 left of 500000"), "{e}");
        // An expression refused takes nothing from the budget.
        assert_eq!(
            expand_within("n[1-100000]", &mut budget).unwrap().len(),
            100_000
        );
        assert!(expand_within("n1", &mut budget).is_err());
    }

    #[test]
    fn many_groups_in_one_name_do_not_recurse() {
        let expr = "a[1]".repeat(100_000);
        assert_eq!(expand(&expr).unwrap(), ["a1".repeat(100_000)]);
    }

    #[test]
    fn sets_are_sorted_without_repeats() {
        let set = expand_set_within("n[3,1-2] n2", &mut Budget::default()).unwrap();
        assert_eq!(set, ["n1", "n2", "n3"]);
    }
}
