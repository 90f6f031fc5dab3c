//! The observer's node listings through one long-lived scontrol.
//!
//! `scontrol` started without a command reads its commands from stdin, and
//! within one process it keeps the last node listing: the next `show node`
//! asks slurmctld only for a listing newer than that one's time
//! (`slurm_load_node` with `update_time`). When no node changed since,
//! slurmctld answers "no change in data" without packing a listing and
//! scontrol prints the one it holds. So a poll through a session costs
//! slurmctld almost nothing while the nodes stand still, and costs no
//! process start (scontrol reads slurm.conf when it starts), where a new
//! `scontrol show node` every poll costs a full listing each time (about
//! 9 ms of slurmctld at 10,000 nodes). slurmctld counts a change made in
//! the second before the time asked for as new (it compares whole seconds,
//! less one), so no change is missed; a change is listed again by the
//! polls of the second after it.
//!
//! Printing a listing of 10,000 nodes costs scontrol itself 40-90 ms, even
//! one it holds. So a poll that only asks what changed first probes:
//! `show node NAME` for one node of the last listing. scontrol runs in
//! verbose mode (`verbose`), where it says `slurm_load_node no change in
//! data` (and `slurm_load_part ...` for the partitions it also reads) when
//! slurmctld answered so; then nothing changed since the last listing, and
//! scontrol prints one node instead of all of them (about 3 ms). Otherwise
//! the probe's load fetched the new listing, and a `show node` prints it
//! (its own load, a moment later, mostly finds nothing newer). Within
//! [`QUIET_BEFORE_PROBE`] of a listing that changed, polls list at once:
//! slurmctld would answer a probe with a new listing anyway, and then the
//! listing's load with another. Slurm 22.05, 24.11 and 26.05 answer alike.
//!
//! Each command is followed by `version`, whose answer (learnt when the
//! session starts) marks the end of the command's output.
//! scontrol's stdout and stderr are one pipe, so an error message arrives
//! inside the listing it belongs to. The prompt and the echo of each
//! command (scontrol prints them when built with readline) are dropped.
//! An error, a timeout, an end of output or a line lockstep does not
//! understand ends the session (the process is killed); the next listing
//! starts a new one. A session also ends after [`SESSION_AGE_MAX`], so that
//! a changed slurm.conf (the controller's address) is read again.

use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lockstep_schemas::SlurmNode;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::process::{Child, ChildStdin, Command};

use super::error::{classify_message, Error, Result};
use super::rest::Fetch;
use super::scontrol::{parse_nodes, Scontrol, SlurmVersion};

/// How long one scontrol process serves listings before a new one is
/// started.
const SESSION_AGE_MAX: Duration = Duration::from_secs(600);

/// What scontrol prints before each command it reads.
const PROMPT: &str = "scontrol: ";
/// The listing's command.
const SHOW: &str = "show node";
/// The command whose answer ends a listing.
const VERSION: &str = "version";
/// How long after a listing that changed polls list in full before they
/// probe again: slurmctld answers a load with a new listing unless its
/// last change is a whole second older than the listing held, so a probe
/// sooner mostly finds "changed" and costs slurmctld a second listing.
const QUIET_BEFORE_PROBE: Duration = Duration::from_secs(2);
/// The command that has scontrol say when slurmctld had nothing new.
const VERBOSE: &str = "verbose";
/// What verbose scontrol prints when slurmctld had no newer node listing.
const NODES_UNCHANGED: &[u8] = b"slurm_load_node no change in data";
/// ... and no newer partitions (the listing prints each node's partitions).
const PARTITIONS_UNCHANGED: &[u8] = b"slurm_load_part no change in data";

/// Lines verbose scontrol prints beside a listing, none of them an error.
fn verbose_note(line: &[u8]) -> bool {
    line == NODES_UNCHANGED
        || line == PARTITIONS_UNCHANGED
        || line.starts_with(b"last_update_time=")
        || line.starts_with(b"slurm_api_version:")
}

