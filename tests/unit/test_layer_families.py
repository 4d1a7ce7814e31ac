"""Each family's layers, states and mixer weights (orchestrator.plan.layer_types), from the published
configs, against vLLM 0.32.0's own shapes, transformers' config defaults and the models' published sizes.
Gemma 3 / Gemma 4 configs: tests/data/checkpoints (SOURCES.md); Command R7B's sizing fields as a model
port's config table copies them (CohereLabs/c4ai-command-r7b-12-2024).

Configs: ai21labs/AI21-Jamba-1.5-Mini and tiiuae/falcon-mamba-7b config.json, as public test code
copies them whole (huggingface.co/<repo>/blob/main/config.json; found through the code index on
2026-12-07). Shapes: vllm/model_executor/layers/mamba/mamba_utils.py (``mamba1_state_shape``) and
mamba_mixer.py (``MambaMixer.__init__``). Sizes: AI21's "12B active / 52B total" for Jamba 1.5 Mini;
TII's 7.27B for Falcon Mamba 7B."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import spec_from_config
from orchestrator.plan.layer_types import FULL, SLIDING, layer_layout
from orchestrator.plan.memory import count_params
from tests.unit.test_layer_types import FALCON_H1, NEMOTRON_NANO_9B, SCOUT

JAMBA_15_MINI = {
    "architectures": ["JambaForCausalLM"], "attention_dropout": 0.0, "attn_layer_offset": 4, "attn_layer_period": 8, "bos_token_id": 1,
    "eos_token_id": [2, 518], "expert_layer_offset": 1, "expert_layer_period": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_state": 16,
    "mamba_dt_rank": 256, "mamba_expand": 2, "mamba_proj_bias": False, "max_position_embeddings": 262144, "model_type": "jamba",
    "num_attention_heads": 32, "num_experts": 16, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_logits_to_keep": 1, "output_router_logits": False, "pad_token_id": 0, "rms_norm_eps": 1e-06, "router_aux_loss_coef": 0.001,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True,
    "use_mamba_kernels": False, "vocab_size": 65536,
}  # fmt: skip
FALCON_MAMBA_7B = {
    "_name_or_path": "./", "architectures": ["FalconMambaForCausalLM"], "bos_token_id": 0, "conv_kernel": 4, "eos_token_id": 11, "expand": 16,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.1, "intermediate_size": 8192, "layer_norm_epsilon": 1e-05,
    "model_type": "falcon_mamba", "num_hidden_layers": 64, "pad_token_id": 11, "rescale_prenorm_residual": False, "residual_in_fp32": True,
    "state_size": 16, "tie_word_embeddings": False, "time_step_floor": 0.0001, "time_step_init_scheme": "random", "time_step_max": 0.1,
    "time_step_min": 0.001, "time_step_rank": 256, "time_step_scale": 1.0, "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0",
    "use_bias": False, "use_cache": True, "use_conv_bias": True, "vocab_size": 65024,
}  # fmt: skip


def _mamba1_mixer(hidden: int, inter: int, state: int, conv: int, dt_rank: int) -> int:
    """MambaMixer's weights (mamba_mixer.py): in_proj [hidden, 2 x inter], conv1d [inter, conv], x_proj
    [inter, dt_rank + 2 x state], dt_proj [dt_rank, inter], A [inter, state], D [inter], out_proj
    [inter, hidden]; written out here without the two bias vectors (conv1d's, dt_proj's: 2 x inter,
    0.02%), which orch leaves out."""
    return hidden * 2 * inter + inter * conv + inter * (dt_rank + 2 * state) + dt_rank * inter + inter * state + inter + inter * hidden


def _mamba1_state_bytes(inter: int, state: int, conv: int, tp: int, dtype_bytes: int) -> int:
    # mamba1_state_shape: conv (inter / tp, conv - 1) and temporal (inter / tp, state), both in the cache dtype
    return (inter // tp) * (conv - 1) * dtype_bytes + (inter // tp) * state * dtype_bytes


def test_jamba_has_attention_every_eighth_layer_from_the_fifth_and_moe_every_second():
    spec = spec_from_config(JAMBA_15_MINI, "jamba", name="jamba-1.5-mini")
    layout = spec.layout
    assert layout is not None and layout.describe() == "28 Mamba + 4 full attention"
    assert [i for i, a in enumerate(layout.attention) if a] == [4, 12, 20, 28]  # i % 8 == 4 (jamba.py)
    assert layout.mixer == tuple(not a for a in layout.attention)
    assert layout.mlp == "dm" * 16  # MoE on i % 2 == 1
    assert "attn_layer_period 8 / attn_layer_offset 4, MoE every 2 from 1 (jamba.py)" == layout.sources[0]
    assert layout.mixer_params == _mamba1_mixer(4096, 8192, 16, 4, 256)
    assert 51.5e9 <= count_params(spec).total <= 52.5e9  # "52B total"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_a_mamba1_state_splits_over_tp_by_channel_as_vllm_shapes_it(tp):
    spec = spec_from_config(JAMBA_15_MINI, "jamba", name="jamba-1.5-mini")
    assert spec.layout is not None and spec.layout.state is not None
    assert spec.layout.state.bytes_per_gpu(tp, 2) == _mamba1_state_bytes(8192, 16, 4, tp, 2)


def test_jamba_defaults_are_transformers_jamba_config_defaults():
    # JambaConfig's defaults: attn_layer_period 8, attn_layer_offset 4, expert_layer_period 2, expert_layer_offset 1,
    # mamba_d_state 16, mamba_d_conv 4, mamba_expand 2, mamba_dt_rank "auto" = ceil(hidden / 16)
    bare = {k: v for k, v in JAMBA_15_MINI.items() if not k.startswith(("attn_layer", "expert_layer", "mamba_"))}
    full = spec_from_config(JAMBA_15_MINI, "jamba", name="j").layout
    defaults = spec_from_config(bare, "jamba", name="j").layout
    assert defaults == full  # Jamba 1.5 Mini writes the defaults out (dt_rank 256 = 4096 / 16)
    auto = spec_from_config({**JAMBA_15_MINI, "mamba_dt_rank": "auto"}, "jamba", name="j").layout
    assert auto.mixer_params == full.mixer_params


def test_falcon_mamba_is_every_layer_a_mamba_state_and_7_27b_parameters():
    spec = spec_from_config(FALCON_MAMBA_7B, "falcon-mamba", name="falcon-mamba-7b")
    layout = spec.layout
    assert layout is not None and layout.describe() == "64 Mamba"
    assert layout.attention == (False,) * 64 and layout.mixer == (True,) * 64 and layout.mlp == "-" * 64
    assert layout.sources == ("every layer Mamba (mamba.py)",)
    assert layout.mixer_params == _mamba1_mixer(4096, 8192, 16, 4, 256)
    assert layout.state is not None and layout.state.bytes_per_gpu(1, 2) == _mamba1_state_bytes(8192, 16, 4, 1, 2)
    assert count_params(spec).total == pytest.approx(7.27e9, rel=0.001)
    # time_step_rank defaults to ceil(hidden / 16) (MambaConfig "auto"), conv_kernel to 4
    bare = {k: v for k, v in FALCON_MAMBA_7B.items() if k not in ("time_step_rank", "conv_kernel")}
    assert spec_from_config(bare, "f", name="f").layout == layout


CHECKPOINTS = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
# google/gemma-3-27b-it's text_config (tests/data/checkpoints/SOURCES.md): no sliding_window_pattern, so
# transformers' Gemma3TextConfig default 6 makes every sixth layer global
GEMMA3_27B = json.loads((CHECKPOINTS / "multimodal" / "gemma3" / "config.json").read_text())["text_config"]
# nvidia/Gemma-4-31B-IT-NVFP4's text_config: layer_types written out, K = V on the global layers
GEMMA4_31B = json.loads((CHECKPOINTS / "nvidia--Gemma-4-31B-IT-NVFP4" / "config.json").read_text())["text_config"]


def test_gemma3_without_a_pattern_takes_transformers_default_of_six():
    layout = layer_layout(GEMMA3_27B, "gemma3", GEMMA3_27B["num_hidden_layers"])
    assert layout is not None and layout.describe() == "52 sliding-window (1,024) + 10 full attention"
    full = [i for i, c in enumerate(layout.caches) if c[0].kind == FULL]
    assert full == list(range(5, 62, 6))  # (i + 1) % 6 == 0; the last layer, 61, is sliding
    assert layout.sources == ("sliding_window_pattern 6, sliding_window 1024 (gemma3.py)",)
    assert layer_layout({**GEMMA3_27B, "sliding_window_pattern": 6}, "gemma3", 62) == layout


def test_gemma2_without_layer_types_alternates_from_a_sliding_first_layer():
    # transformers Gemma2Config: layer_types = sliding if (i + 1) % 2 else full
    gemma2 = {**GEMMA3_27B, "model_type": "gemma2", "num_hidden_layers": 42, "sliding_window": 4096}
    layout = layer_layout(gemma2, "gemma2", 42)
    assert layout is not None and layout.describe() == "21 sliding-window (4,096) + 21 full attention"
    assert [c[0].kind for c in layout.caches[:2]] == [SLIDING, FULL] and layout.caches[-1][0].kind == FULL


def test_cohere2_layers_see_one_token_more_than_the_window_and_every_fourth_is_global():
    # CohereLabs/c4ai-command-r7b-12-2024: 32 layers, sliding_window 4096, sliding_window_pattern 4
    # (transformers' Cohere2Config default too); commandr.py: "sliding_window + 1"
    command_r7b = {"model_type": "cohere2", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 256000,
                   "sliding_window": 4096, "sliding_window_pattern": 4}  # fmt: skip
    layout = layer_layout(command_r7b, "c", 32)
    assert layout is not None and layout.describe() == "24 sliding-window (4,097) + 8 full attention"
    assert [c[0].kind for c in layout.caches[:4]] == [SLIDING, SLIDING, SLIDING, FULL]
    bare = {k: v for k, v in command_r7b.items() if k != "sliding_window_pattern"}
    assert layer_layout(bare, "c", 32) == replace(layout, sources=("sliding_window_pattern 4, sliding_window 4097 (commandr.py)",))


def test_gemma4_global_layers_take_their_own_kv_heads_only_where_k_equals_v():
    layout = layer_layout(GEMMA4_31B, "g", 60)
    assert layout is not None and layout.describe() == "50 sliding-window (1,024) + 10 full attention"
    assert (layout.global_kv_heads, layout.global_head_dim) == (4, 512)
    # transformers' Gemma4TextConfig: the global KV heads override only with attention_k_eq_v; global_head_dim 512 by default
    no_keqv = layer_layout({**GEMMA4_31B, "attention_k_eq_v": False}, "g", 60)
    assert no_keqv is not None and (no_keqv.global_kv_heads, no_keqv.global_head_dim) == (0, 512)
    no_dim = layer_layout({k: v for k, v in GEMMA4_31B.items() if k != "global_head_dim"}, "g", 60)
    assert no_dim is not None and no_dim.global_head_dim == 512


def test_gemma4_kv_shared_layers_are_the_last_ones_and_keep_no_cache():
    # gemma4.py: layers from num_hidden_layers - num_kv_shared_layers on read an earlier layer's cache
    layout = layer_layout({**GEMMA4_31B, "num_kv_shared_layers": 20}, "g", 60)
    assert layout is not None and layout.caches[39] != () and layout.caches[40:] == ((),) * 20
    assert layout.describe() == "34 sliding-window (1,024) + 6 full attention"
    assert layout.sources[0].endswith(", num_kv_shared_layers 20 (gemma4.py)")


def _llama(**extra) -> dict:
    # meta-llama/Llama-3.1-8B-Instruct's sizing fields (tests/data/planner/configs)
    cfg = json.loads((Path(__file__).resolve().parents[1] / "data" / "planner" / "configs" / "Llama-3.1-8B-Instruct" / "config.json").read_text())
    return {**cfg, **extra}


@pytest.mark.parametrize(("model_type", "name"), [("minimax_text_01", "MiniMax-Text-01"), ("minimax_m1", "MiniMax-M1")])
def test_minimax_lightning_attention_is_refused_as_vllm_dropped_it(model_type, name):
    # vLLM 0.32's registry.py lists MiniMaxText01ForCausalLM / MiniMaxM1ForCausalLM as removed in 0.23.0
    with pytest.raises(ModelSpecError) as err:
        layer_layout(_llama(model_type=model_type), "m/config.json", 32)
    assert str(err.value).startswith(f"m/config.json: {name}") and "(lightning attention)" in str(err.value)
    assert "registry.py" in str(err.value) and err.value.exit_code == 2


def test_llama_layer_types_all_full_is_the_plain_transformer_and_one_sliding_layer_is_not():
    full = ["full_attention"] * 32
    assert layer_layout(_llama(layer_types=full), "c", 32) is None
    one = layer_layout(_llama(layer_types=full[:31] + ["sliding_attention"], sliding_window=4096), "c", 32)
    assert one is not None and one.describe() == "1 sliding-window (4,096) + 31 full attention"
    assert one.caches[31][0].kind == SLIDING and one.sources == ("layer_types, sliding_window 4096 (llama.py)",)


def test_a_mistral_window_that_is_switched_off_or_zero_is_no_window():
    # config/model.py: "Some checkpoints set sliding_window to 0 to indicate that sliding window is disabled"
    assert layer_layout(_llama(model_type="mistral", sliding_window=0), "c", 32) is None
    assert layer_layout(_llama(model_type="mistral", sliding_window=4096, use_sliding_window=False), "c", 32) is None
    assert layer_layout(_llama(model_type="mistral", sliding_window=None), "c", 32) is None
    on = layer_layout(_llama(model_type="mistral", sliding_window=4096, use_sliding_window=True), "c", 32)
    assert on is not None and on.describe() == "32 sliding-window (4,096)"


@pytest.mark.parametrize("key", ["attn_type_list", "full_attention_interval", "attention_chunk_size", "attn_layer_period"])
def test_a_hybrid_field_without_a_reader_for_its_model_type_is_refused(key):
    with pytest.raises(ModelSpecError) as err:
        layer_layout(_llama(model_type="some_new_hybrid", **{key: 4}), "m/config.json", 32)
    assert f"'{key}' describes layers that are not full attention" in str(err.value) and "'some_new_hybrid'" in str(err.value)


def test_any_other_family_may_list_full_attention_everywhere():
    # Qwen2/3 configs written by transformers 4.5x carry layer_types: all full attention
    assert layer_layout(_llama(model_type="qwen3", layer_types=["full_attention"] * 32), "c", 32) is None
    assert layer_layout(_llama(model_type="qwen3"), "c", 32) is None


def _mamba2_state_bytes(inter: int, groups: int, heads: int, head_dim: int, state: int, conv: int, tp: int, s: int, ssm: int) -> int:
    """vLLM's mamba2_state_shape: groups grow to TP when TP does not divide them
    (extra_groups_for_head_shards: tp - groups), conv (inter + 2 x groups x state) / tp x (conv - 1) in the
    model dtype, temporal heads / tp x head_dim x state in the SSM cache dtype."""
    groups = groups if groups % tp == 0 else tp
    return (inter + 2 * groups * state) // tp * (conv - 1) * s + heads // tp * head_dim * state * ssm


def _mamba2_mixer(hidden: int, inter: int, groups: int, heads: int, state: int, conv: int) -> int:
    """MambaMixer2's weights (mamba_mixer2.py): in_proj [hidden, inter (z) + inter + 2 x groups x state (x, B, C)
    + heads (dt)], conv1d [inter + 2 x groups x state, conv], out_proj [inter, hidden], A / D / dt_bias [heads]
    and the gated norm [inter]; without conv1d's bias."""
    conv_dim = inter + 2 * groups * state
    return hidden * (inter + conv_dim + heads) + conv_dim * conv + inter * hidden + 3 * heads + inter


