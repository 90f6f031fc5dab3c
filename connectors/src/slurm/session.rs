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
//! A listing is the command `show node`, then `version`, whose answer
//! (learnt when the session starts) marks the end of the listing's output.
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

/// Node listings through one scontrol process, restarted when needed.
#[derive(Debug)]
pub struct NodeSession {
    scontrol: Scontrol,
    running: Option<Running>,
    /// The last listing's output, to tell an unchanged one.
    last: Vec<u8>,
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
}

impl NodeSession {
    /// A session that starts scontrol (as `scontrol` runs it) at its first
    /// listing.
    pub fn new(scontrol: Scontrol) -> Self {
        Self {
            scontrol,
            running: None,
            last: Vec::new(),
        }
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
            let listed = tokio::time::timeout(Duration::from_millis(timeout_ms), self.list()).await;
            match listed {
                Ok(Ok(text)) => break text,
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
        let nodes = parse_nodes(&String::from_utf8_lossy(&text))?;
        self.last = text;
        Ok(Fetch::Changed(nodes))
    }

    /// The process serving listings, while there is one.
    pub fn pid(&self) -> Option<u32> {
        self.running.as_ref().and_then(|r| r.child.id())
    }

    /// One listing's node lines, as printed, started if need be.
    async fn list(&mut self) -> std::result::Result<Vec<u8>, Failure> {
        if self.running.is_none() {
            self.running = Some(self.start().await.map_err(Failure::Other)?);
        }
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
                || l.starts_with(b"No "))
            {
                // "No nodes in the system" is an empty listing; anything
                // else is scontrol's complaint.
                errors.push(String::from_utf8_lossy(l).into_owned());
            }
        }
        if errors.is_empty() {
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
        };
        let what = format!("scontrol {VERSION} (a session)");
        running.send(&format!("{VERSION}\n"), &what).await?;
        let mut line = Vec::new();
        loop {
            let l = String::from_utf8_lossy(running.line(&mut line, &what).await?).into_owned();
            if l.is_empty() || l == VERSION {
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
}