/// Node listings through one scontrol process, restarted when needed.
#[derive(Debug)]
pub struct NodeSession {
    scontrol: Scontrol,
    running: Option<Running>,
    /// The last listing's output, to tell an unchanged one.
    last: Vec<u8>,
    /// When a listing last differed from the one before.
    changed_at: Option<Instant>,
    /// How polls were answered.
    counts: SessionCounts,
}

/// How a session answered its polls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounts {
    /// Full listings printed.
    pub listings: u64,
    /// Probes that found nothing new: no listing printed.
    pub probes_unchanged: u64,
    /// Probes that found a newer listing, which was printed next.
    pub probes_changed: u64,
}

/// Why a listing failed.
enum Failure {
    /// The process is gone (no more output, or its stdin closed).
    Ended(Error),
    /// Anything else.
    Other(Error),
}

#[derive(Debug)]
struct Running {
    /// Killed when dropped.
    child: Child,
    stdin: ChildStdin,
    /// stdout and stderr.
    out: BufReader<pipe::Receiver>,
    /// The line `version` prints.
    end: String,
    started: Instant,
    /// A node of the last listing this process printed: the one to probe
    /// with. None until it printed one.
    probe: Option<String>,
}

impl NodeSession {
    /// A session that starts scontrol (as `scontrol` runs it) at its first
    /// listing.
    pub fn new(scontrol: Scontrol) -> Self {
        Self {
            scontrol,
            running: None,
            last: Vec::new(),
            changed_at: None,
            counts: SessionCounts::default(),
        }
    }

    /// How the polls so far were answered.
    pub fn counts(&self) -> SessionCounts {
        self.counts
    }

    /// Every node. With `changes_only`, [`Fetch::Unchanged`] when the
    /// listing is the same as the last one, byte for byte.
    pub async fn nodes(&mut self, changes_only: bool) -> Result<Fetch<Vec<SlurmNode>>> {
        if self
            .running
            .as_ref()
            .is_some_and(|r| r.started.elapsed() >= SESSION_AGE_MAX)
        {
            self.running = None;
        }
        let timeout_ms = self.scontrol.config().timeout_ms;
        let text = loop {
            // A process that ended since the last listing (killed, or
            // scontrol gave up) is replaced at once, once.
            let was_running = self.running.is_some();
            let listed =
                tokio::time::timeout(Duration::from_millis(timeout_ms), self.poll(changes_only))
                    .await;
            match listed {
                Ok(Ok(Some(text))) => break text,
                Ok(Ok(None)) => return Ok(Fetch::Unchanged),
                Ok(Err(Failure::Ended(_))) if was_running => self.running = None,
                Ok(Err(Failure::Ended(e) | Failure::Other(e))) => {
                    self.running = None;
                    return Err(e);
                }
                Err(_) => {
                    self.running = None;
                    return Err(Error::Timeout {
                        what: format!("scontrol {SHOW} (a session)"),
                        timeout_ms,
                    });
                }
            }
        };
        if changes_only && text == self.last {
            return Ok(Fetch::Unchanged);
        }
        // As a new scontrol's output is read: a reason in another encoding
        // is no reason to fail.
        let nodes = match parse_nodes(&String::from_utf8_lossy(&text)) {
            Ok(nodes) => nodes,
            Err(e) => {
                // The process holds a listing lockstep could not read: a
                // probe would call it unchanged from then on. A new
                // process lists it again, and fails again, until it reads.
                self.running = None;
                return Err(e);
            }
        };
        self.last = text;
        self.changed_at = Some(Instant::now());
        Ok(Fetch::Changed(nodes))
    }

    /// The process serving listings, while there is one.
    pub fn pid(&self) -> Option<u32> {
        self.running.as_ref().and_then(|r| r.child.id())
    }

