"""The collective check of `orch up`: a short torch.distributed all-reduce between the nodes
before Ray starts. ``plan`` (who, which backend, argv/env; pure), the job itself
(``remote/node_programs/collective_job.py``, run on the nodes), ``nccl_log`` (NCCL's INFO lines and nccl-tests tables; pure),
``verdict`` (figures and findings; pure). The I/O edge is ``orchestrator.workflows.collective``."""
