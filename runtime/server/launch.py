"""`radixflow serve`: start the scheduler and detokenizer processes, then the HTTP server.

Shutdown rules: SIGINT/SIGTERM stop everything cleanly; children die with their parent
(runtime/processes.py); a child that dies makes the server unhealthy and then exit with a
message, instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..chat_template import chat_template_text
from ..errors import ModelDownloadError, ModelNotFound, ServerUnavailable
from ..ipc import IpcAddrs
from ..processes import Children, setup_logging, stop_on_sigterm, watch_parent
from ..server_args import ServerArgs

logger = logging.getLogger(__name__)

DEFAULT_SCHEDULER_ENTRY = "radixflow.runtime.scheduler.process:run_scheduler"
# Test/extension hook: "module:function" run instead of the real scheduler.
SCHEDULER_ENTRY_ENV = "RADIXFLOW_SCHEDULER_ENTRY"
# Set by radixflow.Runtime: the server shuts down when this process is gone.
PARENT_PID_ENV = "RADIXFLOW_PARENT_PID"


class _LoadingBar:
    """A tqdm line while the model loads: elapsed time, and a real bar once the scheduler
    reports progress ({"progress": done, "total": n} on its ready pipe)."""

    BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}]"

    def __init__(self, model: str):
        from tqdm import tqdm

        self.bar = tqdm(desc=f"Loading {model}", total=None, file=sys.stderr,
                        bar_format="{desc} [{elapsed}]", dynamic_ncols=True)

    def progress(self, msg: dict) -> None:
        if msg.get("total"):
            self.bar.total = int(msg["total"])
            self.bar.bar_format = self.BAR
        self.bar.n = int(msg["progress"])
        self.bar.refresh()

    def close(self) -> None:
        if self.bar.total:
            self.bar.n = self.bar.total
        self.bar.set_description_str(self.bar.desc + ": ready", refresh=False)
        self.bar.close()


def serve(args: ServerArgs) -> int:
    """Run the server until SIGINT/SIGTERM or a child's death. Returns the exit code."""
    setup_logging(args.log_level)
    stop_on_sigterm()
    parent_pid = os.environ.get(PARENT_PID_ENV)
    if parent_pid:
        watch_parent(int(parent_pid), lambda: os.kill(os.getpid(), signal.SIGTERM))
    if args.node_rank > 0:  # --nnodes: this node runs tensor-parallel ranks only

        return serve_other_node(args)
    addrs = IpcAddrs.create()
    children = Children(log_level=args.log_level)
    try:
        served, model_info, tokenizer = _start(args, addrs, children)
        return _run_http(args, addrs, children, served, model_info, tokenizer)
    except KeyboardInterrupt:
        logger.info("interrupted during start-up; stopping")
        return 130
    except (ServerUnavailable, ModelNotFound, ModelDownloadError) as exc:
        logger.error("%s", exc)
        return 1
    finally:
        children.stop()
        addrs.cleanup()


def scheduler_names(dp_size: int) -> list[str]:
    """The scheduler processes' names: "scheduler", or "scheduler-<rank>" per replica."""
    return ["scheduler"] if dp_size == 1 else [f"scheduler-{rank}" for rank in range(dp_size)]


def model_folder(model: str | None, log_level: str = "info") -> Path:
    """The model's folder, prepared first (a GGUF's config and tokenizer, the default model's
    download) in a child process: transformers' GGUF reading and the model classes it
    imports then never stay in this process (~0.2 GB for the server's lifetime)."""
    from ..model_loader.resolve import NotPrepared, resolve_model

    try:
        return resolve_model(model, prepare=False)
    except NotPrepared:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=setup_logging, initargs=(log_level,)) as pool:
            return pool.submit(prepare, model).result()


def prepare(model: str | None) -> Path:
    """resolve_model, and the prepared folder's tokenizer class recorded while transformers'
    tokenizer machinery is loaded here anyway: the scheduler then skips AutoTokenizer (~3 s of
    a 128k-vocabulary GGUF's first start) and the HTTP process loads its tokenizer at once."""
    from ..model_loader.resolve import resolve_model
    from ..model_loader.tokenizer_class import load_and_record

    folder = resolve_model(model)
    load_and_record(folder, local_files_only=True)
    return folder


def _start(args: ServerArgs, addrs: IpcAddrs, children: Children) -> tuple[str, dict, Any]:
    """Start the children (a scheduler per --dp-size replica, the detokenizer), load the
    tokenizer meanwhile (tokenizer_load.py), wait until every model copy is ready."""
    from ..distributed.launch import start_node_ranks, tp_launch_args
    from ..model_loader import DEFAULT_MODEL_NAME
    from .data_parallel import default_threads
    from .tokenizer_load import TokenizerLoad

    served = (args.served_model_names or [args.model or DEFAULT_MODEL_NAME])[0]
    folder = str(model_folder(args.model, args.log_level))
    tokenizer_path = args.tokenizer or folder
    entry = os.environ.get(SCHEDULER_ENTRY_ENV) or DEFAULT_SCHEDULER_ENTRY
    sched_args = tp_launch_args(default_threads(args.replace(model=folder)))
    names = scheduler_names(args.dp_size)
    sched_conns = [children.start(name, entry, sched_args, addr, addrs.detokenizer,
                                  **({"dp_rank": rank} if args.dp_size > 1 else {}))
                   for rank, (name, addr) in enumerate(zip(names, addrs.schedulers(len(names)),
                                                           strict=True))]
    start_node_ranks(sched_args, children)  # --tp-size: ranks 1.. of this node
    detok_conn = children.start("detokenizer",
                                "radixflow.runtime.server.detokenizer:run_detokenizer",
                                tokenizer_path, addrs.detokenizer, addrs.client)
    bar = _LoadingBar(served)
    tokenizer_load = TokenizerLoad(tokenizer_path)
    try:
        infos = [children.wait_ready(name, conn, bar.progress if rank == 0 else None)
                 for rank, (name, conn) in enumerate(zip(names, sched_conns, strict=True))]
        tokenizer = tokenizer_load.result()
        if args.chat_template is not None:
            tokenizer.chat_template = chat_template_text(args.chat_template)
    finally:
        tokenizer_load.cancel()
        bar.close()
    for info in infos:
        if not isinstance(info, dict) or "context_length" not in info:
            raise ServerUnavailable(f"the scheduler sent a malformed ready message: {info!r}")
    model_info = infos[0]
    if len(infos) > 1:
        # Replicas may differ in KV pool size (GPU memory): a prompt must fit every one.
        model_info = {**model_info, "max_total_tokens": min(
            int(i.get("max_total_tokens") or 1 << 62) for i in infos)}
    children.wait_ready("detokenizer", detok_conn)
    return served, model_info, tokenizer