# transformers' Mamba2Config defaults: mistralai/Mamba-Codestral-7B-v0.1 (its documented default model)
CODESTRAL_MAMBA = {"model_type": "mamba2", "num_hidden_layers": 64, "hidden_size": 4096, "num_heads": 128, "head_dim": 64, "expand": 2,
                   "n_groups": 8, "state_size": 128, "conv_kernel": 4, "vocab_size": 32768, "tie_word_embeddings": False}  # fmt: skip


@pytest.mark.parametrize("tp", [1, 2, 4, 16])
def test_a_mamba2_model_is_every_layer_a_state_shaped_as_vllm_shapes_it(tp):
    layout = layer_layout(CODESTRAL_MAMBA, "m", 64)
    assert layout is not None and layout.describe() == "64 Mamba2" and layout.mlp == "-" * 64
    assert layout.attention == (False,) * 64 and layout.sources == ("every layer Mamba2 (mamba2.py)",)
    assert layout.mixer_params == _mamba2_mixer(4096, 8192, 8, 128, 128, 4)
    assert layout.state is not None and layout.state.bytes_per_gpu(tp, 2) == _mamba2_state_bytes(8192, 8, 128, 64, 128, 4, tp, 2, 2)
    # Mamba2Config's defaults for the fields a config may leave out: n_groups 1, conv_kernel 4, expand 2
    bare = {k: v for k, v in CODESTRAL_MAMBA.items() if k not in ("conv_kernel", "expand")}
    assert layer_layout(bare, "m", 64) == layout
    one_group = layer_layout({k: v for k, v in CODESTRAL_MAMBA.items() if k != "n_groups"}, "m", 64)
    assert one_group is not None and one_group.mixer_params == _mamba2_mixer(4096, 8192, 1, 128, 128, 4)


