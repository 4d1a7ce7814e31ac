"""Capture Serve's start-failure messages and the failed replicas' logs on the 3-host GPU-path
bed of tests/integration/test_gpu_path.py, and time the rollouts (the data of
tests/data/serve/start-failures/, see SOURCES.md there). Root and the test bed needed; it starts
Ray and several vLLM engines, so it runs under the machine's heavy lock:

    /work/bin/heavy .venv/bin/python -m pytest -q -s -p no:cacheprovider scripts/capture_start_failures.py

A pytest module so that it gets the test bed's fixtures (the root conftest.py registers them); it
lives outside tests/ (``testpaths``), so the suites never collect it. Cases, each beside a TP=1
revision that keeps serving:
- ``wrong-nic``: ``orch rollout --tp 2`` with ``interface: lo`` on every node, with the
  fail-fast switched off (nothing watches the start failures), so Serve's three attempts and its
  DEPLOY_FAILED are seen and timed (1,475 s at load average 20-38 when captured);
- ``missing-path``, ``bad-arch``, ``bad-engine-arg``: TP=1 candidates that fail deterministically
  on CPU, with the fail-fast in place.
A thread polls ``GET /api/serve/applications/`` every second and keeps each payload whose engine
deployment's message changed; every host's Ray session logs are kept as a tarball per case.
Output: /tmp/failfast-capture (notes.txt has the errors orch printed). Redact the API key
(``REDACTED-TEST-KEY``) before copying a payload into tests/data.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.doctor.diagnose import node_temp_dirs
from orchestrator.errors import RolloutFailed
from orchestrator.workflows.cluster import UpOptions, up
from orchestrator.workflows.down import down
from orchestrator.workflows.rollout import RolloutOptions
from tests.fixtures.cluster import testbed_manifest as manifest_text
from tests.integration.test_gpu_path import _served, gpu_bed  # noqa: F401
from tests.integration.test_rollout import BackgroundClient

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]

OUT = Path("/tmp/failfast-capture")


class Watcher:
    """Polls Serve's raw JSON every second; keeps every payload whose candidate deployment message changed."""

    def __init__(self, cluster, case: str, live: str) -> None:
        self.cluster, self.case, self.live = cluster, case, live
        self.seen: list[tuple[float, str, str, str]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.n = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        last = None
        with self.cluster.dashboard() as dash:
            while not self.stop.is_set():
                try:
                    payload = dash.get_json("/api/serve/applications/")
                except Exception as exc:
                    self.seen.append((time.monotonic() - self.t0, "ERR", "", repr(exc)[:200]))
                    time.sleep(1)
                    continue
                for name, app in (payload.get("applications") or {}).items():
                    if name == self.live:
                        continue
                    for dname, dep in (app.get("deployments") or {}).items():
                        key = (name, app.get("status"), dname, dep.get("status"), dep.get("message"))
                        if key != last and dname.startswith("LLMServer"):
                            last = key
                            t = time.monotonic() - self.t0
                            self.seen.append((t, f"{name} {app.get('status')}", f"{dname} {dep.get('status')}",
                                              (dep.get("message") or "")[:300]))
                            self.n += 1
                            (OUT / f"{self.case}-status-{self.n:02d}-{int(t)}s.json").write_text(json.dumps(payload, indent=1))
                time.sleep(1)

    def __enter__(self):
        self.t0 = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)
        (OUT / f"{self.case}-timeline.txt").write_text("\n".join(f"{t:7.1f}s | {a} | {d} | {m!r}" for t, a, d, m in self.seen))


PID_IP = re.compile(r"pid=(\d+), ip=([0-9.]+)")


def _copy_replica_logs(cluster, case: str) -> None:
    """Every host's whole session log folder, as a tarball."""
    manifest = cluster.manifest
    for host in cluster.bed.hosts:
        node = manifest.node(host.name)
        for temp in node_temp_dirs(manifest, node):
            logs = Path(temp) / "session_latest" / "logs"
            if logs.is_dir():
                subprocess.run(["tar", "czf", str(OUT / f"{case}-{host.name}-logs.tgz"), "-C", str(logs), "."], check=False)
                break


