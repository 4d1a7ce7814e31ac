"""The names nvidia-smi prints for each GPU type of the catalog, and matching one to a type. Pure.

A manifest says ``gpu_type: RTX4090-24GB`` (or an alias such as ``rtx4090``); nvidia-smi on the
node says ``NVIDIA GeForce RTX 4090``. Splitting both into words cannot tell that these are the
same card (``RTX4090`` is not a word of the name), so every catalog type lists the names real
drivers print for it, each read in a capture (tests/data/probes/SOURCES.md names the file and its
source). A probed name that is in this table belongs to exactly one type; a name that is not
(a card orch has no entry for) falls back to the model token and the memory size.
"""

from __future__ import annotations

import re

from orchestrator.errors import PlanError
from orchestrator.plan.shape import gpu_type

# catalog type -> the names nvidia-smi prints for it (--query-gpu=name, `nvidia-smi -L`).
SMI_NAMES: dict[str, tuple[str, ...]] = {
    "H100-80GB": ("NVIDIA H100 80GB HBM3",),  # HGX H100 (google/gvisor#10413, sglang#30401)
    "H100-94GB": ("NVIDIA H100 NVL",),  # dcgm-exporter#544, akash provider-configs#91
    "H200-141GB": ("NVIDIA H200",),  # nvidia_gpu_exporter H200 capture, driver 590.48.01
    "B200-180GB": ("NVIDIA B200",),  # sglang#27487, driver 610.43.02
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),  # nccl-tests#228; driver 450 without "NVIDIA " (SparK#8)
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),  # bottlerocket-core-kit#834; dcgm-exporter#272
    "L40S-48GB": ("NVIDIA L40S",),  # nvidia_gpu_exporter L40S capture, driver 595.80
    "L4-24GB": ("NVIDIA L4",),  # speaches#438
    "A10G-24GB": ("NVIDIA A10G",),  # DCGM#232
    "RTX3090-24GB": ("NVIDIA GeForce RTX 3090",),  # club-3090#1129
    "RTX4090-24GB": ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090 D"),  # RLinf#255; SpatialLM#28 (same 24564 MiB)
}


def _key(name: str) -> str:
    # Case, spaces and dashes differ between drivers and pastes ("A100-SXM4-80GB"); letters and
    # digits do not.
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_KEY: dict[str, str] = {_key(n): t for t, names in SMI_NAMES.items() for n in names}


def type_of_smi_name(name: str) -> str | None:
    """The catalog type of a name nvidia-smi printed, None for a card not in the table."""
    return _BY_KEY.get(_key(name))


def _tokens_match(declared: str, name: str, memory_mib: int | None, tolerance: float) -> bool:
    """The fallback for names not in the table: every word of ``declared`` is a word of the name,
    a ``<N>GB`` word may instead be nvidia-smi's total within ``tolerance``."""
    name_tokens = set(re.split(r"[-_ ]+", name.upper()))
    for tok in (t for t in re.split(r"[-_ ]+", declared.upper()) if t):
        m = re.fullmatch(r"(\d+)(G|GB|GIB)", tok)
        if m:
            if tok in name_tokens or f"{m.group(1)}GB" in name_tokens:
                continue
            if memory_mib is None:
                return False
            want_gib = int(m.group(1))
            if abs(memory_mib / 1024 - want_gib) > tolerance * want_gib:
                return False
        elif tok not in name_tokens:
            return False
    return True


def gpu_type_matches(declared: str, name: str, memory_mib: int | None, tolerance: float = 0.10) -> bool:
    """Is a GPU that nvidia-smi calls ``name`` (with ``memory_mib``) the manifest's ``declared``
    gpu_type (a catalog name or alias, any case)? Both known: the same catalog type. Otherwise
    the model token and memory rule."""
    try:
        wanted: str | None = gpu_type(declared).name
    except PlanError:
        wanted = None
    probed = type_of_smi_name(name)
    if wanted is not None and probed is not None:
        return wanted == probed
    if wanted is not None and wanted not in SMI_NAMES:
        # a catalog type with no captured name yet: its name or any of its aliases by words
        return any(_tokens_match(ident, name, memory_mib, tolerance) for ident in (wanted, *gpu_type(wanted).aliases))
    return _tokens_match(wanted or declared, name, memory_mib, tolerance)
