"""Validation of a rendered Serve application with Ray Serve LLM's own models, before anything
is applied (lazy: imports ray.serve.llm, vllm, torch only when called). A bad field fails here
with orch's error form, naming the field path. An application whose shape names Ray's model of its
``args`` (``serve.shapes``: the data-parallel ``build_dp_openai_app``'s ``DPOpenAiServingArgs``)
is checked against that model as well."""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from orchestrator.errors import ServeConfigError
from orchestrator.serve.shapes import AppShape, shape_of_app

_FIELD_HINTS = {
    "engine_kwargs": "an engine argument vLLM does not accept: check --max-model-len/--dtype/--engine-arg",
    "deployment_config": "check --replicas and the Serve deployment settings",
    "accelerator_type": "set gpu_type in the manifest to a GPU Ray knows (H100-80GB, A100-40GB, L4, ...)",
    "placement_group_config": "the placement bundles orch rendered are invalid: report it with --debug output",
    "model_loading_config": "check --model and --served-name",
}


def _problem_lines(exc: Any, prefix: str) -> list[tuple[str, str]]:
    """(field path, message) per pydantic error; a validator that wrapped another model's
    ValidationError (Serve's DeploymentConfig, ModelLoadingConfig) is unwrapped to its fields."""
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        path = f"{prefix}.{loc}" if loc else prefix
        cause = getattr((err.get("ctx") or {}).get("error"), "__cause__", None)
        if cause is not None and hasattr(cause, "errors"):
            try:
                out.extend(_problem_lines(cause, path))
                continue
            except Exception:  # a cause without pydantic's errors() shape: keep the outer message
                pass
        out.append((path, str(err.get("msg", ""))))
    return out


def validate_app(app: Mapping[str, Any], check_engine_args: bool = True) -> None:
    """Validate each rendered llm_config with Ray Serve LLM's ``LLMConfig`` (and vLLM's argument
    names). Raises ServeConfigError naming the field path; ray/vllm are imported here only."""
    from pydantic import ValidationError

    # Importing ray.serve.llm configures vLLM's and Ray's loggers, which write to stderr; the
    # CLI's own output must stay clean, so silence fd 2 for the import only.
    with _silenced_stderr():
        from ray.serve.llm import LLMConfig
    # The import set up Ray's JSON log handler on the root logger at INFO: keep httpx's
    # per-request lines (orch's own Serve and probe calls) out of the command's output.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    shape = shape_of_app(app)
    configs = shape.llm_configs(app)
    if len(configs) != 1:
        raise ServeConfigError(f"application {app.get('name')!r} must serve exactly one model, has {len(configs)}")
    prefix = f"applications[{app.get('name')}].{shape.config_path}"
    try:
        llm_config = LLMConfig.model_validate(copy.deepcopy(configs[0]))
    except ValidationError as exc:
        problems = _problem_lines(exc, prefix)
        first_field = problems[0][0].removeprefix(prefix + ".").split(".")[0] if problems else ""
        raise ServeConfigError(
            f"invalid Serve LLM config: {problems[0][0]}: {problems[0][1]}",
            hint=_FIELD_HINTS.get(first_field, "fix the named field"),
            problems=[f"{path}: {msg}" for path, msg in problems],
        ) from exc
    if shape.args_class:
        _check_args(app, shape, llm_config)
    shape.check_engine_kwargs(llm_config.engine_kwargs, prefix)
    if check_engine_args:
        _check_engine_kwargs(llm_config, prefix)


def _check_args(app: Mapping[str, Any], shape: AppShape, llm_config: Any) -> None:
    """The application's ``args`` must be what its builder validates (the data-parallel shape:
    ``DPOpenAiServingArgs``, one ``llm_config``, no list). Its llm_config was validated as an
    LLMConfig already (with that model's field paths), so it goes in as that object."""
    from pydantic import ValidationError

    module, _, cls_name = str(shape.args_class).rpartition(".")
    try:
        with _silenced_stderr():
            args_model = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError):  # a Ray without this builder: the import path itself fails on the nodes
        builder = str(app.get("import_path") or shape.import_paths[0]).rpartition(":")[2]
        raise ServeConfigError(
            f"invalid Serve LLM config: applications[{app.get('name')}].import_path: this Ray has no {builder}",
            hint=f"{builder} needs a Ray that has {shape.args_class} (build_dp_openai_app: Ray 2.60 or later) "
                 "on the control machine and the nodes",
        ) from None
    args = copy.deepcopy(dict(app.get("args") or {}))
    try:
        args_model.model_validate({**args, shape.args_key: [llm_config] if shape.args_is_list else llm_config})
    except ValidationError as exc:
        problems = _problem_lines(exc, f"applications[{app.get('name')}].args")
        raise ServeConfigError(f"invalid Serve LLM config: {problems[0][0]}: {problems[0][1]}",
                               hint=f"the args of {shape.description} are invalid: report it with --debug output",
                               problems=[f"{path}: {msg}" for path, msg in problems]) from exc  # fmt: skip


def _check_engine_kwargs(llm_config: Any, prefix: str) -> None:
    try:
        with _silenced_stderr():
            llm_config.get_engine_config()
    except ImportError:
        return  # no vLLM on the control machine: the nodes validate it at start
    except (ValueError, TypeError) as exc:
        raise ServeConfigError(
            f"invalid Serve LLM config: {prefix}.engine_kwargs: {exc}",
            hint=_FIELD_HINTS["engine_kwargs"],
        ) from exc


@contextlib.contextmanager
def _silenced_stderr() -> Iterator[None]:
    saved = null = None
    try:
        saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
    except OSError:
        saved = None
    try:
        yield
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
        if null is not None:
            os.close(null)
