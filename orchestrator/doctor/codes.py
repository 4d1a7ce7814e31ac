"""The codes ``orch doctor`` reports: each one's title and hint (the runbook is added by
``doctor.signatures``), and which start failures a retry of the same replica cannot fix. Data
only; the log-line patterns that find them are in ``doctor.signatures``."""

from __future__ import annotations

# code -> (title, hint without the runbook)
CODE_INFO: dict[str, tuple[str, str]] = {
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
# NODE_IP_MISMATCH, RAY_VERSION_MISMATCH, VLLM_MISSING_ON_NODE and ILLEGAL_INSTRUCTION (facts of one
# node, and the next attempt may be placed on another).
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
