"""The model-sync agent: a short-lived, stdlib-only program orch runs on nodes with
``python -c SOURCE MODE ...`` over SSH (never installed, never a daemon). It does I/O on the node.
This part moves the files; ``agent_fingerprint`` (sent first, in the same program: see
``sync.agent_source``) says what a folder holds. ``main`` runs every mode.

Modes (the last stdout line of ``fingerprint`` is one JSON object; ``receive``/``send`` print one
JSON event per line): ``fingerprint`` and ``inspect`` (agent_fingerprint), and

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
import sys
import threading
import time

from orchestrator.sync.agent_fingerprint import (  # orch-agent: joined (dropped by agent_source)
    CHUNK,
    OWNER_NAME,
    PART_SUFFIX,
    content_digest,
    emit,
    fingerprint,
    fingerprint_files,
    inspect,
    list_files,
    remember,
)

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
