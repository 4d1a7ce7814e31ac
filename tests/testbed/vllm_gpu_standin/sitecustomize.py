"""Test-bed hardware stand-in: vLLM's CPU platform answers to Ray's ``GPU`` resource key.

Loaded by every Python process of a test host made with ``HostSpec(vllm_gpu=True)``: the test bed
puts this folder first on the host's PYTHONPATH (tests/testbed/bed.py), and Python imports
``sitecustomize`` at start-up. Nothing in the orch package knows about it; it lives under tests/
exactly like the stand-in nvidia-smi.

Why (measured, docs/remote-and-testbed.md): vLLM 0.32's CPU build refuses the Ray executor
(``current platform cpu does not support ray``) because ``CpuPlatform.ray_device_key`` is empty.
With the key set to ``"GPU"`` and Ray started with logical GPUs (``--num-gpus N``, which
``orch up`` passes for the described GPUs), vLLM's Ray executor places one worker per ``GPU``
bundle and runs tensor parallelism across Ray worker actors, on one host or across hosts: the
layout orch renders for a GPU cluster runs unchanged.

How: an import hook (a ``sys.meta_path`` finder) that wraps the loader of ``vllm.platforms.cpu``
and sets the class attribute right after the module body ran. A ``vllm.general_plugins`` entry
point is too late: Ray's worker actors call ``get_node_and_physical_gpu_ids`` before plugins load.
Stdlib only; it costs nothing in processes that never import vLLM.
"""

import importlib.abc
import sys

TARGET = "vllm.platforms.cpu"
DEVICE_KEY = "GPU"


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        module.CpuPlatform.ray_device_key = DEVICE_KEY


class _StandInFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


if not any(isinstance(f, _StandInFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _StandInFinder())
