"""The planner's edges: option checks, forced TP/PP, the suggestions of a plan that does not fit,
and every field of the plan it returns (issue 17: tests that catch the mutants of these functions).

Expected values are worked by hand from the rules the planner documents (plan/planner.py's module
docstring, docs/planner.md), published figures and vLLM's source, named at each test; the hand
arithmetic is in the comments, with margins wide enough that no figure is read off orch's output.
Figures used throughout: an H100-80GB has 79.18 GiB, and vLLM >= 0.21 uses 0.92 of it (72.85 GiB);
Llama 3.1 8B is 8,030,261,248 parameters (15.0 GiB in bf16, 128 KiB of KV cache per token); Llama
3.1 70B is 131.4 GiB in bf16 and 320 KiB of KV per token; Llama 3.1 405B is 756 GiB in bf16
(seed 000, tests/unit/test_planner.py).
"""

from __future__ import annotations

import re

import pytest

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG, ModelSpec
from orchestrator.plan.memory import GIB
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape

H100 = "H100-80GB"
LLAMA_8B, LLAMA_70B, LLAMA_405B = CATALOG["llama3-8b"], CATALOG["llama3-70b"], CATALOG["llama3-405b"]


def h100s(gpus_per_node: int = 8, nodes: int = 1):
    return make_shape(gpu_type_name=H100, gpus_per_node=gpus_per_node, nodes=nodes)


def refused(spec: ModelSpec, shape, **options) -> PlanError:
    with pytest.raises(PlanError) as err:
        plan_model(spec, shape, PlanOptions(**options))
    assert err.value.exit_code == 2
    return err.value


# ---- _check_options: each bound refused with its message, each edge accepted ----

# vLLM's block sizes: `BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]` (vllm/config/cache.py, 0.10-0.11).
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


@pytest.mark.parametrize(
    ("options", "message", "hint"),
    [
        (dict(gpu_memory_utilization=0), "gpu_memory_utilization must be in (0, 1], got 0", None),
        (dict(gpu_memory_utilization=1.01), "gpu_memory_utilization must be in (0, 1], got 1.01", None),
        (dict(max_num_seqs=0), "--max-num-seqs must be between 1 and 10,000,000, got 0", None),
        (dict(max_num_seqs=10_000_001), "--max-num-seqs must be between 1 and 10,000,000, got 10000001", None),
        (dict(max_num_batched_tokens=0), "--max-num-batched-tokens must be between 1 and 10,000,000, got 0", None),
        (
            dict(max_num_batched_tokens=10_000_001),
            "--max-num-batched-tokens must be between 1 and 10,000,000, got 10000001",
            None,
        ),
        (dict(block_size=2), "--block-size must be one of 1, 8, 16, 32, 64, 128, 256 (vLLM's choices), got 2", None),
        (
            dict(block_size=512),
            "--block-size must be one of 1, 8, 16, 32, 64, 128, 256 (vLLM's choices), got 512",
            None,
        ),
        (dict(kv_cache_gib=0), "--kv-cache-gib must be positive, got 0", None),
        (dict(dtype="fp6"), "unknown dtype 'fp6'", "use one of fp32, bf16, fp16, fp8, int8, int4"),
        (dict(kv_cache_dtype="int8"), "unknown kv cache dtype 'int8'", "use auto or fp8"),
        (dict(kv_cache_dtype="FP8"), "unknown kv cache dtype 'FP8'", "use auto or fp8"),
        (dict(max_model_len=-1), "max_model_len must be positive, got -1", None),
        (
            dict(max_model_len=131_073),
            "max_model_len 131,073 exceeds the model's 131,072 positions",
            "use --max-model-len 131072 or less (vLLM refuses longer without rope scaling)",
        ),
        (dict(tp=0), "--tp must be at least 1, got 0", None),
        (dict(pp=0), "--pp must be at least 1, got 0", None),
        (dict(tp=-2, pp=1), "--tp must be at least 1, got -2", None),
    ],
)
def test_an_option_out_of_bounds_is_refused_with_its_message(options, message, hint):
    err = refused(LLAMA_8B, h100s(1), **options)
    assert (err.message, err.hint) == (message, hint)


