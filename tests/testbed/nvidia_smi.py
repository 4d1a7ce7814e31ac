"""Stand-in ``nvidia-smi`` of a test host: prints, in the real tool's formats, the GPUs that the
host is configured to have (``gpus.json`` next to this script, written by ``gpus.py``).

Installed by the test bed as ``<host>/bin/nvidia-smi`` (first on the host's PATH). Supports the
invocations orch and people use: the default table, ``--query-gpu=... --format=csv[,noheader]
[,nounits]`` (with ``-i``), ``-L``, ``-q``, ``topo -m`` and ``--version``. Formats follow the
captures listed in tests/data/nvidia-smi/SOURCES.md (driver 550 layout). Stdlib only; reads
files, writes stdout.
"""

import json
import os
import sys
import time

FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)

W = 91  # width of the driver-550 table


def load():
    here = os.path.dirname(os.path.realpath(__file__))
    with open(os.path.join(here, "gpus.json")) as f:
        return json.load(f)


def _free(g):
    return g["memory_total"] - g["memory_used"] - g.get("memory_reserved", 0)


# name -> (header unit, value function(cfg, index, gpu) -> (plain, with_unit))
def _fields():
    def num(unit):
        return lambda v: (str(v), f"{v} {unit}")

    mib, watt, pct = num("MiB"), (lambda v: (f"{v:.2f}", f"{v:.2f} W")), num("%")
    plain = lambda v: (str(v), str(v))  # noqa: E731
    table = {
        "index": (None, lambda c, i, g: plain(i)),
        "count": (None, lambda c, i, g: plain(len(c["gpus"]))),
        "name": (None, lambda c, i, g: plain(g["name"])),
        "uuid": (None, lambda c, i, g: plain(g["uuid"])),
        "serial": (None, lambda c, i, g: plain(g.get("serial", "[N/A]"))),
        "pci.bus_id": (None, lambda c, i, g: plain(g["pci_bus_id"])),
        "memory.total": ("MiB", lambda c, i, g: mib(g["memory_total"])),
        "memory.used": ("MiB", lambda c, i, g: mib(g["memory_used"])),
        "memory.free": ("MiB", lambda c, i, g: mib(_free(g))),
        "memory.reserved": ("MiB", lambda c, i, g: mib(g.get("memory_reserved", 0))),
        "driver_version": (None, lambda c, i, g: plain(c["driver_version"])),
        "compute_cap": (None, lambda c, i, g: plain(g["compute_cap"])),
        "mig.mode.current": (None, lambda c, i, g: plain(g["mig_mode"])),
        "mig.mode.pending": (None, lambda c, i, g: plain(g["mig_mode"])),
        "persistence_mode": (None, lambda c, i, g: plain("Enabled" if g.get("persistence") == "On" else "Disabled")),
        "temperature.gpu": (None, lambda c, i, g: plain(g.get("temperature", 30))),
        "power.draw": ("W", lambda c, i, g: watt(float(g.get("power_draw", 70)))),
        "power.limit": ("W", lambda c, i, g: watt(float(g.get("power_limit", 400)))),
        "utilization.gpu": ("%", lambda c, i, g: pct(0)),
        "utilization.memory": ("%", lambda c, i, g: pct(0)),
        "pstate": (None, lambda c, i, g: plain("P0")),
        "vbios_version": (None, lambda c, i, g: plain(g.get("vbios", "96.00.89.00.01"))),
    }
    aliases = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id", "gpu_serial": "serial"}
    for alias, target in aliases.items():
        table[alias] = table[target]
    return table


