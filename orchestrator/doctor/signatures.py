"""Known failure signatures in Ray, Serve, vLLM and NCCL/Gloo logs. No I/O.

``orch doctor`` gathers the log lines of the current Ray session from every node
(``orchestrator.doctor.diagnose``) and matches them against these (``doctor.matching``). Each
``Signature`` names a finding code, the component that writes the line, a severity and a hint
that ends with the code's runbook (``runbooks/<CODE>.md``).

Every signature is tested against real log lines quoted in GitHub issues of vLLM, Ray and NCCL
(``tests/data/logs/<CODE>.log``, sources in ``tests/data/logs/SOURCES.md``) and against captured
logs of healthy runs, which must match nothing.

Waiting for resources is a warning: the same lines appear in healthy but slow starts (seen on this
project's loaded test machine: Serve's "taken more than 30s to be scheduled" before the replica
started). Ray's explicit "No available node types can fulfill resource request" is a failure.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from orchestrator.doctor.matching import Component, Severity, Signature
from orchestrator.runbooks import runbook

# code -> (title, component, hint without the runbook)
_CODE_INFO: dict[str, tuple[str, str]] = {
    "COLLECTIVE_IFACE_NOT_FOUND": (
        "NCCL/Gloo socket interface not found on the node",
        "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (set from the manifest's `interface`) must name an "
        "interface that exists and has an address on every node; check `ip -br addr` there",
    ),
    "COLLECTIVE_CONNECT_FAILED": (
        "NCCL/Gloo ranks cannot connect to each other",
        "ranks reached the wrong address or a firewall dropped the connection: pin "
        "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to the cluster NIC and open TCP between nodes",
    ),
    "COLLECTIVE_PEER_LOOPBACK": (
        "A NCCL/Gloo rank was told to reach its peer at a loopback address",
        "the peer advertised 127.0.0.1/::1: its NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME is unset (the host "
        "name resolves to loopback) or names `lo`; orch up sets both to the NIC carrying the node's address "
        "(or the manifest's `interface`): check the node env in cluster.yaml, then `orch up` and roll out again",
    ),
    "NODE_IP_MISMATCH": (
        "Node address seen by vLLM/Ray does not match the Ray node address",
        "start every node with `ray start --node-ip-address=<address on the cluster NIC>` and set "
        "VLLM_HOST_IP to the same address, unique per node",
    ),
    "PLACEMENT_INFEASIBLE": (
        "Placement group or replica waits for resources the cluster does not have",
        "the plan asks for more GPUs/CPUs (or a node resource) than the Ray cluster offers; compare "
        "`ray status` with the plan (`orch plan`) and fix tp/pp or the node list",
    ),
    "RAY_VERSION_MISMATCH": (
        "Ray or Python version differs between nodes",
        "install the same Ray and Python version on every node (the manifest's `python`), then "
        "`orch down` and `orch up`",
    ),
    "VLLM_MISSING_ON_NODE": (
        "vLLM is missing or a different version on a node that runs a vLLM worker",
        "install the same vLLM version into the interpreter Ray uses on every node",
    ),
    "MODEL_PATH_NOT_FOUND": (
        "Model directory missing on a node",
        "the model path must exist with config.json and weights on every node that hosts a "
        "replica or a pipeline stage: `orch model sync cluster.yaml --model NAME` copies it there, "
        "verified (or use a shared mount at the same path)",
    ),
    "SHM_EXHAUSTED": (
        "/dev/shm too small (NCCL shared memory, bus error)",
        "give the node (or container) a larger /dev/shm, e.g. `--shm-size=16g` or "
        "`mount -o remount,size=16G /dev/shm`",
    ),
    "CUDA_OOM": (
        "CUDA out of memory",
        "lower gpu_memory_utilization or max_model_len / max_num_seqs, or raise tp/pp; check that "
        "nothing else holds memory on that GPU (`nvidia-smi`)",
    ),
    "ENGINE_DEAD": (
        "vLLM engine core died while the server process still answers",
        "the engine process crashed (see the first error above the evidence line); the replica "
        "must be restarted: `orch rollout` again or let Serve replace it",
    ),
    "ILLEGAL_INSTRUCTION": (
        "A process was killed by an illegal instruction (SIGILL)",
        "on a CPU with AMX (`amx_tile` in /proc/cpuinfo) vLLM's CPU attention uses tile registers its worker "
        "never asked Linux for: orch's CPU engines ask (worker_extension_cls orch_serve_hooks.AmxTileData, "
        "docs/rollout.md) unless the manifest names its own worker_extension_cls; otherwise the installed "
        "build (vLLM, torch) uses an instruction set this CPU lacks: install a build for the nodes' CPU",
    ),
    "CGRAPH_TIMEOUT": (
        "Ray compiled-graph channel timed out (pipeline-parallel stage stalled)",
        "a pipeline stage did not answer in time: check the other stages' logs for the root "
        "error, the network between stages, and RAY_CGRAPH_get_timeout",
    ),
    "GCS_UNREACHABLE": (
        "Node cannot reach the Ray GCS (GCS down, or port blocked between nodes)",
        "either the GCS on the head is down (check the head's gcs_server.out, `orch status`, "
        "`orch up`) or the Ray ports are blocked between the nodes: open ray.port (default 6379) "
        "and Ray's other ports, from every worker to the head address",
    ),
    "NODE_HEARTBEAT_LOST": (
        "Raylet heartbeats lost: node marked dead by the GCS",
        "the raylet crashed, was overloaded, or traffic between it and the head is dropped; check "
        "the node's raylet.out, memory pressure and the firewall",
    ),
    "MODEL_ARCH_UNSUPPORTED": (
        "The model's architecture is not one the node's vLLM implements",
        "the model's config.json names an architecture (`architectures`) that this vLLM version does not "
        "implement: check the name, and the vLLM version on the nodes (a newer model may need a newer vLLM)",
    ),
    "ENGINE_ARG_INVALID": (
        "vLLM refused the value of an engine argument",
        "an engine argument (an `--engine-arg`, or one orch set from the plan) has a value vLLM's config "
        "refuses; the line above the evidence names the field, the evidence the allowed values and the "
        "value given: fix it and roll out again",
    ),
    # --- data parallel + expert parallel (MoE): one DP group's ranks, their all-to-all
    "DP_MASTER_UNREACHABLE": (
        "Data-parallel ranks cannot reach the DP master (rank 0's address and port)",
        "the ranks of one DP group meet at rank 0 (vLLM's data_parallel_address / data_parallel_master_ip "
        "and its port; Ray Serve's DPServer publishes it in the GCS): rank 0 did not come up (its own first "
        "error, on its node, comes first), or its address is not reachable from the other ranks' nodes: "
        "open TCP between the group's nodes on all ports and check VLLM_HOST_IP / the node address of rank 0",
    ),
    "EP_ALLTOALL_TIMEOUT": (
        "Expert-parallel all-to-all timed out (NCCL all-to-all or DeepEP dispatch/combine)",
        "a rank of the expert-parallel group stopped answering or one pair of nodes cannot exchange "
        "traffic: look for the first error on the other nodes (a dead rank, CUDA_OOM), then test every "
        "pair: `orch up CLUSTER --check-only` runs an all-to-all between all nodes and names the pair "
        "that fails or is slow",
    ),
    "NVSHMEM_INIT_FAILED": (
        "DeepEP's NVSHMEM transport could not start (IBGDA / InfiniBand RC)",
        "the deepep_* all-to-all backends need NVSHMEM over InfiniBand: IBGDA enabled in the GPU driver "
        "(NVreg_EnableStreamMemOPs=1, PeerMappingOverride=1) or GDRCopy, nvidia_peermem, the RDMA "
        "devices visible to the engine (privileged container or /dev/infiniband), and working IB between "
        "the nodes; or serve with VLLM_ALL2ALL_BACKEND=allgather_reducescatter (NCCL)",
    ),
}

# The failures a new attempt of the same replica meets again, and why. Serve retries a replica
# that failed to start (3 times in a row by default, each a new engine start: minutes); when the
# failed replica's error or log shows one of these, `orch rollout` stops its candidate at once
# and names the cause (workflows/start_failures.py). Only ``fail`` signatures count: a ``warn``
# one is an echo of another rank's failure or a wait. Left to Serve's retries, because the next
# attempt may well start: GCS_UNREACHABLE and NODE_HEARTBEAT_LOST (a node briefly unreachable),
# PLACEMENT_INFEASIBLE (scheduling waits for resources another replica is still releasing),
# ENGINE_DEAD (an echo: the cause is another line, matched on its own), CGRAPH_TIMEOUT (a stage
# stalled, load can do that), SHM_EXHAUSTED (/dev/shm filled by a process that may be exiting),
# NODE_IP_MISMATCH, RAY_VERSION_MISMATCH and VLLM_MISSING_ON_NODE (facts of one node, and the next
# attempt may be placed on another).
RETRY_CANNOT_FIX: dict[str, str] = {
    "COLLECTIVE_IFACE_NOT_FOUND": "the interface named for NCCL/Gloo does not exist or has no address on the node, "
                                  "and every new attempt gets the same environment",
    "COLLECTIVE_PEER_LOOPBACK": "every new attempt takes the same socket interface setting, so the peer advertises "
                                "the same loopback address again",
    "COLLECTIVE_CONNECT_FAILED": "NCCL/Gloo retried the connect themselves before giving up; a wrong address or a "
                                 "firewall between the nodes is still there on the next attempt",
    "MODEL_PATH_NOT_FOUND": "the model folder is missing on the node, and nothing puts it there between attempts",
    "CUDA_OOM": "the model, activations and KV cache the config asks for do not fit the GPU's memory at load; the "
                "same config on the same GPU does not fit either",
    "MODEL_ARCH_UNSUPPORTED": "the architecture comes from the model's files and the implementation from the vLLM "
                              "installed on the nodes; neither changes between attempts",
    "ENGINE_ARG_INVALID": "the engine arguments are part of the deployed config: every attempt gets the same value",
}  # fmt: skip


def _sig(
    code: str,
    regex: str,
    keywords: tuple[str, ...],
    component: Component,
    severity: Severity = "fail",
    predicate: Callable[[re.Match[str]], bool] | None = None,
) -> Signature:
    title, hint = _CODE_INFO[code]
    return Signature(
        code=code,
        title=title,
        component=component,
        severity=severity,
        pattern=re.compile(regex),
        keywords=keywords,
        hint=f"{hint}; see {runbook(code)}",
        predicate=predicate,
        retry_cannot_fix=severity == "fail" and code in RETRY_CANNOT_FIX,
    )


def _looks_like_path(m: re.Match[str]) -> bool:
    value = m.group("value")
    return value.startswith(("/", "./", "../", "~"))


SIGNATURES: tuple[Signature, ...] = (
    # --- NCCL / Gloo: the interface named for collectives does not exist or has no address
    _sig("COLLECTIVE_IFACE_NOT_FOUND", r"Unable to find address for: \S+", ("Unable to find address",), "nccl"),
    _sig(
        "COLLECTIVE_IFACE_NOT_FOUND",
        r"Bootstrap : no (?:NCCL_SOCKET_IFNAME )?(?:socket )?interface found",
        ("Bootstrap : no",),
        "nccl",
    ),
    _sig(
        "COLLECTIVE_IFACE_NOT_FOUND",
        r"WARN Socket creation failed : Address family not supported",
        ("Socket creation failed",),
        "nccl",
    ),
    _sig(
        "COLLECTIVE_IFACE_NOT_FOUND",
        r"ncclSocketInit: connecting to address\s+with family \d+ is neither AF_INET",
        ("ncclSocketInit",),
        "nccl",
    ),
    # --- NCCL / Gloo: ranks cannot reach each other
    # A peer at a loopback address: the classic multi-node failure of an unset (or `lo`) socket
    # interface, reproduced on the test bed (tests/data/logs/COLLECTIVE_PEER_LOOPBACK.log).
    _sig(
        "COLLECTIVE_PEER_LOOPBACK",
        r"(?:Gloo connectFullMesh failed|ERROR failed to connect, willRetry=0).*remote=\[(?:127\.\d+\.\d+\.\d+|::1)\]",
        ("connectFullMesh", "willRetry=0"),
        "nccl",
    ),
    _sig(
        "COLLECTIVE_CONNECT_FAILED",
        r"Gloo connectFullMesh failed(?!.*remote=\[(?:127\.\d+\.\d+\.\d+|::1)\])",
        ("connectFullMesh",),
        "nccl",
    ),
    _sig(
        "COLLECTIVE_CONNECT_FAILED",
        r"WARN socketStartConnect: Connect to \S+ failed",
        ("socketStartConnect",),
        "nccl",
    ),
    _sig(
        "COLLECTIVE_CONNECT_FAILED",
        r"WARN Call to connect failed : (?:Connection refused|Connection timed out|No route to host)",
        ("Call to connect failed",),
        "nccl",
    ),
    _sig(
        "COLLECTIVE_CONNECT_FAILED",
        # NCCL >= 2.19 wordings; its INFO "connect returned ..., retrying" lines are not failures
        r"socketPollConnect(?:: connect to \S+ returned (?:Connection refused|Connection timed out|No route to host)"
        r"| poll\(\) failed, ret \d+, error \w|\s+poll\(\) returned \d+, no POLLOUT events)",
        ("socketPollConnect",),
        "nccl",
    ),
    # A peer hanging up is often the echo of another rank's failure: a warning, not the cause.
    _sig(
        "COLLECTIVE_CONNECT_FAILED",
        r"NCCL WARN socketProgress: Connection closed by remote peer",
        ("Connection closed by remote peer",),
        "nccl",
        severity="warn",
    ),
    # --- node address: VLLM_HOST_IP / --node-ip-address disagree with what Ray registered
    _sig(
        "NODE_IP_MISMATCH",
        r"This node has an IP address of \S+,? (?:while we can not find the matched Raylet address"
        r"|but we cannot find a local Raylet with the same address"
        r"|and Ray expects this IP address to be either the GCS address or one of the Raylet addresses)",
        ("This node has an IP address of",),
        "ray",
    ),
    _sig("NODE_IP_MISMATCH", r"Every node should have a unique IP address", ("unique IP address",), "vllm"),
    _sig(
        "NODE_IP_MISMATCH",
        r"Ray does not allocate any GPUs on the driver node",
        ("does not allocate any GPUs on the driver node",),
        "vllm",
    ),
    # --- placement: waiting for resources (a warning: slow healthy starts print the same lines)
    _sig(
        "PLACEMENT_INFEASIBLE",
        r"No available node types can fulfill resource request",
        ("No available node types",),
        "ray",
    ),
    _sig(
        "PLACEMENT_INFEASIBLE",
        r"Waiting for creating a placement group of specs for \d+ seconds",
        ("Waiting for creating a placement group",),
        "vllm",
        severity="warn",
    ),
    _sig(
        "PLACEMENT_INFEASIBLE",
        r"The following resource request cannot be scheduled right now",
        ("cannot be scheduled right now",),
        "ray",
        severity="warn",
    ),
    _sig(
        "PLACEMENT_INFEASIBLE",
        r"replicas that have taken more than \d+s to (?:be scheduled|start up)\..*Resources required for each replica",
        ("Resources required for each replica",),
        "serve",
        severity="warn",
    ),
    # --- versions differ between nodes
    _sig(
        "RAY_VERSION_MISMATCH",
        r"Version mismatch: The cluster was started with",
        ("Version mismatch",),
        "ray",
    ),
    _sig(
        "VLLM_MISSING_ON_NODE",
        r"No module named '(?:vllm)(?:\.[\w.]+)?'",
        ("No module named 'vllm",),
        "vllm",
    ),
    _sig(
        "VLLM_MISSING_ON_NODE",
        r"RayTaskError\(ModuleNotFoundError\): ray::RayWorkerWrapper",
        ("RayTaskError(ModuleNotFoundError)",),
        "vllm",
    ),
    # --- model path missing on a node: vLLM/HF take the missing path for a hub repo id
    _sig(
        "MODEL_PATH_NOT_FOUND",
        r"Invalid repository ID or local directory specified: '(?P<value>[^']+)'",
        ("Invalid repository ID or local directory",),
        "vllm",
    ),
    _sig(
        "MODEL_PATH_NOT_FOUND",
        r"Repo id must (?:be in the form|use alphanumeric chars).*: '(?P<value>[^']+)'",
        ("Repo id must",),
        "vllm",
        predicate=_looks_like_path,
    ),
    # --- /dev/shm too small
    _sig(
        "SHM_EXHAUSTED",
        r"NCCL WARN Call to posix_fallocate failed ?: No space left on device",
        ("posix_fallocate",),
        "system",
    ),
    _sig(
        "SHM_EXHAUSTED",
        r"NCCL WARN Error while creating shared memory segment",
        ("creating shared memory segment",),
        "system",
    ),
    _sig(
        "SHM_EXHAUSTED",
        r"NCCL WARN Error: failed to extend /dev/shm/\S+",
        ("failed to extend /dev/shm",),
        "system",
    ),
    _sig(
        "SHM_EXHAUSTED",
        r"Unexpected bus error encountered in worker\. This might be caused by insufficient shared memory",
        ("Unexpected bus error",),
        "system",
    ),
    _sig("SHM_EXHAUSTED", r"killed by signal: Bus error", ("Bus error",), "system"),
    # --- CUDA out of memory (the evidence names the GPU: "GPU 3 has a total capacity ...")
    _sig("CUDA_OOM", r"CUDA out of memory", ("CUDA out of memory",), "vllm"),
    # --- engine dead while its API process still answers
    _sig("ENGINE_DEAD", r"EngineDeadError", ("EngineDeadError",), "vllm"),
    _sig("ENGINE_DEAD", r"Engine core proc \S+ died unexpectedly", ("died unexpectedly",), "vllm"),
    _sig(
        "ENGINE_DEAD",
        r"Got fatal signal from worker processes, shutting down",
        ("Got fatal signal from worker processes",),
        "vllm",
    ),
    _sig("ENGINE_DEAD", r"EngineCore encountered a fatal error", ("EngineCore encountered a fatal error",), "vllm"),
    # --- a process killed by SIGILL: vLLM's worker (exit code -4), or a shell's report
    _sig("ILLEGAL_INSTRUCTION", r"Worker proc \S+ died unexpectedly \(exit code: -4\)", ("exit code: -4",), "vllm"),
    _sig("ILLEGAL_INSTRUCTION", r"Illegal instruction\s+\(core dumped\)", ("Illegal instruction",), "system"),
    # --- compiled graphs (pipeline parallel over the Ray executor)
    _sig(
        "CGRAPH_TIMEOUT",
        r"RayChannelTimeoutError|Timed out waiting for object available to read",
        ("RayChannelTimeoutError", "Timed out waiting for object available to read"),
        "ray",
    ),
    # --- ports blocked between nodes
    _sig(
        "GCS_UNREACHABLE",
        r"Failed to connect to GCS (?:at address \S+ )?within \d+ seconds",
        ("Failed to connect to GCS",),
        "ray",
    ),
    _sig(
        "GCS_UNREACHABLE",
        r"Failed to get cluster ID from GCS server|Timed out while waiting for GCS to become available",
        ("cluster ID from GCS", "waiting for GCS to become available"),
        "ray",
    ),
    _sig(
        "NODE_HEARTBEAT_LOST",
        r"has been marked dead because the (?:detector|monitor) has missed too many heartbeats",
        ("missed too many heartbeats",),
        "ray",
    ),
    _sig(
        "NODE_HEARTBEAT_LOST",
        r"mistakenly been marked as dead by the GCS|This node has bee[nm] marked as dead",
        ("marked as dead",),
        "ray",
    ),
    _sig(
        "NODE_HEARTBEAT_LOST",
        r"Last heartbeat was sent \d+ ms ago",
        ("Last heartbeat was sent",),
        "ray",
        severity="warn",
    ),
    # --- the model's architecture: vLLM has no implementation of it (vllm/model_executor/models/
    # registry.py; its wordings for an architecture vLLM dropped have no real line here yet)
    _sig(
        "MODEL_ARCH_UNSUPPORTED",
        r"Model architectures \[[^\]]*\] are not supported for now",
        ("are not supported for now",),
        "vllm",
    ),
    # --- an engine argument's value refused by a vLLM config class: pydantic's header naming the
    # class, then the field and its error ("policy\n  Input should be 'fcfs' or 'priority'
    # [type=literal_error, input_value='lifo', ...]"). Not ModelConfig's header: its validators
    # also report a missing model or an unknown architecture ("Value error, ..."), which other
    # signatures name; a field error of ModelConfig still matches the second line.
    _sig(
        "ENGINE_ARG_INVALID",
        r"\d+ validation errors? for (?!ModelConfig\b)\w*Config\b",
        ("validation error",),
        "vllm",
    ),
    _sig(
        "ENGINE_ARG_INVALID",
        r"Input should be .* \[type=\w+, input_value=",
        ("Input should be",),
        "vllm",
    ),
    # --- data parallel: the ranks of a DP group cannot meet at rank 0
    # vLLM's engine handshake (v1/engine/core.py, HANDSHAKE_TIMEOUT_MINS) with the front end at the
    # DP address; Ray Serve's DPServer waiting for rank 0's address (GangMasterInfoRegistry.get).
    _sig(
        "DP_MASTER_UNREACHABLE",
        r"Did not receive response from front-end process within \d+ minute",
        ("Did not receive response from front-end",),
        "vllm",
    ),
    _sig(
        "DP_MASTER_UNREACHABLE",
        r"Timed out waiting for DP master info for gang \S+ after [\d.]+s",
        ("waiting for DP master info",),
        "serve",
    ),
    # --- expert parallel: the all-to-all (torch's NCCL watchdog, DeepEP's own timeouts)
    _sig(
        "EP_ALLTOALL_TIMEOUT",
        r"WorkNCCL\([^()]*OpType=ALLTOALL\w*,.*?Timeout\(ms\)=\d+\) (?:ran for \d+ milliseconds before timing out|timed out)",
        ("OpType=ALLTOALL",),
        "nccl",
    ),
    _sig("EP_ALLTOALL_TIMEOUT", r"DeepEP timeout check failed", ("DeepEP timeout",), "deepep"),
    _sig("EP_ALLTOALL_TIMEOUT", r"DeepEP (?:dispatch|combine) [\w ]*timeout", ("DeepEP dispatch", "DeepEP combine"), "deepep"),
    _sig(
        "EP_ALLTOALL_TIMEOUT",
        r"DeepEP error: (?:CPU recv timeout|timeout \((?:dispatch|combine) CPU\))",
        ("DeepEP error",),
        "deepep",
    ),
    # --- DeepEP's NVSHMEM (IBGDA / IB RC transports) failing to start
    _sig(
        "NVSHMEM_INIT_FAILED",
        r"nvshmemi_transport_init:\d+: (?:init failed for transport: \w+|Unable to initialize any transports)",
        ("nvshmemi_transport_init",),
        "deepep",
    ),
    _sig("NVSHMEM_INIT_FAILED", r"non-zero status: \d+ nvshmem detect topo failed", ("nvshmem detect topo",), "deepep"),
    _sig(
        "NVSHMEM_INIT_FAILED",
        r"nvshmem\S*/src/(?:modules/transport/\w+/\w+\.cpp|host/transport/transport\.cpp):\d+: (?:non-zero status: \d+|NULL value) ",
        ("/transport/",),
        "deepep",
    ),
    _sig(
        "NVSHMEM_INIT_FAILED",
        r"NVSHMEM API called before NVSHMEM initialization has completed",
        ("NVSHMEM API called before",),
        "deepep",
    ),
    _sig(
        "NVSHMEM_INIT_FAILED",
        r"DeepEP/csrc/kernels/\w+\.cu:\d+, condition: ibgda_get_state\(\)",
        ("ibgda_get_state",),
        "deepep",
    ),
)

# code -> title, for every code a signature can report
SIGNATURE_CODES: dict[str, str] = {code: info[0] for code, info in _CODE_INFO.items()}