@pytest.mark.parametrize("block", VLLM_BLOCK_SIZES)
def test_every_block_size_vllm_accepts_is_planned_with_it(block):
    plan = plan_model(LLAMA_8B, h100s(1), PlanOptions(block_size=block, max_model_len=4096))
    assert (plan.block_size, plan.block_size_set, plan.engine_kwargs()["block_size"]) == (block, True, block)
    assert plan.kv_cache_tokens % block == 0


def test_the_edges_of_each_range_are_accepted():
    one = h100s(1)
    assert plan_model(LLAMA_8B, one, PlanOptions(gpu_memory_utilization=1.0)).gpu_memory_utilization == 1.0
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=1)  # sized without a batch: quick to plan
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        for value in (1, 10_000_000):
            plan = plan_model(CATALOG["tiny"], cpu, PlanOptions(max_model_len=1024, **{name: value}))
            assert getattr(plan, name) == value and plan.engine_kwargs()[name] == value
    # A fixed KV cache under 1 GiB is still a KV cache: 0.5 GiB / 128 KiB per token = 4,096 tokens.
    small = plan_model(LLAMA_8B, one, PlanOptions(kv_cache_gib=0.5, max_model_len=4096))
    assert (small.kv_cache_gib_per_gpu, small.kv_cache_tokens, small.fits) == (0.5, 4096, True)
    assert plan_model(LLAMA_8B, one, PlanOptions(max_model_len=1)).max_model_len == 1
    assert plan_model(LLAMA_8B, one, PlanOptions(max_model_len=131_072)).max_model_len == 131_072
    forced = plan_model(LLAMA_8B, one, PlanOptions(tp=1, pp=1, max_model_len=4096))
    assert (forced.tp, forced.pp, forced.fits) == (1, 1, True)


# ---- _check_forced ----


@pytest.mark.parametrize(
    ("options", "message", "hint"),
    [
        (
            dict(tp=3),
            "TP=3 does not divide the 64 attention heads",
            "choose a TP size that divides the attention heads, or leave --tp out",
        ),
        (dict(pp=81), "PP=81 exceeds the model's 80 layers", None),
        (dict(tp=8, pp=2), "TP x PP = 16 GPUs, but the cluster has 8", "lower --tp/--pp or add nodes"),
        (dict(pp=9), "TP x PP = 9 GPUs, but the cluster has 8", "lower --tp/--pp or add nodes"),
        (dict(tp=16), "TP x PP = 16 GPUs, but the cluster has 8", "lower --tp/--pp or add nodes"),
    ],
)
def test_a_forced_layout_vllm_would_refuse_is_refused(options, message, hint):
    err = refused(LLAMA_70B, h100s(8), **options)
    assert (err.message, err.hint) == (message, hint)


def test_a_forced_layout_that_uses_every_gpu_or_every_layer_is_accepted():
    # TP=8 on 8 GPUs: 131.4 / 8 = 16.4 GiB of weights per GPU, one replica.
    eight = plan_model(LLAMA_70B, h100s(8), PlanOptions(tp=8))
    assert (eight.tp, eight.pp, eight.replicas, eight.fits) == (8, 1, 1, True)
    # PP=5 alone: TP may be at most 8 // 5 = 1; 131.4 / 5 = 26.3 GiB per GPU fits; 3 GPUs stay idle.
    five = plan_model(LLAMA_70B, h100s(8), PlanOptions(pp=5))
    assert (five.tp, five.pp, five.replicas, five.fits) == (1, 5, 1, True)
    assert five.stage_layers == (16, 16, 16, 16, 16)
    # PP = the model's 80 layers on 80 GPUs: one layer per stage (about 1.6 GiB) fits, TP can only be 1.
    every_layer = plan_model(LLAMA_70B, h100s(8, nodes=10), PlanOptions(pp=80))
    assert (every_layer.tp, every_layer.pp, every_layer.fits) == (1, 80, True)
    assert every_layer.stage_layers == (1,) * 80


@pytest.mark.parametrize("options", [dict(tp=2), dict(pp=2), dict(tp=2, pp=1), dict(tp=1, pp=2)])
def test_a_cpu_cluster_refuses_tensor_or_pipeline_parallelism(options):
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=2)
    err = refused(CATALOG["tiny"], cpu, **options)
    assert (err.message, err.hint) == (
        "on a CPU cluster each replica runs on one node (TP=1, PP=1)",
        "leave out --tp/--pp",
    )


