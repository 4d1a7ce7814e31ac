# orch-sync-agent (this marker names the process in `ps` on the nodes)
"""The model-sync agent: a short-lived, stdlib-only program orch runs on nodes with
``python -c SOURCE MODE ...`` over SSH (never installed, never a daemon), and the same file
imported here (``workflows/model_sync.py`` sends a local source's files with ``send_files``).
It does I/O on the node. ``main`` runs every mode.

Modes (the last stdout line of ``fingerprint`` is one JSON object; ``receive``/``send`` print one
JSON event per line):

- ``fingerprint PATH [--no-cache]``: size and sha256 of every file of a model folder (dot files and
  dot folders left out), hashed by several threads; a stat cache ``.orch-fingerprint.json`` in the
  folder (keyed by size, mtime_ns, ctime_ns, inode) spares re-hashing unchanged files. Preflight's
  model probe runs this same mode: sync and preflight compare the same fingerprint.
- ``inspect FINAL STAGING STORE``: the final and staging folders' fingerprints and the free space,
  what the sync plan starts from.
- ``receive``: reads a JSON plan line from stdin, binds a listener on the plan's address (port 0),
  prints ``{"event": "listening", ...}``, reads a second line naming the next hop, takes its
  upstream from stdin (``upstream: "stdin"``) or from the one connection that presents the
  one-time token (the listener is closed right then), writes the files it needs into the staging
  folder while forwarding every chunk downstream at once, verifies each file's sha256, then checks
  the whole staging folder and swaps it with the final folder.
- ``send``: reads a JSON plan line, connects to the first hop, sends the token and the files.

Stream: for each file a JSON header line ``{"rel", "size", "sha256", "to": [nodes]}`` then
``size`` raw bytes; ``{"end": true}`` closes it. When stdin reaches EOF (orch went away) the
agent exits at once: an interrupted sync leaves no process and no listener behind.
"""

import ctypes
import hashlib
import hmac
import json
import os
import shutil
import socket
import stat
import sys
import threading
import time
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

PROGRESS_EVERY_S = 0.5
ACCEPT_TIMEOUT_S = 120.0
STALL_TIMEOUT_S = 120.0

# --------------------------------------------------------------------------------------------
# Stream I/O
# --------------------------------------------------------------------------------------------


class Reader:
    """Buffered reads from a socket or a binary stream: lines and exact byte counts."""

    def __init__(self, recv):
        self.recv = recv
        self.buf = b""

    def _fill(self):
        data = self.recv(CHUNK)
        if not data:
            raise EOFError("upstream closed the stream early")
        self.buf += data

    def line(self, limit=1 << 16):
        while b"\n" not in self.buf:
            if len(self.buf) > limit:
                raise ValueError("header line too long")
            self._fill()
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def chunks(self, size):
        left = size
        while left > 0:
            if not self.buf:
                self._fill()
            piece = self.buf[:left] if len(self.buf) > left else self.buf
            self.buf = self.buf[len(piece):]
            left -= len(piece)
            yield piece


class Meter:
    """Bytes moved, reported as a progress event at most every PROGRESS_EVERY_S."""

    def __init__(self, total):
        self.total, self.received, self.written, self.last = total, 0, 0, 0.0

    def add(self, received, written):
        self.received += received
        self.written += written
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            emit(event="progress", received=self.received, written=self.written, total=self.total)


def send_files(root, frames, write, rate=None):
    """Write the stream of ``frames`` ([rel, size, sha256, [nodes]]) read from ``root``.
    ``rate`` (bytes/s) paces the stream (a sync that must not fill the NIC of a serving cluster)."""
    start, sent = time.monotonic(), 0
    for rel, size, sha, to in frames:
        write((json.dumps({"rel": rel, "size": size, "sha256": sha, "to": to}) + "\n").encode())
        with open(os.path.join(root, rel), "rb") as f:
            left = size
            while left > 0:
                data = f.read(min(CHUNK, left))
                if not data:
                    raise OSError(f"{rel} shrank while being sent")
                write(data)
                left -= len(data)
                sent += len(data)
                if rate:
                    ahead = sent / rate - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)
    write(b'{"end": true}\n')
    return sent


FINISHED = threading.Event()  # set once the work is done: a closed stdin then is just goodbye


