"""What ``--dtype`` means for a checkpoint, and the words a plan says about its weights. Pure.

vLLM loads a quantized checkpoint as it is (its ``quantization_config`` decides), and quantizes a
16-bit checkpoint on load only to fp8: ``--quantization fp8_per_tensor`` from 0.29 (the shorthand
in ``vllm/config/quantization.py _ONLINE_SHORTHANDS``, 0.29.0 and 0.32.0; 0.32's ``Fp8Config``
refuses online quantization under the name ``fp8``), ``--quantization fp8`` before (``Fp8Config``
with ``is_checkpoint_fp8_serialized=False``, vLLM 0.11.0 ``quantization/fp8.py``). There is no
int8/int4 weight quantization on load for dense layers, so ``--dtype int8|int4`` on a 16-bit
checkpoint is refused with the checkpoints that would do it.
"""

from __future__ import annotations

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.engine_terms import parse_vllm_version

# the first vLLM release orch renders the fp8_per_tensor shorthand for (see the module docstring)
FP8_PER_TENSOR_SHORTHAND: tuple[int, int, int] = (0, 29, 0)


def check_dtype(spec: ModelSpec, dtype: str | None) -> None:
    """--dtype on a checkpoint: vLLM loads a quantized checkpoint as it is, and quantizes a 16-bit
    one on the fly only to fp8 (no int8/int4 weight quantization on load)."""
    if dtype is None or dtype == spec.dtype:
        return
    if spec.quantization is not None:
        raise PlanError(
            f"--dtype {dtype}: {spec.name} is a quantized checkpoint ({spec.quantization.describe()}); vLLM loads it as it is",
            hint="leave --dtype out, or plan another checkpoint of the model",
        )
    if dtype in ("int8", "int4"):
        raise PlanError(
            f"--dtype {dtype}: vLLM does not quantize a {spec.dtype} checkpoint to {dtype} on load",
            hint=f"use an {dtype} checkpoint of the model (AWQ, GPTQ or compressed-tensors W{dtype[3:]}A16), or --dtype fp8 "
            "(vLLM quantizes the linear layers to fp8 when it loads them)",
        )


def online_quantization(spec: ModelSpec, dtype: str, vllm_version: str) -> str | None:
    """The --quantization vLLM needs to quantize ``spec``'s 16-bit checkpoint to ``dtype`` on load."""
    if dtype != "fp8" or spec.quantization is not None or spec.dtype == "fp8":
        return None
    return "fp8_per_tensor" if parse_vllm_version(vllm_version) >= FP8_PER_TENSOR_SHORTHAND else "fp8"


def quantization_json(spec: ModelSpec) -> dict | None:
    q = spec.quantization
    if q is None:
        return None
    return {"method": q.method, "scheme": q.scheme, "source": q.source, "unquantized_modules": len(q.ignore),
            "kv_cache_dtype": q.kv_cache_dtype}  # fmt: skip


def weights_reason(spec: ModelSpec, options: PlanOptions) -> str | None:
    """Which weights the plan sizes: the checkpoint's quantization (and the file it came from) or
    vLLM's on-the-fly fp8; None for a 16-bit checkpoint planned as it is."""
    dtype = options.dtype or spec.dtype
    q = spec.quantization
    if q is not None:
        kept = f"; {len(q.ignore)} module pattern(s) it lists stay 16-bit" if q.ignore else ""
        return f"weights: {q.method}, {q.scheme}, read from {q.source}{kept}"
    if dtype != spec.dtype:
        if dtype == "fp8":
            return f"weights: --dtype fp8 on a {spec.dtype} checkpoint: vLLM quantizes the linear layers to fp8 on load " \
                   f"(quantization: {online_quantization(spec, dtype, options.vllm_version)}); embeddings and head stay {spec.dtype}"
        return f"weights: {spec.dtype} checkpoint computed in {dtype}"
    return None  # a 16-bit checkpoint as it is: nothing to say