def test_a_cpu_cluster_accepts_tp_1_pp_1_forced():
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=2)
    plan = plan_model(CATALOG["tiny"], cpu, PlanOptions(tp=1, pp=1, max_model_len=1024))
    assert (plan.tp, plan.pp, plan.replicas, plan.fits) == (1, 1, 2, True)


# ---- _forced ----


def test_forced_pp_takes_the_smallest_tp_that_fits():
    # PP=2 on 8 GPUs: TP can be 1, 2 or 4 (it divides 64 heads and 8 KV heads, TP x 2 <= 8).
    # TP=1: 131.4 / 2 = 65.7 GiB of weights per GPU leaves < 7.2 GiB of the 72.85, but one 131,072-token
    # sequence needs 131,072 x 320 KiB / 2 stages = 20 GiB. TP=2: 32.9 GiB leaves ~37 GiB for 10 GiB.
    plan = plan_model(LLAMA_70B, h100s(8), PlanOptions(pp=2))
    assert (plan.tp, plan.pp, plan.replicas, plan.fits) == (2, 2, 2, True)
    assert plan.reasons[-2].startswith("forced PP=2; the smallest TP that fits is 2: TP=2 PP=2: ")
    assert plan.reasons[-1] == "8 GPU(s) / 4 per replica = 2 replica(s)"


def test_forced_pp_that_fits_with_no_tp_reports_the_largest_tp():
    # 405B with PP=2 on 8 GPUs: TP 1, 2 or 4; even TP=4 x PP=2 holds 756 / 8 = 94.5 GiB per GPU > 79.18.
    err = refused(LLAMA_405B, h100s(8), pp=2)
    assert err.message.startswith("the forced layout does not fit: TP=4 PP=2: ")
    assert err.hint is not None and err.hint.startswith("short by ")


def test_forced_tp_that_fits_with_no_pp_reports_the_largest_pp():
    # 405B with TP=2 on 8 GPUs: PP up to 8 // 2 = 4; even TP=2 x PP=4 holds 94.5 GiB per GPU.
    err = refused(LLAMA_405B, h100s(8), tp=2)
    assert err.message.startswith("the forced layout does not fit: TP=2 PP=4: ")


def test_forced_tp_and_pp_are_taken_as_given():
    plan = plan_model(LLAMA_70B, h100s(8), PlanOptions(tp=4, pp=2))
    assert (plan.tp, plan.pp, plan.replicas, plan.fits) == (4, 2, 1, True)
    assert plan.stage_layers == (40, 40)
    assert plan.reasons[-2].startswith("forced TP=4 PP=2: TP=4 PP=2: ")
    assert plan.reasons[-1] == "8 GPU(s) / 8 per replica = 1 replica(s)"


# ---- fit_suggestions (plan/choice.py) ----


def _kv_tokens_in(text: str) -> int:
    found = re.fullmatch(r"the KV cache holds ([\d,]+) tokens but .*: use --max-model-len (\d+) or less", text)
    assert found, text
    assert int(found.group(1).replace(",", "")) == int(found.group(2))
    return int(found.group(2))