def watch_stdin(stream):
    """orch holds our stdin open for as long as it wants us: EOF means it is gone, so go too."""

    def run():
        try:
            while stream.read(65536):
                pass
        except (OSError, ValueError):
            pass
        if not FINISHED.is_set():
            os._exit(3)

    threading.Thread(target=run, daemon=True, name="stdin-watch").start()


# --------------------------------------------------------------------------------------------
# Receive
# --------------------------------------------------------------------------------------------


def safe_join(root, rel):
    full = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not full.startswith(os.path.normpath(root) + os.sep):
        raise ValueError(f"file {rel!r} would land outside the model folder")
    return full


def prepare_staging(plan):
    """Create (or adopt) the staging folder; link the files the final folder already holds;
    drop what is not part of the target (stale or half-received files)."""
    staging, final, name = plan["staging"], plan["final"], plan["name"]
    os.makedirs(plan["store"], exist_ok=True)
    owner = os.path.join(staging, OWNER_NAME)
    if os.path.isdir(staging) and not os.path.isfile(owner):
        raise RuntimeError(f"{staging} exists and is not orch's staging folder; not touching it")
    os.makedirs(staging, exist_ok=True)
    with open(owner, "w") as f:
        json.dump({"model": name}, f)
    target = {rel: (size, sha) for rel, size, sha in plan["target"]}
    for rel, full, _ in list_files(staging):
        if rel not in target:
            os.unlink(full)
    for d, _, names in os.walk(staging):
        for n in names:
            if n.endswith(PART_SUFFIX):
                os.unlink(os.path.join(d, n))
    for rel in plan["link"]:
        dst = safe_join(staging, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.lexists(dst):
            os.unlink(dst)
        try:
            os.link(safe_join(final, rel), dst)
        except OSError:
            shutil.copy2(safe_join(final, rel), dst)
    remember(staging, {rel: target[rel][1] for rel in plan["link"]})


class Downstream:
    """The next hop. When it goes away this node keeps writing its own copy (the next node
    reports its own failure); forwarding just stops."""

    def __init__(self, sock):
        self.sock = sock

    def send(self, data):
        if self.sock is None:
            return
        try:
            self.sock.sendall(data)
        except OSError as exc:
            emit(event="downstream_lost", error=f"{type(exc).__name__}: {exc}")
            self.close()

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def receive_frames(reader, plan, downstream, meter):
    me, after = plan["node"], set(plan["after"])
    staging = plan["staging"]
    failures = []
    while True:
        hdr = json.loads(reader.line())
        if hdr.get("end"):
            if downstream is not None:
                downstream.send(b'{"end": true}\n')
            return failures
        rel, size, sha, to = hdr["rel"], int(hdr["size"]), hdr["sha256"], hdr["to"]
        mine = me in to
        fwd = downstream is not None and bool(after.intersection(to))
        if fwd:
            downstream.send((json.dumps(hdr) + "\n").encode())
        out = h = None
        if mine:
            dst = safe_join(staging, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            part = dst + PART_SUFFIX
            out, h = open(part, "wb"), hashlib.sha256()
        for piece in reader.chunks(size):
            if fwd:
                downstream.send(piece)
            if out is not None:
                out.write(piece)
                h.update(piece)
            meter.add(len(piece), len(piece) if out is not None else 0)
        if out is not None:
            out.flush()
            os.fsync(out.fileno())
            out.close()
            if h.hexdigest() != sha:
                os.unlink(part)
                failures.append(rel)
                emit(event="file_failed", rel=rel, expected=sha, got=h.hexdigest())
            else:
                os.replace(part, dst)
                remember(staging, {rel: sha})
                emit(event="file_done", rel=rel, size=size)


def rename_exchange(a, b):
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange_flag = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange_flag) == 0


def verify_and_swap(plan):
    """Every target file in staging with its size and sha256, nothing else; then staging takes
    the final path in one step and the old copy (the model's own folder) is removed."""
    staging, final = plan["staging"], plan["final"]
    files, _ = fingerprint_files(staging)
    got = sorted(map(tuple, files))
    want = sorted(map(tuple, plan["target"]))
    if got != want:
        bad = sorted({f[0] for f in set(got) ^ set(want)})
        return {"ok": False, "error": "staging does not match the source: {}".format(", ".join(bad[:5]))}
    os.unlink(os.path.join(staging, OWNER_NAME))
    if os.path.lexists(final):
        if rename_exchange(staging, final):
            shutil.rmtree(staging)
        else:
            old = plan["old"]
            if os.path.lexists(old):
                shutil.rmtree(old)
            os.rename(final, old)
            os.rename(staging, final)
            shutil.rmtree(old)
    else:
        os.rename(staging, final)
    return {"ok": True, "content_sha256": content_digest(files)}


def receive(stdin, plan):
    prepare_staging(plan)
    listener = None
    if plan["upstream"] == "listen":
        fam = socket.AF_INET6 if ":" in plan["bind"] else socket.AF_INET
        listener = socket.socket(fam, socket.SOCK_STREAM)
        listener.bind((plan["bind"], 0))
        listener.listen(4)
    bound = listener.getsockname() if listener else (None, None)
    emit(event="listening", address=bound[0], port=bound[1])  # what the kernel bound, not what was asked
    nxt = json.loads(stdin.readline() or "null")
    if nxt is None:
        raise EOFError("orch closed the control stream")
    downstream = None
    if nxt.get("next"):
        host, port = nxt["next"]["host"], nxt["next"]["port"]
        downstream = Downstream(None)
        try:
            sock = socket.create_connection((host, port), timeout=ACCEPT_TIMEOUT_S)
            sock.settimeout(STALL_TIMEOUT_S)
            sock.sendall(plan["token"].encode() + b"\n")
            downstream.sock = sock
        except OSError as exc:  # this node still takes its own copy; the next one fails on its own
            emit(event="downstream_lost", error=f"{type(exc).__name__}: {exc}")
    meter = Meter(plan["bytes"])
    failures = []
    if listener is not None:
        watch_stdin(stdin)
        conn, reader = accept_one(listener, plan["token"])
        conn.settimeout(STALL_TIMEOUT_S)
        failures = receive_frames(reader, plan, downstream, meter)
        conn.close()
    elif plan["upstream"] == "stdin":
        failures = receive_frames(Reader(stdin.read1), plan, downstream, meter)
    else:
        watch_stdin(stdin)  # nothing to receive: only links from the final folder and the swap
    if downstream is not None:
        downstream.close()
    emit(event="progress", received=meter.received, written=meter.written, total=plan["bytes"])
    if failures:
        FINISHED.set()
        emit(event="result", ok=False, error="sha256 mismatch after transfer: {}".format(", ".join(failures[:5])))
        return 1
    res = verify_and_swap(plan)
    FINISHED.set()
    emit(event="result", **res)
    return 0 if res["ok"] else 1


def accept_one(listener, token):
    """The first connection that presents the token; others are dropped. The listener is closed
    as soon as it is found (one-time), or when the deadline passes."""
    deadline = time.monotonic() + ACCEPT_TIMEOUT_S
    want = token.encode()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no upstream presented the token within {ACCEPT_TIMEOUT_S:.0f} s")
            listener.settimeout(left)
            conn, _ = listener.accept()
            conn.settimeout(10.0)
            reader = Reader(conn.recv)
            try:
                got = reader.line(limit=256)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            if hmac.compare_digest(got, want):
                return conn, reader
            conn.close()
    finally:
        listener.close()


def send(stdin, plan):
    watch_stdin(stdin)
    sock = socket.create_connection((plan["host"], plan["port"]), timeout=ACCEPT_TIMEOUT_S)
    sock.settimeout(STALL_TIMEOUT_S)
    sock.sendall(plan["token"].encode() + b"\n")
    sent = send_files(plan["root"], plan["frames"], sock.sendall, plan.get("rate"))
    sock.close()
    FINISHED.set()
    emit(event="result", ok=True, sent=sent)
    return 0


def main(argv):
    mode = argv[0] if argv else ""
    if mode == "fingerprint":
        print(json.dumps(fingerprint(argv[1], use_cache="--no-cache" not in argv)))
        return 0
    if mode == "inspect":
        print(json.dumps(inspect(argv[1], argv[2], argv[3])))
        return 0
    if mode in ("receive", "send"):
        stdin = sys.stdin.buffer
        plan = json.loads(stdin.readline())
        try:
            rc = receive(stdin, plan) if mode == "receive" else send(stdin, plan)
        except Exception as exc:  # the node's reason, as an event orch can show
            emit(event="result", ok=False, error=f"{type(exc).__name__}: {exc}")
            rc = 1
        FINISHED.set()
        sys.stdout.flush()
        os._exit(rc)  # the stdin watcher thread still blocks in a read: end without joining it
    sys.stderr.write("usage: agent fingerprint PATH | inspect FINAL STAGING STORE | receive | send\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
