"""The collective check of `orch up`: a short torch.distributed all-reduce between the nodes
before Ray starts. ``plan`` (who, which backend, argv/env; pure), ``node_job`` (the job, run on
the nodes, never imported by orch), ``nccl_log`` (NCCL's INFO lines and nccl-tests tables; pure),
``verdict`` (figures and findings; pure). The I/O edge is ``orchestrator.workflows.collective``."""
