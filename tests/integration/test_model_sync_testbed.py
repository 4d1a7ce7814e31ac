"""`orch model sync` over real SSH on the test bed: three hosts whose model stores are private
(each host bind-mounts its own dir at the bed's Ray temp dir), a small generated model (MBs).

Mixed starting states -> every fingerprint matches the source and preflight has no MODEL_PATH_*
finding; a sync killed half-way leaves no model at the final path and the next one sends less;
a host whose store is a 1 MiB tmpfs is refused before anything is sent; after every sync nothing
listens on the hosts but their sshd (`ss` in each host's namespace)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.manifest.load import load_manifest
from orchestrator.nodes import inventory
from orchestrator.preflight.run import run_checks
from orchestrator.remote.connect import open_runners
from tests.conftest import REPO
from tests.testbed import HostSpec

pytestmark = pytest.mark.integration

DEADLINE_S = 120
SHARD_BYTES = 3 << 20


def make_model(root: Path, seed: int) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "seed": seed}))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "seed": seed}))
    for i in range(1, 4):
        (root / f"model-0000{i}-of-00003.safetensors").write_bytes(os.urandom(SHARD_BYTES))
    return root


def sha256sum(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): subprocess.run(["sha256sum", str(p)], capture_output=True, text=True, check=True).stdout.split()[0]
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.fixture(scope="module")
def bed(testbed_factory):
    bed = testbed_factory.make([HostSpec("none", name=f"ms{i}") for i in range(3)], name="model-sync")
    yield bed
    bed.close()


@pytest.fixture
def store(bed):
    """A fresh, empty model store (a private folder per host) for each test."""
    name = f"models-{os.urandom(3).hex()}"
    for h in bed.hosts:
        (h.ray_dir / name).mkdir()
    yield name
    for h in bed.hosts:
        bed.ns_exec(h, ["umount", str(bed.ray_temp_dir / name)], check=False)
        shutil.rmtree(h.ray_dir / name, ignore_errors=True)


def manifest_file(bed, store: str, tmp_path: Path) -> Path:
    doc = bed.manifest_dict(accelerator="cpu", model_store=str(bed.ray_temp_dir / store))
    for node in doc["nodes"]:
        node["interface"] = "eth0"
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def orch(*args: str, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "--state-dir", str(state), *args],
        capture_output=True, text=True, timeout=DEADLINE_S, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def listeners(bed, h) -> set[str]:
    """Listening TCP sockets of the host, as `ss` in its namespace prints them."""
    out = bed.ns_exec(h, ["ss", "-Htln"]).stdout
    return {line.split()[3] for line in out.splitlines() if line.strip()}


def agents_running(bed, h) -> list[str]:
    out = bed.ns_exec(h, ["ps", "-eo", "pid,args"]).stdout
    return [line for line in out.splitlines() if "orch-sync-agent" in line or "def receive(stdin, plan)" in line]


def preflight_model(bed, manifest_path: Path, final: str) -> tuple[list[str], dict]:
    """Preflight's MODEL_PATH_* findings and each host's model fingerprint, as `orch up` probes them."""
    manifest = load_manifest(manifest_path.read_text(), str(manifest_path))
    with open_runners(manifest, bed.known_hosts) as runners:
        facts = inventory.gather_all(runners, manifest, clock=time.time, model_path=final)
    findings = sorted(f"{f.code}@{f.node}" for f in run_checks(manifest, facts) if f.code.startswith("MODEL_PATH"))
    return findings, {n: f.model.fingerprint for n, f in facts.items()}


def test_mixed_states_end_identical_and_preflight_is_clean(bed, store, tmp_path):
    src = make_model(tmp_path / "tiny-sync", seed=1)
    h0, h1, h2 = bed.hosts
    # h0 lacks the model; h1 has one shard corrupted in place (same size); h2 an older copy
    make_model(h1.ray_dir / store / "tiny-sync", seed=1)
    for rel, data in ((p.name, p.read_bytes()) for p in src.iterdir()):
        (h1.ray_dir / store / "tiny-sync" / rel).write_bytes(data)
    with open(h1.ray_dir / store / "tiny-sync" / "model-00002-of-00003.safetensors", "r+b") as f:
        f.seek(4096)
        f.write(b"\x00" * 512)
    make_model(h2.ray_dir / store / "tiny-sync", seed=0)
    shutil.copy(src / "model-00001-of-00003.safetensors", h2.ray_dir / store / "tiny-sync")
    (h2.ray_dir / store / "tiny-sync" / "old-extra.bin").write_bytes(b"x" * 100)
    manifest = manifest_file(bed, store, tmp_path)
    final = str(bed.ray_temp_dir / store / "tiny-sync")
    before = {h.name: listeners(bed, h) for h in bed.hosts}
    findings, prints = preflight_model(bed, manifest, final)
    # ms0 (the head) has nothing, so ms1 and ms2 are compared with each other: one DIFFERS
    assert "MODEL_PATH_MISSING@ms0" in findings and any(f.startswith("MODEL_PATH_DIFFERS") for f in findings)

    dry = orch("model", "sync", str(manifest), "--model", str(src), "--dry-run", "--json", state=tmp_path / "st")
    assert dry.returncode == 0, dry.stderr
    plan = {n["node"]: n for n in json.loads(dry.stdout)["plan"]["nodes"]}
    assert len(plan["ms0"]["receive_files"]) == 5
    assert plan["ms1"]["receive_files"] == ["model-00002-of-00003.safetensors"]
    assert sorted(plan["ms2"]["receive_files"]) == ["config.json", "model-00002-of-00003.safetensors",
                                                    "model-00003-of-00003.safetensors", "tokenizer.json"]  # fmt: skip
    assert plan["ms2"]["remove_files"] == ["old-extra.bin"]
    assert not (h0.ray_dir / store / "tiny-sync").exists()  # a dry run copies nothing

    res = orch("model", "sync", str(manifest), "--model", str(src), "--json", state=tmp_path / "st")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["action"] == "synced" and all(n["verified"] for n in out["nodes"])
    # the source sent the union of what the nodes lacked once, not once per node
    assert out["sent_bytes"] == 3 * SHARD_BYTES + (src / "config.json").stat().st_size + (src / "tokenizer.json").stat().st_size
    want = sha256sum(src)
    for h in bed.hosts:
        assert sha256sum(h.ray_dir / store / "tiny-sync") == want, h.name
        assert sorted(p.name for p in (h.ray_dir / store).iterdir()) == ["tiny-sync"]  # no staging left
    findings, after = preflight_model(bed, manifest, final)
    assert findings == []
    assert len(set(after.values())) == 1
    # the corrupted shard (same size, same safetensors names) changed preflight's fingerprint
    assert prints["ms1"] != after["ms1"] and prints["ms2"] != after["ms2"]
    assert {h.name: listeners(bed, h) for h in bed.hosts} == before
    assert all(agents_running(bed, h) == [] for h in bed.hosts)

    again = orch("model", "sync", str(manifest), "--model", str(src), "--json", state=tmp_path / "st")
    assert again.returncode == 0 and json.loads(again.stdout)["action"] == "noop"


def test_killed_sync_leaves_no_partial_model_and_resumes(bed, store, tmp_path):
    src = make_model(tmp_path / "tiny-resume", seed=2)
    manifest = manifest_file(bed, store, tmp_path)
    total = sum(p.stat().st_size for p in src.iterdir())
    argv = [sys.executable, "-m", "orchestrator", "--state-dir", str(tmp_path / "st"), "model", "sync", str(manifest),
            "--model", str(src), "--max-rate", "2"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = [h.ray_dir / store / ".tiny-resume.orch-sync" for h in bed.hosts]
    deadline = time.monotonic() + DEADLINE_S
    # kill it once a shard has arrived whole on some host (the stream is paced at 2 MiB/s)
    while not any((s / "model-00001-of-00003.safetensors").exists() for s in staging):
        assert proc.poll() is None and time.monotonic() < deadline, "the sync ended before it could be interrupted"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(DEADLINE_S)
    for h in bed.hosts:
        assert not (h.ray_dir / store / "tiny-resume").exists(), h.name
    deadline = time.monotonic() + DEADLINE_S
    while any(agents_running(bed, h) for h in bed.hosts):  # the agents see their stdin close
        assert time.monotonic() < deadline, [agents_running(bed, h) for h in bed.hosts]
        time.sleep(0.1)
    res = orch("model", "sync", str(manifest), "--model", str(src), "--json", state=tmp_path / "st")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["action"] == "synced"
    assert 0 < out["sent_bytes"] < total
    for h in bed.hosts:
        assert sha256sum(h.ray_dir / store / "tiny-resume") == sha256sum(src)


def test_low_disk_refused_before_sending(bed, store, tmp_path):
    src = make_model(tmp_path / "tiny-big", seed=3)
    small = bed.hosts[1]
    bed.ns_exec(small, ["mount", "-t", "tmpfs", "-o", "size=1m", "orch-small", str(bed.ray_temp_dir / store)])
    manifest = manifest_file(bed, store, tmp_path)
    res = orch("model", "sync", str(manifest), "--model", str(src), state=tmp_path / "st")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "ms1: needs" in res.stderr and "refused before sending anything" in res.stderr
    for h in bed.hosts:
        assert list((h.ray_dir / store).iterdir()) == [], h.name  # nothing was sent anywhere
    assert bed.ns_exec(small, ["ls", "-A", str(bed.ray_temp_dir / store)]).stdout == ""


def test_from_a_node_the_data_goes_node_to_node_on_the_interface(bed, store, tmp_path):
    h0, h1, h2 = bed.hosts
    src = make_model(h2.ray_dir / store / "tiny-peer", seed=4)  # only ms2 holds it, in the store
    manifest = manifest_file(bed, store, tmp_path)
    before = {h.name: listeners(bed, h) for h in bed.hosts}
    res = orch("model", "sync", str(manifest), "--model", "tiny-peer", "--from", "ms2", "--json", state=tmp_path / "st")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["action"] == "synced" and out["plan"]["chain"] == ["ms0", "ms1"]
    # each agent listened on its host's eth0 address (the manifest's interface), nothing wider
    assert out["addresses"] == {h.name: h.address for h in bed.hosts}
    assert {n: a.rsplit(":", 1)[0] for n, a in out["listeners"].items()} == {"ms0": h0.address, "ms1": h1.address}
    nodes = {n["node"]: n for n in out["nodes"]}
    assert nodes["ms2"]["action"] == "up to date"
    # the model's files (the source's own fingerprint cache, a dot file, is not part of it)
    assert out["sent_bytes"] == sum(p.stat().st_size for p in src.iterdir() if not p.name.startswith("."))
    for h in (h0, h1):
        assert sha256sum(h.ray_dir / store / "tiny-peer") == sha256sum(src)
    assert {h.name: listeners(bed, h) for h in bed.hosts} == before