def test_nemotron_h_keeps_its_ssm_state_in_fp32_by_default_and_groups_grow_to_tp():
    # NemotronHConfig: mamba_ssm_cache_dtype "float32" unless the config says otherwise; n_groups 8
    spec = spec_from_config(NEMOTRON_NANO_9B, "n", name="n")
    assert spec.layout is not None and spec.layout.state is not None
    for tp in (1, 2, 8, 16):
        assert spec.layout.state.bytes_per_gpu(tp, 2) == _mamba2_state_bytes(10240, 8, 128, 80, 128, 4, tp, 2, 4), tp
    assert spec.layout.mixer_params == _mamba2_mixer(4480, 10240, 8, 128, 128, 4)
    assert spec.layout.mlp_matrices == 2  # NemotronHMLP: up and down only


def test_nemotron_h_reads_layers_block_type_as_its_pattern():
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    blocks = [names[c] for c in NEMOTRON_NANO_9B["hybrid_override_pattern"]]
    cfg = {k: v for k, v in NEMOTRON_NANO_9B.items() if k != "hybrid_override_pattern"}
    by_blocks = layer_layout({**cfg, "layers_block_type": blocks}, "n", 56)
    by_pattern = layer_layout(NEMOTRON_NANO_9B, "n", 56)
    assert by_blocks is not None and by_pattern is not None
    assert replace(by_blocks, sources=()) == replace(by_pattern, sources=())
    assert by_blocks.sources == ("layers_block_type (nemotron_h.py)",)
    moe = layer_layout({**cfg, "layers_block_type": ["moe" if b == "mlp" else b for b in blocks]}, "n", 56)
    assert moe is not None and moe.mlp == by_pattern.mlp.replace("d", "m")
    with pytest.raises(ModelSpecError, match="has 55 layers, num_hidden_layers 56"):
        layer_layout({**NEMOTRON_NANO_9B, "hybrid_override_pattern": NEMOTRON_NANO_9B["hybrid_override_pattern"][:55]}, "n", 56)


