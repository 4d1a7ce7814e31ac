"""The KV cache of a model whose layers cache different things, sized as vLLM's KV cache manager
sizes it. Pure.

vLLM (``vllm/v1/core/kv_cache_utils.py``, 0.29.0 and 0.32.0 alike where not said):
1. Each cached module has a spec (``vllm/v1/kv_cache_interface.py``); its page is one block of
   ``block_size`` tokens (attention) or one whole state (``MambaSpec``).
2. Hybrid attention + state models (``Platform._align_hybrid_block_size``,
   ``vllm/platforms/interface.py``): the attention block grows to the smallest multiple of the
   kernel block (16; 128 with MLA) whose page holds a state, and the state page is padded to it.
3. ``_get_kv_cache_groups_uniform_page_size``: layers of one spec form a bucket; the group size is
   the smallest bucket (the largest when it is under 1.5x the smallest); each bucket splits into
   ``ceil(n / group size)`` groups (the last padded). One block of the pool is one page of every
   layer of a group: ``num_blocks = memory // (group size x page)``.
4. ``get_max_concurrency_for_kv_cache_config``: a request of ``max_model_len`` takes, per group,
   ``cdiv(max_memory_usage_bytes, page)`` blocks: full attention ``cdiv(L, block)``, sliding window
   ``cdiv(min(window - 1 + in-flight tokens, L), block) + 1``, chunked
   ``cdiv(min(chunk + in-flight tokens, L), block)``, a state 1 page (2 with prefix caching's
   ``mamba_cache_mode="align"``). Concurrency = num_blocks / the sum over groups.
5. The printed lines: from 0.21 ``GPU KV cache size`` is ``int(concurrency x max_model_len)``
   (``get_kv_cache_capacity``); up to 0.20 it was ``num_blocks // groups x block_size``.

Version differences read in the wheels of 0.11.0, 0.20.0, 0.21.0, 0.25.0, 0.26.0, 0.29.0 and 0.32.0:
in-flight tokens are ``max_num_batched_tokens`` up to 0.25 and ``max_concurrent_batches x
max_num_batched_tokens`` from 0.26 (2 with async scheduling at PP=1, the GPU default; PP
otherwise); hybrid Mamba models turn prefix caching (and so the "align" mode's 2 state pages) on
by default from 0.26, 1 page before.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan.layer_types import CHUNKED, FULL, INDEXER, SLIDING, STATE, LayerLayout

Version = tuple[int, ...]
TOKENS_AS_CONCURRENCY: Version = (0, 21, 0)
IN_FLIGHT_BATCHES: Version = (0, 26, 0)
MAMBA_ALIGN_DEFAULT: Version = (0, 26, 0)
KERNEL_BLOCK = 16  # FlashAttention / FlashInfer's smallest kernel block (MultipleOf(16))
MLA_HYBRID_BLOCK = 128  # _align_hybrid_block_size: MLA + Mamba keeps a multiple of 128


@dataclass(frozen=True)
class KvBucket:
    """The layers of one spec: ``count`` of them, ``groups`` KV cache groups, ``blocks`` per request each."""

    kind: str
    window: int
    count: int
    groups: int
    blocks: int
    page_bytes: int
    block_size: int


@dataclass(frozen=True)
class KvSizing:
    """One engine's KV cache: blocks, the two printed lines, and how they came about."""

    num_blocks: int
    concurrency: float
    logged_tokens: int  # what the version prints as "GPU KV cache size"
    tokens: int  # concurrency x max_model_len: what fit decisions use
    block_size: int
    group_size: int
    buckets: tuple[KvBucket, ...]
    bytes_per_token: float  # the memory one token of a max_model_len request takes, over all layers
    asked_block_size: int  # the block before the hybrid alignment: --block-size or the platform's default

    def to_json(self) -> dict:
        return {
            "num_blocks": self.num_blocks, "concurrency": round(self.concurrency, 3), "logged_tokens": self.logged_tokens,
            "block_size": self.block_size, "group_size": self.group_size,
            "groups": [{"kind": b.kind, "window": b.window, "layers": b.count, "groups": b.groups, "blocks_per_request": b.blocks,
                        "page_bytes": b.page_bytes} for b in self.buckets],
        }  # fmt: skip


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def size_kv(layout: LayerLayout, start: int, end: int, *, attn_token_bytes: float, global_token_bytes: float, state_bytes: int,
            indexer_token_bytes: float, available: float, max_model_len: int, max_num_batched_tokens: int, block_size: int,
            block_size_set: bool, version: Version, pp: int, mla: bool, gpu: bool, enable_prefix_caching: bool | None = None) -> KvSizing:  # fmt: skip
    """Blocks and concurrency of one engine's worker holding layers [start, end)."""
    counts: dict[tuple[str, int], int] = {}
    for layer in layout.caches[start:end]:
        for c in layer:
            counts[(c.kind, c.window)] = counts.get((c.kind, c.window), 0) + 1
    has_attention = any(k in (FULL, SLIDING, CHUNKED) for k, _ in counts)
    block = block_size
    if counts.get((STATE, 0)) and has_attention and state_bytes:
        align = max(KERNEL_BLOCK, block, MLA_HYBRID_BLOCK if mla else 0)
        block = max(block, align * _cdiv(state_bytes, int(align * attn_token_bytes)))
    del block_size_set  # the alignment overrides a --block-size too (platforms/interface.py)
    in_flight = max_num_batched_tokens
    if version >= IN_FLIGHT_BATCHES:
        in_flight *= (2 if pp == 1 else pp) if gpu else pp
    # mamba_cache_mode "align" (2 state pages) comes with prefix caching: on by default for hybrids from 0.26
    prefix = enable_prefix_caching if enable_prefix_caching is not None else version >= MAMBA_ALIGN_DEFAULT
    state_pages = 2 if prefix else 1
    L = max_model_len

    def per_token(kind: str, window: int) -> float:
        if kind == INDEXER:
            return indexer_token_bytes
        return global_token_bytes if kind == FULL else attn_token_bytes

    pages: dict[tuple[str, int], int] = {}
    for key in counts:
        kind, window = key
        pages[key] = state_bytes if kind == STATE and not has_attention else int(block * per_token(kind, window))
    page = max(pages.values()) if pages else 0
    buckets_raw = []
    for (kind, window), n in counts.items():
        # unify_kv_cache_spec_page_size: a smaller page grows its block (or is padded) to the largest page
        bs = block * max(1, page // pages[(kind, window)]) if kind != STATE and pages[(kind, window)] else block
        if kind == FULL or kind == INDEXER:
            blocks = _cdiv(L, bs)
        elif kind == SLIDING:
            blocks = _cdiv(min(window - 1 + in_flight, L), bs) + 1
        elif kind == CHUNKED:
            blocks = _cdiv(min(window + in_flight, L), bs)
        else:
            blocks = state_pages if has_attention else 1  # attention-free models: no prefix caching (config/model.py)
        buckets_raw.append((kind, window, n, blocks, bs))
    if not buckets_raw or page <= 0:
        return KvSizing(1, 0.0, 0, 0, block, 0, (), 0.0, block_size)
    smallest, largest = min(b[2] for b in buckets_raw), max(b[2] for b in buckets_raw)
    group = largest if largest < smallest * 1.5 else smallest
    buckets = tuple(KvBucket(k, w, n, _cdiv(n, group), blk, page, bs) for k, w, n, blk, bs in buckets_raw)
    num_blocks = max(0, int(available // (group * page))) if available > 0 else 0
    per_request = sum(b.groups * b.blocks for b in buckets)
    concurrency = num_blocks / per_request
    n_groups = sum(b.groups for b in buckets)
    min_block = min(b.block_size for b in buckets)
    if version >= TOKENS_AS_CONCURRENCY:
        logged = int(concurrency * L)
    else:
        logged = num_blocks // n_groups * min_block
    bytes_per_token = per_request * group * page / L
    return KvSizing(num_blocks, concurrency, logged, int(concurrency * L), block, group, buckets, bytes_per_token, block_size)


def state_page_note(layout: LayerLayout, sizing: KvSizing) -> str | None:
    """Why the attention block grew (vLLM logs "Setting attention block size to N tokens"): against
    the block it was asked for, the platform's default included (128 on CPU, not 16)."""
    if sizing.block_size != sizing.asked_block_size and layout.state is not None:
        return (f"attention block size {sizing.block_size} tokens so one page holds a {layout.state.kind} state "
                "(vLLM pads the state page to it: platforms/interface.py _align_hybrid_block_size)")
    return None
