"""The I/O edge of Hugging Face repo ids: download a repo's config.json (and ModelOpt's
hf_quant_config.json when the repo has one) into the local Hugging Face cache, so the planner
(``orchestrator.plan.model_ref.spec_for_ref``) reads it from there. Network I/O.

Only when ``--model`` is a repo id (``orchestrator.plan.model_ref``'s rule) not already cached, and
``HF_HUB_OFFLINE`` is not set. The wait is bounded: one metadata request without retries
(``huggingface_hub.get_hf_file_metadata(retry_on_errors=False)``, ``timeout_s``), then the two small
files; an unreachable Hub is a ``ModelSpecError`` (exit 2) naming what to do, never a hang
(``hf_hub_download`` alone retries five times with back-off: 24 s here without a network).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import QUANT_CONFIG_FILE
from orchestrator.plan.hf_cache import cached_snapshot, hub_cache_dir, hub_offline, not_cached_error
from orchestrator.plan.model_ref import HUB_REF, ModelRef

FETCH_TIMEOUT_S = 10.0


def needs_fetch(ref: ModelRef, env: Mapping[str, str]) -> bool:
    """A repo id whose config.json is not in the cache."""
    return ref.kind == HUB_REF and cached_snapshot(ref.name, env) is None


def fetch_repo_config(ref: ModelRef, env: Mapping[str, str] = os.environ, timeout_s: float = FETCH_TIMEOUT_S) -> str | None:
    """Download the config files of the repo ``ref`` names into the cache when it needs them; a
    note of what was done (None: nothing to do)."""
    if not needs_fetch(ref, env):
        return None
    model = ref.name
    if hub_offline(env):
        raise not_cached_error(model, env)
    try:
        # huggingface_hub comes with vLLM (orch's cpu and gpu extras); imported here so that
        # `orch --help` and the planner stay fast and work without it.
        import huggingface_hub
        from huggingface_hub import errors as hf_errors
    except ImportError:
        raise not_cached_error(model, env, "huggingface_hub is not installed here to download it") from None
    cache = str(hub_cache_dir(env))
    endpoint = env.get("HF_ENDPOINT") or None
    token = env.get("HF_TOKEN") or None
    try:
        url = huggingface_hub.hf_hub_url(model, "config.json", endpoint=endpoint)
        huggingface_hub.get_hf_file_metadata(url, token=token, timeout=timeout_s, retry_on_errors=False)
        huggingface_hub.hf_hub_download(model, "config.json", cache_dir=cache, token=token, endpoint=endpoint, etag_timeout=timeout_s)
    except (hf_errors.RepositoryNotFoundError, hf_errors.GatedRepoError) as exc:
        raise ModelSpecError(
            f"{model}: the Hugging Face Hub has no such repo, or it is gated ({type(exc).__name__})",
            hint="check the repo id; for a gated repo set HF_TOKEN, or download it yourself and set HF_HOME",
        ) from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise not_cached_error(model, env, f"the Hub did not answer within {timeout_s:g} s: {first}") from None
    try:
        huggingface_hub.hf_hub_download(model, QUANT_CONFIG_FILE, cache_dir=cache, token=token, endpoint=endpoint, etag_timeout=timeout_s)
        extra = f" and {QUANT_CONFIG_FILE}"
    except hf_errors.EntryNotFoundError:
        extra = ""  # most repos have none
    except Exception as exc:
        raise ModelSpecError(
            f"{model}: config.json was downloaded but whether the repo has {QUANT_CONFIG_FILE} could not be checked ({type(exc).__name__})",
            hint=f"run again, or download it yourself: `huggingface-cli download {model} config.json {QUANT_CONFIG_FILE}`",
        ) from None
    return f"downloaded {model}'s config.json{extra} into the Hugging Face cache {cache}"