# Zyphra/Zamba2-2.7B's layer plan (transformers' Zamba2Config default, spelled "mamba" / "hybrid" as the
# published config.json spells it): a shared attention block beside the Mamba2 on 9 of 54 layers
ZAMBA2_BLOCKS = ["hybrid" if i in (6, 12, 18, 24, 30, 36, 42, 47, 51) else "mamba" for i in range(54)]
ZAMBA2 = {"model_type": "zamba2", "num_hidden_layers": 54, "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 32,
          "num_key_value_heads": 32, "vocab_size": 32000, "layers_block_type": ZAMBA2_BLOCKS, "mamba_d_state": 64, "mamba_d_conv": 4,
          "mamba_expand": 2, "mamba_headdim": 64, "mamba_ngroups": 1, "n_mamba_heads": 80, "num_mem_blocks": 1}  # fmt: skip


def test_zamba2_counts_its_shared_attention_blocks_once_and_a_state_on_every_layer():
    layout = layer_layout(ZAMBA2, "z", 54)
    assert layout is not None and layout.describe() == "54 Mamba2 + 9 full attention"
    assert layout.mixer == (True,) * 54
    # num_mem_blocks 1: one shared attention + MLP block, its weights counted once, on the first hybrid layer
    assert [i for i, a in enumerate(layout.attention) if a] == [6] and layout.mlp == "-" * 6 + "d" + "-" * 47
    two = layer_layout({**ZAMBA2, "num_mem_blocks": 2}, "z", 54)
    assert two is not None and [i for i, a in enumerate(two.attention) if a] == [6, 12]
    assert layout.mixer_params == _mamba2_mixer(2560, 5120, 1, 80, 64, 4)
    assert layout.state is not None and layout.state.bytes_per_gpu(2, 2) == _mamba2_state_bytes(5120, 1, 80, 64, 64, 4, 2, 2, 2)
    # Zamba2Config defaults: mamba_ngroups 1, mamba_d_conv 4, mamba_expand 2, num_mem_blocks 1
    bare = {k: v for k, v in ZAMBA2.items() if k not in ("mamba_ngroups", "mamba_d_conv", "mamba_expand", "num_mem_blocks")}
    assert layer_layout(bare, "z", 54) == layout
    with pytest.raises(ModelSpecError, match=r"layers_block_type\[3\]"):
        layer_layout({**ZAMBA2, "layers_block_type": ZAMBA2_BLOCKS[:3] + ["attention"] + ZAMBA2_BLOCKS[4:]}, "z", 54)


