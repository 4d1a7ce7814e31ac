#!/usr/bin/env bash
# `make demo`: the local main job, end to end on this machine (CPU, no download).
#   1. build the tiny random-weight Llama where the manifest's model_store says models live
#   2. orch up cluster-templates/local.yaml          (preflight, Ray with token auth)
#   3. orch rollout --model tiny                     (Ray Serve LLM app, gated by a real completion)
#   4. a chat completion with the API key, and its answer
#   5. orch status
# The API key: $ORCH_API_KEY (the manifest's serve.api_key_env) when set; otherwise one is
# generated once, kept in <state dir>/demo-api-key (mode 0600) and never printed.
# `make demo-down` stops it (orch down).
set -euo pipefail

cd "$(dirname "$0")/.."
BIN="${BIN:-.venv/bin}"
MANIFEST="${MANIFEST:-cluster-templates/local.yaml}"
STATE_DIR="${ORCH_STATE_DIR:-$HOME/.orch}"
export ORCH_STATE_DIR="$STATE_DIR"

say() { printf '\n== %s\n' "$*"; }

# The variable that holds the key, and the model store, as the manifest names them.
read -r KEY_VAR MODEL_STORE HTTP_PORT < <("$BIN/python" - "$MANIFEST" <<'PY'
import sys
from orchestrator.manifest.load import load_manifest_file
m = load_manifest_file(sys.argv[1])
print(m.serve.api_key_env, m.model_store or "", m.serve.http_port)
PY
)

if [ -z "${!KEY_VAR:-}" ]; then
  KEY_FILE="$STATE_DIR/demo-api-key"
  if [ ! -s "$KEY_FILE" ]; then
    mkdir -p "$STATE_DIR"
    (umask 077 && "$BIN/python" -c 'import secrets; print("orch-" + secrets.token_urlsafe(32))' > "$KEY_FILE")
  fi
  export "$KEY_VAR"="$(cat "$KEY_FILE")"
  echo "API key: \$$KEY_VAR was not set; using the one stored in $KEY_FILE (mode 0600)."
  echo "         To call the endpoint yourself: export $KEY_VAR=\"\$(cat $KEY_FILE)\""
fi

say "1/5 tiny model (random weights, built locally in a few seconds)"
"$BIN/python" - "$MODEL_STORE" <<'PY'
import sys
from pathlib import Path
from orchestrator.plan.tinymodel import build_tiny_model
store = sys.argv[1]
dest = Path(store).expanduser() / "tiny" if store else None
print(f"model folder: {build_tiny_model(dest)}")
PY

say "2/5 orch up $MANIFEST"
"$BIN/orch" up "$MANIFEST"

say "3/5 orch rollout --model tiny (Ray Serve LLM on CPU takes about two minutes to come up)"
"$BIN/orch" rollout --model tiny "$MANIFEST"

say "4/5 a chat completion through the endpoint, with the API key"
"$BIN/python" - "$KEY_VAR" "$HTTP_PORT" <<'PY'
import os, sys
import httpx
key, port = os.environ[sys.argv[1]], sys.argv[2]
url = f"http://127.0.0.1:{port}/v1/chat/completions"
body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello! Who are you?"}], "max_tokens": 24}
resp = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)
resp.raise_for_status()
data = resp.json()
print(f"POST {url} -> {resp.status_code}")
print(f"answer ({data['usage']['completion_tokens']} tokens, random weights so it is noise): {data['choices'][0]['message']['content']!r}")
unauth = httpx.post(url, json=body, timeout=60)
print(f"the same request without the key -> {unauth.status_code}")
PY

say "5/5 orch status"
"$BIN/orch" status "$MANIFEST"
