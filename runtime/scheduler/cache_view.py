"""What the /dashboard shows of one scheduler: its radix tree (the most recently used nodes,
with their token counts, hits, last use and the requests that hold them), its KV pool and its
queues, as plain JSON (the CacheSnapshot message's `view`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixflow.radix_cache import TreeNode

    from .state import SchedulerState

PREVIEW_TOKENS = 48  # of each node's key, decoded for the page


def cache_view(state: SchedulerState, max_nodes: int) -> dict:
    tree = state.tree
    holders = _holders(state)
    nodes, queue, ids = [], [tree.root], {id(tree.root): 0}
    while queue and len(nodes) < max_nodes:
        node = queue.pop(0)
        nid = ids[id(node)]
        nodes.append({
            "id": nid, "parent": None if node.parent is None else ids.get(id(node.parent)),
            "tokens": len(node.key), "hits": node.hits, "last_access": node.last_access,
            "locks": node.lock_ref, "text": _preview(state, node),
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
        "requests": [{"rid": r.rid, "phase": phase, "prompt_tokens": len(r.input_ids),
                      "output_tokens": len(r.output_ids), "cached_tokens": r.cached_len}
                     for phase, queue_ in (("waiting", state.waiting),
                                           ("prefilling", state.prefilling),
                                           ("running", state.running))
                     for r in queue_],
    }


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
