"""PolicyConfig: the knobs of the balancing policy (policy.py) and their checks.

A leaf (the standard library only): ServerArgs checks the --dp-size routing flags with it,
RouterArgs the router's, each error naming its flag.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("round_robin", "shortest_queue", "cache_aware")


@dataclass(frozen=True)
class PolicyConfig:
    """Defaults: sglang_router's launch_router."""

    method: str = "cache_aware"
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001
    eviction_interval: float = 60.0
    max_tree_size: int = 2 ** 24

    def __post_init__(self) -> None:
        """ValueError naming the flag of a bad value."""
        if self.method not in METHODS:
            raise ValueError(f"--load-balance-method must be one of {', '.join(METHODS)}, "
                             f"got {self.method!r}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"--cache-threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError("--balance-abs-threshold must be >= 0, got "
                             f"{self.balance_abs_threshold}")
        if self.balance_rel_threshold < 1.0:
            raise ValueError("--balance-rel-threshold must be >= 1 (a max/min load ratio), got "
                             f"{self.balance_rel_threshold}")
        if self.eviction_interval <= 0:
            raise ValueError(f"--eviction-interval must be > 0, got {self.eviction_interval}")
        if self.max_tree_size <= 0:
            raise ValueError(f"--max-tree-size must be > 0, got {self.max_tree_size}")
