//! Writing a file that the command creates (`export`, `convert`) so that
//! nothing is lost: the content goes to a temporary file in the target's
//! directory, which is renamed over the target only once it is complete and
//! on disk. Until then the target (which may be the very file being read,
//! as in `lockstep convert x.jsonl x.jsonl`) is untouched; a failure leaves
//! it as it was and removes the temporary file.
//!
//! This module never writes anywhere but that directory, and refuses targets
//! a rename would destroy rather than replace (a directory, a device, a
//! FIFO): those are named in the error.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Why an output file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The target exists and is not a regular file.
    #[error("refusing to write {path}: it is {what}, not a regular file (the output is written to a temporary file that replaces the target)")]
    NotARegularFile {
        /// The target.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// The target's path cannot be resolved (a dangling symlink, a missing
    /// directory, no permission).
    #[error("cannot write {path}")]
    Resolve {
        /// The target.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The temporary file cannot be created next to the target.
    #[error("cannot create a temporary file in {dir} to write {path} safely")]
    CreateTemp {
        /// The target's directory.
        dir: PathBuf,
        /// The target.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Writing, flushing or renaming failed; the target is untouched.
    #[error("writing {path} failed; it was left as it was")]
    Write {
        /// The target.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Temporary names tried before giving up (another run may hold one).
const TEMP_NAMES_MAX: u32 = 100;

/// A file being written; see the module docs.
pub struct OutFile {
    /// Where the content goes when committed (symlinks resolved).
    target: PathBuf,
    /// The name the user gave, for messages.
    shown: PathBuf,
    temp: PathBuf,
    out: Option<BufWriter<File>>,
}

impl OutFile {
    /// Starts writing `path`.
    pub fn create(path: &Path) -> Result<Self, Error> {
        let shown = path.to_owned();
        let (target, existing) = match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                // A symlink keeps pointing where it points: replace the
                // file it names.
                let target = if meta.file_type().is_symlink() {
                    std::fs::canonicalize(path).map_err(|source| Error::Resolve {
                        path: shown.clone(),
                        source,
                    })?
                } else {
                    path.to_owned()
                };
                let meta = std::fs::metadata(&target).map_err(|source| Error::Resolve {
                    path: shown.clone(),
                    source,
                })?;
                if !meta.is_file() {
                    return Err(Error::NotARegularFile {
                        path: shown,
                        what: kind_of(&meta),
                    });
                }
                (target, Some(meta))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (path.to_owned(), None),
            Err(source) => {
                return Err(Error::Resolve {
                    path: shown,
                    source,
                })
            }
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .ok_or_else(|| Error::NotARegularFile {
                path: shown.clone(),
                what: "a directory",
            })?
            .to_string_lossy()
            .into_owned();
        let mut attempt = 0;
        let (temp, file) = loop {
            let temp = dir.join(format!(
                ".{name}.lockstep-{}-{attempt}.tmp",
                std::process::id()
            ));
            match File::options().write(true).create_new(true).open(&temp) {
                Ok(f) => break (temp, f),
                Err(e)
                    if e.kind() == std::io::ErrorKind::AlreadyExists
                        && attempt + 1 < TEMP_NAMES_MAX =>
                {
                    attempt += 1;
                }
                Err(source) => {
                    return Err(Error::CreateTemp {
                        dir,
                        path: shown,
                        source,
                    })
                }
            }
        };
        let out = Self {
            target,
            shown,
            temp,
            out: Some(BufWriter::new(file)),
        };
        // The replacement keeps the permissions of the file it replaces.
        if let Some(meta) = existing {
            std::fs::set_permissions(&out.temp, meta.permissions())
                .map_err(|e| out.write_error(e))?;
        }
        Ok(out)
    }

    fn write_error(&self, source: std::io::Error) -> Error {
        Error::Write {
            path: self.shown.clone(),
            source,
        }
    }

    /// Puts the complete content in place of the target.
    pub fn commit(mut self) -> Result<(), Error> {
        let out = self.out.take().expect("committed once");
        let file = out
            .into_inner()
            .map_err(|e| self.write_error(e.into_error()))?;
        file.sync_all().map_err(|e| self.write_error(e))?;
        drop(file);
        std::fs::rename(&self.temp, &self.target).map_err(|e| self.write_error(e))?;
        // Make the rename itself durable; a file system that cannot sync a
        // directory still has the complete file under one name or the other.
        if let Some(dir) = self.target.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        self.temp.clear();
        Ok(())
    }
}

impl Write for OutFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.as_mut().expect("not committed").write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.as_mut().expect("not committed").flush()
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        // Not committed: the target stays as it was.
        if !self.temp.as_os_str().is_empty() {
            drop(self.out.take());
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("lockstep-outfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_target_changes_only_on_commit() {
        let dir = scratch("commit");
        let path = dir.join("out.jsonl");
        std::fs::write(&path, "old").unwrap();
        let mut f = OutFile::create(&path).unwrap();
        f.write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        f.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(entries(&dir), ["out.jsonl"], "no temporary file left");
        // Dropped without a commit: nothing changes, nothing is left.
        let mut f = OutFile::create(&path).unwrap();
        f.write_all(b"half").unwrap();
        drop(f);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(entries(&dir), ["out.jsonl"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_symlink_keeps_pointing_at_the_replaced_file() {
        let dir = scratch("symlink");
        let real = dir.join("real.jsonl");
        let link = dir.join("link.jsonl");
        std::fs::write(&real, "old").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let mut f = OutFile::create(&link).unwrap();
        f.write_all(b"new").unwrap();
        f.commit().unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn targets_a_rename_would_destroy_are_refused() {
        let dir = scratch("special");
        // (target, what the error says)
        for (path, says) in [
            (dir.clone(), "a directory"),
            (PathBuf::from("/dev/null"), "a device"),
        ] {
            let err = OutFile::create(&path).err().expect("refused");
            assert!(err.to_string().contains(says), "{err}");
            assert!(err.to_string().contains("not a regular file"), "{err}");
        }
        let err = OutFile::create(&dir.join("missing/out.jsonl"))
            .err()
            .expect("refused");
        assert!(
            err.to_string().contains("cannot create a temporary file"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
