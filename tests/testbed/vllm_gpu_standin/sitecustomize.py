"""Test-bed hardware stand-in: vLLM's CPU platform takes the place of a GPU and its collectives.

Loaded by every Python process of a test host made with ``HostSpec(vllm_gpu=True)``: the test bed
puts this folder first on the host's PYTHONPATH (tests/testbed/bed.py), and Python imports
``sitecustomize`` at start-up. Nothing in the orch package knows about it; it lives under tests/
exactly like the stand-in nvidia-smi.

1. **The device key.** vLLM 0.32's CPU build refuses the Ray executor (``current platform cpu
   does not support ray``) because ``CpuPlatform.ray_device_key`` is empty. With the key set to
   ``"GPU"`` and Ray started with logical GPUs (``--num-gpus N``, which ``orch up`` passes for the
   described GPUs), vLLM's Ray executor places one worker per ``GPU`` bundle and runs tensor
   parallelism across Ray worker actors, on one host or across hosts: the layout orch renders for
   a GPU cluster runs unchanged (docs/remote-and-testbed.md).
2. **The variable-size collectives a GPU's communicator has.** A MoE layer of a data-parallel
   engine gathers every rank's tokens before its experts and scatters the sums back
   (``AgRsAll2AllManager`` in ``vllm/distributed/device_communicators/all2all.py``) with
   ``all_gatherv`` and ``reduce_scatterv``. On a GPU, NCCL does them (``CudaCommunicator``:
   ``pynccl``'s ``all_gatherv`` / ``reduce_scatterv``); vLLM 0.32's ``CpuCommunicator`` has
   neither, so the base class raises ``NotImplementedError`` and every DP engine dies in its
   profiling run (docs/moe.md). Here they are done over the group's own Gloo process group with
   the collectives Gloo has: ``all_gather`` of rows padded to the largest rank's count, then cut
   back; ``all_reduce`` of the whole tensor, then this rank's rows. Same result as NCCL's, only
   slower (``orch_testbed_collectives.py`` beside this file). Added only where the class has no
   method of its own (a vLLM that implements them keeps its own). The MoE computation stays
   vLLM's: this moves tensors between ranks and nothing else.

3. **The AMX tiles a CPU engine needs.** On an AMX CPU vLLM's CPU attention uses the tile
   registers, which a process must ask Linux for first; vLLM's worker does not, and dies with
   SIGILL at a first prompt of up to 4 tokens. orch asks in the worker of a CPU engine it renders
   (``worker_extension_cls``, ``orchestrator/serve/node_hooks.py``); an engine rendered for GPUs
   has no such class (CUDA kernels need no tiles), so here, where the CPU stands in for the GPU,
   the process that imports vLLM's CPU platform asks for them itself, as orch's class would.

How: an import hook (a ``sys.meta_path`` finder) that wraps the loader of each target module and
patches it right after the module body ran. A ``vllm.general_plugins`` entry point is too late:
Ray's worker actors call ``get_node_and_physical_gpu_ids`` before plugins load. Nothing is
imported until vLLM imports the target itself; it costs nothing in processes that never import
vLLM.
"""

import importlib.abc
import sys

DEVICE_KEY = "GPU"
PLATFORM = "vllm.platforms.cpu"
CPU_COMMUNICATOR = "vllm.distributed.device_communicators.cpu_communicator"


def _patch_platform(module):
    module.CpuPlatform.ray_device_key = DEVICE_KEY
    import torch

    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()


def _patch_cpu_communicator(module):
    from orch_testbed_collectives import all_gatherv, reduce_scatterv
    from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase

    cls = module.CpuCommunicator
    if cls.all_gatherv is DeviceCommunicatorBase.all_gatherv:
        cls.all_gatherv = all_gatherv
    if cls.reduce_scatterv is DeviceCommunicatorBase.reduce_scatterv:
        cls.reduce_scatterv = reduce_scatterv


PATCHES = {PLATFORM: _patch_platform, CPU_COMMUNICATOR: _patch_cpu_communicator}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner = inner
        self.patch = patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.patch(module)


class _StandInFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


if not any(type(f).__name__ == "_StandInFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _StandInFinder())
