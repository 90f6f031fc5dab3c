//! The scontrol back end: for sites without slurmrestd, and for node updates
//! on Slurm versions whose REST API has none (22.05's v0.0.38).
//!
//! Reads `scontrol --all --oneliner show node|job|partition` (one object a
//! line of `Key=Value` pairs) into the same observation types as the REST
//! parser, so both back ends produce identical events for the same cluster;
//! writes with `scontrol update nodename=...`. Every run is bounded by a
//! timeout and killed when it expires. The environment is passed through
//! (SLURM_CONF, munge); it never sets SLURM_JWT.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use lockstep_schemas::{SlurmJob, SlurmNode, SlurmPartition, Text};
use tokio::process::Command;

use super::error::{classify_message, Error, Result};
use super::hostlist;
use super::parse;

/// How to run scontrol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScontrolConfig {
    /// The program (looked up in `PATH` unless absolute).
    pub program: PathBuf,
    /// `SLURM_CONF` for the child; unset: inherited.
    pub slurm_conf: Option<PathBuf>,
    /// Upper bound of one run; the child is killed after it.
    pub timeout_ms: u64,
    /// Upper bound of what one run may print, in bytes (a 50,000-node
    /// `show node` is about 40 MB).
    pub output_bytes_max: usize,
}

impl Default for ScontrolConfig {
    fn default() -> Self {
        Self {
            program: PathBuf::from("scontrol"),
            slurm_conf: None,
            timeout_ms: 10_000,
            output_bytes_max: 256 << 20,
        }
    }
}

/// A Slurm release, from `scontrol --version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlurmVersion {
    /// Year part (22 for 22.05).
    pub major: u32,
    /// Month part (5 for 22.05).
    pub minor: u32,
}

impl SlurmVersion {
    /// Parses `slurm 24.05.1`, `slurm-wlm 22.05.8`, `24.11.0-0rc1`.
    pub fn parse(text: &str) -> Option<Self> {
        let word = text
            .split_whitespace()
            .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))?;
        let mut parts = word.split(['.', '-']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Self { major, minor })
    }

    /// Whether `scontrol update nodename=... topology=...` exists (25.05+).
    pub fn has_node_topology(self) -> bool {
        self >= Self {
            major: 25,
            minor: 5,
        }
    }
}

impl std::fmt::Display for SlurmVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:02}", self.major, self.minor)
    }
}

/// Runs scontrol.
#[derive(Debug, Clone)]
pub struct Scontrol {
    config: ScontrolConfig,
}

impl Scontrol {
    /// A runner with this configuration.
    pub fn new(config: ScontrolConfig) -> Self {
        Self { config }
    }

    /// The configuration.
    pub fn config(&self) -> &ScontrolConfig {
        &self.config
    }

    /// Runs `scontrol ARGS`; stdout on success.
    pub async fn run(&self, args: &[&str]) -> Result<String> {
        self.run_env(args, &[]).await
    }