def test_a_plan_short_of_kv_cache_says_what_would_fit_it():
    # 8B on one 24 GiB GPU: 0.92 x 24 = 22.1 GiB - 15.0 GiB of weights - a reserve under 2 GiB leaves
    # 5-7 GiB of KV cache = 40,000-57,000 tokens at 128 KiB; max_model_len 80,001 needs
    # ceil(80,001 / 16) x 16 = 80,016 (whole blocks of 16).
    one = make_shape(gpu_type_name=None, gpu_memory_gib=24, gpus_per_node=1, nodes=1)
    plan = plan_model(LLAMA_8B, one, PlanOptions(max_model_len=80_001))
    assert not plan.fits and plan.replicas == 0
    tokens = _kv_tokens_in(plan.suggestions[0])
    assert 40_000 < tokens < 57_000 and tokens == plan.kv_cache_tokens
    assert plan.suggestions[0] == (
        f"the KV cache holds {tokens:,} tokens but one sequence of max_model_len needs 80,016: use --max-model-len {tokens} or less"
    )
    # The rest, each worked by hand: PP=2 on 2 such GPUs halves the weights and the KV per token
    # (7.5 GiB, 64 KiB: > 150,000 tokens); fp8 weights (7.0 GiB of linear layers + 2.0 GiB of bf16
    # embeddings and head) leave > 11 GiB = > 90,000 tokens; an fp8 KV cache (64 KiB per token) holds
    # the 5-7 GiB as 80,000-114,000 tokens: at least 80,016 with the reserve under 2 GiB.
    assert plan.suggestions[1:] == (
        "2 nodes of 1 would fit it with TP=1 PP=2",
        "--dtype fp8 (vLLM quantizes the linear layers on load) would fit with TP=1 PP=1",
        "--kv-cache-dtype fp8 would double the KV cache and fit",
    )
    assert not any("GPU(s) /" in r for r in plan.reasons)  # no replicas line for a plan that does not fit
    # The suggested max_model_len fits, on the same layout.
    shorter = plan_model(LLAMA_8B, one, PlanOptions(max_model_len=tokens))
    assert (shorter.tp, shorter.pp, shorter.fits, shorter.replicas) == (1, 1, True, 1)


def test_a_plan_whose_weights_do_not_fit_says_by_how_much():
    # 405B on one node of 8: the largest layout, TP=8, holds 756 / 8 = 94.5 GiB per GPU; with 72.85 GiB
    # usable and a reserve of 0-4 GiB it is short by 21.6-25.7 GiB.
    plan = plan_model(LLAMA_405B, h100s(8))
    short = re.fullmatch(r"short by ([\d.]+) GiB per GPU on the tightest stage", plan.suggestions[0])
    assert short, plan.suggestions[0]
    assert 21.6 < float(short.group(1)) < 25.7
    assert float(short.group(1)) == round(-plan.kv_cache_gib_per_gpu, 1)


def test_more_nodes_are_counted_in_whole_nodes_that_hold_the_pipeline():
    # 70B on one single-GPU node: PP=2 leaves < 7.2 GiB for the 20 GiB of one 131,072-token sequence,
    # PP=3 holds 43.8 GiB per GPU and leaves > 25 GiB for 13.3 GiB: 3 nodes. Neither fp8 (67.6 GiB
    # + reserve leave < 5.3 GiB for 40 GiB) nor int4 (35.8 GiB + reserve leave < 37 GiB for 40 GiB)
    # fits one GPU, and the weights do not fit, so no KV-dtype suggestion.
    plan = plan_model(LLAMA_70B, h100s(1))
    assert (plan.fits, plan.replicas) == (False, 0)
    assert plan.suggestions[1:] == ("3 nodes of 1 would fit it with TP=1 PP=3",)


@pytest.mark.parametrize(("layers", "nodes"), [(65, "65 nodes of 1 would fit it with TP=1 PP=65"), (66, None)])
def test_more_nodes_are_looked_for_up_to_64_more(layers, nodes):
    # A made-up deep model whose layers are each 151.0M attention + 704.6M MLP parameters (70B-like,
    # hidden 8192, ffn 28672, 64/8 heads) = 1.59 GiB in bf16, with a 1,000-word vocabulary (16 MB of
    # embeddings). On 4 GiB GPUs (3.68 usable) with a 1 GiB reserve one layer leaves 1.07 GiB for a
    # 1,024-token sequence (4 MiB), two layers (3.19 GiB) do not fit: PP must equal the layers, one
    # node each. 65 layers need 64 more nodes, the most the planner looks for; 66 need 65.
    spec = ModelSpec(f"deep-{layers}", layers, 8192, 28672, 64, 8, 128, 1000)
    one = make_shape(gpu_type_name=None, gpu_memory_gib=4.0, gpus_per_node=1, nodes=1)
    plan = plan_model(spec, one, PlanOptions(max_model_len=1024, reserve_gib=1.0))
    assert not plan.fits and plan.suggestions[0].startswith("short by ")
    assert plan.suggestions[1:] == ((nodes,) if nodes else ())


