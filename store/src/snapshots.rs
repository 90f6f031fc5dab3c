//! Snapshots kept by the log's own engine: the engine's state after a
//! sequence, stored beside the streams in a JetStream object store bucket
//! (`LOCKSTEP_SNAPSHOTS`, replicated like the streams), so that the state
//! outlives the log's retention.
//!
//! A snapshot is a checkpoint file as the store writes it (magic, format,
//! sequence, the engine's snapshot, SHA-256), uploaded as it is read from
//! disk and downloaded to a file the same way: its checksum is verified
//! when the store restores from it. Its object's metadata names the
//! sequence, the state hash, the engine's state layout and the lockstep
//! version that wrote it. Names sort by sequence (`seq-00000000000000001234`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::StreamExt;
use tokio::io::{AsyncRead, ReadBuf};

use crate::log::{Error, Result};

/// The object store bucket of snapshots.
pub const BUCKET: &str = "LOCKSTEP_SNAPSHOTS";

/// One snapshot: what its object's metadata says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotInfo {
    /// The object's name.
    pub name: String,
    /// The last sequence applied to the state it holds.
    pub seq: u64,
    /// `Engine::hash` of that state.
    pub state_hash: String,
    /// The engine's state layout (`lockstep_engine::LAYOUT`).
    pub layout: u32,
    /// The lockstep version that wrote it.
    pub version: String,
    /// Its size in bytes (0 before it is stored).
    pub bytes: u64,
}

impl SnapshotInfo {
    /// A snapshot of the state after `seq`, named after it.
    pub fn new(seq: u64, state_hash: String, layout: u32, version: &str) -> Self {
        Self {
            name: format!("seq-{seq:020}"),
            seq,
            state_hash,
            layout,
            version: version.to_owned(),
            bytes: 0,
        }
    }

    fn metadata(&self) -> HashMap<String, String> {
        HashMap::from([
            ("seq".to_owned(), self.seq.to_string()),
            ("state_hash".to_owned(), self.state_hash.clone()),
            ("layout".to_owned(), self.layout.to_string()),
            ("version".to_owned(), self.version.clone()),
        ])
    }

    fn from_object(o: &async_nats::jetstream::object_store::ObjectInfo) -> Option<Self> {
        let m = &o.metadata;
        Some(Self {
            name: o.name.clone(),
            seq: m.get("seq")?.parse().ok()?,
            state_hash: m.get("state_hash")?.clone(),
            layout: m.get("layout")?.parse().ok()?,
            version: m.get("version")?.clone(),
            bytes: o.size as u64,
        })
    }
}

fn js(what: &'static str) -> impl FnOnce(String) -> Error {
    move |message| Error::JetStream { what, message }
}

async fn bucket(
    js_ctx: &async_nats::jetstream::Context,
) -> Result<Option<async_nats::jetstream::object_store::ObjectStore>> {
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    // The bucket is its stream; one that does not exist yet is no error.
    match js_ctx.get_stream(format!("OBJ_{BUCKET}")).await {
        Ok(_) => {}
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                return Ok(None)
            }
            _ => return Err(js("snapshot bucket")(e.to_string())),
        },
    }
    js_ctx
        .get_object_store(BUCKET)
        .await
        .map(Some)
        .map_err(|e| js("snapshot bucket")(e.to_string()))
}

/// The snapshots in the bucket, oldest first; objects without lockstep's
/// metadata are left out.
pub(crate) async fn list(js_ctx: &async_nats::jetstream::Context) -> Result<Vec<SnapshotInfo>> {
    let Some(b) = bucket(js_ctx).await? else {
        return Ok(Vec::new());
    };
    let mut objects = b
        .list()
        .await
        .map_err(|e| js("list snapshots")(e.to_string()))?;
    let mut out = Vec::new();
    while let Some(o) = objects.next().await {
        let o = o.map_err(|e| js("list snapshots")(e.to_string()))?;
        if let Some(info) = SnapshotInfo::from_object(&o).filter(|_| !o.deleted) {
            out.push(info);
        }
    }
    out.sort_by_key(|s| s.seq);
    Ok(out)
}

