"""A tensor-parallel rank other than 0: load its shard, then run rank 0's batch plans.

Started by the server's launcher (`run_worker`, a child like the scheduler) or by Engine
(`python -m radixflow.runtime.distributed.worker`, its arguments pickled on stdin). It has no
scheduler, radix tree or sampler: rank 0 decides every batch and samples; a worker holds its
part of the weights and of the KV pool, and its copy of req_to_token (kept by the plans).
"""

from __future__ import annotations

import logging
import pickle
import sys
from typing import Any

from ..processes import become_child, fast_exit
from ..server_args import ServerArgs

logger = logging.getLogger(__name__)


def run_worker(args: ServerArgs, rank: int, ready: Any = None) -> None:
    """Serve as rank `rank` until rank 0 shuts down (exit 0) or goes away (exit 1)."""
    from ..model_loader import load_config, resolve_model
    from ..model_runner import ModelRunner
    from .parallel_state import RankLost
    from .plan import receive

    try:
        folder = resolve_model(args.model)
        runner = ModelRunner(args, folder, load_config(folder), tp_rank=rank)
    except (ValueError, TimeoutError, RankLost) as exc:
        logger.error("tensor-parallel rank %d failed to start: %s", rank, exc)
        fast_exit(1)
    except Exception:
        logger.exception("tensor-parallel rank %d failed to start", rank)
        fast_exit(1)
    if ready is not None:
        ready.close()  # (the launcher needs no word: rank 0 is ready only once every rank is)
    tp, table = runner.tp, runner.req_to_token_pool.req_to_token
    forwards = 0
    try:
        while (plan := receive(tp, table)) is not None:
            runner.forward(plan.mode, plan.parts, plan.out_slots)
            forwards += 1
    except RankLost as exc:
        logger.error("%s; rank %d exits", exc, rank)
        fast_exit(1)
    except Exception:
        logger.exception("tensor-parallel rank %d failed in a forward", rank)
        fast_exit(1)
    logger.debug("rank %d: shut down after %d forwards", rank, forwards)
    tp.close()
    fast_exit(0)


def main() -> None:
    """Engine's workers: `python -m radixflow.runtime.distributed.worker` < pickle of
    (ServerArgs, rank, log level, parent pid)."""
    import multiprocessing

    args, rank, log_level, parent_pid = pickle.load(sys.stdin.buffer)
    multiprocessing.current_process().name = f"tp-rank-{rank}"  # in its log lines
    become_child(parent_pid, log_level)  # Ctrl-C reaches the Engine's process, not this one
    run_worker(args, rank)


if __name__ == "__main__":
    main()
