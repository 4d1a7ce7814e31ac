"""A CPU engine on an AMX CPU answers a first prompt of 2 tokens (orch's worker extension).

vLLM 0.32's CPU attention runs AMX kernels whenever the CPU has the flags, but its worker never
asks Linux for the tile registers: only a linear layer of more than 4 tokens happens to make
oneDNN ask. An engine whose first forward pass is a prompt of up to 4 tokens dies with SIGILL
(``Worker proc VllmWorker-0 died unexpectedly (exit code: -4)``), which is how the side-by-side
rollout test's client (``"hi"``, 2 tokens) killed every replica of the session on an AMX host.
orch renders ``worker_extension_cls: orch_serve_hooks.AmxTileData`` for a CPU engine
(``serve.node_hooks``); resolving it in the worker asks for the tiles. Here vLLM resolves it
itself, from the module file orch writes to the nodes, in a bare engine whose first request is
2 token ids. On a CPU without AMX there is nothing to ask for: the test is skipped there (the
hardware, not the bed, decides). docs/rollout.md, "AMX"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.serve import node_hooks
from tests.fixtures.serving import TEST_KV_CACHE_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ENGINE = """
import sys
from vllm import LLM, SamplingParams

def main():
    llm = LLM(model=sys.argv[1], max_model_len=1024, enforce_eager=True, kv_cache_memory_bytes=int(sys.argv[2]),
              worker_extension_cls=sys.argv[3])
    out = llm.generate([{"prompt_token_ids": [1, 5]}], SamplingParams(max_tokens=2, temperature=0))
    print("ANSWER", len(out[0].outputs[0].token_ids), flush=True)

if __name__ == "__main__":
    main()
"""


def _cpu_has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.mark.skipif(not _cpu_has_amx(), reason="this CPU has no AMX tiles: vLLM's CPU attention takes its other kernels")
def test_first_prompt_of_two_tokens_is_answered_on_an_amx_cpu(tiny_model_dir, tmp_path):
    folder = tmp_path / "python"
    folder.mkdir()
    (folder / f"{node_hooks.MODULE}.py").write_text(node_hooks.source())
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    # One compute thread, unpinned, as orch renders a CPU engine on a 2-core node (serve.config).
    env = {**os.environ, "PYTHONPATH": str(folder), "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    argv = [sys.executable, str(script), str(tiny_model_dir), str(TEST_KV_CACHE_BYTES), node_hooks.AMX_CLASS]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the engine's own processes, whatever happened
        except ProcessLookupError:
            pass
    tail = "\n".join(out.splitlines()[-15:])
    assert "died unexpectedly (exit code: -4)" not in out, tail  # SIGILL: the tiles were never asked for
    assert proc.returncode == 0 and "ANSWER 2" in out, tail
    assert node_hooks.AMX_GRANTED_LINE in out, tail  # the worker resolved orch's class and the kernel granted the tiles
