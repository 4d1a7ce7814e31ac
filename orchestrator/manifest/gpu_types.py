"""The GPU types orch knows: each one's memory as CUDA reports it, its usual interconnect and the
names it may be given (``gpu_type:`` in cluster.yaml, ``orch plan --gpu-type``). Pure.

One rule for every reader (issue 25 item 3): a type is one of these names or aliases, in any case.
``orch validate`` refuses any other ``gpu_type`` with the closest name, and ``orch plan`` sizes
with the same table, so a manifest that validates is one the planner can size.

Memory per GPU is what CUDA reports as the device total (``torch.cuda.mem_get_info``), the figure
vLLM multiplies by ``gpu_memory_utilization``; it is below the marketing size and below
nvidia-smi's total because the driver keeps a part. Where a vLLM or PyTorch log gave the figure
it is used (H100 79.18 GiB, A100-80GB 79.15, A100-40GB 39.39, A10G 22.06, RTX 3090 23.58,
RTX PRO 6000 Blackwell 95.01); otherwise nvidia-smi's MiB total less the ~0.5 GiB the driver keeps
on an H100.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

GIB = 2**30
MIB = 2**20
DRIVER_RESERVED_BYTES = int(0.47 * GIB)  # H100: nvidia-smi 81559 MiB, CUDA total 79.18 GiB


@dataclass(frozen=True)
class GpuType:
    name: str
    memory_bytes: int  # CUDA-visible device total
    nvlink: bool  # SXM parts with NVLink/NVSwitch in their usual 8-GPU boards
    aliases: tuple[str, ...] = ()


def _g(gib: float) -> int:
    return int(round(gib * GIB))


def smi_memory_bytes(mib: int) -> int:
    """CUDA's device total from nvidia-smi's MiB total (the driver keeps ~0.5 GiB)."""
    return mib * MIB - DRIVER_RESERVED_BYTES


GPU_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("H100-80GB", _g(79.18), True, ("h100", "h100-sxm", "h100-80g", "nvidia h100 80gb hbm3")),
        GpuType("H100-94GB", smi_memory_bytes(95830), True, ("h100-nvl", "h100 nvl")),
        GpuType("H200-141GB", smi_memory_bytes(143771), True, ("h200", "nvidia h200")),
        GpuType("B200-180GB", smi_memory_bytes(183359), True, ("b200", "nvidia b200")),
        GpuType("A100-80GB", _g(79.15), True, ("a100-80g", "nvidia a100-sxm4-80gb", "a100-sxm4-80gb")),
        GpuType("A100-40GB", _g(39.39), True, ("a100", "a100-40g", "nvidia a100-sxm4-40gb", "a100-sxm4-40gb")),
        GpuType("L40S-48GB", smi_memory_bytes(46068), False, ("l40s", "nvidia l40s")),
        GpuType("L4-24GB", smi_memory_bytes(23034), False, ("l4", "nvidia l4")),
        GpuType("A10G-24GB", _g(22.06), False, ("a10g", "nvidia a10g")),
        GpuType("RTX3090-24GB", _g(23.58), False, ("rtx3090", "nvidia geforce rtx 3090")),
        GpuType("RTX4090-24GB", smi_memory_bytes(24564), False, ("rtx4090", "nvidia geforce rtx 4090")),
        GpuType("RTXPRO6000-96GB", _g(95.01), False, ("rtxpro6000", "rtx pro 6000", "nvidia rtx pro 6000 blackwell server edition")),
    )
}


def find_gpu_type(name: str) -> GpuType | None:
    """The known type called ``name`` (its name or an alias, any case, spaces around ignored)."""
    key = name.strip().lower()
    return next((t for t in GPU_TYPES.values() if key == t.name.lower() or key in t.aliases), None)


def unknown_gpu_type(name: str, also: tuple[str, ...] = ()) -> str:
    """What to say about a name that is no known type: the closest known name, then the list
    (``also``: further names the caller accepts, such as ``cpu`` for `orch plan --gpu-type`)."""
    spellings = {t.name.lower(): t.name for t in GPU_TYPES.values()}
    spellings.update({alias: t.name for t in GPU_TYPES.values() for alias in t.aliases})
    close = difflib.get_close_matches(name.strip().lower(), list(spellings), n=1, cutoff=0.6)
    did_you_mean = f"; did you mean '{spellings[close[0]]}'?" if close else ""
    return f"unknown GPU type '{name}'{did_you_mean} (known: {', '.join([*GPU_TYPES, *also])}; any case, or an alias such as h100)"
