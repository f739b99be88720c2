"""Radix tree over token ids -> KV slots (pure Python, no torch)."""

from __future__ import annotations

from radixflow.radix_cache.radix_tree import MatchResult, RadixTree, TreeNode, common_prefix_len
from radixflow.radix_cache.tree_audit import namespace_label

__all__ = ["MatchResult", "RadixTree", "TreeNode", "common_prefix_len", "namespace_label"]