/// Uploads the checkpoint file `file` as the snapshot `meta`, then deletes
/// all but the newest `keep` snapshots.
pub(crate) async fn put(
    js_ctx: &async_nats::jetstream::Context,
    replicas: usize,
    file: &Path,
    meta: &SnapshotInfo,
    keep: usize,
) -> Result<()> {
    use async_nats::jetstream::object_store::{Config, ObjectMetadata};
    let b = match bucket(js_ctx).await? {
        Some(b) => b,
        None => js_ctx
            .create_object_store(Config {
                bucket: BUCKET.to_owned(),
                description: Some("lockstep's engine snapshots".to_owned()),
                num_replicas: replicas,
                storage: async_nats::jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| js("create snapshot bucket")(e.to_string()))?,
    };
    let f = std::fs::File::open(file)
        .map_err(|e| Error::Snapshot(format!("reading {}: {e}", file.display())))?;
    let object = ObjectMetadata {
        name: meta.name.clone(),
        description: Some(format!("engine state after seq {}", meta.seq)),
        metadata: meta.metadata(),
        ..Default::default()
    };
    b.put(object, &mut BlockingRead(f))
        .await
        .map_err(|e| js("put snapshot")(e.to_string()))?;
    let all = list(js_ctx).await?;
    for old in &all[..all.len().saturating_sub(keep.max(1))] {
        b.delete(&old.name)
            .await
            .map_err(|e| js("delete snapshot")(e.to_string()))?;
    }
    Ok(())
}

/// Downloads the snapshot `name` to the file `to` (made durable); its size.
pub(crate) async fn fetch(
    js_ctx: &async_nats::jetstream::Context,
    name: &str,
    to: &Path,
) -> Result<u64> {
    let Some(b) = bucket(js_ctx).await? else {
        return Err(Error::Snapshot(format!("no snapshot bucket holds {name}")));
    };
    let mut object = b
        .get(name)
        .await
        .map_err(|e| js("get snapshot")(e.to_string()))?;
    let io = |e: std::io::Error| Error::Snapshot(format!("writing {}: {e}", to.display()));
    let mut file = std::fs::File::create(to).map_err(io)?;
    let mut chunk = vec![0u8; 256 << 10];
    let mut bytes = 0u64;
    loop {
        let n = std::future::poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut chunk);
            Pin::new(&mut object)
                .poll_read(cx, &mut buf)
                .map_ok(|()| buf.filled().len())
        })
        .await
        .map_err(|e| js("read snapshot")(e.to_string()))?;
        if n == 0 {
            break;
        }
        file.write_all(&chunk[..n]).map_err(io)?;
        bytes += n as u64;
    }
    file.sync_all().map_err(io)?;
    Ok(bytes)
}

/// The embedded log's snapshots: files in a directory beside it
/// (`<name>`, the checkpoint file, and `<name>.meta`, its metadata), each
/// made durable before it counts.
pub(crate) mod files {
    use std::path::Path;

    use super::SnapshotInfo;
    use crate::log::{Error, Result};

    fn io<'a>(what: &'a str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
        move |e| Error::Snapshot(format!("{what} {}: {e}", path.display()))
    }

    /// The snapshots in `dir`, oldest first.
    pub(crate) fn list(dir: &Path) -> Result<Vec<SnapshotInfo>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("listing", dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(io("listing", dir))?.path();
            if path.extension().is_none_or(|x| x != "meta") {
                continue;
            }
            let Ok(raw) = std::fs::read(&path) else {
                continue;
            };
            let Ok(mut info) = rmp_serde::from_slice::<SnapshotInfo>(&raw) else {
                continue;
            };
            // The metadata is written after the file: both, or it does
            // not count.
            let Ok(meta) = std::fs::metadata(dir.join(&info.name)) else {
                continue;
            };
            info.bytes = meta.len();
            out.push(info);
        }
        out.sort_by_key(|s| s.seq);
        Ok(out)
    }

    /// Copies the checkpoint file `file` into `dir` as the snapshot
    /// `meta`, then deletes all but the newest `keep`.
    pub(crate) fn put(dir: &Path, file: &Path, meta: &SnapshotInfo, keep: usize) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let to = dir.join(&meta.name);
        let temp = dir.join(format!("{}.tmp", meta.name));
        std::fs::copy(file, &temp).map_err(io("copying to", &temp))?;
        std::fs::File::open(&temp)
            .and_then(|f| f.sync_all())
            .map_err(io("syncing", &temp))?;
        std::fs::rename(&temp, &to).map_err(io("renaming to", &to))?;
        let meta_path = dir.join(format!("{}.meta", meta.name));
        let raw = rmp_serde::to_vec_named(meta).expect("snapshot metadata encodes");
        std::fs::write(&meta_path, raw)
            .and_then(|()| std::fs::File::open(&meta_path)?.sync_all())
            .map_err(io("writing", &meta_path))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing", dir))?;
        let all = list(dir)?;
        for old in &all[..all.len().saturating_sub(keep.max(1))] {
            // The metadata first: a snapshot without it is not listed.
            let _ = std::fs::remove_file(dir.join(format!("{}.meta", old.name)));
            let _ = std::fs::remove_file(dir.join(&old.name));
        }
        Ok(())
    }

    /// Copies the snapshot `name` to the file `to` (made durable); its size.
    pub(crate) fn fetch(dir: &Path, name: &str, to: &Path) -> Result<u64> {
        let from = dir.join(name);
        let bytes = std::fs::copy(&from, to).map_err(io("copying", &from))?;
        std::fs::File::open(to)
            .and_then(|f| f.sync_all())
            .map_err(io("syncing", to))?;
        Ok(bytes)
    }
}

/// A local file read by blocking reads as an `AsyncRead`: the uploader
/// reads it chunk by chunk, each a short read from the page cache or the
/// disk, and nothing else waits on this task meanwhile.
struct BlockingRead(std::fs::File);

impl AsyncRead for BlockingRead {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.0.read(buf.initialize_unfilled())?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}