def query(cfg, fields_arg, fmt_arg, ids):
    fmt = [f.strip() for f in fmt_arg.split(",")] if fmt_arg else []
    if "csv" not in fmt:
        sys.stdout.write('"--format" must be specified when using "--query-gpu".\n' if not fmt_arg else "Unknown format\n")
        return 2
    table = _fields()
    names = [f.strip() for f in fields_arg.split(",") if f.strip()]
    for n in names:
        if n not in table:
            sys.stdout.write(f'Field "{n}" is not a valid field to query.\n\n')
            return 2
    out = []
    if "noheader" not in fmt:
        heads = []
        for n in names:
            unit = table[n][0]
            heads.append(f"{n} [{unit}]" if unit and "nounits" not in fmt else n)
        out.append(", ".join(heads))
    for i, g in enumerate(cfg["gpus"]):
        if ids is not None and i not in ids:
            continue
        row = []
        for n in names:
            plain, united = table[n][1](cfg, i, g)
            row.append(plain if "nounits" in fmt else united)
        out.append(", ".join(row))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def table_view(cfg):
    sep = "+-----------------------------------------+------------------------+----------------------+"
    lines = [
        time.strftime("%a %b %e %H:%M:%S %Y"),
        "+" + "-" * (W - 2) + "+",
        "| NVIDIA-SMI {:<22} Driver Version: {:<14} CUDA Version: {:<8} |".format(
            cfg["driver_version"], cfg["driver_version"], cfg["cuda_version"]
        ),
        "|-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
    ]
    for i, g in enumerate(cfg["gpus"]):
        mig_on = g["mig_mode"] == "Enabled"
        lines.append(
            "|{:>4}  {:<31}{:<3} |   {} Off | {:>20} |".format(
                i, g["name"][:31], g.get("persistence", "On"), g["pci_bus_id"], "On" if mig_on else "0"
            )
        )
        if mig_on:
            lines.append("| N/A  {:>3}C    P0  {:>13}W / {:>4}W | {:>22} |     N/A      Default |".format(
                g.get("temperature", 30), g.get("power_draw", 70), g.get("power_limit", 400), "N/A"))
        else:
            lines.append("| N/A  {:>3}C    P0  {:>13}W / {:>4}W | {:>7}MiB / {:>6}MiB | {:>6}%  {:>11} |".format(
                g.get("temperature", 30), g.get("power_draw", 70), g.get("power_limit", 400),
                g["memory_used"], g["memory_total"], 0, "Default"))
        lines.append("|                                         |                        | {:>20} |".format(
            "Enabled" if mig_on else ("Disabled" if g["mig_mode"] == "Disabled" else "N/A")))
        lines.append(sep)
    migs = [(i, m) for i, g in enumerate(cfg["gpus"]) for m in g.get("mig_devices", [])]
    if migs:
        msep = "+------------------+----------------------------------+-----------+-----------------------+"
        lines += [
            "",
            "+" + "-" * (W - 2) + "+",
            "| MIG devices:" + " " * (W - 15) + "|",
            msep,
            "| GPU  GI  CI  MIG |                     Memory-Usage |        Vol|        Shared         |",
            "|      ID  ID  Dev |                       BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
            "|                  |                                  |        ECC|                       |",
            "|==================+==================================+===========+=======================|",
        ]
        for i, m in migs:
            lines.append("| {:>2}  {:>3} {:>3} {:>3}  | {:>32} | {:>2}      0 |  {:>1}   0    {:>1}    0    0 |".format(
                i, m["gi"], m["ci"], m["dev"], "{}MiB / {}MiB".format(m.get("memory_used", 13), m["memory_total"]),
                m.get("sm", 42), m.get("ce", 3), m.get("dec", 2)))
            lines.append("|                  | {:>32} |           |                       |".format("0MiB / 32767MiB"))
            lines.append(msep)
    lines += [
        "",
        "+" + "-" * (W - 2) + "+",
        "| Processes:" + " " * (W - 13) + "|",
        "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * (W - 2) + "|",
        "|  No running processes found" + " " * (W - 30) + "|",
        "+" + "-" * (W - 2) + "+",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def list_view(cfg):
    out = []
    for i, g in enumerate(cfg["gpus"]):
        out.append(f"GPU {i}: {g['name']} (UUID: {g['uuid']})")
        for m in g.get("mig_devices", []):
            out.append(f"  MIG {m['profile']:<12}Device {m['dev']:>2}: (UUID: {m['uuid']})")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def q_view(cfg):
    def kv(key, value, indent=0):
        return "{}{:<{w}}: {}".format(" " * indent, key, value, w=42 - indent)

    out = ["", "==============NVSMI LOG==============", "",
           kv("Timestamp", time.strftime("%a %b %e %H:%M:%S %Y")),
           kv("Driver Version", cfg["driver_version"]), kv("CUDA Version", cfg["cuda_version"]), "",
           kv("Attached GPUs", len(cfg["gpus"]))]
    for g in cfg["gpus"]:
        out += [f"GPU {g['pci_bus_id']}", kv("Product Name", g["name"], 4),
                kv("Product Architecture", g.get("arch", "Hopper"), 4),
                kv("Persistence Mode", "Enabled" if g.get("persistence") == "On" else "Disabled", 4),
                "    MIG Mode", kv("Current", g["mig_mode"].strip("[]"), 8), kv("Pending", g["mig_mode"].strip("[]"), 8),
                kv("GPU UUID", g["uuid"], 4),
                "    FB Memory Usage", kv("Total", f"{g['memory_total']} MiB", 8),
                kv("Reserved", f"{g.get('memory_reserved', 0)} MiB", 8),
                kv("Used", f"{g['memory_used']} MiB", 8), kv("Free", f"{_free(g)} MiB", 8), ""]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def topo_view(cfg):
    gpus = cfg["gpus"]
    n = len(gpus)
    link = cfg.get("link", "pcie")
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [head]
    for i, g in enumerate(gpus):
        cells = []
        for j, h in enumerate(gpus):
            if i == j:
                cells.append(" X ")
            elif link.startswith("NV"):
                cells.append(link)
            elif g.get("numa", 0) != h.get("numa", 0):
                cells.append("SYS")
            else:
                cells.append("PIX" if i // 2 == j // 2 else "NODE")
        rows.append(f"GPU{i}\t" + "\t".join(cells) + f"\t{g.get('cpu_affinity', '0-1')}\t{g.get('numa', 0)}\t\tN/A")
    sys.stdout.write("\n".join(rows) + "\n" + LEGEND)
    return 0


def version_view(cfg):
    d, c = cfg["driver_version"], cfg["cuda_version"]
    nvml = ".".join(d.split(".")[:2])
    sys.stdout.write(
        f"NVIDIA-SMI version  : {d}\nNVML version        : {nvml}\nDRIVER version      : {d}\nCUDA Version        : {c}\n"
    )
    return 0


def main(argv):
    cfg = load()
    if cfg.get("fail") == "driver":
        sys.stdout.write(FAILED)
        return 9
    fields = fmt = None
    ids = None
    args = list(argv)
    if args[:1] == ["topo"]:
        if "-m" in args or "--matrix" in args:
            return topo_view(cfg)
        sys.stdout.write("Usage: nvidia-smi topo -m\n")
        return 2
    i = 0
    mode = "table"
    while i < len(args):
        a = args[i]
        if a.startswith("--query-gpu="):
            fields, mode = a.split("=", 1)[1], "query"
        elif a == "--query-gpu" and i + 1 < len(args):
            fields, mode = args[i + 1], "query"
            i += 1
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format" and i + 1 < len(args):
            fmt = args[i + 1]
            i += 1
        elif a in ("-i", "--id") and i + 1 < len(args):
            ids = {int(x) for x in args[i + 1].split(",")}
            i += 1
        elif a.startswith("--id="):
            ids = {int(x) for x in a.split("=", 1)[1].split(",")}
        elif a in ("-L", "--list-gpus"):
            mode = "list"
        elif a in ("-q", "--query"):
            mode = "q"
        elif a == "--version":
            mode = "version"
        else:
            sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
            return 2
        i += 1
    if mode == "query":
        return query(cfg, fields, fmt, ids)
    return {"table": table_view, "list": list_view, "q": q_view, "version": version_view}[mode](cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