def _run_http(args: ServerArgs, addrs: IpcAddrs, children: Children, served: str,
              model_info: dict, tokenizer: Any) -> int:
    return _HttpProcess(args, addrs, children, served, model_info, tokenizer).run()


@dataclass
class _HttpProcess:
    """The HTTP server of this process, and a watcher that stops it when a child dies."""

    args: ServerArgs
    addrs: IpcAddrs
    children: Children
    served: str
    model_info: dict
    tokenizer: Any
    exit_code: int = 0

    def run(self) -> int:
        import uvloop

        # uvicorn re-raises the SIGINT/SIGTERM it shut down for; the shutdown is done.
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(self._serve())
        return self.exit_code

    async def _serve(self) -> None:
        import uvicorn

        from .data_parallel import replica_info
        from .http_server import create_app
        from .metrics import Metrics
        from .scheduler_client import SchedulerClient

        args, addrs = self.args, self.addrs
        client: SchedulerClient | None = None
        metrics = Metrics(self.served, lambda: client.stats if client is not None else None,
                          replicas=lambda: replica_info(client) if client is not None else [])
        client = SchedulerClient(self.tokenizer, self.model_info,
                                 scheduler_addr=addrs.schedulers(args.dp_size),
                                 recv_addr=addrs.client,
                                 metrics=metrics, policy=args.policy_config())
        client.start()
        processes = {"http": os.getpid(),
                     **{name: proc.pid for name, proc in self.children.procs.items()}}
        app = create_app(args, client, metrics, served_model_name=self.served, processes=processes)
        from .door import door_protocol

        # The door protocol: --http-header-timeout (slowloris) and --max-connections (a 503
        # with Retry-After; uvicorn's own limit_concurrency sends a bare one).
        protocol = door_protocol(header_timeout=args.http_header_timeout,
                                 max_connections=args.max_connections)
        server = uvicorn.Server(uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
            timeout_graceful_shutdown=3, timeout_keep_alive=30, http=protocol))
        watcher = asyncio.create_task(self._watch(server, client))
        try:
            await server.serve()
        finally:
            watcher.cancel()
            await client.close()
        if not server.started and self.exit_code == 0:
            self.exit_code = 1  # could not bind the port; uvicorn logged why

    async def _watch(self, server: Any, client: Any) -> None:
        """Announce the server once it listens; shut it down when a child or the pipeline
        fails."""
        announced = False
        while not server.should_exit:
            if server.started and not announced:
                announced = True
                _announce(server, self.args, self.served)
            dead = self.children.dead()
            if dead is not None or client.failure is not None:
                reason = (f"the {dead[0]} process died unexpectedly (exit code {dead[1]})"
                          if dead is not None else client.failure)
                logger.error("%s; the server is unhealthy and shuts down", reason)
                client.fail(reason or "a server process failed")
                self.exit_code = 1
                await asyncio.sleep(0.5)  # let waiting clients receive their 503s
                server.should_exit = True
                return
            await asyncio.sleep(0.2)


def _announce(server: Any, args: ServerArgs, served: str) -> None:
    port = args.port
    for s in getattr(server, "servers", []):
        for sock in s.sockets:
            port = sock.getsockname()[1]
            break
    print(f"radixflow is serving {served} at http://{args.host}:{port} "
          f"(OpenAI API at http://{args.host}:{port}/v1)", file=sys.stderr, flush=True)


def serve_other_node(args: ServerArgs) -> int:
    """`radixflow serve --nnodes N --node-rank K` for K > 0: this node's ranks, no HTTP
    server. Returns when they exit (rank 0 shut down or went away, or one failed)."""
    from ..distributed.launch import start_node_ranks, tp_launch_args
    from ..distributed.layout import Layout

    layout = Layout(args.tp_size, args.nnodes)
    ranks = layout.ranks_of(args.node_rank)
    children = Children(log_level=args.log_level)
    try:
        args = tp_launch_args(args)
        start_node_ranks(args, children)
        logger.info("node %d of %d: tensor-parallel ranks %d..%d of %d, joining rank 0 at %s",
                    args.node_rank, args.nnodes, ranks[0], ranks[-1], args.tp_size,
                    args.dist_init_addr)
        while True:
            dead = children.dead()
            if dead is not None:
                name, code = dead
                logger.error("the %s process exited (exit code %s); node %d stops", name, code,
                             args.node_rank)
                return 1
            time.sleep(0.2)
    except KeyboardInterrupt:
        return 130
    except ServerUnavailable as exc:
        logger.error("%s", exc)
        return 1
    finally:
        children.stop()
