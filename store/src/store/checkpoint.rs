//! The checkpoint file: `[magic: 8][format: u32 BE][seq: u64 BE][body]
//! [sha256: 32]`, the SHA-256 over everything before it.
//!
//! Written as a stream to a temporary file beside it, made durable, then
//! renamed over it: a crash at any point leaves the old checkpoint or the
//! new one, never a mix. Read as a stream too, the checksum verified once
//! the body has been read.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

/// The checkpoint file's name in the store directory.
pub(super) const FILE_NAME: &str = "engine.checkpoint";
/// The file a checkpoint is written to before it replaces the last one.
const TEMP_NAME: &str = "engine.checkpoint.tmp";
/// First bytes of a checkpoint file.
const MAGIC: &[u8; 8] = b"LSCKPT\r\n";
/// The layout of the file this build writes and reads.
const FORMAT: u32 = 1;
/// Magic, format and sequence.
const HEADER_LEN: u64 = 20;
/// The SHA-256.
const TRAILER_LEN: u64 = 32;
/// Buffer between the file and the encoder or decoder, which move a few
/// bytes at a time.
const BUFFER_BYTES: usize = 256 << 10;

/// Why a checkpoint file does not read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// Not a checkpoint of this format, truncated, or its checksum does
    /// not match.
    Corrupt {
        /// The sequence it claims (0 when not even that can be read).
        seq: u64,
    },
    /// Reading failed.
    Io(io::Error),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Writes the checkpoint at `path` (`body` writes the body), replacing the
/// old one only once the new one is whole and on disk. On failure the old
/// one stays and no temporary file is left. Returns the file's size.
pub(super) fn write(
    path: &Path,
    seq: u64,
    body: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<u64> {
    let temp = path.with_file_name(TEMP_NAME);
    let replaced = write_file(&temp, seq, body).and_then(|bytes| {
        std::fs::rename(&temp, path)?;
        Ok(bytes)
    });
    match replaced {
        Ok(bytes) => {
            sync_dir(path)?;
            Ok(bytes)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(e)
        }
    }
}

/// Header, body and trailer to `path`, synced to disk.
fn write_file(
    path: &Path,
    seq: u64,
    body: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<u64> {
    let file = File::create(path)?;
    let mut out = BufWriter::with_capacity(BUFFER_BYTES, Hashing::new(file));
    out.write_all(&header(seq))?;
    body(&mut out)?;
    let (mut file, sum, bytes) = out
        .into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .finish();
    file.write_all(&sum)?;
    file.sync_all()?;
    Ok(bytes + TRAILER_LEN)
}

fn header(seq: u64) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT.to_be_bytes());
    h[12..].copy_from_slice(&seq.to_be_bytes());
    h
}

/// The rename of a file in `path`'s directory made durable.
fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => File::open(".")?.sync_all(),
    }
}

/// Reads the checkpoint in `file`: `decode` reads the body as a stream;
/// then what it left of the body is read too and the checksum compared.
/// A mismatch is [`ReadError::Corrupt`] whatever `decode` returned.
pub(super) fn read<T, E>(
    mut file: File,
    decode: impl FnOnce(&mut dyn Read) -> Result<T, E>,
) -> Result<(u64, Result<T, E>), ReadError> {
    let len = file.metadata()?.len();
    if len < HEADER_LEN + TRAILER_LEN {
        return Err(ReadError::Corrupt { seq: 0 });
    }
    let mut header = [0u8; HEADER_LEN as usize];
    read_exact(&mut file, &mut header, 0)?;
    if &header[..8] != MAGIC {
        return Err(ReadError::Corrupt { seq: 0 });
    }
    let seq = u64::from_be_bytes(header[12..].try_into().expect("8 bytes"));
    if header[8..12] != FORMAT.to_be_bytes() {
        return Err(ReadError::Corrupt { seq });
    }
    let mut hashing = Hashing::new(file.take(len - HEADER_LEN - TRAILER_LEN));
    hashing.sha.update(header);
    let mut body = BufReader::with_capacity(BUFFER_BYTES, hashing);
    let decoded = decode(&mut body);
    // The rest of the body, if the decoder stopped short of its end.
    io::copy(&mut body, &mut io::sink())?;
    let (body, sum, _) = body.into_inner().finish();
    let mut file = body.into_inner();
    let mut trailer = [0u8; TRAILER_LEN as usize];
    read_exact(&mut file, &mut trailer, seq)?;
    if trailer != sum {
        return Err(ReadError::Corrupt { seq });
    }
    Ok((seq, decoded))
}

/// The sequence a checkpoint file names in its header, without reading or
/// verifying its body; `None` for a file that is not a checkpoint of this
/// format.
pub(super) fn seq_of(mut file: File) -> io::Result<Option<u64>> {
    let mut header = [0u8; HEADER_LEN as usize];
    match file.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let ours = &header[..8] == MAGIC && header[8..12] == FORMAT.to_be_bytes();
    Ok(ours.then(|| u64::from_be_bytes(header[12..].try_into().expect("8 bytes"))))
}

/// `read_exact`, a file that ends early being a damaged checkpoint.
fn read_exact(file: &mut File, buf: &mut [u8], seq: u64) -> Result<(), ReadError> {
    file.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => ReadError::Corrupt { seq },
        _ => ReadError::Io(e),
    })
}

/// Flips the last byte of the body (tests: simulate damage).
pub(super) fn damage(path: &Path) -> io::Result<()> {
    let mut f = OpenOptions::new().read(true).write(true).open(path)?;
    let at = f.metadata()?.len().saturating_sub(TRAILER_LEN + 1);
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(at))?;
    f.read_exact(&mut byte)?;
    byte[0] ^= 0xff;
    f.seek(SeekFrom::Start(at))?;
    f.write_all(&byte)?;
    f.sync_all()
}

/// A reader or writer that feeds what passes through it to a SHA-256 and
/// counts it.
struct Hashing<T> {
    inner: T,
    sha: Sha256,
    bytes: u64,
}

impl<T> Hashing<T> {
    fn new(inner: T) -> Self {
        Self {
            inner,
            sha: Sha256::new(),
            bytes: 0,
        }
    }

    /// The inner reader or writer, the digest and the byte count.
    fn finish(self) -> (T, [u8; 32], u64) {
        (self.inner, self.sha.finalize().into(), self.bytes)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}
