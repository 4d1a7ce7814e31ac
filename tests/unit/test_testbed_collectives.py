"""The test bed's stand-in collectives (tests/testbed/vllm_gpu_standin/orch_testbed_collectives.py)
against the definitions of NCCL's variable-size gather and reduce-scatter as vLLM's
``CudaCommunicator`` uses them: rank r sends ``sizes[r]`` rows; the gather is every rank's rows in
rank order; the reduce-scatter sums the whole tensor over the ranks and rank r keeps its own rows.

The ranks are threads here and Gloo's two collectives (``all_gather`` of equal shapes,
``all_reduce`` sum) are played by an in-memory exchange: what is checked is the stand-in's own
padding, cutting and row ranges, which is where a wrong rank would read another rank's tokens.
On the test bed the same functions run over Gloo between two hosts (tests/integration/test_moe_dp.py).
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

STANDIN = Path(__file__).resolve().parents[1] / "testbed" / "vllm_gpu_standin" / "orch_testbed_collectives.py"


@pytest.fixture(scope="module")
def collectives():
    spec = importlib.util.spec_from_file_location("orch_testbed_collectives", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Exchange:
    """Gloo's all_gather / all_reduce for ``world`` threads: each deposits its tensor, all meet."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.slots: list[torch.Tensor | None] = [None] * world
        self.barrier = threading.Barrier(world, timeout=10)

    def _swap(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = tensor.clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got

    def all_gather(self, parts, tensor, group):
        got = self._swap(group.rank, tensor)
        assert all(g.shape == tensor.shape and g.dtype == tensor.dtype for g in got), "Gloo gathers equal shapes only"
        for out, g in zip(parts, got):
            out.copy_(g)

    def all_reduce(self, tensor, group):
        got = self._swap(group.rank, tensor)
        tensor.copy_(torch.stack(got).sum(0))


@dataclass
class Group:
    rank: int
    exchange: Exchange


@dataclass
class Comm:
    """The attributes of vLLM's communicator the stand-in reads."""

    rank_in_group: int
    world_size: int
    device_group: Group


def run_ranks(world: int, monkeypatch, collectives, call):
    """``call(comm, rank)`` on every rank at once; the results by rank."""
    exchange = Exchange(world)
    monkeypatch.setattr(collectives.dist, "all_gather", exchange.all_gather)
    monkeypatch.setattr(collectives.dist, "all_reduce", exchange.all_reduce)
    results: list = [None] * world
    errors: list = []

    def one(rank):
        try:
            results[rank] = call(Comm(rank, world, Group(rank, exchange)), rank)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)
            exchange.barrier.abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    if errors:
        raise errors[0]
    return results


def rows(rank: int, n: int, width: int = 4, dtype=torch.bfloat16) -> torch.Tensor:
    """Rank-tagged rows: row i of rank r holds 100 r + i (exact in bf16), one column per width."""
    return (100 * rank + torch.arange(n, dtype=torch.float32)).unsqueeze(1).repeat(1, width).to(dtype)


@pytest.mark.parametrize("sizes", [[3, 1], [1, 3], [2, 2], [0, 2], None, [2, 1, 3]])
def test_all_gatherv_gives_every_rank_all_rows_in_rank_order(sizes, monkeypatch, collectives):
    world = len(sizes) if sizes else 2
    counts = sizes or [2, 2]
    inputs = [rows(r, counts[r]) for r in range(world)]
    out = run_ranks(world, monkeypatch, collectives, lambda comm, r: collectives.all_gatherv(comm, inputs[r], dim=0, sizes=sizes))
    expected = torch.cat(inputs)
    for got in out:
        assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_all_gatherv_of_a_list_keeps_each_tensors_dtype(monkeypatch, collectives):
    # dispatch() gathers hidden states (bf16), top-k weights (fp32) and top-k expert ids (int32).
    sizes = [3, 1]
    inputs = [[rows(r, sizes[r]), rows(r, sizes[r], 2, torch.float32), rows(r, sizes[r], 2, torch.int32)] for r in range(2)]
    out = run_ranks(2, monkeypatch, collectives, lambda comm, r: collectives.all_gatherv(comm, inputs[r], sizes=sizes))
    for got in out:
        assert [t.dtype for t in got] == [torch.bfloat16, torch.float32, torch.int32]
        for i, t in enumerate(got):
            assert torch.equal(t, torch.cat([inputs[0][i], inputs[1][i]]))


def test_all_gatherv_refuses_another_dim_as_nccls_does(collectives):
    with pytest.raises(NotImplementedError):
        collectives.all_gatherv(Comm(0, 2, Group(0, Exchange(2))), rows(0, 2), dim=1)


@pytest.mark.parametrize("sizes", [[3, 1], [1, 3], [2, 2], None, [2, 1, 3], [1, 0, 3]])
def test_reduce_scatterv_sums_over_the_ranks_and_each_keeps_its_own_rows(sizes, monkeypatch, collectives):
    world = len(sizes) if sizes else 2
    total = sum(sizes) if sizes else 4
    counts = sizes or [total // world] * world
    # Each rank holds partial sums for ALL rows (combine() after the experts): rank r adds 10 r (sums exact in bf16).
    inputs = [rows(0, total) + 10 * r for r in range(world)]
    out = run_ranks(world, monkeypatch, collectives, lambda comm, r: collectives.reduce_scatterv(comm, inputs[r], dim=0, sizes=sizes))
    summed = torch.stack([t.float() for t in inputs]).sum(0)
    start = 0
    for r, got in enumerate(out):
        assert got.dtype == torch.bfloat16
        assert torch.equal(got.float(), summed[start : start + counts[r]]), (r, got, summed)
        start += counts[r]
    # The caller's tensor is left as it was (the sum goes to a copy).
    assert torch.equal(inputs[1], rows(0, total) + 10)


def test_reduce_scatterv_of_fp32_does_not_sum_into_the_callers_tensor(monkeypatch, collectives):
    inputs = [rows(0, 4, dtype=torch.float32) for _ in range(2)]
    kept = [t.clone() for t in inputs]
    run_ranks(2, monkeypatch, collectives, lambda comm, r: collectives.reduce_scatterv(comm, inputs[r], dim=0))
    assert all(torch.equal(a, b) for a, b in zip(inputs, kept))
