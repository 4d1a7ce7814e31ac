# orch-sync-agent (this marker names the process in `ps` on the nodes)
"""The model-sync agent, part 1: what a model folder on a node holds. Stdlib only, does I/O on
the node. ``sync.agent_source`` sends this text followed by ``sync/agent.py`` as one
``python -c`` program (nothing is installed on the nodes), so neither part imports anything
but the standard library, and ``agent.py``'s import of this module is dropped when they are joined.

- ``fingerprint PATH [--no-cache]``: size and sha256 of every file of a model folder (dot files and
  dot folders left out), hashed by several threads; a stat cache ``.orch-fingerprint.json`` in the
  folder (keyed by size, mtime_ns, ctime_ns, inode) spares re-hashing unchanged files. Preflight's
  model probe runs this same mode: sync and preflight compare the same fingerprint.
- ``inspect FINAL STAGING STORE``: the final and staging folders' fingerprints and the free space,
  what the sync plan starts from.
"""

import hashlib
import json
import os
import stat
import sys
from concurrent.futures import ThreadPoolExecutor

CACHE_NAME = ".orch-fingerprint.json"
OWNER_NAME = ".orch-sync-owner"
PART_SUFFIX = ".orch-part"
CHUNK = 1 << 20


def emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# Fingerprint
# --------------------------------------------------------------------------------------------


def list_files(root):
    """(rel, full path, stat) of every regular file under root; dot names skipped (the cache,
    orch's markers, .git, .cache of hub downloads), symlinks followed as preflight always did."""
    out = []
    for d, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        for n in sorted(names):
            if n.startswith(".") or n.endswith(PART_SUFFIX):
                continue
            full = os.path.join(d, n)
            try:
                st = os.stat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out.append((os.path.relpath(full, root), full, st))
    out.sort()
    return out


def stat_key(st):
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def read_cache(root):
    try:
        with open(os.path.join(root, CACHE_NAME)) as f:
            data = json.load(f)
        return data.get("files", {}) if data.get("version") == 1 else {}
    except (OSError, ValueError, AttributeError):
        return {}


def remember(root, shas):
    """Add files whose sha256 is known (just received and verified, or linked from a verified
    copy) to the folder's cache under their current stat key."""
    cache = read_cache(root)
    for rel, sha in shas.items():
        try:
            cache[rel] = {"key": stat_key(os.stat(os.path.join(root, rel))), "sha256": sha}
        except OSError:
            pass
    write_cache(root, cache)


def write_cache(root, entries):
    """Best effort, atomic (temp + rename inside the folder); a read-only store just skips it."""
    tmp = os.path.join(root, f"{CACHE_NAME}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump({"version": 1, "files": entries}, f)
        os.replace(tmp, os.path.join(root, CACHE_NAME))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def fingerprint_files(root, use_cache=True, workers=None):
    """[[rel, size, sha256]] of the folder, hashing in parallel what the cache cannot vouch for."""
    files = list_files(root)
    cache = read_cache(root) if use_cache else {}
    known, todo = {}, []
    for rel, full, st in files:
        hit = cache.get(rel)
        if hit and hit.get("key") == stat_key(st):
            known[rel] = hit["sha256"]
        else:
            todo.append((rel, full))
    hashed = 0
    if todo:
        with ThreadPoolExecutor(max_workers=workers or min(8, (os.cpu_count() or 2))) as pool:
            for (rel, _), digest in zip(todo, pool.map(lambda t: sha256_file(t[1]), todo)):
                known[rel] = digest
                hashed += 1
    entries = {rel: {"key": stat_key(st), "sha256": known[rel]} for rel, _, st in files}
    if use_cache and (todo or set(cache) != set(entries)):
        write_cache(root, entries)
    return [[rel, st.st_size, known[rel]] for rel, _, st in files], hashed


def content_digest(files):
    """sha256 of the sorted ``rel\\tsize\\tsha256`` lines: two folders hold the same model when equal."""
    h = hashlib.sha256()
    for rel, size, sha in sorted(files):
        h.update(f"{rel}\t{size}\t{sha}\n".encode())
    return h.hexdigest()


def fingerprint(path, use_cache=True):
    out = {"path": path, "exists": os.path.isdir(path) or os.path.isfile(path)}
    if out["exists"] and os.path.isdir(path):
        files, hashed = fingerprint_files(path, use_cache)
        out["files"] = files
        out["hashed"] = hashed
        out["file_count"] = len(files)
        out["total_bytes"] = sum(f[1] for f in files)
        out["content_sha256"] = content_digest(files)
        shas = {f[0]: f[2] for f in files}
        out["config_sha256"] = shas.get("config.json")
        if "model.safetensors.index.json" in shas:
            out["index_sha256"], out["index_kind"] = shas["model.safetensors.index.json"], "safetensors-index"
        else:
            listing = "".join(f"{f[0]}\t{f[1]}\n" for f in files).encode()
            out["index_sha256"], out["index_kind"] = hashlib.sha256(listing).hexdigest(), "file-list"
    elif out["exists"]:
        size, sha = os.stat(path).st_size, sha256_file(path)
        out["files"] = [[os.path.basename(path), size, sha]]
        out["file_count"], out["total_bytes"], out["hashed"] = 1, size, 1
        out["content_sha256"] = content_digest(out["files"])
        out["config_sha256"], out["index_sha256"], out["index_kind"] = None, sha, "file"
    return out


def free_bytes(path):
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    s = os.statvfs(p)
    return s.f_frsize * s.f_bavail


def inspect(final, staging, store):
    """What a node holds: the final folder's and the staging folder's fingerprints, free space."""
    return {
        "final": fingerprint(final),
        "final_is_link": os.path.islink(final),
        "staging": fingerprint(staging) if os.path.isdir(staging) else {"path": staging, "exists": False},
        "staging_owned": os.path.isfile(os.path.join(staging, OWNER_NAME)),
        "free_bytes": free_bytes(store),
    }


