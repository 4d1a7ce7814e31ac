"""What each vLLM generation keeps out of the KV cache, by version. Pure.

vLLM sizes the KV cache as ``total x gpu_memory_utilization - weights - profiled peak - non-torch
memory - (since 0.21) the CUDA graph estimate``, but what the profile run does has changed across
releases. These are the terms orch models, with the release that changed each and the vLLM file
that defines it (docs/planner.md has the table with its evidence):

- engine: V0 (``vllm/worker/worker.py``) until 0.8.0 made V1 the default
  (``vllm/v1/worker/gpu_worker.py determine_available_memory``).
- sampler warm-up: V1 before 0.8.0 ran no sampler in its profile (vllm#13507, fixed by #13594);
  from 0.8.0 ``_dummy_sampler_run`` (``v1/worker/gpu_model_runner.py``) samples max_num_seqs rows
  with top-k/top-p. The PyTorch sort path peaks at ~38.5 bytes per logit; the Triton top-k/top-p
  kernel (``v1/sample/ops/topk_topp_triton.py``, vllm#33538, present in 0.18.0) at ~12 (vllm#32558's
  table: 384 MB against 1.25 GB at 256 x 131072); FlashInfer's kernel, when the engine logs
  "Using FlashInfer for top-p & top-k sampling", at ~8 (logits and probabilities in fp32).
- which sampler: ``default_flashinfer_sampler`` (FlashInfer by default from 0.29, whose wheel
  requires flashinfer-python; where installed in 0.9-0.11.0 and 0.21-0.28), or the plan's
  ``--sampler``; the rollout renders VLLM_USE_FLASHINFER_SAMPLER to match (``vllm/envs.py``).
- V0 past 32K tokens: chunked prefill by default, 512 batched tokens (0.6.4
  ``engine/arg_utils.py``, ``config.py SchedulerConfig``).
- Model Runner V2 (``v1/worker/gpu/model_runner.py``) skips top-k/top-p in its dummy sampler run
  (~4 bytes per logit). Default for Qwen3 dense models from 0.22.0, Llama and Mistral dense from
  0.23.0, all dense models from 0.25.0 (release notes; vllm#39337, #43458, #44443).
- CUDA graph estimate: measured and logged from 0.17 but subtracted only from 0.21.0, which also
  raised the default gpu_memory_utilization from 0.90 to 0.92 (vllm#38284;
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` in ``vllm/envs.py``).
- scheduler defaults (``engine/arg_utils.py get_batch_defaults``, API server): from 0.9.0 8192
  batched tokens / 1024 sequences on >= 70 GiB GPUs other than A100 (vllm#17885), 16384 / 1024 on
  >= 160 GiB, else 2048 / 256; V1 before 0.9.0: 2048 / 256; V0 without chunked prefill profiles a
  whole ``max_model_len`` batch (at least 2048 tokens), 256 sequences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.errors import PlanError

GIB = 2**30
Version = tuple[int, int, int]

# ray[llm]==2.60.0 (the gpu extra in setup.cfg) requires vllm[audio]==0.29.0
GPU_EXTRA_VLLM = "0.29.0"

V1_DEFAULT: Version = (0, 8, 0)
BATCH_DEFAULTS_BY_GPU: Version = (0, 9, 0)
TRITON_TOPK_TOPP: Version = (0, 18, 0)
CUDA_GRAPH_ESTIMATE: Version = (0, 21, 0)
MRV2_QWEN3: Version = (0, 22, 0)
MRV2_LLAMA_MISTRAL: Version = (0, 23, 0)
MRV2_ALL_DENSE: Version = (0, 25, 0)
FLASHINFER_SAMPLER_ON: tuple[Version, Version] = ((0, 9, 0), (0, 11, 1))  # on when installed (vllm#15777 .. #26859)
FLASHINFER_SAMPLER_DEFAULT_AGAIN: Version = (0, 21, 0)  # on when installed again (vllm#40376)
FLASHINFER_REQUIRED: Version = (0, 29, 0)  # vllm 0.29.0's wheel requires flashinfer-python (0.6.18)
V0_LONG_CONTEXT = 32_768  # V0: chunked prefill by default past this max_model_len
V0_CHUNKED_PREFILL_TOKENS = 512

SORT_BYTES_PER_LOGIT = 38.5  # fp32 logits + sorted values + int64 indices + softmax/cumsum/mask
TRITON_BYTES_PER_LOGIT = 12.0
FLASHINFER_BYTES_PER_LOGIT = 8.0
MRV2_BYTES_PER_LOGIT = 4.0
# The "Estimated CUDA graph memory" vLLM 0.27.1 printed (gpustack/runner#251; the version of the
# fitting rows M and N), the value chosen before the held-out rows were looked at. A later move to
# 0.31 GiB (the median of four logged estimates) came after a look at held-out row P and was
# reverted: no term changes because of a held-out row (tests/data/planner/SOURCES.md).
CUDA_GRAPH_GIB = 0.36

_VERSION = re.compile(r"^v?(\d{1,3})\.(\d{1,4})(?:\.(\d{1,5}))?(?:[.+-].*)?$")


def parse_vllm_version(text: str) -> Version:
    """"0.10.1.1", "0.6.5.dev123+gabc", "0.11.0+582e4e37.nv25.11", "v0.27.1" -> (major, minor, patch)."""
    match = _VERSION.match(text.strip())
    if not match:
        raise PlanError(f"unrecognised vLLM version {text!r}", hint="use X.Y or X.Y.Z, e.g. --vllm-version 0.29.0")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def version_text(version: Version) -> str:
    return ".".join(str(p) for p in version)


@dataclass(frozen=True)
class EngineTerms:
    """The terms one vLLM version uses to size the KV cache (see the module docstring)."""

    version: Version
    engine: str  # "V0", "V1" or "V1 (Model Runner V2)"
    gpu_memory_utilization: float
    sampler: str  # "none" | "sort" | "triton" | "flashinfer" | "mrv2"
    cuda_graph_subtracted: bool
    flashinfer_sampler: bool = False  # the sampler the engine is told to use (VLLM_USE_FLASHINFER_SAMPLER)

    @property
    def v0(self) -> bool:
        return self.engine == "V0"

    @property
    def sampler_bytes_per_logit(self) -> float:
        return {
            "none": 0.0,
            "sort": SORT_BYTES_PER_LOGIT,
            "triton": TRITON_BYTES_PER_LOGIT,
            "flashinfer": FLASHINFER_BYTES_PER_LOGIT,
            "mrv2": MRV2_BYTES_PER_LOGIT,
        }[self.sampler]

    def batch_defaults(self, gpu_memory_bytes: int, gpu_type: str, max_model_len: int, multimodal: bool = False) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) this version's API server picks."""
        if gpu_type == "cpu":  # vLLM's CPU backend (get_batch_defaults, API server, one worker)
            return 2048, 128
        if self.v0:
            # V0 turns chunked prefill on by default past 32K tokens on a GPU for text models, and
            # then batches 512 tokens (vllm 0.6.4 engine/arg_utils.py create_engine_config, config.py
            # SchedulerConfig); otherwise a whole max_model_len (at least 2048) per step.
            if max_model_len > V0_LONG_CONTEXT and not multimodal:
                return V0_CHUNKED_PREFILL_TOKENS, 256
            return max(max_model_len, 2048), 256
        if self.version < BATCH_DEFAULTS_BY_GPU:
            return 2048, 256
        if gpu_memory_bytes >= 160 * GIB:
            return 16384, 1024
        if gpu_memory_bytes >= 70 * GIB and "a100" not in gpu_type.lower():
            return 8192, 1024
        return 2048, 256

    def to_json(self) -> dict:
        return {
            "vllm_version": version_text(self.version),
            "engine": self.engine,
            "default_gpu_memory_utilization": self.gpu_memory_utilization,
            "sampler_warmup": self.sampler,
            "sampler_bytes_per_logit": self.sampler_bytes_per_logit,
            "cuda_graph_estimate_subtracted": self.cuda_graph_subtracted,
            "flashinfer_sampler": self.flashinfer_sampler,
        }


