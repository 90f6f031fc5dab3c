#!/usr/bin/env python3
"""Writes fuzz/seeds/log_file: small logs cut from the shipped ones.

Whole incident logs (5-100 KB) make AFL slow (about 150 executions/s) and
its mutations land far from the decoder's branches. A seed here is a
header and up to three consecutive records, one seed for each set of
record kinds a file shows; every third is also converted to MessagePack.

    fuzz/seeds/log_file.py [LOCKSTEP_BIN]   (default target/debug/lockstep)
"""

import glob
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
out = os.path.join(here, "log_file")
lockstep = sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "target/debug/lockstep")


def kind(record):
    key = next(iter(record))
    if key != "event":
        return key
    event = record["event"]["envelope"]["event"]
    return next(iter(event)) if isinstance(event, dict) else event


os.makedirs(out, exist_ok=True)
for old in os.listdir(out):
    os.remove(os.path.join(out, old))
logs = sorted(glob.glob(os.path.join(repo, "replay-tests/incidents/*.jsonl")))
logs += sorted(glob.glob(os.path.join(repo, "replay-tests/compat/*.jsonl")))
seen = set()
n = 0
for log in logs:
    header, *records = open(log).read().splitlines()
    base = os.path.basename(log).removesuffix(".jsonl")
    for i in range(0, len(records), 3):
        chunk = records[i : i + 3]
        signature = (header, frozenset(kind(json.loads(r)) for r in chunk))
        if signature in seen:
            continue
        seen.add(signature)
        path = os.path.join(out, f"{n:03}-{base}.jsonl")
        with open(path, "w") as f:
            f.write("\n".join([header, *chunk]) + "\n")
        if n % 3 == 0:
            done = subprocess.run(
                [lockstep, "convert", path, path.removesuffix(".jsonl") + ".msgpack"],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                sys.exit(f"{lockstep} convert {path}: {done.stderr}")
        n += 1
print(f"{n} JSON Lines seeds, {(n + 2) // 3} MessagePack, in {out}")
