"""orch's planner against three public estimators on the same public vLLM start-up logs.

    python benchmarks/planner_vs_peers.py [--venv DIR] [--keep] [--orch-only]

Installs the peers into a throwaway venv (``pip install llm-d-planner[estimation]==0.3.3
hf-mem==0.5.6 aiconfigurator==0.12.0``), runs them and orch on every row of
tests/data/planner/vllm_logs.json (fitting and held-out sets) from the local config.json files in
tests/data/planner/configs, and prints one JSON object: each tool's median and maximum absolute
error on the KV tokens vLLM printed (on the KV memory for the rows that printed only memory), per
set, and per row.

Local-path workaround: llm-d-planner and hf-mem read the weights' sizes from the checkpoint's
safetensors headers on the Hugging Face Hub (llm-d-planner: ``model_params_by_dtype``; hf-mem:
``fetch_safetensors_metadata``), and nothing here reaches the Hub. The script writes the headers the
Hub would serve (tensor names, shapes and dtypes as the checkpoint stores them: bf16 weights; for
FP8 checkpoints F8_E4M3 linear weights with their F32 scales, embeddings and lm_head in bf16) from
each config.json, and hands them to the peers in place of the download: llm-d-planner's
``model_params_by_dtype`` is replaced by the per-dtype counts of those headers, hf-mem's
``parse_safetensors_metadata`` is called on them directly.

How each tool's prediction of vLLM's KV cache is formed (per GPU, the tightest stage):
- llm-d-planner: ``allocatable_kv_cache_memory`` (its reserve model) / GPUs; tokens as its
  ``max_concurrent_requests`` counts them (KV memory of all GPUs over the whole model's bytes per
  token, whole blocks). Its ``total_kv_cache_blocks`` sums the blocks of every GPU, TP x PP times
  what vLLM reports for a replica, so it is not used.
- hf-mem: no reserve: total x utilization - weights/(TP x PP), over its per-token KV bytes/(TP x PP).
- aiconfigurator: ``aiconfigurator_core.sdk.memory.estimate_kv_cache`` (its native path: the
  backend memory model with its flat 3.5 GiB "runtime overhead", activations from its performance
  database, NCCL), backend ``vllm``, ``of_total`` at the row's utilization, the row's TP and PP,
  ``max_num_tokens``/``max_batch_size`` = the scheduler values that vLLM release used (the row's
  flags, else the release's defaults), and the GPU memory overridden with CUDA's total of the
  row, the KV cache in bf16 (vLLM's ``auto`` for these checkpoints; left alone it infers an fp8
  KV cache from an FP8 checkpoint) and, for MoE, the experts sharded by TP (``moe_tp_size`` = TP,
  vLLM's default without expert parallelism). Its ``total_kv_size_tokens`` (per rank) is rounded
  down to whole blocks as vLLM counts.
  Local path: it reads the config.json folder itself (``model_path`` = the folder), so no
  workaround is needed beyond ``HF_HUB_OFFLINE``. It ships a vLLM performance database for a few
  systems only: h100_sxm (vLLM 0.24.0), a100_sxm (0.14.0; also used for the A100-40GB rows with
  the 40 GB total) and rtx_pro_6000_server (0.24.0); rows on other GPUs (RTX 3090) are "not run"
  with the reason. Its database version is not the row's vLLM version (it has one per system).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.plan.engine_terms import engine_terms, parse_vllm_version  # noqa: E402
from orchestrator.plan.memory import GIB  # noqa: E402
from tests.fixtures.planner_rows import predict_row  # noqa: E402

DATA = REPO / "tests" / "data" / "planner"
PEERS = ("llm-d-planner[estimation]==0.3.3", "hf-mem==0.5.6", "aiconfigurator==0.12.0")


# ---- the safetensors headers the Hub would serve, from config.json ----


def _linear(name: str, out_dim: int, in_dim: int, quant: dict | None) -> dict[str, dict]:
    if not quant:
        return {f"{name}.weight": {"dtype": "BF16", "shape": [out_dim, in_dim]}}
    block = quant.get("weight_block_size")
    if block:  # FP8 block quantization: one F32 scale per block
        scale = [math.ceil(out_dim / block[0]), math.ceil(in_dim / block[1])]
        return {f"{name}.weight": {"dtype": "F8_E4M3", "shape": [out_dim, in_dim]}, f"{name}.weight_scale_inv": {"dtype": "F32", "shape": scale}}
    return {f"{name}.weight": {"dtype": "F8_E4M3", "shape": [out_dim, in_dim]}, f"{name}.weight_scale": {"dtype": "F32", "shape": [out_dim, 1]}}


def synthetic_headers(cfg: dict[str, Any]) -> dict[str, dict]:
    """{tensor name: {dtype, shape}} for Llama, Qwen2, Qwen3 and Qwen3-MoE checkpoints."""
    h, layers, heads = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv, d = cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or cfg["hidden_size"] // heads
    vocab, kind = cfg["vocab_size"], cfg.get("model_type", "")
    quant = cfg.get("quantization_config")
    out: dict[str, dict] = {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [vocab, h]}, "model.norm.weight": {"dtype": "BF16", "shape": [h]}}
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = {"dtype": "BF16", "shape": [vocab, h]}
    for i in range(layers):
        p = f"model.layers.{i}"
        out |= _linear(f"{p}.self_attn.q_proj", heads * d, h, quant) | _linear(f"{p}.self_attn.k_proj", kv * d, h, quant)
        out |= _linear(f"{p}.self_attn.v_proj", kv * d, h, quant) | _linear(f"{p}.self_attn.o_proj", h, heads * d, quant)
        if kind == "qwen2":
            out |= {f"{p}.self_attn.{x}_proj.bias": {"dtype": "BF16", "shape": [n]} for x, n in (("q", heads * d), ("k", kv * d), ("v", kv * d))}
        if kind.startswith("qwen3"):
            out |= {f"{p}.self_attn.{x}_norm.weight": {"dtype": "BF16", "shape": [d]} for x in ("q", "k")}
        out |= {f"{p}.{n}.weight": {"dtype": "BF16", "shape": [h]} for n in ("input_layernorm", "post_attention_layernorm")}
        if cfg.get("num_experts"):
            e, inter = cfg["num_experts"], cfg["moe_intermediate_size"]
            out[f"{p}.mlp.gate.weight"] = {"dtype": "BF16", "shape": [e, h]}
            for j in range(e):
                q = f"{p}.mlp.experts.{j}"
                out |= _linear(f"{q}.gate_proj", inter, h, quant) | _linear(f"{q}.up_proj", inter, h, quant) | _linear(f"{q}.down_proj", h, inter, quant)
        else:
            inter = cfg["intermediate_size"]
            out |= _linear(f"{p}.mlp.gate_proj", inter, h, quant) | _linear(f"{p}.mlp.up_proj", inter, h, quant) | _linear(f"{p}.mlp.down_proj", h, inter, quant)
    return out


# ---- the peers, run inside the throwaway venv ----

PEER_SCRIPT = r'''
import json, math, sys
job = json.load(open(sys.argv[1]))
out = {"versions": {}, "rows": {}, "errors": {}}
from importlib.metadata import version
for dist in ("llm-d-planner", "hf-mem", "aiconfigurator"):
    try:
        out["versions"][dist] = version(dist)
    except Exception as exc:
        out["versions"][dist] = f"not installed: {exc}"
GIB = 2**30

def counts_by_dtype(headers):
    counts = {}
    for t in headers.values():
        counts[t["dtype"]] = counts.get(t["dtype"], 0) + math.prod(t["shape"])
    return counts

try:
    import planner.capacity_planner as cp
    from transformers import AutoConfig
except Exception as exc:
    cp = None
    out["errors"]["llm-d-planner"] = f"import failed: {type(exc).__name__}: {exc}"
try:
    from aiconfigurator_core.sdk.memory import estimate_kv_cache as aic_estimate
except Exception as exc:
    aic_estimate = None
    out["errors"]["aiconfigurator"] = f"import failed: {type(exc).__name__}: {exc}"
try:
    from hf_mem.safetensors.metadata import parse_safetensors_metadata
    from hf_mem.safetensors.kv_cache import compute_safetensors_kv_cache_size
except Exception as exc:
    parse_safetensors_metadata = None
    out["errors"]["hf-mem"] = f"import failed: {type(exc).__name__}: {exc}"

for row in job["rows"]:
    rid, model = row["id"], row["model"]
    headers = job["headers"][model]
    cfg = job["configs"][model]
    tp, pp, util, total = row["tp"], row["pp"], row["options"].get("gpu_memory_utilization", 0.9), row["total_gib"]
    length = row["options"].get("max_model_len") or cfg.get("max_position_embeddings")
    block = row["options"].get("block_size", 16)
    res = {}
    if cp is not None:
        try:
            cp.model_params_by_dtype = lambda name, hf_token=None, _h=headers: counts_by_dtype(_h)
            config = AutoConfig.from_pretrained(job["config_dirs"][model])
            kv_total = cp.allocatable_kv_cache_memory(model, config, total, util, tp, pp, 1, max_model_len=length)
            # tokens as its max_concurrent_requests counts them (all GPUs' KV memory over the whole
            # model's bytes per token): its total_kv_cache_blocks sums every GPU's blocks, which is
            # TP x PP times what vLLM reports for a replica
            per_token = cp.KVCacheDetail(model, config, length, 1).per_token_memory_bytes
            res["llm-d-planner"] = {"kv_gib": kv_total / (tp * pp), "kv_tokens": int(kv_total * GIB // (per_token * block)) * block,
                                     "weights_gib": cp.model_memory_req(model, config) / (tp * pp)}
        except Exception as exc:
            res["llm-d-planner"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if parse_safetensors_metadata is not None:
        try:
            meta = parse_safetensors_metadata({"model.safetensors": headers})
            weights = meta.bytes_count / GIB / (tp * pp)
            per_token = compute_safetensors_kv_cache_size(cfg, "BF16", max_model_len=1) / (tp * pp)
            kv = total * util - weights
            res["hf-mem"] = {"kv_gib": kv, "kv_tokens": int(kv * GIB // (per_token * block)) * block, "weights_gib": weights}
        except Exception as exc:
            res["hf-mem"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if aic_estimate is not None:
        system = job["aic_systems"].get(row["gpu"])
        if system is None:
            res["aiconfigurator"] = {"error": f"not run: aiconfigurator 0.12.0 ships no vLLM performance database for {row['gpu']}"}
        else:
            try:
                tokens, seqs = job["batch"][rid]
                got = aic_estimate(job["config_dirs"][model], system[0], "vllm", system[1], max_num_tokens=tokens, max_batch_size=seqs,
                                   memory_fraction_kind="of_total", memory_fraction_value=util, tp_size=tp, pp_size=pp,
                                   # vLLM's kv_cache_dtype "auto" is the model's bf16 (left alone, aiconfigurator
                                   # infers an fp8 KV cache from an FP8 checkpoint)
                                   kvcache_quant_mode="fp8" if row["options"].get("kv_cache_dtype") == "fp8" else "bfloat16",
                                   # vLLM without --enable-expert-parallel shards the experts by TP
                                   **({"moe_tp_size": tp, "moe_ep_size": 1} if cfg.get("num_experts") else {}),
                                   gpu_memory_capacity_bytes_override=int(total * GIB))
                brk = got.get("memory_breakdown") or {}
                res["aiconfigurator"] = {"kv_gib": got["total_kv_size_bytes"] / GIB, "kv_tokens": int(got["total_kv_size_tokens"]) // block * block,
                                         "weights_gib": brk.get("weights_bytes", float("nan")) / GIB, "source": got.get("source"),
                                         "system": f"{system[0]} (vLLM perf database {system[1]})"}
            except Exception as exc:
                res["aiconfigurator"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out["rows"][rid] = res
print(json.dumps(out))
'''


def make_venv(where: Path) -> Path:
    py = where / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *PEERS], check=True, timeout=1800)
    return py


# aiconfigurator 0.12.0's systems with a vLLM performance database (systems/data/<system>/gemm/vllm/<version>)
AIC_SYSTEMS = {"H100-80GB": ("h100_sxm", "0.24.0"), "A100-80GB": ("a100_sxm", "0.14.0"), "A100-40GB": ("a100_sxm", "0.14.0"),
               "RTXPRO6000-96GB": ("rtx_pro_6000_server", "0.24.0")}  # fmt: skip


def batch_of(row: dict) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) the row's vLLM ran with: its flags, else that release's defaults."""
    terms = engine_terms(parse_vllm_version(row["vllm"]))
    opts = row["options"]
    tokens, seqs = terms.batch_defaults(int(row["total_gib"] * GIB), row["gpu"], opts.get("max_model_len") or 0)
    return opts.get("max_num_batched_tokens", tokens), opts.get("max_num_seqs", seqs)


