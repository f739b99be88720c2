"""The `radixflow` command line. `radixflow serve --help` lists every ServerArgs field."""

from __future__ import annotations

import argparse
import sys

from .server_args import ServerArgs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixflow", description="radixflow: a prefix-sharing, structured-generation LLM "
                                      "runtime")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve", help="serve a model over HTTP (native SGLang-compatible and OpenAI APIs)",
        description="Start the HTTP server, the scheduler and the detokenizer.")
    ServerArgs.add_cli_args(serve)
    router = sub.add_parser(
        "router", help="route requests over several `radixflow serve` workers (cache aware)",
        description="One HTTP endpoint in front of several `radixflow serve` processes, "
                    "possibly on other machines: each request goes to the worker with the "
                    "longest prefix match of its prompt unless loads are imbalanced "
                    "(SGLang's router policy); dead workers are removed and requests that had "
                    "not started are retried on another.")
    from .router.args import RouterArgs

    RouterArgs.add_cli_args(router)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        try:
            args = ServerArgs.from_cli_args(ns)
        except ValueError as exc:
            parser.error(str(exc))
        from .processes import fast_exit
        from .server.launch import serve

        # serve() has stopped the children and cleaned up by the time it returns.
        fast_exit(serve(args))
    if ns.command == "router":
        from .router.args import RouterArgs

        try:
            router_args = RouterArgs.from_cli_args(ns)
        except ValueError as exc:
            parser.error(str(exc))
        from .processes import fast_exit
        from .router.app import run_router

        fast_exit(run_router(router_args))
    parser.error(f"unknown command {ns.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