    /// One listing's node lines, as printed, started if need be; with
    /// `changes_only`, None when a probe found nothing newer than the last.
    async fn poll(&mut self, changes_only: bool) -> std::result::Result<Option<Vec<u8>>, Failure> {
        if self.running.is_none() {
            self.running = Some(self.start().await.map_err(Failure::Other)?);
        }
        let r = self.running.as_mut().expect("started above");
        // The process holds the last listing only once it printed one.
        // Shortly after a change slurmctld answers every load with a new
        // listing (it compares whole seconds), so a probe would only make
        // it pack the listing twice: the listing is asked for at once.
        let quiet = self
            .changed_at
            .is_none_or(|at| at.elapsed() >= QUIET_BEFORE_PROBE);
        if changes_only && quiet && !self.last.is_empty() {
            if let Some(name) = r.probe.clone() {
                if r.probe_unchanged(&name).await? {
                    self.counts.probes_unchanged += 1;
                    return Ok(None);
                }
                self.counts.probes_changed += 1;
            }
        }
        let text = self.list().await?;
        self.counts.listings += 1;
        Ok(Some(text))
    }

    /// One listing's node lines, as printed.
    async fn list(&mut self) -> std::result::Result<Vec<u8>, Failure> {
        let config = self.scontrol.config();
        let bytes_max = config.output_bytes_max;
        let r = self.running.as_mut().expect("started above");
        let what = format!("scontrol {SHOW} (a session)");
        r.send(&format!("{SHOW}\n{VERSION}\n"), &what)
            .await
            .map_err(Failure::Ended)?;
        // Bytes until the listing has changed: an unchanged one is compared,
        // never decoded.
        let mut text = Vec::with_capacity(self.last.len());
        let mut errors = Vec::new();
        let mut line = Vec::new();
        loop {
            let l = r.line(&mut line, &what).await.map_err(Failure::Ended)?;
            if l == r.end.as_bytes() {
                break;
            }
            if l.starts_with(b"NodeName=") {
                if text.len() + l.len() >= bytes_max {
                    return Err(Failure::Other(Error::ScontrolOutput {
                        what,
                        detail: format!("more than {bytes_max} bytes of output"),
                    }));
                }
                text.extend_from_slice(l);
                text.push(b'\n');
            } else if !(l.is_empty()
                || l == SHOW.as_bytes()
                || l == VERSION.as_bytes()
                || l.starts_with(b"No ")
                || verbose_note(l))
            {
                // "No nodes in the system" is an empty listing; anything
                // else is scontrol's complaint.
                errors.push(String::from_utf8_lossy(l).into_owned());
            }
        }
        if errors.is_empty() {
            r.probe = text
                .strip_prefix(b"NodeName=")
                .and_then(|rest| rest.split(|&b| b == b' ' || b == b'\n').next())
                .map(|name| String::from_utf8_lossy(name).into_owned());
            Ok(text)
        } else {
            let stderr = errors.join("; ");
            let retryable = classify_message(&stderr);
            Err(Failure::Other(Error::Command {
                what,
                status: "still running".to_owned(),
                stderr,
                retryable,
            }))
        }
    }

    /// Starts scontrol and learns what its `version` prints.
    async fn start(&self) -> Result<Running> {
        let config = self.scontrol.config();
        let spawn_error = |source| Error::Spawn {
            program: config.program.clone(),
            source,
        };
        let (reader, writer) = std::io::pipe().map_err(spawn_error)?;
        let writer_too = writer.try_clone().map_err(spawn_error)?;
        let mut cmd = Command::new(&config.program);
        cmd.args(["--all", "--oneliner"])
            .stdin(Stdio::piped())
            .stdout(writer)
            .stderr(writer_too)
            // Nothing but text: no terminal for readline to drive.
            .env("TERM", "dumb")
            .kill_on_drop(true);
        if let Some(conf) = &config.slurm_conf {
            cmd.env("SLURM_CONF", conf);
        }
        let mut child = cmd.spawn().map_err(spawn_error)?;
        // The command holds the pipe's write ends: without it, the end of
        // scontrol is the end of the output.
        drop(cmd);
        let stdin = child.stdin.take().expect("stdin is piped");
        let out = pipe::Receiver::from_owned_fd(OwnedFd::from(reader)).map_err(spawn_error)?;
        let mut running = Running {
            child,
            stdin,
            // A listing of 10,000 nodes is about 6 MB: read in large parts.
            out: BufReader::with_capacity(256 << 10, out),
            end: String::new(),
            started: Instant::now(),
            probe: None,
        };
        let what = format!("scontrol {VERSION} (a session)");
        running
            .send(&format!("{VERBOSE}\n{VERSION}\n"), &what)
            .await?;
        let mut line = Vec::new();
        loop {
            let l = String::from_utf8_lossy(running.line(&mut line, &what).await?).into_owned();
            if l.is_empty() || l == VERBOSE || l == VERSION {
                continue;
            }
            if SlurmVersion::parse(&l).is_none() {
                return Err(Error::ScontrolOutput {
                    what,
                    detail: format!("no version in {l:?}"),
                });
            }
            running.end = l;
            return Ok(running);
        }
    }
}