    async fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Result<String> {
        let (what, out) = self.output(args, env).await?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(command_failed(what, &out, &stdout));
        }
        Ok(stdout)
    }

    /// Runs `scontrol ARGS` to its end, whatever its exit status; what it
    /// was (for errors) and its output.
    async fn output(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<(String, std::process::Output)> {
        let what = format!("scontrol {}", args.join(" "));
        let mut cmd = Command::new(&self.config.program);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(conf) = &self.config.slurm_conf {
            cmd.env("SLURM_CONF", conf);
        }
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            program: self.config.program.clone(),
            source,
        })?;
        let out = tokio::time::timeout(
            Duration::from_millis(self.config.timeout_ms),
            child.wait_with_output(),
        )
        .await
        .map_err(|_| Error::Timeout {
            what: what.clone(),
            timeout_ms: self.config.timeout_ms,
        })?
        .map_err(|source| Error::Spawn {
            program: self.config.program.clone(),
            source,
        })?;
        if out.stdout.len() > self.config.output_bytes_max {
            return Err(Error::ScontrolOutput {
                what,
                detail: format!("more than {} bytes of output", self.config.output_bytes_max),
            });
        }
        Ok((what, out))
    }

    /// `scontrol --version`.
    pub async fn version(&self) -> Result<SlurmVersion> {
        let out = self.run(&["--version"]).await?;
        SlurmVersion::parse(&out).ok_or_else(|| Error::ScontrolOutput {
            what: "scontrol --version".to_owned(),
            detail: format!("no version in {:?}", out.trim()),
        })
    }

    /// Every node.
    pub async fn nodes(&self) -> Result<Vec<SlurmNode>> {
        let out = self.run(&["--all", "--oneliner", "show", "node"]).await?;
        parse_nodes(&out)
    }

    /// The nodes named (`scontrol show node A,B,...`), in one run per
    /// [`NAMES_PER_RUN_BYTES`] of names. scontrol prints those alone, where
    /// [`Scontrol::nodes`] prints every field of every node (5 MB at 10,000
    /// nodes, 40-90 ms of scontrol's time, and lockstep's to read it);
    /// slurmctld's part is the same. A name slurmctld does not know is left
    /// out (scontrol says so among the nodes it prints, and exits 1).
    pub async fn nodes_named(&self, names: &[&str]) -> Result<Vec<SlurmNode>> {
        for name in names {
            check_node_name(name)?;
        }
        let mut found = Vec::with_capacity(names.len());
        for list in name_lists(names, NAMES_PER_RUN_BYTES) {
            let (what, out) = self
                .output(&["--all", "--oneliner", "show", "node", &list], &[])
                .await?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if out.status.success() {
                found.extend(parse_nodes(&stdout)?);
                continue;
            }
            // scontrol says so on stdout of each name slurmctld does not
            // know, prints the others and exits 1: those are read, the
            // unknown are left out.
            let unknown = |line: &str| {
                line.trim()
                    .strip_prefix("Node ")
                    .and_then(|l| l.strip_suffix(" not found"))
                    .is_some_and(|n| names.contains(&n))
            };
            let known: String = stdout
                .split_inclusive('\n')
                .filter(|l| !unknown(l))
                .collect();
            if known.len() == stdout.len() || !out.stderr.trim_ascii().is_empty() {
                return Err(command_failed(what, &out, &stdout));
            }
            found.extend(parse_nodes(&known)?);
        }
        Ok(found)
    }

    /// One node; `Ok(None)` if slurmctld does not know it.
    pub async fn node(&self, name: &str) -> Result<Option<SlurmNode>> {
        check_node_name(name)?;
        match self.run(&["--oneliner", "show", "node", name]).await {
            Ok(out) => Ok(parse_nodes(&out)?.into_iter().find(|n| n.name == name)),
            Err(Error::Command { stderr, .. }) if stderr.contains("not found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every job slurmctld still holds.
    pub async fn jobs(&self) -> Result<Vec<SlurmJob>> {
        let out = self.run(&["--all", "--oneliner", "show", "job"]).await?;
        parse_jobs(&out)
    }

    /// Every partition.
    pub async fn partitions(&self) -> Result<Vec<SlurmPartition>> {
        let out = self
            .run(&["--all", "--oneliner", "show", "partition"])
            .await?;
        parse_partitions(&out)
    }

    /// One reservation (`scontrol show reservation NAME`, times in UTC);
    /// `Ok(None)` if slurmctld has none of that name.
    pub async fn reservation(&self, name: &str) -> Result<Option<Reservation>> {
        check_reservation_name(name)?;
        match self
            .run_utc(&["--oneliner", "show", "reservation", name])
            .await
        {
            Ok(out) => out
                .lines()
                .map(parse_reservation)
                .find(|r| r.as_ref().map_or(true, |r| r.name == name))
                .transpose(),
            Err(Error::Command { stderr, .. }) if stderr.contains("not found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `scontrol create|update reservation ReservationName=NAME KEY=VALUE...`
    /// (times in UTC); `scontrol delete reservation NAME`.
    pub async fn write_reservation(
        &self,
        verb: ReservationVerb,
        name: &str,
        settings: &[(&str, String)],
    ) -> Result<()> {
        check_reservation_name(name)?;
        let mut args: Vec<String> = match verb {
            ReservationVerb::Create => vec!["create".into(), "reservation".into()],
            ReservationVerb::Update => vec!["update".into()],
            ReservationVerb::Delete => vec!["delete".into(), "reservation".into()],
        };
        match verb {
            ReservationVerb::Delete => args.push(name.to_owned()),
            _ => args.push(format!("reservationname={name}")),
        }
        args.extend(settings.iter().map(|(k, v)| format!("{k}={v}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run_utc(&args).await.map(drop)
    }

    /// [`Scontrol::run`] with `TZ=UTC`: scontrol reads and prints times in
    /// its local time zone.
    async fn run_utc(&self, args: &[&str]) -> Result<String> {
        self.run_env(args, &[("TZ", "UTC")]).await
    }

    /// `scontrol update nodename=NODE KEY=VALUE...`.
    pub async fn update_node(&self, node: &str, settings: &[(&str, &str)]) -> Result<()> {
        self.update_nodes(&[node], settings).await
    }

    /// `scontrol update nodename=A,B,... KEY=VALUE...`: one run updates
    /// every node named. Slurm answers for the run as a whole: a name it
    /// does not know fails it, and the nodes listed before that name may
    /// be updated already.
    pub async fn update_nodes(&self, nodes: &[&str], settings: &[(&str, &str)]) -> Result<()> {
        for node in nodes {
            check_node_name(node)?;
        }
        let mut args = vec!["update".to_owned(), format!("nodename={}", nodes.join(","))];
        args.extend(settings.iter().map(|(k, v)| format!("{k}={v}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&args).await.map(drop)
    }
}

/// The error of a run that exited non-zero: its stderr (else its stdout),
/// classified retryable or not.
fn command_failed(what: String, out: &std::process::Output, stdout: &str) -> Error {
    let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if stderr.is_empty() {
        stderr = stdout.trim().to_owned();
    }
    let retryable = classify_message(&stderr);
    Error::Command {
        what,
        status: out.status.to_string(),
        stderr,
        retryable,
    }
}

/// The most bytes of node names one [`Scontrol::nodes_named`] run takes:
/// well below Linux's bound on one argument (128 KiB).
pub const NAMES_PER_RUN_BYTES: usize = 32 * 1024;

/// `names` as comma-separated lists, in order, each at most `max_bytes`
/// long unless a single name is longer.
fn name_lists<'a>(names: &'a [&'a str], max_bytes: usize) -> impl Iterator<Item = String> + 'a {
    let mut rest = names;
    std::iter::from_fn(move || {
        let (first, more) = rest.split_first()?;
        let mut list = (*first).to_owned();
        let mut taken = 1;
        for name in more {
            if list.len() + 1 + name.len() > max_bytes {
                break;
            }
            list.push(',');
            list.push_str(name);
            taken += 1;
        }
        rest = &rest[taken..];
        Some(list)
    })
}

/// What [`Scontrol::write_reservation`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationVerb {
    /// `scontrol create reservation`.
    Create,
    /// `scontrol update reservationname=...`.
    Update,
    /// `scontrol delete reservation`.
    Delete,
}

/// A reservation as scontrol shows it (what lockstep compares).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// `ReservationName`.
    pub name: String,
    /// `Nodes`, expanded and sorted.
    pub nodes: Vec<String>,
    /// `StartTime`, as printed (UTC under [`ReservationVerb`]'s runs).
    pub start: String,
    /// `EndTime`, as printed.
    pub end: String,
    /// `Duration`, as printed (`365-00:00:00` for `Duration=UNLIMITED`:
    /// Slurm keeps an open reservation for a year).
    pub duration: String,
    /// `Flags`, split.
    pub flags: Vec<String>,
}

/// One line of `scontrol -o show reservation`.
pub fn parse_reservation(line: &str) -> Result<Reservation> {
    let f: Vec<_> = fields(line).collect();
    let get = |k: &str| f.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
    let name = get("ReservationName").ok_or_else(|| Error::ScontrolOutput {
        what: "scontrol show reservation".to_owned(),
        detail: format!("no ReservationName in {line:?}"),
    })?;
    // `expand` reads an empty list and Slurm's `(null)` as no nodes.
    let mut nodes = hostlist::expand(get("Nodes").unwrap_or_default())?;
    nodes.sort();
    Ok(Reservation {
        name: name.to_owned(),
        nodes,
        start: get("StartTime").unwrap_or_default().to_owned(),
        end: get("EndTime").unwrap_or_default().to_owned(),
        duration: get("Duration").unwrap_or_default().to_owned(),
        flags: get("Flags")
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    })
}

impl Reservation {
    /// Made with `Duration=UNLIMITED` (shown as a year).
    pub fn open_ended(&self) -> bool {
        self.duration == "UNLIMITED" || self.duration == "365-00:00:00"
    }
}

/// Rejects reservation names that scontrol would read as something else.
pub(crate) fn check_reservation_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidValue {
            what: "slurm reservation name",
            value: name.to_owned(),
        })
    }
}

/// Rejects node names that scontrol would read as something else.
pub(crate) fn check_node_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 256
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '=' | ',' | '[' | ']'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidValue {
            what: "slurm node name",
            value: name.to_owned(),
        })
    }
}

/// The `Key=Value` fields of one `scontrol -o` line, in order. A value runs
/// up to the next ` Key=`; words without `=` belong to the value before them
/// (`OS=Linux 6.1.0 #1 SMP`). Scanned as bytes, with nothing allocated: a
/// listing of 10,000 nodes is some 400,000 fields.
fn fields(line: &str) -> Fields<'_> {
    Fields {
        line,
        next: key_from(line.as_bytes(), 0),
    }
}

/// The fields of a line ([`fields`]); `next` is where the next key starts
/// and its `=`.
struct Fields<'a> {
    line: &'a str,
    next: Option<(usize, usize)>,
}

impl<'a> Iterator for Fields<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let (key, eq) = self.next?;
        self.next = key_from(self.line.as_bytes(), eq + 1);
        let end = self.next.map_or(self.line.len(), |(next, _)| next);
        Some((&self.line[key..eq], self.line[eq + 1..end].trim_end()))
    }
}

