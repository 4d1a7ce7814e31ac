"""The sync agent as it runs on a node (a real subprocess, stdlib only), on this machine:
fingerprints checked against `sha256sum`, a two-node relay over 127.0.0.1 with the one-time
token, the atomic swap of an older copy, and no listener left behind."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.nodes.probes import agent_argv
from orchestrator.remote.node_programs import sync_agent as agent

DEADLINE_S = 60


def make_model(root: Path, seed: int = 1) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"seed": seed, "hidden_size": 256}))
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    for i in (1, 2):
        (root / f"model-0000{i}-of-00002.safetensors").write_bytes(os.urandom(2 << 20))
    (root / ".gitattributes").write_text("*.safetensors filter=lfs\n")  # dot files are not part of a model
    return root


def sha256sum(root: Path) -> dict[str, tuple[int, str]]:
    """What coreutils says about every non-dot file."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not any(part.startswith(".") for part in rel.split("/")):
            digest = subprocess.run(["sha256sum", str(p)], capture_output=True, text=True, check=True).stdout.split()[0]
            out[rel] = (p.stat().st_size, digest)
    return out


def fingerprint(path: Path) -> dict:
    res = subprocess.run(agent_argv(sys.executable, "fingerprint", str(path)), capture_output=True, text=True, check=True, timeout=DEADLINE_S)
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_fingerprint_matches_sha256sum_and_the_cache_notices_a_changed_shard(tmp_path):
    src = make_model(tmp_path / "m")
    first = fingerprint(src)
    assert {r: (s, h) for r, s, h in first["files"]} == sha256sum(src)
    assert first["hashed"] == 4
    again = fingerprint(src)
    assert again["hashed"] == 0 and again["content_sha256"] == first["content_sha256"]
    shard = src / "model-00002-of-00002.safetensors"
    with open(shard, "r+b") as f:  # corrupt in place: same size, other bytes
        f.seek(1000)
        f.write(b"\xff" * 64)
    changed = fingerprint(src)
    assert changed["hashed"] == 1
    assert {r: (s, h) for r, s, h in changed["files"]} == sha256sum(src)
    assert changed["content_sha256"] != first["content_sha256"]