# The GraniteMoeHybrid example config of transformers' model docs (8 layers: three Mamba2, one attention, twice)
GRANITE_H = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 512, "intermediate_size": 1024, "model_type": "granitemoehybrid",
    "layer_types": ["mamba", "mamba", "mamba", "attention", "mamba", "mamba", "mamba", "attention"], "mamba_d_conv": 4,
    "mamba_d_head": 128, "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 8, "num_attention_heads": 8,
    "num_experts_per_tok": 2, "num_hidden_layers": 8, "num_key_value_heads": 8, "num_local_experts": 8, "shared_intermediate_size": 512,
    "tie_word_embeddings": True, "vocab_size": 49152,
}  # fmt: skip


def test_granite_h_layer_types_are_mamba2_or_attention_with_moe_on_every_layer():
    layout = layer_layout(GRANITE_H, "g", 8)
    assert layout is not None and layout.describe() == "6 Mamba2 + 2 full attention"
    assert [i for i, a in enumerate(layout.attention) if a] == [3, 7] and layout.mixer == tuple(not a for a in layout.attention)
    assert layout.mlp == "m" * 8 and layout.sources == ("layer_types mamba / attention (granitemoehybrid.py)",)
    assert layout.mixer_params == _mamba2_mixer(512, 1024, 1, 8, 128, 4)
    assert layout.state is not None and layout.state.bytes_per_gpu(2, 2) == _mamba2_state_bytes(1024, 1, 8, 128, 128, 4, 2, 2, 2)
    dense = layer_layout({k: v for k, v in GRANITE_H.items() if k not in ("num_local_experts", "mamba_expand")}, "g", 8)
    assert dense is not None and dense.mlp == "d" * 8 and dense.mixer_params == layout.mixer_params  # mamba_expand 2 by default
    blocks = {k: v for k, v in GRANITE_H.items() if k != "layer_types"}
    assert layer_layout({**blocks, "layers_block_type": GRANITE_H["layer_types"]}, "g", 8) == layout  # the older name
    with pytest.raises(ModelSpecError, match=r"layer_types\[0\]"):
        layer_layout({**GRANITE_H, "layer_types": ["moe"] + GRANITE_H["layer_types"][1:]}, "g", 8)


def test_kimi_linear_kda_layers_are_one_based_and_the_state_is_vllms_kda_shape():
    # vLLM's kimi_linear config: is_kda_layer(i) = (i + 1) in linear_attn_config["kda_layers"];
    # kda_state_shape: conv (3 x heads x head_dim) / tp x (kernel - 1), recurrent heads / tp x head_dim x head_dim (fp32)
    lin = {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4}
    cfg = {"model_type": "kimi_linear", "num_hidden_layers": 4, "hidden_size": 2304, "num_attention_heads": 32, "vocab_size": 163840,
           "first_k_dense_replace": 1, "linear_attn_config": lin}  # fmt: skip
    layout = layer_layout(cfg, "k", 4)
    assert layout is not None and layout.describe() == "3 KDA + 1 full attention"
    assert layout.attention == (False, False, False, True) and layout.mixer == (True, True, True, False) and layout.mlp == "dmmm"
    for tp in (1, 2, 4):
        assert layout.state is not None and layout.state.bytes_per_gpu(tp, 2) == 3 * 32 * 128 // tp * 3 * 2 + 32 // tp * 128 * 128 * 4
    no_conv = layer_layout({**cfg, "linear_attn_config": {k: v for k, v in lin.items() if k != "short_conv_kernel_size"}}, "k", 4)
    assert no_conv == layout  # kernel 4 by default
    with pytest.raises(ModelSpecError, match="linear_attn_config.kda_layers is missing"):
        layer_layout({**cfg, "linear_attn_config": {"num_heads": 32}}, "k", 4)


