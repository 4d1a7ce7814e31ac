"""vLLM engine arguments as orch takes them: `--engine-arg KEY=VALUE`, the names orch sets itself,
and the planner's dtype as vLLM's --dtype/--quantization. Pure.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.errors import ServeConfigError

_DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "auto": "auto",
}

# Planner dtypes that are a weight quantization rather than an activation dtype: vLLM takes the
# activation dtype from the checkpoint ("auto") and the quantization from the checkpoint's own
# quantization_config, or, for on-the-fly fp8 of a 16-bit checkpoint, from the plan's
# `quantization` engine argument (orchestrator.plan.dtype_rules). Rendering `quantization: fp8`
# for an fp8 checkpoint would make vLLM refuse it ("Quantization method specified in the model
# config (compressed-tensors) does not match ...", vllm/config/model.py _verify_quantization).
_WEIGHT_QUANTIZATIONS = ("fp8", "int8", "int4")

# vLLM engine argument names are Python identifiers in snake case (``AsyncEngineArgs`` fields);
# anything else (quotes, spaces, YAML syntax) is refused before it gets near the template.
ENGINE_ARG_KEY = re.compile(r"[a-z][a-z0-9_]*\Z")

# Set by orch from the plan, the flags or the key: an --engine-arg may not override them.
RESERVED_ENGINE_ARGS = ("api_key", "model", "served_model_name", "tensor_parallel_size", "pipeline_parallel_size",
                        "max_model_len", "dtype", "data_parallel_size", "enable_expert_parallel")  # fmt: skip
# Set per rank by Ray Serve LLM's DPServer (the rank, the group's master address and port).
DP_RANK_ENGINE_ARGS = ("data_parallel_rank", "data_parallel_address", "data_parallel_rpc_port")


def check_engine_arg_key(key: str) -> None:
    """Refuse an engine argument name that is not a plain vLLM name, or one orch sets itself."""
    if not isinstance(key, str) or not ENGINE_ARG_KEY.match(key):
        raise ServeConfigError(
            f"engine argument name {key!r} is not a vLLM engine argument name (lowercase letters, digits and _)",
            hint="e.g. --engine-arg max_num_seqs=64 (vLLM's flag --max-num-seqs without the dashes)",
        )
    if key in RESERVED_ENGINE_ARGS:
        raise ServeConfigError(
            f"engine argument {key!r} is set by orch",
            hint="use the matching orch flag (--tp, --pp, --dp, --expert-parallel, --max-model-len, --dtype, --served-name)",
        )
    if key in DP_RANK_ENGINE_ARGS:
        raise ServeConfigError(
            f"engine argument {key!r} is set for each data-parallel rank by Ray Serve LLM",
            hint="leave it out: --dp N deploys the group, and each rank learns its rank and the group's master itself",
        )


def parse_engine_arg(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of --engine-arg -> (vLLM name, value). The value is YAML (``64``, ``true``,
    ``[1, 2]``, ``{a: 1}``) without anchors or aliases; bad input is a ServeConfigError (exit 2)."""
    import yaml

    key, sep, raw = item.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ServeConfigError(f"--engine-arg {item!r}: expected KEY=VALUE", hint="e.g. --engine-arg max_num_seqs=64")
    check_engine_arg_key(key)
    try:
        if any(
            isinstance(ev, yaml.AliasEvent) or getattr(ev, "anchor", None)
            for ev in yaml.parse(raw, Loader=yaml.SafeLoader)
        ):
            raise ServeConfigError(f"--engine-arg {key}: YAML anchors and aliases (& and *) are not allowed in a value",
                                   hint="write the value out in full")  # fmt: skip
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ServeConfigError(f"--engine-arg {key}: the value is not valid YAML: {' '.join(str(exc).split())}",
                               hint="quote it, e.g. --engine-arg 'name=\"a value\"'") from exc  # fmt: skip


def vllm_dtype(dtype: str) -> str:
    """Planner dtype -> vLLM's --dtype (the activation dtype)."""
    key = dtype.lower()
    if key in _WEIGHT_QUANTIZATIONS:
        return "auto"
    return _DTYPES.get(key, key)
