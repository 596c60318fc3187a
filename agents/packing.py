"""Packed sequences: many (prompt, response) turns in one forward row, no padding, prompts once.

The update used to run a minibatch as several forward calls: each distinct prompt in length
buckets, then the responses on its key/value cache. On a GPU every call is thousands of small
kernels, so the count of calls, not the tokens, set the update's time. Here the turns of a
microbatch become **one row**:

- **A prefix tree of tokens.** Each turn is the token path ``prompt + response``. Paths are put in
  a trie, so tokens that several turns share as a prefix (the G samples of a GRPO group share
  their prompt; distinct prompts share a system prompt) are one *node*, run once. The row holds
  every node once, in creation order (a parent before its children), but a response's last
  token where no path goes on below it: that node's output would predict nothing, so it is
  never run (its token is still scored, from its parent's output). An exact action scoring's
  texts end in such leaves: 10 of the 26 nodes of a signal candidate's spellings. No padding
  anywhere in the linear layers, the MLPs or the norms, where nearly all of the compute is.
- **Positions** are each node's depth in its path, so rotary embeddings see what a padded forward
  would have shown.
- **Attention** (:func:`packed_attention`) lets a node see exactly its ancestors. Every node is
  *owned* by the first turn that created it; a turn's owned nodes are a suffix of its path. The
  owned nodes are cut into pieces of at most ``chunk`` nodes, and each query chunk attends to its
  pieces' path prefixes, gathered from the packed keys and values: one
  ``scaled_dot_product_attention`` call per layer over ``(chunks, heads, chunk, keys)``, with
  query heads folded onto their key/value head (grouped-query attention). Short sibling pieces
  (the dozens of reply texts an exact action scoring puts under one prompt, the G samples of a
  group) share a chunk, and so one gather of their common prefix, where that is less work: an
  exact listening measure's pieces were 3-5 nodes each under 200-node prompts, in chunks of 16
  query slots, 4.6 slots per real query. A node's output is then taken from its chunk.
- **Logits** only for the nodes that predict a response token (``logits_to_keep`` as indices),
  and each token's log-probability is gathered from its predictor's row: the vocabulary-wide
  softmax runs once per predictor, not once per (turn, token).

Every node's value is a function of its ancestors only, as in a padded forward, and gradients
from every turn meet at the shared nodes: the logprobs and their gradient equal the padded
forward's to float rounding (tested on the tiny model). ``share=False`` gives every turn its own
path (no trie), for comparisons.

The model must run its attention through :data:`marl.agents.attention.MARL_ATTENTION`
(:func:`marl.agents.attention.use_marl_attention` switches an ``sdpa`` model in place); the
layout travels to it as the forward keyword ``packed_layout``, and a 4D mask (the chunks' own)
stops transformers from building an ``N x N`` one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch
from torch import nn

from marl.agents.logprobs import ResponseLogprobs, sampling_logprobs, token_entropy

__all__ = [
    "PackedLayout",
    "PrefixCounter",
    "host_to_device",
    "pack_prompts",
    "pack_turns",
    "packed_positions",
    "packed_response_logprobs",
]

# index tensors are built here, on the host, whatever the default device, then moved once
HOST = torch.device("cpu")
CHUNK_SIZES = (16, 32, 64, 128, 256)
# What gathering a chunk's keys and values (and their gradient) costs, in query slots: on a
# 2-core EPYC, SmolLM2's shape, chunks of 8 queries were 1.1-1.5x slower than chunks of 64
# because every chunk gathers its whole path prefix again.
GATHER_COST = 64


@dataclass(frozen=True)
class PackedLayout:
    """Index tensors of one packed row (built by :func:`pack_turns`; all on one device).

    ``N`` nodes, ``R`` query chunks of ``C`` queries over ``K`` keys, ``M`` predictor nodes,
    ``B`` turns whose longest response has ``T`` tokens.
    """

    input_ids: torch.Tensor  # (1, N) each node's token
    position_ids: torch.Tensor  # (1, N) each node's depth
    chunk_queries: torch.Tensor  # (R, C) the node of each query slot (0 on padding)
    chunk_keys: torch.Tensor  # (R, K) the nodes each chunk attends to: its pieces' prefixes
    chunk_mask: torch.Tensor  # (R, 1, C, K) bool: query slot may see key slot
    node_slot: torch.Tensor  # (N,) where each node's output lies in the flattened (R * C)
    predictors: torch.Tensor  # (M,) nodes whose logits predict some response token
    predictor_of: torch.Tensor  # (B, T) row of ``predictors`` for each response token
    targets: torch.Tensor  # (B, T) each response token (0 on padding)
    valid: torch.Tensor  # (B, T) bool: a real response token

    @property
    def nodes(self) -> int:
        """Positions the model runs."""
        return int(self.input_ids.shape[1])


class PrefixCounter:
    """Counts the nodes of a growing token trie: :meth:`add` a turn's path, learn how many new
    positions it costs in a packed row (all of it without ``share``). A budget's count: the
    row runs at most this many (it leaves out the responses' final leaves, which a growing trie
    cannot know are final; :func:`packed_positions` counts exactly)."""

    def __init__(self, share: bool = True) -> None:
        self.share = share
        self.root: dict[int, dict] = {}
        self.nodes = 0

    def cost(self, path: Sequence[int]) -> int:
        """New positions ``path`` would add, without adding it."""
        if not self.share:
            return len(path)
        level, depth = self.root, 0
        for token in path:
            nxt = level.get(token)
            if nxt is None:
                break
            level, depth = nxt, depth + 1
        return len(path) - depth

    def add(self, path: Sequence[int]) -> int:
        """Add ``path``; returns the positions it added."""
        added = self.cost(path)
        if self.share:
            level = self.root
            for token in path:
                level = level.setdefault(token, {})
        self.nodes += added
        return added

    def goes_on(self, path: Sequence[int]) -> bool:
        """Whether some path added goes on below ``path`` (itself added); never without
        ``share``, where every path is its own."""
        if not self.share:
            return False
        level = self.root
        for token in path:
            level = level[token]
        return bool(level)


def packed_positions(
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    share: bool = True,
) -> int:
    """How many positions :func:`pack_turns` runs for these turns: the trie's nodes (each
    turn's own path without ``share``), less each response's last node below which no path goes
    on (:func:`_drop_final_leaves`). :class:`PrefixCounter` counts those too: at most one
    position a turn more than the row runs."""
    counter = PrefixCounter(share)
    turns = [[*prompt, *response] for prompt, response in zip(prompt_ids_list, response_ids_list)]
    for path in turns:
        counter.add(path)
    final = [
        path
        for path, response in zip(turns, response_ids_list)
        if response and not counter.goes_on(path)
    ]  # shared, equal turns end in one leaf; unshared, each in its own
    return counter.nodes - (len({tuple(path) for path in final}) if share else len(final))


def host_to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` (built on the host) on ``device``: on CUDA through pinned memory without
    blocking, so the host does not wait for the device's queue (a copy from pageable memory
    waits for it); elsewhere a plain move."""
    device = torch.device(device)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def pack_turns(
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    device: torch.device | str = "cpu",
    share: bool = True,
    chunk: int | None = None,
) -> PackedLayout:
    """The packed layout of B turns (each prompt non-empty). ``chunk``: query chunk size
    (None: the size in :data:`CHUNK_SIZES` that attends over the fewest padded slots)."""
    return _pack(prompt_ids_list, response_ids_list, device, share, chunk)[0]


