#!/usr/bin/env python3
"""Writes an OCI image archive (an image layout in a tar) from directories,
one uncompressed layer per directory, without a container engine or a
registry. Python standard library only.

    mkoci.py OUT.tar NAME:TAG [--also NAME:TAG ...] --layer DIR [--layer DIR ...]
             [--exclude GLOB ...] [--entrypoint JSON] [--cmd JSON] [--user U]
             [--env K=V ...] [--workdir DIR] [--label K=V ...]

`ctr -n k8s.io images import OUT.tar` names the image after NAME:TAG (and
each --also), from the index's `io.containerd.image.name` annotation;
`skopeo copy oci-archive:OUT.tar docker://REGISTRY/NAME:TAG` pushes it.

The output is a function of the input files only: entries sorted, times 0,
numeric owners kept (a Debian root has files owned by system users, e.g.
munge), names dropped. The same directory gives the same layer digest, so
images that share a base directory share that layer in containerd's store.
--exclude GLOB (relative to a layer's directory, e.g. `proc/*`) leaves out
what matches; a directory itself is kept when only its content is excluded.
Sockets and other special files other than devices are skipped.
"""

import argparse
import fnmatch
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile

LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
CHUNK_BYTES = 1 << 20


def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uname = info.gname = ""
    return info


def excluded(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def write_layer(src: str, patterns: list[str], out) -> None:
    """Writes the tar of directory `src` to the open file `out`."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(src):
            rel_root = os.path.relpath(root, src)
            kept = []
            for name in sorted(dirs + files):
                path = os.path.join(root, name)
                rel = name if rel_root == "." else os.path.join(rel_root, name)
                if excluded(rel, patterns):
                    continue
                info = tar.gettarinfo(path, arcname=rel)
                if info is None:  # a socket or fifo: nothing a layer needs
                    continue
                info = reset(info)
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
                if name in dirs and not os.path.islink(path):
                    kept.append(name)
            # Walk only the kept directories, in order.
            dirs[:] = sorted(d for d in dirs if d in kept)


def sha256_file(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("ref")
    ap.add_argument("--also", action="append", default=[], help="another NAME:TAG for the same image")
    ap.add_argument("--layer", action="append", required=True, help="a directory: one layer, in order")
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--entrypoint", default="null")
    ap.add_argument("--cmd", default="null")
    ap.add_argument("--user", default="")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--label", action="append", default=[])
    a = ap.parse_args()

    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + a.env
    labels = dict(kv.split("=", 1) for kv in a.label)
    work = tempfile.mkdtemp(prefix="mkoci.", dir=os.path.dirname(os.path.abspath(a.out)) or ".")
    try:
        layers = []
        for i, src in enumerate(a.layer):
            if not os.path.isdir(src):
                print(f"mkoci: not a directory: {src}", file=sys.stderr)
                return 2
            path = os.path.join(work, f"layer{i}.tar")
            with open(path, "wb") as f:
                write_layer(src, a.exclude, f)
            d, size = sha256_file(path)
            layers.append((path, d, size))

        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Env": env,
                "Entrypoint": json.loads(a.entrypoint),
                "Cmd": json.loads(a.cmd),
                "User": a.user,
                "WorkingDir": a.workdir,
                "Labels": labels or None,
            },
            "rootfs": {"type": "layers", "diff_ids": [d for _, d, _ in layers]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": f"mkoci.py --layer {os.path.basename(os.path.normpath(s))}"} for s in a.layer],
        }
        config_bytes = json.dumps(config, sort_keys=True).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config_bytes), "size": len(config_bytes)},
            "layers": [{"mediaType": LAYER_MEDIA, "digest": d, "size": size} for _, d, size in layers],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        manifest_digest = digest(manifest_bytes)
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                    },
                }
                for ref in [a.ref] + a.also
            ],
        }

        def add_bytes(tar, name, data):
            info = reset(tarfile.TarInfo(name))
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))

        tmp_out = a.out + ".partial"
        with tarfile.open(tmp_out, "w") as tar:
            add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add_bytes(tar, "index.json", json.dumps(index, sort_keys=True).encode())
            seen = set()
            for path, d, size in layers:
                if d in seen:
                    continue
                seen.add(d)
                info = reset(tarfile.TarInfo("blobs/sha256/" + d[7:]))
                info.size = size
                info.mode = 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            add_bytes(tar, "blobs/sha256/" + digest(config_bytes)[7:], config_bytes)
            add_bytes(tar, "blobs/sha256/" + manifest_digest[7:], manifest_bytes)
        os.replace(tmp_out, a.out)
        total = sum(size for _, _, size in layers)
        print(f"{a.ref} {manifest_digest} {len(layers)} layers {total} bytes")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
