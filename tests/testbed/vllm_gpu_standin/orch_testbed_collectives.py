"""The test bed's stand-in for the variable-size collectives a GPU's communicator has.

vLLM's ``AgRsAll2AllManager`` (vllm/distributed/device_communicators/all2all.py) gathers every
data-parallel rank's tokens before a MoE layer and scatters the sums back with ``all_gatherv`` and
``reduce_scatterv`` on the group's communicator. NCCL does them on a GPU (``CudaCommunicator``);
vLLM 0.32's ``CpuCommunicator`` has neither. ``sitecustomize.py`` (beside this file) adds these two
to it, done with the collectives Gloo has on the group's own process group (``device_group``).
Their contract is ``CudaCommunicator``'s: dim 0 only for the gather; rank r contributes
``sizes[r]`` rows (all the same when ``sizes`` is None); the reduce-scatter sums the whole tensor
over the group and rank r keeps rows ``sum(sizes[:r])`` to ``sum(sizes[:r + 1])``.

Test-only (a hardware stand-in, like the stand-in nvidia-smi); tests/unit/test_testbed_collectives.py
checks it against those definitions.
"""

import torch
import torch.distributed as dist


def _exchange_dtype(dtype):
    """Gloo's reductions and gathers on CPU cover the float and integer types; bf16/fp16 travel as fp32."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def all_gatherv(self, input_, dim=0, sizes=None):
    """``input_`` (a tensor or a list) gathered over the group along dim 0; rank r sends ``sizes[r]`` rows."""
    if dim != 0:
        raise NotImplementedError("only dim 0 all-gatherv is supported")  # as CudaCommunicator
    world = self.world_size

    def one(t):
        counts = list(sizes) if sizes is not None else [t.shape[0]] * world
        assert len(counts) == world and t.shape[0] == counts[self.rank_in_group], (counts, t.shape)
        rows = max(counts)
        padded = t.new_zeros((rows,) + tuple(t.shape[1:]), dtype=_exchange_dtype(t.dtype))
        padded[: t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded, group=self.device_group)
        return torch.cat([p[:n] for p, n in zip(parts, counts)], dim=0).to(t.dtype)

    if isinstance(input_, torch.Tensor):
        return one(input_)
    return [one(t) for t in input_]


def reduce_scatterv(self, input_, dim=-1, sizes=None):
    """The sum over the group of ``input_``, of which this rank keeps its ``sizes[rank]`` rows."""
    world, rank = self.world_size, self.rank_in_group
    if dim < 0:
        dim += input_.dim()
    flat = input_.movedim(0, dim).contiguous()  # as CudaCommunicator._reduce_scatterv
    counts = list(sizes) if sizes is not None else [flat.shape[0] // world] * world
    assert len(counts) == world and sum(counts) == flat.shape[0], (counts, flat.shape)
    total = flat.to(_exchange_dtype(flat.dtype))
    if total is flat:
        total = flat.clone()
    dist.all_reduce(total, group=self.device_group)
    mine = total.narrow(0, sum(counts[:rank]), counts[rank]).to(flat.dtype)
    return mine.movedim(0, dim).contiguous()