def pack_prompts(
    prompts: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> tuple[PackedLayout, torch.Tensor]:
    """The packed layout of P prompts alone, every shared prefix once (a prefill), and where
    each prompt's tokens lie in it: ``(P, W)`` node indices, each prompt right-aligned in the
    width ``W`` of the longest, the padding on its left pointing at ``N`` (one past the last
    node: the caller appends a zero node there)."""
    layout, paths = _pack(prompts, [[] for _ in prompts], device, True, None)
    width = max(len(path) for path in paths)
    padding = layout.nodes
    rows = [[padding] * (width - len(path)) + path for path in paths]
    return layout, host_to_device(torch.tensor(rows, device=HOST), device)  # (P, W)


def _pack(
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    device: torch.device | str,
    share: bool,
    chunk: int | None,
) -> tuple[PackedLayout, list[list[int]]]:
    """:func:`pack_turns`, and each turn's path of nodes (prompt then response)."""
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(
            f"pack_turns: {len(prompt_ids_list)} prompts but {len(response_ids_list)} responses"
        )
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("pack_turns: every prompt needs at least one token")
    tokens: list[int] = []
    depths: list[int] = []
    children: list[dict[int, int]] = []  # trie edges by token; roots in `roots`
    roots: dict[int, int] = {}
    paths: list[list[int]] = []
    owned_from: list[int] = []  # index in the path of the turn's first owned node
    for prompt, response in zip(prompt_ids_list, response_ids_list):
        path: list[int] = []
        start = -1
        level = roots
        for depth, token in enumerate((*prompt, *response)):
            node = level.get(token) if share else None
            if node is None:
                node = len(tokens)
                tokens.append(int(token))
                depths.append(depth)
                children.append({})
                level[token] = node
                if start < 0:
                    start = depth
            path.append(node)
            level = children[node]
        paths.append(path)
        owned_from.append(len(path) if start < 0 else start)
    tokens, depths, paths = _drop_final_leaves(tokens, depths, children, paths, response_ids_list)
    owned_from = [min(start, len(path)) for start, path in zip(owned_from, paths)]

    size, chunks = _best_chunks(paths, owned_from, chunk)
    keys = [c.keys(paths) for c in chunks]
    width = max(len(k) for k in keys)
    slot = [0] * len(tokens)
    queries, query_turn, query_depth = [], [], []
    for r, c in enumerate(chunks):
        nodes, turns, at = [], [], []
        for turn, a, end in c.pieces:
            nodes += paths[turn][a:end]
            turns += [turn] * (end - a)
            at += range(a, end)
        for i, node in enumerate(nodes):
            slot[node] = r * size + i
        pad = size - len(nodes)  # padded query slots: the first piece's root, at depth 0
        queries.append(nodes)
        query_turn.append(turns + [c.pieces[0][0]] * pad)
        query_depth.append(at + [0] * pad)
    chunk_queries = _rows(queries, size)  # (R, C)
    chunk_keys = _rows(keys, width)  # (R, K), 0 on padding
    key_real = torch.tensor([[len(k)] for k in keys], device=HOST) > torch.arange(
        width, device=HOST
    )  # (R, K)
    key_depth = torch.tensor(depths, device=HOST)[chunk_keys]  # (R, K)
    longest = max(len(path) for path in paths)
    path_nodes = torch.tensor(
        [[*path, *[-1] * (longest - len(path))] for path in paths], device=HOST
    )  # (B, L): each turn's nodes by depth
    query_at = torch.tensor(query_depth, device=HOST)  # (R, C)
    # the ancestor of each query at each key's depth: the key is visible when it is that node
    ancestor = path_nodes[
        torch.tensor(query_turn, device=HOST).unsqueeze(-1), key_depth.unsqueeze(1)
    ]  # (R, C, K)
    mask = (
        key_real.unsqueeze(1)
        & (key_depth.unsqueeze(1) <= query_at.unsqueeze(-1))
        & (ancestor == chunk_keys.unsqueeze(1))
    ).unsqueeze(1)  # (R, 1, C, K): each query sees its ancestors and itself
    # padded query slots see their first piece's root: no row is fully masked (NaN-free)

    t_max = max((len(r) for r in response_ids_list), default=0)
    batch = len(paths)
    targets = torch.zeros(batch, t_max, dtype=torch.long, device=HOST)
    valid = torch.zeros(batch, t_max, dtype=torch.bool, device=HOST)
    predictor_node = torch.zeros(batch, t_max, dtype=torch.long, device=HOST)
    for b, (prompt, response) in enumerate(zip(prompt_ids_list, response_ids_list)):
        n = len(response)
        if n:
            targets[b, :n] = torch.tensor(list(response), device=HOST)
            valid[b, :n] = True
            p = len(prompt)
            predictor_node[b, :n] = torch.tensor(paths[b][p - 1 : p + n - 1], device=HOST)
    predictors, predictor_of = torch.unique(predictor_node[valid], return_inverse=True)  # (M,)
    rows_of = torch.zeros(batch, t_max, dtype=torch.long, device=HOST)
    rows_of[valid] = predictor_of
    layout = PackedLayout(
        input_ids=host_to_device(torch.tensor([tokens], device=HOST), device),
        position_ids=host_to_device(torch.tensor([depths], device=HOST), device),
        chunk_queries=host_to_device(chunk_queries, device),
        chunk_keys=host_to_device(chunk_keys, device),
        chunk_mask=host_to_device(mask, device),
        node_slot=host_to_device(torch.tensor(slot, device=HOST), device),
        predictors=host_to_device(predictors, device),
        predictor_of=host_to_device(rows_of, device),
        targets=host_to_device(targets, device),
        valid=host_to_device(valid, device),
    )
    return layout, paths


def _drop_final_leaves(
    tokens: list[int],
    depths: list[int],
    children: list[dict[int, int]],
    paths: list[list[int]],
    responses: Sequence[Sequence[int]],
) -> tuple[list[int], list[int], list[list[int]]]:
    """The trie without the last node of each response below which no path goes on: its
    output would predict nothing (its token is a target, predicted by its parent's output) and
    no other node attends to it, so the row never runs it. The nodes are renumbered in order;
    the paths end one node early where theirs was dropped. A prompt's last node always stays
    (a prefill keeps its keys and values)."""
    dropped = {
        path[-1] for path, response in zip(paths, responses) if response and not children[path[-1]]
    }
    if not dropped:
        return tokens, depths, paths
    keep = [node not in dropped for node in range(len(tokens))]
    renumbered = list(accumulate(keep, initial=0))  # a kept node's index: the kept before it
    return (
        [t for t, k in zip(tokens, keep) if k],
        [d for d, k in zip(depths, keep) if k],
        [[renumbered[n] for n in path if keep[n]] for path in paths],
    )


def _rows(rows: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """``(len(rows), width)`` long tensor on the host, each row right-padded with 0."""
    return torch.tensor([[*row, *[0] * (width - len(row))] for row in rows], device=HOST)


@dataclass
class _Chunk:
    """One query chunk: its pieces ``(turn, first index, end)`` of owned path nodes. Its keys
    are the first piece's path prefix, then the nodes of the pieces after it (each of which
    hangs below a key already there), so the key set is closed under ancestors."""

    pieces: list[tuple[int, int, int]]
    added: set[int]  # the nodes of the pieces after the first
    queries: int

    def width(self) -> int:
        """How many keys the chunk attends to."""
        _, a, end = self.pieces[0]
        return end + self.queries - (end - a)

    def keys(self, paths: Sequence[Sequence[int]]) -> list[int]:
        """The nodes the chunk attends to, in order."""
        turn, _, end = self.pieces[0]
        return [*paths[turn][:end], *(n for t, a, e in self.pieces[1:] for n in paths[t][a:e])]

    def holds(self, paths: Sequence[Sequence[int]], node: int, depth: int) -> bool:
        """Whether ``node`` (at ``depth`` in its path) is one of the chunk's keys."""
        turn, _, end = self.pieces[0]
        return (depth < end and paths[turn][depth] == node) or node in self.added


def _cut(
    paths: Sequence[Sequence[int]], owned_from: Sequence[int], size: int, merge: bool
) -> list[_Chunk]:
    """Each turn's owned nodes cut into pieces of at most ``size``, a chunk per piece; with
    ``merge`` a piece joins the chunk before it when the queries fit and its parent node is
    among that chunk's keys (so all its ancestors are: siblings under one prompt, the scored
    replies of one prompt or the G samples of a group, share one chunk and one gather)."""
    chunks: list[_Chunk] = []
    for turn, (path, start) in enumerate(zip(paths, owned_from)):
        for a in range(start, len(path), size):
            end = min(a + size, len(path))
            last = chunks[-1] if chunks else None
            if (
                merge
                and last is not None
                and last.queries + end - a <= size
                and (a == 0 or last.holds(paths, path[a - 1], a - 1))
            ):
                last.pieces.append((turn, a, end))
                last.added.update(path[a:end])
                last.queries += end - a
            else:
                chunks.append(_Chunk([(turn, a, end)], set(), end - a))
    return chunks


def _best_chunks(
    paths: Sequence[Sequence[int]], owned_from: Sequence[int], chunk: int | None
) -> tuple[int, list[_Chunk]]:
    """The query chunk size (``chunk``, or the best of :data:`CHUNK_SIZES`) and the chunks
    with the least work: (query slots + :data:`GATHER_COST`) x key slots, summed over the
    chunks, each padded to the widest, with sibling pieces merged or not (without merging, a
    chunk per piece and the longest owning path's keys: priced without cutting)."""
    owning = [(len(path), len(path) - start) for path, start in zip(paths, owned_from)]
    widest = max(length for length, owned in owning if owned)
    best: tuple[int, int, bool] | None = None
    for size in (chunk,) if chunk else CHUNK_SIZES:
        pieces = sum(-(-owned // size) for _, owned in owning)
        merged = _cut(paths, owned_from, size, merge=True)
        for merge, rows, width in (
            (False, pieces, widest),
            (True, len(merged), max(c.width() for c in merged)),
        ):
            cost = rows * (size + GATHER_COST) * width
            if best is None or cost < best[0]:
                best = (cost, size, merge)
    assert best is not None
    _, size, merge = best
    return size, _cut(paths, owned_from, size, merge)


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: PackedLayout,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention of a packed row: each node attends to its ancestors and itself.

    ``query`` (1, H, N, D), ``key`` and ``value`` (1, H_kv, N, D), H a multiple of H_kv.
    Returns (1, N, H, D), transformers' attention-function layout.
    """
    _, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    rows, size = layout.chunk_queries.shape
    width = layout.chunk_keys.shape[1]
    # index_select, not advanced indexing: its backward is an index_add, far cheaper on a CPU
    # than the accumulating index_put that indexing's backward runs
    q = query[0].index_select(1, layout.chunk_queries.reshape(-1))  # (H, R * C, D)
    q = q.view(kv_heads, groups, rows, size, dim).permute(2, 0, 1, 3, 4)  # (R, H_kv, G, C, D)
    q = q.reshape(rows, kv_heads, groups * size, dim)  # (R, H_kv, G * C, D): heads folded
    keys = layout.chunk_keys.reshape(-1)  # (R * K,)
    k = key[0].index_select(1, keys).view(kv_heads, rows, width, dim).transpose(0, 1)
    v = value[0].index_select(1, keys).view(kv_heads, rows, width, dim).transpose(0, 1)
    # k, v: (R, H_kv, K, D)
    mask = layout.chunk_mask.repeat(1, 1, groups, 1)  # (R, 1, G * C, K)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scaling
    )  # (R, H_kv, G * C, D)
    out = out.view(rows, heads, size, dim).transpose(1, 2)  # (R, C, H, D)
    out = out.reshape(rows * size, heads, dim).index_select(0, layout.node_slot)  # (N, H, D)
    return out.unsqueeze(0)  # (1, N, H, D)


def packed_response_logprobs(
    model: nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    top_p: float = 1.0,
    untruncated: bool = False,
    share: bool = True,
    layout: PackedLayout | None = None,
    entropy: bool = False,
) -> ResponseLogprobs:
    """:func:`marl.agents.logprobs.response_logprobs` in one packed forward: ``(B, T)``
    left-aligned logprobs (sampling, and without top-p when ``untruncated``), their mask and
    (``entropy``) the sampling distribution's entropy at each position. Differentiable.
    ``layout``: a :func:`pack_turns` result for these turns, if already built."""
    device = next(model.parameters()).device
    batch = len(prompt_ids_list)
    t_max = max((len(r) for r in response_ids_list), default=0)
    if batch == 0 or t_max == 0:
        return ResponseLogprobs.empty(batch, device, untruncated, entropy)
    if layout is None:
        layout = pack_turns(prompt_ids_list, response_ids_list, device, share)
    logits = model(
        input_ids=layout.input_ids,
        position_ids=layout.position_ids,
        attention_mask=layout.chunk_mask,  # 4D: transformers passes it on unchanged
        packed_layout=layout,
        logits_to_keep=layout.predictors,
        use_cache=False,
    ).logits[0]  # (M, V)
    flat = layout.predictor_of * logits.shape[-1] + layout.targets  # (B, T) into (M * V)

    def gathered(logp_all: torch.Tensor) -> torch.Tensor:  # (M, V) -> (B, T)
        return logp_all.reshape(-1)[flat].masked_fill(~layout.valid, 0.0)

    logp_all = sampling_logprobs(logits, temperature, top_p)  # (M, V)
    sampling = gathered(logp_all)  # (B, T)
    full = None
    if untruncated:
        full = sampling if top_p >= 1.0 else gathered(sampling_logprobs(logits, temperature))
    spread = None
    if entropy:  # (M,) per predictor -> (B, T)
        spread = token_entropy(logp_all)[layout.predictor_of].masked_fill(~layout.valid, 0.0)
    return ResponseLogprobs(sampling, full, layout.valid.to(sampling.dtype), spread)
