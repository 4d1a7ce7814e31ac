"""GPU profiles of test hosts: a profile string -> the ``gpus.json`` the stand-in nvidia-smi reads.

Profiles: ``"<N>x<MODEL>"`` with MODEL one of ``MODELS`` (e.g. ``8xH100-80GB`` an HGX H100 SXM
box with NVSwitch, ``4xA100-40GB`` a PCIe box without NVLink), ``"none"`` (no nvidia-smi at all:
the command is not found), ``"mig"`` (one A100 40GB with MIG enabled and two 3g.20gb instances),
``"broken"`` (nvidia-smi exists but cannot talk to the driver, exit 9). Values (names, memory
sizes, driver versions, bus ids) follow real captures: tests/data/nvidia-smi/SOURCES.md.
No I/O except ``install`` (writes the host's bin dir).
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

STAND_IN = Path(__file__).with_name("nvidia_smi.py")


@dataclass(frozen=True)
class Model:
    smi_name: str  # what nvidia-smi prints as name
    memory_total: int  # MiB, as nvidia-smi reports it
    memory_reserved: int
    compute_cap: str
    power_limit: int
    link: str  # "NV18" for NVSwitch boxes, "pcie" otherwise
    mig_capable: bool
    arch: str
    bus_ids: tuple[str, ...]
    driver: str = "550.54.15"
    cuda: str = "12.4"


_H100_BUS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
_A100_BUS = ("17", "31", "B1", "CA", "3B", "4B", "C1", "D1")

MODELS: dict[str, Model] = {
    "H100-80GB": Model("NVIDIA H100 80GB HBM3", 81559, 555, "9.0", 700, "NV18", True, "Hopper", _H100_BUS),
    "A100-80GB": Model("NVIDIA A100-SXM4-80GB", 81920, 527, "8.0", 400, "NV12", True, "Ampere", _A100_BUS),
    "A100-40GB": Model("NVIDIA A100-PCIE-40GB", 40960, 431, "8.0", 250, "pcie", True, "Ampere", _A100_BUS),
    "L4-24GB": Model("NVIDIA L4", 23034, 417, "8.9", 72, "pcie", False, "Ada Lovelace", _A100_BUS),
}

_PROFILE = re.compile(r"^(\d+)x([A-Za-z0-9]+-\d+GB)$")


@dataclass(frozen=True)
class GpuProfile:
    """What a host has: ``count`` GPUs of ``model`` (``model`` None: no GPU / no nvidia-smi)."""

    text: str
    count: int
    model: str | None
    mig: bool = False
    broken: bool = False

    @property
    def has_nvidia_smi(self) -> bool:
        return self.model is not None or self.broken


def parse_profile(text: str) -> GpuProfile:
    if text == "none":
        return GpuProfile(text, 0, None)
    if text == "mig":
        return GpuProfile(text, 1, "A100-40GB", mig=True)
    if text == "broken":
        return GpuProfile(text, 0, None, broken=True)
    m = _PROFILE.match(text)
    if not m or m.group(2) not in MODELS or not 1 <= int(m.group(1)) <= 8:
        raise ValueError(
            f"unknown GPU profile {text!r}: use 'none', 'mig', 'broken' or '<1-8>x<MODEL>' with MODEL in {sorted(MODELS)}"
        )
    return GpuProfile(text, int(m.group(1)), m.group(2))


def gpus_json(profile: GpuProfile, host_seed: str) -> dict:
    """The stand-in's configuration for one host. UUIDs are derived from ``host_seed`` so two
    hosts never share a GPU UUID (and a host keeps its UUIDs across restarts)."""
    if profile.broken:
        return {"fail": "driver", "gpus": [], "driver_version": "550.54.15", "cuda_version": "12.4"}
    model = MODELS[profile.model]  # type: ignore[index]
    gpus = []
    for i in range(profile.count):
        numa = 0 if i < max(1, profile.count // 2) else 1
        g = {
            "name": model.smi_name,
            "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"orchtb/{host_seed}/{i}")),
            "serial": str(1650000000000 + uuid.uuid5(uuid.NAMESPACE_URL, f"orchtb/{host_seed}/{i}/sn").int % 10**9),
            "pci_bus_id": f"00000000:{model.bus_ids[i]}:00.0",
            "memory_total": model.memory_total,
            "memory_reserved": model.memory_reserved,
            "memory_used": 0,
            "compute_cap": model.compute_cap,
            "power_limit": model.power_limit,
            "power_draw": round(model.power_limit * 0.12),
            "temperature": 28 + i % 5,
            "persistence": "On",
            "arch": model.arch,
            "mig_mode": ("Enabled" if profile.mig else "Disabled") if model.mig_capable else "[N/A]",
            "numa": numa,
            "cpu_affinity": "0-47,96-143" if numa == 0 else "48-95,144-191",
        }
        if profile.mig:
            g["memory_used"] = 0
            g["mig_devices"] = [
                {
                    "gi": gi,
                    "ci": 0,
                    "dev": dev,
                    "profile": "3g.20gb",
                    "memory_total": 19968,
                    "uuid": "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"orchtb/{host_seed}/{i}/mig{dev}")),
                }
                for dev, gi in enumerate((1, 2))
            ]
        gpus.append(g)
    return {"driver_version": model.driver, "cuda_version": model.cuda, "link": model.link, "gpus": gpus}


def install(profile: GpuProfile, bin_dir: Path, host_seed: str) -> None:
    """Put the stand-in nvidia-smi and its gpus.json into ``bin_dir`` (nothing for ``none``)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    if not profile.has_nvidia_smi:
        return
    (bin_dir / "gpus.json").write_text(json.dumps(gpus_json(profile, host_seed), indent=1))
    script = bin_dir / "nvidia-smi"
    # The host's python3 without site-packages: starts in ~20 ms and needs nothing installed.
    # (One shebang argument only: "-IS", not "-I -S".)
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    script.write_text(f"#!{python} -IS\n" + STAND_IN.read_text())
    script.chmod(0o755)
