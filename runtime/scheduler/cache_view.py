"""What the /dashboard shows of one scheduler: its radix tree (the most recently used nodes,
with their token counts, hits, last use and the requests that hold them), its KV pool,
evictions, its queues and its grammar cache, as plain JSON (the CacheSnapshot message's
`view`).

The tree is walked breadth first, most recently used children first, so a bounded view keeps
the shared prefixes near the root. `last_access` is the wall-clock time (seconds since the
epoch, as `time`) the node was last matched or inserted. A cache_salt namespace shows as a
node with no tokens and no text: the salt itself is a tenant's secret and never leaves the
scheduler.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixflow.radix_cache import TreeNode

    from .grammar import SchedulerGrammar
    from .state import SchedulerState

PREVIEW_TOKENS = 48  # of each node's key, decoded for the page
GRAMMAR_COUNTERS = ("num_masked_rows", "num_jumps", "num_forced_tokens", "num_closed_early")


def cache_view(state: SchedulerState, max_nodes: int,
               grammars: SchedulerGrammar | None = None) -> dict:
    tree = state.tree
    holders = _holders(state)
    nodes: list[dict] = []
    queue: deque[TreeNode] = deque([tree.root])
    ids = {id(tree.root): 0}
    while queue and len(nodes) < max_nodes:
        node = queue.popleft()
        nid = ids[id(node)]
        nodes.append({
            "id": nid, "parent": None if node.parent is None else ids.get(id(node.parent)),
            "tokens": len(node.key), "hits": node.hits, "last_access": node.last_access,
            "locks": node.lock_ref, "text": _preview(state, node),
            "namespace": node.namespace is not None,
            "requests": holders.get(id(node), []),
        })
        children = sorted(node.children.values(), key=lambda c: -c.last_access)
        for child in children:
            ids[id(child)] = len(ids)
        queue.extend(children)
    pool = state.kv_pool
    return {
        "time": time.time(),
        "nodes": nodes, "truncated": bool(queue),
        "tree_tokens": tree.total_size(), "evictable_tokens": tree.evictable_size(),
        "kv_total_tokens": pool.num_slots, "kv_free_tokens": pool.num_free,
        "evicted_tokens": state.kv.num_evicted_tokens,
        "radix_cache": not tree.disabled,
        "requests": [{"rid": r.rid, "phase": phase, "prompt_tokens": len(r.input_ids),
                      "output_tokens": len(r.output_ids), "cached_tokens": r.cached_len}
                     for phase, queue_ in (("waiting", state.waiting),
                                           ("prefilling", state.prefilling),
                                           ("running", state.running))
                     for r in queue_],
        "grammar": grammar_view(grammars),
    }


def grammar_view(grammars: SchedulerGrammar | None) -> dict | None:
    """The grammar backend's compile cache and counters; None before any constraint built it."""
    backend = None if grammars is None else grammars.built_backend
    if backend is None:
        return None
    counters = dataclasses.asdict(grammars.stats)
    return {**backend.cache_stats(), **{k: counters[k] for k in GRAMMAR_COUNTERS}}


def _holders(state: SchedulerState) -> dict[int, list[str]]:
    """id(node) -> the rids of live requests whose locked path runs through it."""
    out: dict[int, list[str]] = {}
    for req in state.prefilling + state.running:
        node = req.last_node
        while node is not None and node is not state.tree.root:
            out.setdefault(id(node), []).append(req.rid)
            node = node.parent
    return out


def _preview(state: SchedulerState, node: TreeNode) -> str:
    if not node.key:
        return ""
    try:
        return state.tokenizer.decode(node.key[:PREVIEW_TOKENS])
    except Exception:  # noqa: BLE001 -- a view, never a failure
        return ""