PLANNER_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "planner" / "configs"
QWEN3_CODER_NEXT = json.loads((PLANNER_CONFIGS / "Qwen3-Coder-Next" / "config.json").read_text())


def _gdn_state_bytes(kh: int, vh: int, kd: int, vd: int, conv: int, tp: int, s: int, ssm: int) -> int:
    # vLLM's gated_delta_net_state_shape: conv (2 x kh x kd + vh x vd) / tp x (conv - 1), temporal vh / tp x vd x kd
    return (2 * kh * kd + vh * vd) // tp * (conv - 1) * s + vh // tp * vd * kd * ssm


def _gdn_mixer(hidden: int, kh: int, vh: int, kd: int, vd: int, conv: int) -> int:
    """Qwen3NextGatedDeltaNet's weights (qwen3_next.py): in_proj_qkvz [hidden, 2 x kh x kd + 2 x vh x vd],
    in_proj_ba [hidden, 2 x vh], conv1d [2 x kh x kd + vh x vd, conv], out_proj [vh x vd, hidden], A_log and
    dt_bias [vh], the gated norm [vd]."""
    return hidden * (2 * kh * kd + 2 * vh * vd + 2 * vh) + (2 * kh * kd + vh * vd) * conv + vh * vd * hidden + 2 * vh + vd


def test_qwen3_next_every_fourth_layer_is_full_attention_up_to_the_last():
    layout = layer_layout(QWEN3_CODER_NEXT, "q", 48)
    assert layout is not None and layout.describe() == "36 Gated DeltaNet + 12 full attention"
    assert [i for i, a in enumerate(layout.attention) if a] == list(range(3, 48, 4))  # (i + 1) % 4 == 0: the last layer too
    assert layout.mlp == "m" * 48 and layout.sources == ("full_attention_interval 4 (qwen3_next.py)",)
    assert layout.mixer_params == _gdn_mixer(2048, 16, 32, 128, 128, 4)
    for tp in (1, 2, 4):
        assert layout.state is not None and layout.state.bytes_per_gpu(tp, 2) == _gdn_state_bytes(16, 32, 128, 128, 4, tp, 2, 2)
    # Qwen3NextConfig's defaults: full_attention_interval 4, linear_conv_kernel_dim 4
    bare = {k: v for k, v in QWEN3_CODER_NEXT.items() if k not in ("full_attention_interval", "linear_conv_kernel_dim")}
    assert layer_layout(bare, "q", 48) == layout
    dense = layer_layout({k: v for k, v in QWEN3_CODER_NEXT.items() if k != "num_experts"}, "q", 48)
    assert dense is not None and dense.mlp == "d" * 48