/// The first key at or after byte `from`: a word (at the start or after a
/// space) that begins with a letter and runs over letters, digits, `_`, `/`
/// and `:` up to `=`. Its start and its `=`; every index on an ASCII byte.
fn key_from(bytes: &[u8], from: usize) -> Option<(usize, usize)> {
    let key_byte = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'/' | b':');
    let mut i = from;
    while i < bytes.len() {
        let word = i == 0 || bytes[i - 1] == b' ';
        if !(word && bytes[i].is_ascii_alphabetic()) {
            i += 1;
            continue;
        }
        let end = i + bytes[i..].iter().take_while(|b| key_byte(b)).count();
        if bytes.get(end) == Some(&b'=') {
            return Some((i, end));
        }
        // No word starts inside a run of key bytes.
        i = end;
    }
    None
}

fn lines(out: &str) -> impl Iterator<Item = &str> {
    out.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("No ") && l.contains('='))
}

/// Splits `reason [user@time] Key=Value...` into the reason (with its
/// `[user@time]`) and the fields after it, if any.
fn split_reason_tail(rest: &str) -> (&str, &str) {
    let mut from = 0;
    while let Some(i) = rest[from..].find("] ") {
        let end = from + i + 1;
        let after = &rest[end + 1..];
        let bracket = rest[..end].rfind(" [").map_or("", |open| &rest[open..end]);
        let key_follows = after.find('=').is_some_and(|eq| {
            eq > 0
                && after[..eq]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
        if bracket.contains('@') && key_follows {
            return (&rest[..end], after);
        }
        from = end;
    }
    (rest, "")
}

/// Splits a node reason `text [user@2024-01-01T00:00:00]` into text and user.
fn split_reason(reason: &str) -> (Option<String>, Option<String>) {
    let reason = reason.trim();
    let (text, user) = match reason.rfind(" [") {
        Some(open) if reason.ends_with(']') && reason[open..].contains('@') => {
            let inner = &reason[open + 2..reason.len() - 1];
            let user = inner.split('@').next().unwrap_or("").trim();
            (&reason[..open], (!user.is_empty()).then(|| user.to_owned()))
        }
        _ => (reason, None),
    };
    let text = text.trim();
    if text.is_empty() || text == "(null)" || text == "None" {
        (None, None)
    } else {
        (Some(text.to_owned()), user)
    }
}

/// Parses `scontrol --oneliner show node`.
pub fn parse_nodes(out: &str) -> Result<Vec<SlurmNode>> {
    let mut nodes = Vec::new();
    for line in lines(out) {
        // `Reason=` is free text (it may hold ` x=y`): cut it out before
        // splitting. It ends the line on 22.05; should fields follow it, its
        // `[user@time]` suffix marks its end.
        let (head, reason, tail) = match line.find(" Reason=") {
            Some(at) => {
                let rest = &line[at + " Reason=".len()..];
                let (reason, tail) = split_reason_tail(rest);
                (&line[..at], Some(reason), tail)
            }
            None => (line, None, ""),
        };
        let mut name = None;
        let mut state = None;
        let mut features = None;
        let mut available = None;
        let mut partitions = Vec::new();
        let mut topology = None;
        for (k, v) in fields(head).chain(fields(tail)) {
            match k {
                "NodeName" => name = Some(v),
                "State" => state = Some(v),
                "ActiveFeatures" => features = Some(parse::csv_sorted(v)),
                "AvailableFeatures" | "Features" => available = Some(v),
                "Partitions" => partitions = parse::csv_sorted(v),
                "Topology" => topology = Some(v).filter(|t| !t.is_empty() && *t != "(null)"),
                _ => {}
            }
        }
        let err = |detail: String| Error::ScontrolOutput {
            what: "scontrol show node".to_owned(),
            detail,
        };
        let name = name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| err(format!("line without NodeName: {:.120}", line)))?;
        let state = state.ok_or_else(|| err(format!("node {name} without State")))?;
        let (state, flags) = parse::node_state(state.split('+'))
            .ok_or_else(|| err(format!("node {name} has an empty State")))?;
        let (reason, reason_user) = reason.map(split_reason).unwrap_or_default();
        nodes.push(SlurmNode {
            name: name.into(),
            state,
            flags,
            reason,
            reason_user,
            features: features
                .or_else(|| available.map(parse::csv_sorted))
                .unwrap_or_default(),
            topology: topology.map(Text::from),
            partitions,
            version: 0,
        });
    }
    Ok(nodes)
}

/// Parses `scontrol --oneliner show job`.
pub fn parse_jobs(out: &str) -> Result<Vec<SlurmJob>> {
    let mut jobs = Vec::new();
    let mut budget = hostlist::Budget::default();
    for line in lines(out) {
        let mut job_id = None;
        let mut state = None;
        let mut partition = "";
        let mut nodes = "";
        let mut node_count = 0;
        let mut reason = None;
        for (k, v) in fields(line) {
            match k {
                "JobId" => job_id = v.parse::<u64>().ok(),
                "JobState" => state = Some(v),
                "Partition" => partition = v,
                "NodeList" => nodes = v,
                // `NumNodes=3-3` (min-max) or `NumNodes=1`.
                "NumNodes" => {
                    node_count = v
                        .split('-')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                }
                "Reason" => reason = Some(v.to_owned()),
                _ => {}
            }
        }
        let err = |detail: String| Error::ScontrolOutput {
            what: "scontrol show job".to_owned(),
            detail,
        };
        let job_id = job_id.ok_or_else(|| err(format!("line without JobId: {:.120}", line)))?;
        let state = state
            .and_then(|s| parse::job_state([s]))
            .ok_or_else(|| err(format!("job {job_id} without JobState")))?;
        let nodes = hostlist::expand_set_within(nodes, &mut budget)?
            .into_iter()
            .map(Text::from)
            .collect();
        jobs.push(SlurmJob {
            job_id,
            partition: parse::first_partition(partition),
            nodes,
            node_count,
            pending_reason: parse::pending_reason(&state, reason),
            state,
            version: 0,
        });
    }
    Ok(jobs)
}

/// Parses `scontrol --oneliner show partition`.
pub fn parse_partitions(out: &str) -> Result<Vec<SlurmPartition>> {
    let mut parts = Vec::new();
    let mut budget = hostlist::Budget::default();
    for line in lines(out) {
        let mut name = None;
        let mut nodes = "";
        for (k, v) in fields(line) {
            match k {
                "PartitionName" => name = Some(v),
                "Nodes" => nodes = v,
                _ => {}
            }
        }
        let name = name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::ScontrolOutput {
                what: "scontrol show partition".to_owned(),
                detail: format!("line without PartitionName: {:.120}", line),
            })?;
        let nodes = hostlist::expand_set_within(nodes, &mut budget)?;
        parts.push(SlurmPartition {
            name: name.to_owned(),
            nodes,
            version: 0,
        });
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_keep_values_with_spaces() {
        let f: Vec<_> = fields(
            "NodeName=a OS=Linux 6.1 #1 SMP  RealMemory=1 CfgTRES=cpu=2,mem=1G ReqB:S:C:T=0:0:*:*",
        )
        .collect();
        assert_eq!(
            f,
            vec![
                ("NodeName", "a"),
                ("OS", "Linux 6.1 #1 SMP"),
                ("RealMemory", "1"),
                ("CfgTRES", "cpu=2,mem=1G"),
                ("ReqB:S:C:T", "0:0:*:*"),
            ]
        );
    }

    /// The fields as a plain reading of the rule finds them: every word
    /// start tried as a key, then each value up to the next key.
    fn fields_by_the_rule(line: &str) -> Vec<(&str, &str)> {
        let b = line.as_bytes();
        let starts: Vec<(usize, usize)> = (0..b.len())
            .filter(|&i| (i == 0 || b[i - 1] == b' ') && b[i].is_ascii_alphabetic())
            .filter_map(|i| {
                let end = line[i..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | ':')))
                    .map(|e| i + e)?;
                (b[end] == b'=').then_some((i, end))
            })
            .collect();
        starts
            .iter()
            .enumerate()
            .map(|(n, &(k, eq))| {
                let end = starts.get(n + 1).map_or(line.len(), |&(next, _)| next);
                (&line[k..eq], line[eq + 1..end].trim_end())
            })
            .collect()
    }

    #[test]
    fn fields_are_those_the_rule_finds() {
        // Lines of words over an alphabet that makes keys, values with
        // spaces, `=` inside values, empty values and multibyte text.
        let alphabet = [
            "a", "Z", "9", "_", "/", ":", "=", " ", "  ", "#", "é", "-", "(null)",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let len = next() % 24;
            let line: String = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            assert_eq!(
                fields(&line).collect::<Vec<_>>(),
                fields_by_the_rule(&line),
                "{line:?}"
            );
        }
    }

    #[test]
    fn reasons_split_off_their_user() {
        let cases: &[(&str, Option<&str>, Option<&str>)] = &[
            (
                "disk check [root@2026-11-30T01:29:22]",
                Some("disk check"),
                Some("root"),
            ),
            (
                "Not responding [slurm@2024-01-01T00:00:00]",
                Some("Not responding"),
                Some("slurm"),
            ),
            (
                "lockstep: x [y] [admin@2024-01-01T00:00:00]",
                Some("lockstep: x [y]"),
                Some("admin"),
            ),
            ("no user here", Some("no user here"), None),
            ("", None, None),
        ];
        for (text, reason, user) in cases {
            let (r, u) = split_reason(text);
            assert_eq!((r.as_deref(), u.as_deref()), (*reason, *user), "{text}");
        }
    }

    #[test]
    fn fields_after_the_reason_are_read() {
        let line = "NodeName=a State=IDLE+DRAIN Partitions=p Reason=x=1 y [root@2024-01-01T00:00:00] Comment=c Topology=default:s1";
        let n = &parse_nodes(line).unwrap()[0];
        assert_eq!(n.reason.as_deref(), Some("x=1 y"));
        assert_eq!(n.reason_user.as_deref(), Some("root"));
        assert_eq!(n.topology.as_deref(), Some("default:s1"));
        assert_eq!(n.partitions, ["p"]);
    }

    #[test]
    fn node_names_are_listed_within_the_bound() {
        let lists = |names: &[&str], max| name_lists(names, max).collect::<Vec<_>>();
        assert!(lists(&[], 10).is_empty());
        assert_eq!(lists(&["a1", "a2", "a3"], 5), ["a1,a2", "a3"]);
        assert_eq!(lists(&["a1", "a2", "a3"], 8), ["a1,a2,a3"]);
        // A name longer than the bound still gets a run of its own.
        assert_eq!(
            lists(&["a1", "long-name", "a3"], 5),
            ["a1", "long-name", "a3"]
        );
        let many: Vec<String> = (0..10_000).map(|i| format!("gpu-node-{i:05}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let runs = lists(&many, NAMES_PER_RUN_BYTES);
        assert!(runs.len() > 1 && runs.iter().all(|l| l.len() <= NAMES_PER_RUN_BYTES));
        assert_eq!(runs.join(","), many.join(","));
    }

    #[test]
    fn versions_parse() {
        let v = SlurmVersion::parse("slurm-wlm 22.05.8\n").unwrap();
        assert_eq!((v.major, v.minor), (22, 5));
        assert!(!v.has_node_topology());
        assert!(SlurmVersion::parse("slurm 25.05.0")
            .unwrap()
            .has_node_topology());
        assert_eq!(
            SlurmVersion::parse("slurm 24.11.0-0rc1")
                .unwrap()
                .to_string(),
            "24.11"
        );
        assert!(SlurmVersion::parse("no version").is_none());
    }

    #[test]
    fn node_names_are_checked() {
        assert!(check_node_name("ls-n1").is_ok());
        for bad in ["", "a b", "a=b", "n[1-2]", "a,b", "a\nb"] {
            assert!(check_node_name(bad).is_err(), "{bad:?}");
        }
    }

    /// Inputs the `scontrol` fuzz target found taking over a second each:
    /// a partition's `Nodes=` value with several bracket groups and a long
    /// tail, which expanded to 800,000 names of several hundred bytes.
    fn fuzz_regression(name: &str) -> String {
        let path = format!(
            "{}/../fuzz/regressions/scontrol/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned()
    }

    #[test]
    fn whitespace_in_a_node_list_separates_names() {
        let parts = parse_partitions(&fuzz_regression("hostlist-tail-after-tab")).unwrap();
        assert_eq!(parts.len(), 1);
        let nodes = &parts[0].nodes;
        // `ls-n[1-44]`, a tab, `UlkhqLIMs-n[1-444444]`, and 13 single words.
        assert_eq!(nodes.len(), 44 + 444_444 + 13);
        for name in ["ls-n44", "UlkhqLIMs-n444444", "PrikzRmcEffquj?0"] {
            assert!(
                nodes.binary_search_by(|n| n.as_str().cmp(name)).is_ok(),
                "{name}"
            );
        }
        assert!(nodes.iter().all(|n| !n.contains(char::is_whitespace)));

        let parts = parse_partitions(&fuzz_regression("hostlist-three-groups-long-tail")).unwrap();
        let nodes = &parts[0].nodes;
        assert_eq!(nodes.len(), 4 * 4444 + 45 + 13);
        assert!(nodes.iter().any(|n| n == "ls-`4ln4444"));
        assert!(nodes.iter().all(|n| n.len() < 64), "no name takes the tail");

        // 874 x 4 x 4 x 45 names of 53 bytes (and 5 words), out of order:
        // sorting them took over a second. Over the bound, refused unread.
        let e = parse_partitions(&fuzz_regression("hostlist-six-groups-out-of-order"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("629285 names, over the 500000 left"), "{e}");
    }

    #[test]
    fn the_node_lists_of_one_answer_share_one_bound() {
        let out: String = (0..5)
            .map(|i| format!("PartitionName=p{i} Nodes=n[0-199999]\n"))
            .collect();
        let e = parse_partitions(&out).unwrap_err().to_string();
        assert!(e.contains("for one answer"), "{e}");
        let out: String = (0..5)
            .map(|i| format!("JobId={i} JobState=RUNNING NodeList=n[0-199999]\n"))
            .collect();
        let e = parse_jobs(&out).unwrap_err().to_string();
        assert!(e.contains("for one answer"), "{e}");
        // Two such lines are within it.
        let two = "PartitionName=a Nodes=n[0-199999]\nPartitionName=b Nodes=m[0-199999]\n";
        let parts = parse_partitions(two).unwrap();
        assert_eq!(parts[1].nodes.len(), 200_000);
    }
}