impl Running {
    /// Whether slurmctld has neither newer nodes nor newer partitions than
    /// the listing this process printed last (`show node NAME`, verbose).
    /// Whatever else the probe prints (the node, or that it is gone) is
    /// left to the full listing that follows a change.
    async fn probe_unchanged(&mut self, name: &str) -> std::result::Result<bool, Failure> {
        let what = format!("scontrol {SHOW} {name} (a session)");
        self.send(&format!("{SHOW} {name}\n{VERSION}\n"), &what)
            .await
            .map_err(Failure::Ended)?;
        let (mut nodes, mut partitions) = (false, false);
        let mut line = Vec::new();
        loop {
            let l = self.line(&mut line, &what).await.map_err(Failure::Ended)?;
            if l == self.end.as_bytes() {
                return Ok(nodes && partitions);
            }
            nodes |= l == NODES_UNCHANGED;
            partitions |= l == PARTITIONS_UNCHANGED;
        }
    }

    /// Writes `commands` (lines) to scontrol. An error: the process is gone.
    async fn send(&mut self, commands: &str, what: &str) -> Result<()> {
        self.stdin
            .write_all(commands.as_bytes())
            .await
            .map_err(|e| ended(what, &e.to_string()))
    }

    /// The next line of output, without its prompts and its end. An error:
    /// the process is gone (or its output could not be read).
    async fn line<'b>(&mut self, buf: &'b mut Vec<u8>, what: &str) -> Result<&'b [u8]> {
        buf.clear();
        let n = self
            .out
            .read_until(b'\n', buf)
            .await
            .map_err(|e| ended(what, &e.to_string()))?;
        if n == 0 {
            return Err(ended(what, "scontrol exited"));
        }
        Ok(unprompted(buf))
    }
}

/// A line without the prompts printed before it, nor its end.
fn unprompted(mut line: &[u8]) -> &[u8] {
    while let Some(rest) = line.strip_prefix(PROMPT.as_bytes()) {
        line = rest;
    }
    line.trim_ascii_end()
}

/// The process is gone: retryable, with a new one.
fn ended(what: &str, detail: &str) -> Error {
    Error::Command {
        what: what.to_owned(),
        status: "ended".to_owned(),
        stderr: detail.to_owned(),
        retryable: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_and_echoes_are_dropped() {
        assert_eq!(unprompted(b"scontrol: show node\n"), SHOW.as_bytes());
        assert_eq!(unprompted(b"scontrol: scontrol: NodeName=a"), b"NodeName=a");
        assert_eq!(
            unprompted(b"NodeName=a State=IDLE \r\n"),
            b"NodeName=a State=IDLE"
        );
        assert_eq!(unprompted(b"slurm-wlm 26.05.5\n"), b"slurm-wlm 26.05.5");
    }

    #[test]
    fn verbose_notes_are_not_errors_but_errors_stay_errors() {
        for note in [
            &b"slurm_load_node no change in data"[..],
            b"slurm_load_part no change in data",
            b"last_update_time=2026-12-06T21:35:31, records=10000",
            b"slurm_api_version: 2949120, 45.0.0",
        ] {
            assert!(verbose_note(note), "{}", String::from_utf8_lossy(note));
        }
        for error in [
            &b"slurm_load_node error: Unable to contact slurm controller (connect failure)"[..],
            b"slurm_load_partitions error: Zero Bytes were transmitted or received",
            b"Node ls-n9 not found",
        ] {
            assert!(!verbose_note(error), "{}", String::from_utf8_lossy(error));
        }
    }
}
