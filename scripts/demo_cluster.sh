#!/usr/bin/env bash
# `make demo-cluster`: the GPU serving path on two test hosts of this machine (needs root).
#   1. two test hosts (network namespaces with their own sshd), one described H100 each, whose
#      Python carries the test bed's vLLM device-key stand-in (tests/testbed/vllm_gpu_standin/):
#      vLLM's CPU build then runs its Ray executor, the layout orch renders for GPUs
#   2. orch up                     (the NCCL/Gloo interface derived from the probed NICs)
#   3. orch rollout --tp 2 --dry-run, then for real: ONE replica whose two tensor-parallel
#      workers run on the two hosts (TP across nodes: asked for explicitly, with a warning)
#   4. where each worker runs, a completion with the API key, and orch status
#   5. orch down and the test bed removed (DEMO_KEEP=1 keeps both)
# `make demo` stays the one-node default.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN="${BIN:-.venv/bin}"
if [ "$(id -u)" != 0 ]; then
  echo "error: make demo-cluster needs root (network namespaces, sshd per test host)" >&2
  exit 1
fi
WORK="$(mktemp -d /tmp/orch-demo-cluster.XXXXXX)"
export ORCH_STATE_DIR="$WORK/state"
export ORCH_API_KEY="orch-demo-$("$BIN/python" -c 'import secrets; print(secrets.token_hex(16))')"
say() { printf '\n== %s\n' "$*"; }

say "1/5 two test hosts x 1 described H100, vLLM device-key stand-in"
RUN="$("$BIN/python" scripts/testbed.py up --hosts 2 --gpus 1xH100-80GB --ib0 --vllm-gpu --name demo-cluster --json \
  | "$BIN/python" -c 'import json, sys; print(json.load(sys.stdin)["run"])')"
cleanup() {
  if [ "${DEMO_KEEP:-0}" != 1 ]; then
    "$BIN/orch" down "$WORK/cluster.yaml" >/dev/null 2>&1 || true
    "$BIN/python" scripts/testbed.py down "$RUN" >/dev/null || true
  else
    echo "kept: test bed $RUN, manifest $WORK/cluster.yaml (ORCH_STATE_DIR=$ORCH_STATE_DIR)"
  fi
}
trap cleanup EXIT
"$BIN/python" - "$RUN" "$WORK" <<'PY'
import sys
from pathlib import Path
import yaml
from orchestrator.plan.tinymodel import build_tiny_model
run, work = sys.argv[1], Path(sys.argv[2])
doc = yaml.safe_load(Path(f"/var/tmp/orchtb/{run}/cluster.yaml").read_text())
model = build_tiny_model(work / "models" / "tiny")
# Lean Ray for a small machine (logical CPUs are bookkeeping), the model where the nodes read it.
doc["ray"].update({"object_store_memory": "150MB", "num_cpus": 8})
doc["env"] = {"VLLM_CPU_KVCACHE_SPACE": "1"}
doc["model_store"] = str(model.parent)
(work / "cluster.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
print(f"manifest {work / 'cluster.yaml'}; model {model}")
PY

say "2/5 orch up"
"$BIN/orch" up "$WORK/cluster.yaml" --skip-collective-check  # stand-in GPUs: torch is a CPU build, NCCL cannot run

say "3/5 orch rollout --model tiny --tp 2 (plan first, then for real: a few minutes on CPU)"
"$BIN/orch" rollout --model tiny --tp 2 --max-model-len 2048 --dry-run "$WORK/cluster.yaml"
"$BIN/orch" rollout --model tiny --tp 2 --max-model-len 2048 "$WORK/cluster.yaml"

say "4/5 where the workers run, and an answer through the endpoint with the API key"
"$BIN/python" - "$RUN" "$WORK/cluster.yaml" <<'PY'
import os, subprocess, sys
import httpx
from orchestrator.manifest.load import load_manifest_file
run, path = sys.argv[1], sys.argv[2]
m = load_manifest_file(path)
for i, node in enumerate(m.nodes):
    ps = subprocess.run(["ip", "netns", "exec", f"orchtb-{run}-{i}", "ps", "-eo", "pid=,args="], capture_output=True, text=True)
    for line in ps.stdout.splitlines():
        if "RayWorkerProc" in line:
            print(f"{node.name} ({node.host}): {line.strip()[:100]}")
r = httpx.post(f"http://{m.head.host}:{m.serve.http_port}/v1/completions", timeout=120,
               headers={"Authorization": f"Bearer {os.environ['ORCH_API_KEY']}"},
               json={"model": "tiny", "prompt": "Tensor parallelism across two hosts", "max_tokens": 16})
r.raise_for_status()
body = r.json()
print(f"answer ({body.get('system_fingerprint')}): {body['choices'][0]['text']!r}")
PY

say "5/5 orch status"
"$BIN/orch" status "$WORK/cluster.yaml"
