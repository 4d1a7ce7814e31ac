"""DP x EP layouts: what a DP group holds per GPU, its KV cache per rank, the choice against TP x PP.

Per-GPU weights are written out here from DeepSeek-V3's config.json and vLLM 0.32.0's layer
construction (test_sharding.py names the files); KV tokens follow vLLM's rule (whole blocks of
the rank's KV memory, one pool per DP engine). Nothing is copied from orch's output.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG, spec_from_config
from orchestrator.plan.memory import GIB
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape
from tests.unit.test_memory import QWEN3_235B_FP8

V3 = CATALOG["deepseek-v3"]
H200x2 = make_shape(gpu_type_name="H200-141GB", gpus_per_node=8, nodes=2)
H100x2 = make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=2)
LATENT = 61 * (512 + 64) * 2  # MLA: one latent per layer, bf16, the same on every TP rank


def blocks(n_in: int, n_out: int) -> int:
    """Bytes of an fp8 matrix's weight_scale_inv: one fp32 per 128 x 128 block (DeepSeek-V3's
    ``weight_block_size``; vllm 0.32.0 quantization/fp8.py)."""
    return -(-n_in // 128) * -(-n_out // 128) * 4


def v3_weights_at_tp1(local_experts: int) -> int:
    """One GPU of a DP rank at TP=1 with ``local_experts`` whole experts per MoE layer: the FP8
    checkpoint's linear layers at 1 byte plus their block scales, the router (GateLinear without a
    quant_config, models/deepseek_v2.py) at 16 bits, embeddings, head and norms at 16 bits."""
    mats = ((7168, 1536), (7168, 576), (1536, 128 * 192), (512, 128 * 256), (128 * 128, 7168))  # q_a, kv_a, q_b, kv_b, o
    attention = sum(i * o + blocks(i, o) for i, o in mats)
    expert = 3 * 7168 * 2048 + 2 * blocks(7168, 2048) + blocks(2048, 7168)
    dense = 3 * (attention + 3 * 7168 * 18432 + 2 * blocks(7168, 18432) + blocks(18432, 7168))
    moe = 58 * (attention + 2 * 7168 * 256 + local_experts * expert + expert)  # router, routed, the shared expert
    norms = 61 * (2 * 7168 + 1536 + 512) + 7168
    return dense + moe + 2 * (norms + 2 * 129280 * 7168)


def test_deepseek_v3_on_two_h200_nodes_chooses_dp_with_expert_parallel():
    plan = plan_model(V3, H200x2)
    assert (plan.dp, plan.tp, plan.pp, plan.expert_parallel, plan.replicas) == (16, 1, 1, True, 1)
    assert plan.weights_gib_per_gpu * GIB == pytest.approx(v3_weights_at_tp1(16))
    assert plan.kv_bytes_per_token_per_gpu == LATENT
    rank = int(plan.kv_cache_gib_per_gpu * GIB // (16 * LATENT)) * 16
    assert plan.kv_cache_tokens_per_rank == rank and plan.kv_cache_tokens == 16 * rank
    assert plan.max_concurrency == pytest.approx(16 * rank / 163840)
    assert plan.engine_kwargs() | {} == {
        **plan.engine_kwargs(), "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
        "data_parallel_size": 16, "enable_expert_parallel": True,
    }  # fmt: skip
    why = [r for r in plan.reasons if r.startswith("layout: ")]
    assert why and "MLA" in why[0] and "TP=8 keeps 8 copies" in why[0]
    # side by side: the TP x PP plan (TP=8, two replicas) and the chosen DP x EP one
    tp, dp = plan.layouts["tp_pp"], plan.layouts["dp_ep"]
    assert (tp["tp"], tp["pp"], tp["replicas"], tp["chosen"]) == (8, 1, 2, False)
    assert (dp["dp"], dp["ep_size"], dp["gpus_per_replica"], dp["dp_ranks_per_node"], dp["nodes_per_replica"], dp["chosen"]) == (16, 16, 16, 8, 2, True)
    assert dp["kv_cache_tokens_cluster"] > 5 * tp["kv_cache_tokens_cluster"]  # each TP=8 GPU caches the same latent


def test_a_forced_dp_group_per_node():
    plan = plan_model(V3, H200x2, PlanOptions(dp=8))
    assert (plan.dp, plan.tp, plan.replicas, plan.gpus_per_replica) == (8, 1, 2, 8)
    assert plan.weights_gib_per_gpu * GIB == pytest.approx(v3_weights_at_tp1(32))  # 256 experts / EP=8
    assert plan.kv_cache_tokens == 8 * plan.kv_cache_tokens_per_rank
    assert plan.engine_kwargs()["data_parallel_size"] == 8
    with_tp = plan_model(V3, H200x2, PlanOptions(dp=4, tp=2))
    assert (with_tp.dp, with_tp.tp, with_tp.gpus_per_replica, with_tp.replicas) == (4, 2, 8, 2)


def test_dp_without_expert_parallel_splits_the_experts_and_says_so_in_engine_kwargs():
    plan = plan_model(V3, H200x2, PlanOptions(dp=16, expert_parallel=False))
    assert plan.expert_parallel is False and "enable_expert_parallel" not in plan.engine_kwargs()
    assert plan.weights_gib_per_gpu * GIB == pytest.approx(v3_weights_at_tp1(16))  # 256 / 16 experts' worth either way


def test_a_tp_plan_passes_neither_dp_key_to_vllm():
    plan = plan_model(CATALOG["llama3-70b"], H100x2)
    assert "data_parallel_size" not in plan.engine_kwargs() and "enable_expert_parallel" not in plan.engine_kwargs()
    assert list(plan.layouts) == ["tp_pp"]
    tp_ep = plan_model(CATALOG["mixtral-8x7b"], H100x2, PlanOptions(dp=1, expert_parallel=True))
    assert (tp_ep.dp, tp_ep.expert_parallel, tp_ep.engine_kwargs()["enable_expert_parallel"]) == (1, True, True)
    assert "data_parallel_size" not in tp_ep.engine_kwargs()


def test_moe_without_mla_keeps_tp_when_dp_on_the_same_gpus_holds_fewer_tokens():
    # Mixtral-8x7B at TP=2 splits its 8 KV heads; DP=2 x TP=1 on the same 2 GPUs keeps attention whole in
    # both ranks (its weights are the same per GPU otherwise: 8 experts over 2 GPUs either way)
    plan = plan_model(CATALOG["mixtral-8x7b"], H100x2)
    assert (plan.dp, plan.tp) == (1, 2)
    dp = plan.layouts["dp_ep"]
    assert (dp["dp"], dp["tp"], dp["gpus_per_replica"], dp["chosen"]) == (2, 1, 2, False)
    assert dp["kv_cache_tokens_cluster"] < plan.layouts["tp_pp"]["kv_cache_tokens_cluster"]
    assert any(r.startswith("layout: TP=2 PP=1 holds at least as many KV tokens") for r in plan.reasons)


def test_tp_past_the_kv_heads_gives_way_to_dp_ranks_on_the_same_gpus():
    # Qwen3-235B-A22B in bf16 needs TP=8 on H100s; its 4 KV heads are then each cached twice.
    bf16 = replace(spec_from_config(QWEN3_235B_FP8, "Qwen/Qwen3-235B-A22B-FP8 config.json"), dtype="bf16", quantization=None)
    plan = plan_model(bf16, H100x2, PlanOptions(max_model_len=32768))
    tp = plan.layouts["tp_pp"]
    assert tp["tp"] == 8 and plan.gpus_per_replica == 8
    assert (plan.dp, plan.tp, plan.expert_parallel) == (2, 4, True)
    assert plan.kv_cache_tokens > tp["kv_cache_tokens"]
    assert any("caches each head 2 times" in r for r in plan.reasons)


def test_dp_is_refused_for_dense_models_and_impossible_groups():
    with pytest.raises(PlanError, match="dense model: data parallelism is for MoE models"):
        plan_model(CATALOG["llama3-8b"], H100x2, PlanOptions(dp=2))
    with pytest.raises(PlanError, match="expert parallelism needs an MoE model"):
        plan_model(CATALOG["llama3-8b"], H100x2, PlanOptions(expert_parallel=True))
    with pytest.raises(PlanError, match="without pipeline parallelism"):
        plan_model(V3, H200x2, PlanOptions(dp=8, pp=2))
    with pytest.raises(PlanError, match="takes whole nodes"):
        plan_model(V3, H200x2, PlanOptions(dp=12))
    with pytest.raises(PlanError, match="exceeds the 8 experts"):
        plan_model(CATALOG["mixtral-8x7b"], H100x2, PlanOptions(dp=16))
    with pytest.raises(PlanError, match="the forced layout does not fit") as err:
        plan_model(V3, H100x2, PlanOptions(dp=8, tp=1))  # 32 experts of 256 per H100 do not fit
    assert "--dp" in (err.value.hint or "")


def test_a_cpu_dp_group_takes_one_rank_per_node():
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=2)
    moe = CATALOG["mixtral-8x7b"]
    plan = plan_model(moe, cpu, PlanOptions(dp=2, max_model_len=1024))
    assert (plan.dp, plan.tp, plan.replicas, plan.expert_parallel) == (2, 1, 1, True)
    assert plan.kv_cache_tokens == 2 * plan.kv_cache_tokens_per_rank
    with pytest.raises(PlanError, match="one rank per node"):
        plan_model(moe, cpu, PlanOptions(dp=3, max_model_len=1024))


def test_the_moe_layouts_benchmark_prints_both_layouts_for_its_six_rows(capsys):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "moe_layouts.py"
    spec = importlib.util.spec_from_file_location("moe_layouts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--part", "plan"]) == 0
    rows = json.loads(capsys.readouterr().out)["plan"]
    assert [(r["model"], r["gpus"]) for r in rows] == [
        (m, f"2 x 8 {g}") for m in ("deepseek-v3", "qwen3-235b-a22b", "mixtral-8x22b") for g in ("H100-80GB", "H200-141GB")
    ]
    assert all(set(r["layouts"]) == {"tp_pp", "dp_ep"} for r in rows)
    assert {r["chosen"] for r in rows if r["model"] == "deepseek-v3"} == {"dp_ep"}  # MLA
