"""The rendered Serve application of each shape stays what it was: orch's own renders of a set
of plans (TP x PP on GPUs with pinned stages, TP with a request router, a bucket source, CPU,
autoscaling; data-parallel on GPUs and on CPU), kept under tests/data/serve/shapes/ as YAML.
They were rendered before the shapes became a registry (serve/shapes.py), to prove that the
refactor changed nothing; a deliberate change to rendering regenerates them with
``python -m tests.unit.test_shape_renders --write`` and says why in its commit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.manifest.load import load_manifest_file
from orchestrator.serve.config import AppTarget, ServeDefaults, ServingPlan, render_app

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "serve" / "shapes"
LOCAL_MODEL = AppTarget("orch-r3", "/", "tiny", "/models/tiny")
BUCKET_MODEL = AppTarget("orch-r4", "/_orch/r4", "llama", "s3://weights/llama-3-8b")

# name -> (manifest, plan, target, render keywords)
CASES = {
    "tp_pp_gpu_pinned": ("2x8-h100-405b.yaml", dict(tp=8, pp=2, max_model_len=8192, max_num_seqs=256, kv_cache_dtype="fp8"),
                         LOCAL_MODEL, dict(accelerator_type="H100", stage_nodes=("gpu-0", "gpu-1"))),
    "tp_gpu_session_router": ("1x8-h100.yaml", dict(tp=4, pp=1, replicas=2, max_model_len=4096, max_num_seqs=128),
                              LOCAL_MODEL, dict(accelerator_type="H100", defaults=ServeDefaults(request_router="session_affinity"))),
    "tp_gpu_bucket_source": ("1x8-h100.yaml", dict(tp=2, pp=1, max_model_len=4096, expert_parallel=True), BUCKET_MODEL,
                             dict(accelerator_type="H100")),
    "tp_cpu_autoscaling": ("local.yaml", dict(tp=1, pp=1, max_model_len=2048, kv_cache_gib=2, max_num_seqs=16), LOCAL_MODEL,
                           dict(node_cores=2, defaults=ServeDefaults(autoscaling_max_replicas=3, autoscaling_min_replicas=1))),
    "dp_ep_gpu": ("2x8-h100-405b.yaml", dict(tp=1, pp=1, dp=16, expert_parallel=True, max_model_len=4096, max_num_seqs=128),
                  LOCAL_MODEL, dict(accelerator_type="H100")),
    "dp_tp_gpu_bucket_router": ("2x8-h100-405b.yaml", dict(tp=2, pp=1, dp=4, replicas=2, max_model_len=4096), BUCKET_MODEL,
                                dict(accelerator_type="H100", defaults=ServeDefaults(request_router="session_affinity"))),
    "dp_cpu": ("local.yaml", dict(tp=1, pp=1, dp=2, max_model_len=2048, max_num_seqs=8), LOCAL_MODEL,
               dict(node_cores=2, defaults=ServeDefaults(max_ongoing_requests=12))),
}


def render(name: str) -> str:
    manifest, plan, target, kw = CASES[name]
    app = render_app(load_manifest_file(REPO / "cluster-templates" / manifest), ServingPlan(**plan), target,
                     node_resource=node_resource, **kw).app  # fmt: skip
    return yaml.safe_dump(app, sort_keys=False, width=200)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_render_is_what_it_was(name):
    assert render(name) == (GOLDEN / f"{name}.yaml").read_text()


def test_the_cases_cover_both_shapes_and_every_builder():
    paths = {yaml.safe_load((GOLDEN / f"{name}.yaml").read_text())["import_path"] for name in CASES}
    assert paths == {"ray.serve.llm:build_openai_app", "orch_serve_hooks:build_openai_app", "ray.serve.llm:build_dp_openai_app"}


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for case in CASES:
        (GOLDEN / f"{case}.yaml").write_text(render(case))
        print(f"wrote {GOLDEN / case}.yaml")