def orch_prediction(row: dict) -> dict:
    got = predict_row(row)
    return {"kv_gib": got.kv_gib, "kv_tokens": got.kv_tokens, "weights_gib": got.weights_gib}


def error(row: dict, pred: dict) -> float | None:
    if "error" in pred:
        return None
    if row["kv_tokens"] is not None:
        return abs(pred["kv_tokens"] - row["kv_tokens"]) / row["kv_tokens"]
    return abs(pred["kv_gib"] - row["kv_gib"]) / row["kv_gib"]


def summary(rows: list[dict], preds: dict[str, dict], which: str) -> dict:
    errs = [e for r in rows if r["set"] == which and (e := error(r, preds.get(r["id"], {"error": "missing"}))) is not None]
    n = sum(1 for r in rows if r["set"] == which)
    if not errs:
        return {"rows": 0, "of": n}
    return {"rows": len(errs), "of": n, "median": round(statistics.median(errs), 4), "max": round(max(errs), 4)}


def run_peers(job: dict, venv: Path | None, keep: bool) -> dict | None:
    """The three peers' predictions for every row, run in a throwaway venv; None when their run failed
    (its stderr printed as the JSON)."""
    root = venv or Path(tempfile.mkdtemp(prefix="orch-peers-"))
    try:
        py = make_venv(root)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump(job, fh)
        script = root / "peers.py"
        script.write_text(PEER_SCRIPT)
        done = subprocess.run([str(py), str(script), fh.name], capture_output=True, text=True, timeout=1800, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(root)})
        if done.returncode != 0:
            print(json.dumps({"error": "the peers' run failed", "stderr": done.stderr[-2000:]}))
            return None
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        if not keep and venv is None:
            shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=None, help="where to create the throwaway venv [default: a temporary folder]")
    ap.add_argument("--keep", action="store_true", help="keep the venv")
    ap.add_argument("--orch-only", action="store_true",
                    help="orch's column only: no venv, no peers installed (seconds, no network; the suite's smoke run)")
    args = ap.parse_args()
    rows = json.loads((DATA / "vllm_logs.json").read_text())["rows"]
    models = sorted({r["model"] for r in rows})
    configs = {m: json.loads((DATA / "configs" / m / "config.json").read_text()) for m in models}
    job = {
        "rows": rows,
        "configs": configs,
        "config_dirs": {m: str(DATA / "configs" / m) for m in models},
        "headers": {m: synthetic_headers(configs[m]) for m in models},
        "aic_systems": AIC_SYSTEMS,
        "batch": {r["id"]: batch_of(r) for r in rows},
    }
    peers = {"versions": {}, "errors": {}, "rows": {}} if args.orch_only else run_peers(job, args.venv, args.keep)
    if peers is None:
        return 1
    tools: dict[str, dict[str, dict]] = {"orch": {r["id"]: orch_prediction(r) for r in rows}}
    for tool in () if args.orch_only else ("llm-d-planner", "hf-mem", "aiconfigurator"):
        tools[tool] = {rid: res.get(tool, {"error": "missing"}) for rid, res in peers["rows"].items()}
    report = {
        "peer_versions": peers["versions"],
        "peer_errors": peers["errors"],
        "metric": "|predicted - vLLM| / vLLM on KV tokens (KV memory where vLLM printed only memory)",
        "tools": {t: {"fit": summary(rows, p, "fit"), "held_out": summary(rows, p, "held_out")} for t, p in tools.items()},
        "rows": {r["id"]: {"set": r["set"], "vllm": {"kv_tokens": r["kv_tokens"], "kv_gib": r["kv_gib"]},
                           **{t: (round(e, 4) if (e := error(r, tools[t][r["id"]])) is not None else tools[t][r["id"]].get("error")) for t in tools}}
                 for r in rows},  # fmt: skip
    }
    held = {t: v["held_out"].get("median") for t, v in report["tools"].items() if v["held_out"].get("median") is not None}
    report["lowest_held_out_median"] = min(held, key=lambda t: held[t]) if held else None
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