def test_a_forced_layout_that_does_not_fit_is_told_of_a_larger_pp_on_this_cluster():
    # TP=2 PP=1: 65.7 GiB of weights leave < 7.2 GiB = < 47,000 tokens at 160 KiB, not 131,072. TP=2
    # PP=2 fits on the same 8 GPUs (see test_forced_pp_takes_the_smallest_tp_that_fits): the hint says
    # so instead of asking for a second node. fp8 weights: one GPU is not enough (67.6 GiB + reserve
    # leave < 5.3 GiB for 40 GiB), TP=2 is (33.8 GiB leaves > 35 GiB for 20 GiB). An fp8 KV cache only
    # doubles < 47,000 tokens.
    err = refused(LLAMA_70B, h100s(8), tp=2, pp=1)
    assert err.message.startswith("the forced layout does not fit: TP=2 PP=1: ")
    assert err.hint is not None
    first, *rest = err.hint.split("; ")
    assert 20_000 < _kv_tokens_in(first) < 47_000 and "needs 131,072:" in first
    assert rest == ["TP=2 PP=2 would fit it on this cluster", "--dtype fp8 (vLLM quantizes the linear layers on load) would fit with TP=2 PP=1"]


def test_a_quantized_checkpoint_is_told_of_smaller_dtypes_only():
    # 70B fp8 forced to TP=1 PP=1 on 8 GPUs: 67.6 GiB + reserve leave < 5.3 GiB of the 40 GiB one
    # sequence needs. int8 is as large as fp8 and not suggested; int4 (35.8 GiB) fits one node at TP=2.
    # PP=2 at TP=1 (33.8 GiB per GPU, 20 GiB of KV needed) fits this cluster.
    err = refused(LLAMA_70B, h100s(8), tp=1, pp=1, dtype="fp8")
    first, *rest = (err.hint or "").split("; ")
    _kv_tokens_in(first)
    assert rest == [
        "TP=1 PP=2 would fit it on this cluster",
        "an int4 checkpoint of the model (AWQ, GPTQ, compressed-tensors) would fit with TP=2 PP=1",
    ]


def test_an_fp8_checkpoint_too_large_for_the_node_is_told_of_int4():
    # 405B fp8 on 4 GPUs: TP=4 holds > 94 GiB per GPU (378 GiB / 4). int4: 189 GiB of linear layers
    # + 4 GiB of bf16 embeddings and head / 4 = 48 GiB per GPU, leaving > 20 GiB for 1 GiB of KV cache.
    plan = plan_model(LLAMA_405B, h100s(4), PlanOptions(dtype="fp8", max_model_len=8192))
    assert (plan.fits, plan.dtype) == (False, "fp8")
    assert plan.suggestions[-1] == "an int4 checkpoint of the model (AWQ, GPTQ, compressed-tensors) would fit with TP=4 PP=1"


# ---- plan_model: every field of the plan ----