def test_qwen3_5_keeps_its_gated_deltanet_state_in_fp32_when_the_config_says_so():
    # Qwen3.8-27B's text_config: mamba_ssm_dtype float32 (vLLM's Qwen3_5 config reads it for the SSM state)
    cfg = json.loads((PLANNER_CONFIGS / "Qwen3.8-27B" / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    layout = layer_layout(text, "q", 64)
    assert layout is not None and layout.describe() == "48 Gated DeltaNet + 16 full attention"
    assert layout.state is not None and layout.state.bytes_per_gpu(2, 2) == _gdn_state_bytes(16, 48, 128, 128, 4, 2, 2, 4)
    assert layout.sources[0].startswith("layer_types, mamba_ssm_dtype float32 (qwen3_5.py)")
    bf16 = layer_layout({**text, "mamba_ssm_dtype": "bfloat16"}, "q", 64)
    assert bf16 is not None and bf16.state is not None and bf16.state.bytes_per_gpu(2, 2) == _gdn_state_bytes(16, 48, 128, 128, 4, 2, 2, 2)
    with pytest.raises(ModelSpecError, match=r"layer_types\[0\]"):
        layer_layout({**text, "layer_types": ["sliding_attention"] + text["layer_types"][1:]}, "q", 64)


def test_llama4_defaults_are_transformers_llama4_text_config_defaults():
    # Llama4TextConfig: attention_chunk_size 8192, no_rope_layer_interval 4, interleave_moe_layer_step 1;
    # llama4.py chunks a RoPE layer only when attention_chunk_size is set (a null turns it off)
    scout = layer_layout(SCOUT, "s", 48)
    bare = {k: v for k, v in SCOUT.items() if k not in ("attention_chunk_size", "interleave_moe_layer_step", "no_rope_layers")}
    assert layer_layout(bare, "s", 48) == scout
    assert layer_layout({**SCOUT, "no_rope_layer_interval": 0}, "s", 48) == scout  # 0 would divide by zero: the default
    off = layer_layout({**SCOUT, "attention_chunk_size": None}, "s", 48)
    assert off is not None and off.describe() == "48 full attention"
    assert off.mlp == "m" * 48
    every_other = layer_layout({**SCOUT, "interleave_moe_layer_step": 2}, "s", 48)
    assert every_other is not None and every_other.mlp == "dm" * 24
    with pytest.raises(ModelSpecError, match="'no_rope_layers' must list the 48 layers"):
        layer_layout({**SCOUT, "no_rope_layers": [1] * 47}, "s", 48)


def test_falcon_h1_runs_attention_and_mamba2_side_by_side_with_d_ssm_or_expand_times_hidden():
    # falcon_h1.py: d_ssm = mamba_d_ssm, or mamba_expand x hidden_size when unset; the state is mamba2_state_shape's
    layout = layer_layout(FALCON_H1, "f", 24)
    assert layout is not None and layout.describe() == "24 Mamba2 + 24 full attention"
    assert layout.attention == (True,) * 24 and layout.mixer == (True,) * 24 and layout.mlp == ""
    assert layout.mixer_params == _mamba2_mixer(2048, 3072, 1, 48, 256, 4)
    assert layout.state is not None and layout.state.bytes_per_gpu(2, 2) == _mamba2_state_bytes(3072, 1, 48, 64, 256, 4, 2, 2, 2)
    expand = layer_layout({k: v for k, v in FALCON_H1.items() if k != "mamba_d_ssm"}, "f", 24)
    assert expand is not None and expand.mixer_params == _mamba2_mixer(2048, 4096, 1, 48, 256, 4)


# ---- every reader names the file and the field it cannot read (a bad config exits 2 naming both) ----

GEMMA3_27B_TEXT = {**GEMMA3_27B, "model_type": "gemma3_text"}
KIMI_LINEAR = {"model_type": "kimi_linear", "num_hidden_layers": 4, "hidden_size": 2304, "num_attention_heads": 32, "vocab_size": 163840,
               "linear_attn_config": {"kda_layers": [1, 2, 3], "num_heads": 32, "head_dim": 128}}  # fmt: skip
REQUIRED_FIELDS = [
    (QWEN3_CODER_NEXT, ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "hidden_size")),
    (KIMI_LINEAR, ("hidden_size",)),
    (NEMOTRON_NANO_9B, ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel", "hidden_size")),
    (GRANITE_H, ("hidden_size", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv")),
    (JAMBA_15_MINI, ("hidden_size",)),
    (FALCON_H1, ("hidden_size", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv")),
    (ZAMBA2, ("hidden_size", "n_mamba_heads", "mamba_headdim", "mamba_d_state")),
    (CODESTRAL_MAMBA, ("hidden_size", "num_heads", "head_dim", "state_size")),
    (FALCON_MAMBA_7B, ("hidden_size", "intermediate_size", "state_size")),
    (GEMMA3_27B_TEXT, ("sliding_window",)),
]
CASES = [(cfg, key) for cfg, keys in REQUIRED_FIELDS for key in keys]


@pytest.mark.parametrize(("cfg", "key"), CASES, ids=[f"{c['model_type']}-{k}" for c, k in CASES])
def test_a_missing_or_bad_layer_field_names_the_file_and_the_field(cfg, key):
    n = cfg["num_hidden_layers"]
    with pytest.raises(ModelSpecError) as err:
        layer_layout({k: v for k, v in cfg.items() if k != key}, "m/config.json", n)
    assert str(err.value) == f"m/config.json: config is missing '{key}', which sizes this model's layers"
    assert err.value.hint and err.value.hint.startswith("orch sizes full, sliding-window, chunked, Mamba/linear-attention and indexer caches")
    with pytest.raises(ModelSpecError) as err:
        layer_layout({**cfg, key: "x"}, "m/config.json", n)
    assert str(err.value) == f"m/config.json: '{key}' must be a non-negative integer, got 'x'"


@pytest.mark.parametrize(("cfg", "key"), [(GRANITE_H, "layer_types"), (ZAMBA2, "layers_block_type"), (QWEN3_CODER_NEXT, "layer_types")])
def test_a_short_layer_list_names_the_file_and_the_field(cfg, key):
    n = cfg["num_hidden_layers"]
    short = cfg[key][: n - 1] if cfg.get(key) else ["full_attention"] * (n - 1)
    with pytest.raises(ModelSpecError) as err:
        layer_layout({**cfg, key: short}, "m/config.json", n)
    assert str(err.value).startswith(f"m/config.json: '{key}' must list the {n} layers, got ")
    bad = ["moe"] + list(cfg[key][1:]) if cfg.get(key) else ["moe"] + ["full_attention"] * (n - 1)
    with pytest.raises(ModelSpecError) as err:
        layer_layout({**cfg, key: bad}, "m/config.json", n)
    assert str(err.value) == f"m/config.json: {'layers_block_type' if key == 'layers_block_type' else 'layer_types'}[0] names a layer type orch does not know: 'moe'"


def test_granite_h_intermediate_size_is_mamba_expand_times_hidden():
    # granitemoehybrid.py: intermediate_size=config.mamba_expand * config.hidden_size
    layout = layer_layout({**GRANITE_H, "mamba_expand": 4}, "g", 8)
    assert layout is not None and layout.mixer_params == _mamba2_mixer(512, 2048, 1, 8, 128, 4)
    assert layout.state is not None and layout.state.bytes_per_gpu(1, 2) == _mamba2_state_bytes(2048, 1, 8, 128, 128, 4, 1, 2, 2)


def test_llama4_reads_its_chunk_and_rope_interval_and_names_the_file_in_each_error():
    # llama4.py: a RoPE layer caches attention_chunk_size tokens; no_rope_layers derived from no_rope_layer_interval
    # (every interval-th layer full) when the list is empty
    layout = layer_layout({**SCOUT, "attention_chunk_size": 4096, "no_rope_layer_interval": 2}, "s", 48)
    assert layout is not None and layout.describe() == "24 chunked-local (4,096) + 24 full attention"
    for key in ("attention_chunk_size", "no_rope_layer_interval", "interleave_moe_layer_step"):
        with pytest.raises(ModelSpecError) as err:
            layer_layout({**SCOUT, key: "x"}, "m/config.json", 48)
        assert str(err.value) == f"m/config.json: '{key}' must be a non-negative integer, got 'x'"
    with pytest.raises(ModelSpecError) as err:
        layer_layout({**SCOUT, "no_rope_layers": [1] * 47}, "m/config.json", 48)
    assert str(err.value) == "m/config.json: 'no_rope_layers' must list the 48 layers"
    assert err.value.hint and err.value.hint.startswith("orch sizes full, sliding-window, chunked")


def test_an_unknown_layer_type_is_shown_to_40_characters_with_the_hint():
    long_name = "a_layer_type_with_a_name_longer_than_forty_characters"
    with pytest.raises(ModelSpecError) as err:
        layer_layout({**GRANITE_H, "layer_types": [long_name] + GRANITE_H["layer_types"][1:]}, "m/config.json", 8)
    assert str(err.value) == f"m/config.json: layer_types[0] names a layer type orch does not know: {long_name[:40]!r}"
    assert err.value.hint == (
        "orch sizes full, sliding-window, chunked, Mamba/linear-attention and indexer caches; "
        "a new layer type needs vLLM's model file read first"
    )


# ---- every field a family reader takes from the config is read (a value other than the default changes the
# layout: vLLM's model file reads it) and a bad value names the file and the field ----

DEEPSEEK_V32_CFG = {"model_type": "deepseek_v32", "num_hidden_layers": 4, "index_topk": 2048, "index_head_dim": 128, "first_k_dense_replace": 3}
READ_FIELDS = [
    (JAMBA_15_MINI, "attn_layer_period", 4), (JAMBA_15_MINI, "attn_layer_offset", 2), (JAMBA_15_MINI, "expert_layer_period", 4),
    (JAMBA_15_MINI, "expert_layer_offset", 0), (JAMBA_15_MINI, "mamba_d_state", 32), (JAMBA_15_MINI, "mamba_d_conv", 2),
    (JAMBA_15_MINI, "mamba_expand", 4), (JAMBA_15_MINI, "mamba_dt_rank", 128),
    (ZAMBA2, "mamba_ngroups", 2), (ZAMBA2, "mamba_d_conv", 2), (ZAMBA2, "mamba_expand", 4), (ZAMBA2, "num_mem_blocks", 2),
    (CODESTRAL_MAMBA, "n_groups", 4), (CODESTRAL_MAMBA, "conv_kernel", 2), (CODESTRAL_MAMBA, "expand", 4),
    (FALCON_MAMBA_7B, "conv_kernel", 2), (FALCON_MAMBA_7B, "time_step_rank", 128),
    (NEMOTRON_NANO_9B, "n_groups", 4), (QWEN3_CODER_NEXT, "linear_conv_kernel_dim", 2),
    (DEEPSEEK_V32_CFG, "index_head_dim", 64), (DEEPSEEK_V32_CFG, "first_k_dense_replace", 1),
]  # fmt: skip


@pytest.mark.parametrize(("cfg", "key", "value"), READ_FIELDS, ids=[f"{c['model_type']}-{k}" for c, k, _ in READ_FIELDS])
def test_each_field_a_family_reads_changes_its_layout_and_a_bad_one_names_the_file(cfg, key, value):
    n = cfg["num_hidden_layers"]
    assert cfg.get(key) != value
    assert layer_layout({**cfg, key: value}, "c", n) != layer_layout(cfg, "c", n)
    with pytest.raises(ModelSpecError) as err:
        layer_layout({**cfg, key: "x"}, "m/config.json", n)
    assert str(err.value) == f"m/config.json: '{key}' must be a non-negative integer, got 'x'"