class Agent:
    def __init__(self, plan: dict) -> None:
        self.proc = subprocess.Popen(agent_argv(sys.executable, "receive"), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.send(plan)

    def send(self, obj) -> None:
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def event(self, kind: str) -> dict:
        for line in self.proc.stdout:
            ev = json.loads(line)
            if ev["event"] in (kind, "result"):
                return ev
        raise AssertionError(f"agent ended before {kind}")


def receive_plan(node: str, store: Path, target, upstream: str, after=(), link=()) -> dict:
    return {
        "node": node, "name": "m", "store": str(store), "final": str(store / "m"), "staging": str(store / ".m.orch-sync"),
        "old": str(store / ".m.orch-old"), "target": target, "link": list(link), "after": list(after),
        "bytes": sum(f[1] for f in target), "upstream": upstream, "bind": "127.0.0.1", "token": "t" * 64,
    }


def test_relay_of_two_nodes_with_a_one_time_token(tmp_path):
    src = make_model(tmp_path / "src")
    target = fingerprint(src)["files"]
    store_a, store_b = tmp_path / "a", tmp_path / "b"
    make_model(store_b / "m", seed=2)  # an older copy: replaced in one step
    (store_b / "m" / "stale.bin").write_bytes(b"old")
    a = Agent(receive_plan("a", store_a, target, "stdin", after=["b"]))
    b = Agent(receive_plan("b", store_b, target, "listen"))
    la, lb = a.event("listening"), b.event("listening")
    assert lb["address"] == "127.0.0.1" and lb["port"] > 0 and la["port"] is None
    b.send({"next": None})  # b is the tail; it now waits for its upstream
    # a stranger without the token is dropped; the listener still waits for the real upstream
    rogue = socket.create_connection(("127.0.0.1", lb["port"]), timeout=DEADLINE_S)
    rogue.sendall(b"x" * 64 + b"\n")
    rogue.settimeout(DEADLINE_S)
    assert rogue.recv(1) == b""
    rogue.close()
    a.send({"next": {"host": "127.0.0.1", "port": lb["port"]}})
    frames = [[r, s, h, ["a", "b"]] for r, s, h in target]
    sent = agent.send_files(str(src), frames, lambda d: (a.proc.stdin.write(d), a.proc.stdin.flush()))
    a.proc.stdin.close()
    assert sent == sum(f[1] for f in target)
    ra, rb = a.event("result"), b.event("result")
    assert ra["ok"] and rb["ok"], (ra, rb)
    b.proc.stdin.close()
    assert a.proc.wait(DEADLINE_S) == 0 and b.proc.wait(DEADLINE_S) == 0
    for store in (store_a, store_b):
        assert sha256sum(store / "m") == sha256sum(src)
        assert sorted(p.name for p in store.iterdir()) == ["m"]  # no staging, no old copy left
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", lb["port"]), timeout=DEADLINE_S)


def test_a_stream_cut_short_leaves_the_final_path_alone(tmp_path):
    src = make_model(tmp_path / "src")
    target = fingerprint(src)["files"]
    store = tmp_path / "s"
    a = Agent(receive_plan("a", store, target, "stdin"))
    a.event("listening")
    a.send({"next": None})
    frames = [[r, s, h, ["a"]] for r, s, h in target]
    first = frames[0]
    a.proc.stdin.write((json.dumps({"rel": first[0], "size": first[1], "sha256": first[2], "to": ["a"]}) + "\n").encode())
    a.proc.stdin.write((src / first[0]).read_bytes())
    a.proc.stdin.close()  # orch went away mid-stream
    res = a.event("result")
    assert not res["ok"] and "EOFError" in res["error"]
    assert a.proc.wait(DEADLINE_S) == 1
    assert not (store / "m").exists()
    # the file that arrived whole is kept, verified, in orch's staging folder for the next run
    held = fingerprint(store / ".m.orch-sync")
    assert held["files"] == [first[:3]]


def test_a_node_whose_next_hop_dies_still_completes_its_own_copy(tmp_path):
    src = make_model(tmp_path / "src")
    target = fingerprint(src)["files"]
    a = Agent(receive_plan("a", tmp_path / "a", target, "stdin", after=["b"]))
    b = Agent(receive_plan("b", tmp_path / "b", target, "listen"))
    a.event("listening")
    lb = b.event("listening")
    b.send({"next": None})
    a.send({"next": {"host": "127.0.0.1", "port": lb["port"]}})
    frames = [[r, s, h, ["a", "b"]] for r, s, h in target]
    write = lambda d: (a.proc.stdin.write(d), a.proc.stdin.flush())  # noqa: E731
    agent.send_files(str(src), frames[:1], lambda d: None if d == b'{"end": true}\n' else write(d))
    assert a.event("file_done")["rel"] == frames[0][0]  # a has it, and has passed it on to b
    b.proc.kill()  # the next node dies mid-stream
    b.proc.wait(DEADLINE_S)
    agent.send_files(str(src), frames[1:], write)
    a.proc.stdin.close()
    res = a.event("result")
    assert res["ok"], res
    assert sha256sum(tmp_path / "a" / "m") == sha256sum(src)


def test_the_agent_runs_where_orch_is_not_installed(tmp_path):
    """The agent goes to the node as one program: it must run in an isolated interpreter (-I: no
    site-packages, not the checkout) from a folder without orch in it."""
    src = agent_argv(sys.executable)[2]
    assert src.startswith("# orch-sync-agent")  # what `ps` shows on the nodes
    assert "from orchestrator" not in src and "import orchestrator" not in src
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(b"\0" * 1000)
    res = subprocess.run([sys.executable, "-I", "-c", src, "fingerprint", str(tmp_path / "m")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=DEADLINE_S)  # fmt: skip
    assert res.returncode == 0, res.stderr
    files = json.loads(res.stdout.splitlines()[-1])["files"]
    assert files == [["w.bin", 1000, hashlib.sha256(b"\0" * 1000).hexdigest()]]
