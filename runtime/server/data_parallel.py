"""`radixflow serve --dp-size N`: N scheduler replicas behind one HTTP process.

Each replica is a scheduler process with its own model copy, KV pool and radix cache, reading
its own socket (IpcAddrs.schedulers). All of them write to the one detokenizer, whose outputs
the SchedulerClient routes back by request id, as with one replica. The SchedulerClient
picks a replica for each request with the balancing policy that `radixflow router` uses too
(runtime/balance/, --load-balance-method; keys are token ids) and sends its aborts to that
replica; a cache flush goes to every replica; each replica tags its stats with its rank,
and /get_server_info and /metrics show them per replica.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..messages import SchedulerStats

if TYPE_CHECKING:
    from ..server_args import ServerArgs

# SchedulerStats fields that add up over replicas (all of them but the rank).
SUMMED_STATS = ("num_running", "num_waiting", "kv_used_tokens", "kv_total_tokens",
                "cache_hit_tokens", "prompt_tokens", "generation_tokens",
                "spec_verify_passes", "spec_draft_tokens", "spec_accepted_tokens")


def default_threads(args: ServerArgs) -> ServerArgs:
    """On a CPU, replicas share the cores: without --num-threads each gets cores / dp_size."""
    if args.dp_size == 1 or args.num_threads is not None or args.device == "cuda":
        return args
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return args.replace(num_threads=max(1, (cores or 1) // args.dp_size))


def replica_args(args: ServerArgs, dp_rank: int) -> ServerArgs:
    """In replica `dp_rank`'s process, before the model loads: on CUDA, its device is
    dp_rank % device_count, and replicas sharing a device share --mem-fraction."""
    if args.device == "cpu":
        return args
    import torch

    if not torch.cuda.is_available():
        return args
    count = torch.cuda.device_count()
    device = dp_rank % count
    torch.cuda.set_device(device)
    sharing = len(range(device, args.dp_size, count))
    if sharing > 1:
        args = args.replace(mem_fraction=args.mem_fraction / sharing)
    return args


def total_stats(per_replica: list[SchedulerStats | None]) -> SchedulerStats | None:
    """The server's stats: the replicas' summed (those that have reported)."""
    got = [s for s in per_replica if s is not None]
    if len(per_replica) == 1 or not got:
        return got[0] if got else None
    return SchedulerStats(**{name: sum(getattr(s, name) for s in got) for name in SUMMED_STATS})


def replica_info(client: Any) -> list[dict]:
    """Per replica: its rank, requests in flight (load), requests routed to it, the routing
    tree's size, and its scheduler's last stats with its cache hit rate."""
    out = []
    for rank, stats in enumerate(client.replica_stats):
        info: dict[str, Any] = {"dp_rank": rank, **client.balancer.describe(rank)}
        if stats is not None:
            info.update({name: getattr(stats, name) for name in SUMMED_STATS})
            info["cache_hit_rate"] = (stats.cache_hit_tokens / stats.prompt_tokens
                                      if stats.prompt_tokens else 0.0)
        out.append(info)
    return out
