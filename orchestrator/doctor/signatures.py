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

from orchestrator.doctor.codes import CODE_INFO, RETRY_CANNOT_FIX
from orchestrator.doctor.matching import Component, Severity, Signature
from orchestrator.runbooks import runbook


def _sig(
    code: str,
    regex: str,
    keywords: tuple[str, ...],
    component: Component,
    severity: Severity = "fail",
    predicate: Callable[[re.Match[str]], bool] | None = None,
) -> Signature:
    title, hint = CODE_INFO[code]
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
SIGNATURE_CODES: dict[str, str] = {code: info[0] for code, info in CODE_INFO.items()}