def _mrv2_default(version: Version, architecture: str, is_moe: bool) -> bool:
    if is_moe:
        return False
    arch = architecture.lower()
    if version >= MRV2_ALL_DENSE:
        return True
    if version >= MRV2_LLAMA_MISTRAL and ("llama" in arch or "mistral" in arch):
        return True
    return version >= MRV2_QWEN3 and "qwen3" in arch


def default_flashinfer_sampler(version: Version, installed: bool | None = None) -> bool:
    """Whether vLLM ``version`` samples with FlashInfer when VLLM_USE_FLASHINFER_SAMPLER is unset.

    From 0.29 flashinfer-python is a requirement of the vLLM wheel and the variable defaults to on
    (0.29.0/0.32.0 ``vllm/envs.py``, ``v1/sample/ops/topk_topp_sampler.py flashinfer_sampler_supported``),
    so yes unless the nodes' probe found it missing. 0.9-0.11.0 and 0.21-0.28 use it when it is
    installed (``installed``: what `orch up` probed; None: unknown, taken as not installed). Before
    V1 (0.8) and 0.11.1-0.20: only when asked for."""
    if version >= FLASHINFER_REQUIRED:
        return installed is not False
    on = FLASHINFER_SAMPLER_ON[0] <= version < FLASHINFER_SAMPLER_ON[1] or version >= FLASHINFER_SAMPLER_DEFAULT_AGAIN
    return bool(on and installed)