def test_capture(gpu_bed, tiny_model_dir, monkeypatch, tmp_path):  # noqa: F811 (the fixture imported above)
    monkeypatch.setenv("ORCH_STATE_DIR", str(tmp_path / "orch-state"))  # never the shared ~/.orch
    OUT.mkdir(exist_ok=True)
    cluster = gpu_bed
    cluster.ups.append(up(cluster.manifest, cluster.deps(cluster.up_log.append), UpOptions(timeout=240, collective_check=False)))
    old = _served(cluster, cluster.manifest_path, Path(tiny_model_dir))
    old.first = old.rollout(tp=1)
    live = old.first.app_name
    notes = []
    bad = None
    try:
        # 1. wrong interface, TP=2 across two hosts (the code as it is: the "before" figure)
        bad_path = cluster.manifest_path.with_name(cluster.manifest_path.stem + "-wrong-nic.yaml")
        bad_path.write_text(manifest_text(cluster.bed, model_store=Path(tiny_model_dir).parent,
                                          node_overrides={h.name: {"interface": "lo"} for h in cluster.bed.hosts}))
        bad = _served(cluster, bad_path, Path(tiny_model_dir), api_key=old.api_key)
        with monkeypatch.context() as m:
            # the code before the fail-fast: nothing watches the start failures
            m.setattr("orchestrator.workflows.rollout.StartWatch", lambda *a, **k: (lambda app: None))
            with BackgroundClient(old) as client, Watcher(cluster, "wrong-nic", live) as w:
                t0 = time.monotonic()
                with pytest.raises(RolloutFailed) as err:
                    bad.rollout(RolloutOptions(timeout_s=1500.0), tp=2)
                took = time.monotonic() - t0
        notes.append(f"wrong-nic (old path): rollout failed after {took:.0f} s (watcher clock {time.monotonic() - w.t0:.0f} s); ok={client.ok} fail={client.fail}; {err.value}")
        _copy_replica_logs(cluster, "wrong-nic")
        # 2. CPU-producible deterministic cases, TP=1 beside the serving revision
        store = Path(tiny_model_dir).parent
        arch_dir = store / "tiny-badarch-failfast"
        if arch_dir.exists():
            shutil.rmtree(arch_dir)
        shutil.copytree(tiny_model_dir, arch_dir)
        cfg = json.loads((arch_dir / "config.json").read_text())
        cfg["architectures"] = ["OrchNoSuchForCausalLM"]
        (arch_dir / "config.json").write_text(json.dumps(cfg, indent=2))
        cases = {
            "missing-path": dict(model_path="/nonexistent/models/tiny-missing", model="tiny"),
            "bad-arch": dict(model=str(arch_dir)),
            "bad-engine-arg": dict(engine_args=(("scheduling_policy", "lifo"),)),
        }
        for case, req in cases.items():
            with Watcher(cluster, case, live) as w:
                t0 = time.monotonic()
                try:
                    old.rollout(RolloutOptions(timeout_s=600.0, check_model_path=False), tp=1, **req)
                    notes.append(f"{case}: rollout SUCCEEDED?!")
                except RolloutFailed as exc:
                    notes.append(f"{case}: failed after {time.monotonic() - t0:.0f} s (watcher clock {time.monotonic() - w.t0:.0f} s): {exc} || hint: {exc.hint}")
                except Exception as exc:
                    notes.append(f"{case}: {type(exc).__name__}: {exc}")
            _copy_replica_logs(cluster, case)
        shutil.rmtree(arch_dir, ignore_errors=True)
    finally:
        (OUT / "notes.txt").write_text("\n".join(notes) + "\n" + "\n".join(old.log + (bad.log if bad is not None else [])))
        down(cluster.manifest, cluster.deps())
