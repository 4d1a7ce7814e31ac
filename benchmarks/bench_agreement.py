"""How closely orch's client-side TTFT/TPOT medians agree with vLLM's own histograms, per level.

    .venv/bin/python benchmarks/bench_agreement.py cluster-templates/local.yaml --tokenizer DIR [--runs 2]
    .venv/bin/python benchmarks/bench_agreement.py --url http://127.0.0.1:8000 --model tiny --tokenizer DIR

Runs ``orch bench --concurrency 1,4,16 --requests 16 --prompt-tokens 3072 --output-tokens 32 --json``
(the sweep of docs/bench.md's table) ``--runs`` times against a running deployment and prints one
JSON object: for every run, level and figure (ttft, tpot) vLLM's median, orch's median read through
vLLM's buckets, orch's exact median, the relative difference and orch's "agrees within 10%"
verdict. This is a measurement, not a pass/fail test: the suite
(tests/integration/test_bench_cluster.py) asserts only what holds on any host (exact request and
token counts, vLLM counting exactly each level's requests). Extra arguments after ``--`` go to
``orch bench`` unchanged (for example ``-- --concurrency 1,4``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP = ["--concurrency", "1,4,16", "--requests", "16", "--prompt-tokens", "3072", "--output-tokens", "32"]


def one_run(target: list[str], tokenizer: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="orch-agreement-") as out:
        argv = [sys.executable, "-m", "orchestrator", "bench", *target, "--tokenizer", tokenizer, *SWEEP, *extra,
                "--out", out, "--json"]  # fmt: skip
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": f"orch bench exited {proc.returncode}", "stderr": proc.stderr[-2000:]}
    result = json.loads(proc.stdout)
    levels = []
    for level in result["levels"]:
        row: dict = {"concurrency": level["concurrency"], "succeeded": level["succeeded"]}
        for fig in ("ttft", "tpot"):
            check = level["crosscheck"][fig]
            row[fig] = {k: check.get(k) for k in ("server_count", "server_median_ms", "client_median_binned_ms",
                                                  "client_median_exact_ms", "median_diff", "agrees")}  # fmt: skip
        levels.append(row)
    return {"seed": result.get("seed"), "levels": levels}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cluster_yaml", nargs="?", help="the deployment's manifest (or --url/--model)")
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--tokenizer", required=True, help="the served model's folder (exact prompt lengths)")
    ap.add_argument("--runs", type=int, default=1)
    # Everything after "--" is orch bench's: split it off before argparse, which would otherwise
    # take the first of those words for the optional CLUSTER_YAML positional.
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, unknown = ap.parse_known_args(argv[:cut])
    extra = [*unknown, *argv[cut + 1 :]]
    target = [args.cluster_yaml] if args.cluster_yaml else ["--url", args.url, "--model", args.model]
    runs = [one_run(target, args.tokenizer, extra) for _ in range(args.runs)]
    print(json.dumps({"sweep": " ".join(SWEEP), "runs": runs}))
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