def engine_terms(version: Version, *, architecture: str = "", is_moe: bool = False, flashinfer_sampler: bool | None = None) -> EngineTerms:
    """The terms of ``version`` for a model of ``architecture`` (config.json's model_type or
    architectures, which decide Model Runner V2). ``flashinfer_sampler``: True/False as the engine
    is told (orch renders VLLM_USE_FLASHINFER_SAMPLER to match), None for the version's default
    (``default_flashinfer_sampler``)."""
    flashinfer = default_flashinfer_sampler(version) if flashinfer_sampler is None else flashinfer_sampler
    if version < V1_DEFAULT:
        return EngineTerms(version, "V0", 0.90, "sort", False, flashinfer)
    util = 0.92 if version >= CUDA_GRAPH_ESTIMATE else 0.90
    graphs = version >= CUDA_GRAPH_ESTIMATE
    if _mrv2_default(version, architecture, is_moe):
        return EngineTerms(version, "V1 (Model Runner V2)", util, "mrv2", graphs, flashinfer)
    if flashinfer:
        sampler = "flashinfer"
    else:
        sampler = "triton" if version >= TRITON_TOPK_TOPP else "sort"
    return EngineTerms(version, "V1", util, sampler, graphs, flashinfer)


# ---- where the version comes from ----


def probed_vllm_version(facts: dict) -> str | None:
    """The vLLM version `orch up` probed on the nodes (``facts.json``: node -> {"versions": {"vllm": ...}}),
    or None when no node reported one. Nodes run one version (preflight's VERSION_MISMATCH)."""
    found = sorted({str(v["versions"]["vllm"]) for v in facts.values() if isinstance(v, dict) and isinstance(v.get("versions"), dict) and v["versions"].get("vllm")})
    return found[0] if found else None


def probed_flashinfer(facts: dict) -> bool | None:
    """Whether every node `orch up` probed has flashinfer installed (``versions.flashinfer``);
    None when no node reported its versions."""
    reported = [v["versions"] for v in facts.values() if isinstance(v, dict) and isinstance(v.get("versions"), dict)]
    if not reported:
        return None
    return all(bool(r.get("flashinfer")) for r in reported)
