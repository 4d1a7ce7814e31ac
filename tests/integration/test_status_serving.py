"""The serving section of `orch status` on the test bed: the tiny model served by Ray Serve LLM
(``served_tiny``, tests/fixtures/serving.py: real SSH hosts, real Ray, real vLLM on CPU).

- The KV-cache capacity shown is the one the engine logged: the replica's worker log is read
  here independently (the host's Ray temp dir, as this machine sees it) and compared.
- The live figures move: `orch bench` run between two status reads shows up in the TTFT/TPOT window
  of the second read (Ray exports the engine's series every few seconds: polled, bounded).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from orchestrator.cli import main
from orchestrator.status.serving import node_refs
from orchestrator.workflows.status import ServingOptions, StatusDeps, gather_serving
from orchestrator.workflows.status_nodes import status_nodes
from tests.fixtures.serving import MAX_MODEL_LEN

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]

REQUESTS = 6
EXPORT_WAIT_S = 60.0  # Ray's metrics agent exports every few seconds; a loaded machine is slower


def _status(served, deps, window_s: float = 300.0):
    manifest = served.manifest
    report = status_nodes(manifest, deps)
    sdeps = StatusDeps.from_cluster(deps)
    sdeps.environ = {manifest.serve.api_key_env: served.api_key}
    return gather_serving(manifest, sdeps, node_refs(report.nodes), ServingOptions(window_s=window_s))


def _logged_line(served, serving) -> str:
    """The engine's capacity line, read straight from the replica's worker log on its host."""
    engine = next(r for d in serving.deployments if d.name.startswith("LLMServer") for r in d.replicas if r.state == "RUNNING")
    host = served.cluster.bed.host(engine.node)
    # session_latest points at the path as the host sees it (its private temp dir is bind-mounted
    # over the bed's shared one): follow only the link's last part under the host's own folder.
    logs = host.ray_dir / os.readlink(host.ray_dir / "session_latest").rstrip("/").rsplit("/", 1)[-1] / "logs"
    files = sorted(logs.glob(f"worker-{engine.worker_id}-*-{engine.pid}.out"))
    assert files, f"no worker log of replica {engine.replica_id} under {logs}: {sorted(p.name for p in logs.glob('worker-*'))}"
    return next(line for line in files[0].read_text(errors="replace").splitlines() if "KV cache size:" in line)


def test_capacity_equals_the_engine_log_and_metrics_move(served_tiny, monkeypatch, capsys):
    served = served_tiny
    monkeypatch.setenv(served.manifest.serve.api_key_env, served.api_key)
    deps = served.cluster.deps()
    first = _status(served, deps)
    assert first.app_status == "RUNNING", first.problems
    assert first.probe is not None and first.probe.ok, first.probe
    assert first.healthy, [p.to_dict() for p in first.problems]

    (model,) = first.models
    line = _logged_line(served, first)
    tokens = int(re.search(r"KV cache size: ([\d,]+) tokens", line).group(1).replace(",", ""))
    length, conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", line).groups()
    assert model.capacity.source == "log"
    assert model.capacity.tokens == tokens
    assert model.capacity.max_model_len == int(length.replace(",", "")) == MAX_MODEL_LEN
    assert model.capacity.max_concurrency == float(conc)
    # calibration: what the engine logged against the plan the rollout stored, recorded for `orch plan --cluster`
    cal = first.calibration
    assert cal is not None and cal["measured"]["kv_tokens"] == tokens, cal
    assert cal["predicted"]["kv_tokens"] == tokens and cal["error"]["kv_tokens"] == 0.0, cal  # CPU: the size orch rendered, exact
    assert cal["gpu_type"] == "cpu" and cal["tp"] == 1 and cal["pp"] == 1
    assert cal["platform"] == "cpu"  # "CPU KV cache size" / cpu_worker.py: the engine said where it ran
    # the rollout itself recorded it once its gate passed, before any status read
    rolled = served.first.calibration
    assert rolled is not None, served.first.calibration_note
    assert rolled["revision"] == served.first.revision and rolled["platform"] == "cpu" and rolled["measured"]["kv_tokens"] == tokens
    assert served.first.calibration_note.startswith("calibration: recorded what the engine logged")

    before = model.live.ttft.count if model.live and model.live.ttft else 0
    # the load comes from `orch bench` against the cluster (its endpoint, its key variable)
    code = main(served.cluster.cli(
        "bench", served.manifest_path, "--concurrency", "2", "--requests", str(REQUESTS),
        "--prompt-tokens", "16", "--output-tokens", "8", "--warmup", "0", "--json",
    ))  # fmt: skip
    assert code == 0
    bench = json.loads(capsys.readouterr().out)
    assert bench["levels"][0]["succeeded"] == REQUESTS
    # A bench of the cluster's endpoint is recorded against the revision serving it (the levels a
    # later `orch rollout --slo-gate` replays); this manifest sets no slo:, so no goodput is judged.
    serving_rev = deps.state.current_revision(served.manifest.name).number
    assert (bench["goodput"]["revision"], bench["goodput"]["objective"], bench["goodput"]["goodput"]) == (serving_rev, None, None)

    def moved():
        s = _status(served, deps)
        live = s.models[0].live if s.models else None
        # The window counts the probe of each read too: at least the requests sent here.
        return s if live and live.ttft and live.window_s is not None and live.ttft.count >= REQUESTS else None

    second = served.cluster.wait_for(moved, timeout=EXPORT_WAIT_S, interval=5.0)
    assert second is not None, f"the TTFT window never counted the {REQUESTS} requests (first read counted {before})"
    live = second.models[0].live
    assert live.tpot.count >= REQUESTS and live.ttft.p50 is not None and live.ttft.p95 >= live.ttft.p50
    assert second.models[0].capacity.tokens == tokens
    # The engine replica's prefix cache, from its own counters: every prompt was looked up (16
    # tokens each, at least), whatever share of them it found.
    engine = next(r for d in second.deployments if d.name.startswith("LLMServer") for r in d.replicas if r.state == "RUNNING")
    cache = engine.prefix_cache
    assert cache is not None and cache.queries >= REQUESTS * 16 and 0.0 <= cache.hit_rate <= 1.0, cache