def test_every_field_of_a_plan_that_fits_one_gpu():
    plan = plan_model(LLAMA_8B, h100s(8))
    assert (plan.model, plan.params, plan.dtype, plan.kv_cache_dtype) == ("llama3-8b", 8_030_261_248, "bf16", "auto")
    assert (plan.tp, plan.pp, plan.replicas, plan.fits, plan.stage_layers, len(plan.stages)) == (
        1,
        1,
        8,
        True,
        (32,),
        1,
    )
    assert plan.weights_gib_per_gpu == pytest.approx(8_030_261_248 * 2 / GIB)  # 14.96
    assert 0.5 < plan.reserve_gib_per_gpu < 4
    assert plan.kv_bytes_per_token_per_gpu == 128 * 1024
    assert plan.kv_cache_gib_per_gpu == pytest.approx(0.92 * 79.18 - 14.96 - plan.reserve_gib_per_gpu, abs=0.02)
    assert plan.kv_cache_tokens == int(plan.kv_cache_gib_per_gpu * GIB // (128 * 1024 * 16)) * 16
    assert plan.max_concurrency == plan.kv_cache_tokens / 131_072
    assert (plan.max_model_len, plan.gpu_memory_utilization, plan.kv_cache_gib_fixed) == (131_072, 0.92, False)
    assert (plan.gpu_type, round(plan.gpu_memory_gib or 0, 2), plan.gpus_per_node, plan.nodes) == (H100, 79.18, 8, 1)
    # vLLM's API-server defaults on a GPU of >= 70 GiB that is not an A100 (vllm/engine/arg_utils.py,
    # get_batch_defaults): 8,192 batched tokens, 1,024 sequences.
    assert (plan.max_num_batched_tokens, plan.max_num_seqs, plan.block_size, plan.block_size_set) == (
        8192,
        1024,
        16,
        False,
    )
    assert (plan.suggestions, plan.enforce_eager, plan.vllm_version) == ((), False, "0.29.0")
    assert plan.engine_terms is not None
    assert (plan.engine_terms["vllm_version"], plan.engine_terms["default_gpu_memory_utilization"]) == ("0.29.0", 0.92)
    assert len(plan.reasons) == 4
    assert plan.reasons[0].startswith("sized for vLLM 0.29.0 (")
    assert plan.reasons[1].startswith("interconnect not probed: assumed NVLink")
    assert plan.reasons[2].startswith("fits one GPU, so TP=1 PP=1: ")
    assert plan.reasons[3] == "8 GPU(s) / 1 per replica = 8 replica(s)"


def test_a_plan_keeps_the_options_it_was_given():
    shape = make_shape(
        gpu_type_name=None, gpu_memory_gib=24, gpus_per_node=2, nodes=3, notes=("sized for the smallest GPU",)
    )
    options = PlanOptions(
        max_model_len=4096, dtype="fp8", kv_cache_dtype="fp8", enforce_eager=True, vllm_version="0.11.0"
    )
    plan = plan_model(LLAMA_8B, shape, options)
    assert (plan.dtype, plan.kv_cache_dtype, plan.enforce_eager, plan.vllm_version) == ("fp8", "fp8", True, "0.11.0")
    assert (plan.max_model_len, plan.gpu_memory_gib, plan.gpus_per_node, plan.nodes) == (4096, 24.0, 2, 3)
    assert plan.gpu_memory_utilization == 0.9  # vLLM's default before 0.21 (engine_terms.py, vllm#38284)
    assert plan.engine_kwargs()["enforce_eager"] is True
    assert plan.reasons[0] == "sized for the smallest GPU"  # the shape's notes come first
    assert plan.reasons[1].startswith("sized for vLLM 0.11.0 (")


def test_a_cpu_plan_reasons_with_the_fixed_kv_cache():
    # tiny: 4 layers x 2 KV heads x 64 x (K and V) x 2 bytes = 2,048 bytes per token; vLLM's CPU KV
    # cache (VLLM_CPU_KVCACHE_SPACE) of 1 GiB holds 524,288 tokens.
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=3)
    plan = plan_model(CATALOG["tiny"], cpu, PlanOptions(max_model_len=1024))
    assert plan.reasons == (
        "CPU cluster: one replica per node (Ray Serve LLM keeps a CPU replica on one node); "
        "KV cache 1.00 GiB (VLLM_CPU_KVCACHE_SPACE) = 524,288 tokens",
    )
    assert (plan.tp, plan.pp, plan.replicas, plan.kv_cache_tokens, plan.kv_cache_gib_fixed) == (1, 1, 3, 524_288, True)
    assert "kv_cache_memory_bytes" not in plan.engine_kwargs()  # VLLM_CPU_KVCACHE_SPACE=1 in the runtime env


def test_a_cpu_kv_cache_in_a_fraction_of_a_gib_is_planned_and_passed_in_bytes():
    # vLLM 0.32 CPU with kv_cache_memory_bytes=268435456 and VLLM_CPU_KVCACHE_SPACE unset logged
    # "CPU KV cache size: 131,072 tokens" for the tiny model (tests/data/planner/vllm-0.32-cpu-tiny-kv-fraction.log).
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=1)
    plan = plan_model(CATALOG["tiny"], cpu, PlanOptions(max_model_len=1024, kv_cache_gib=0.25))
    assert plan.kv_cache_tokens == 131_072
    assert plan.engine_kwargs()["kv_cache_memory_bytes"] == 268_435_456
    assert plan.reasons[-1].endswith("KV cache 0.25 GiB (kv_cache_memory_bytes: VLLM_CPU_KVCACHE_SPACE takes whole GiB) = 131,072 tokens")
