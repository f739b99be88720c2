"""Tensor parallelism (`--tp-size N`): the model split over N ranks, on torch.distributed.

- parallel_state.py: a rank's group (gloo on CPU, NCCL on CUDA), joining at
  --dist-init-addr, the collectives a forward needs, failures turned into clear errors;
- sharding.py: which heads, KV heads, MLP features and vocab rows a rank holds, and the
  slices of the checkpoint's tensors that give them;
- tp_model.py: a rank's model (llama.py's or gemma.py's, with all-reduces and a
  vocab-parallel embedding and head);
- plan.py: the batch plan rank 0 (the scheduler's process) broadcasts before each forward;
- worker.py: ranks 1..N-1, which run rank 0's plans; launch.py starts them (Engine: as
  subprocesses of this process; the server: as children of its launcher, on every node);
- liveness.py: whether the other ranks are still there, asked while a collective is slow;
- watch.py: node 0's watch over ranks on other nodes;
- rendezvous.py: rank 0's store listens on --dist-init-addr only (the store has no
  authentication; that address must be loopback unless --dist-trusted-network:
  runtime/parallel_flags.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .parallel_state import RankLost, TensorParallel
    from .sharding import ShardSpec
    from .split import check_split

__all__ = ["RankLost", "ShardSpec", "TensorParallel", "check_split"]
_WHERE = {"RankLost": "parallel_state", "TensorParallel": "parallel_state",
          "ShardSpec": "sharding", "check_split": "split"}


def __getattr__(name: str) -> Any:
    # lazy: importing a module of this package runs no torch
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
