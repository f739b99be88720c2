"""RouterArgs: the configuration of `radixflow router` and its command-line flags."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..balance.config import METHODS, PolicyConfig

_DEFAULTS = PolicyConfig()
STR_FLAGS = frozenset({"worker_urls", "api_key", "admin_api_key", "worker_api_key"})


def check_worker_url(url: str) -> str:
    """`url` as the router keys its workers (no trailing slash); ValueError unless it is an
    http:// or https:// URL of a host (and port), with no user:password, query or
    fragment (a path is kept: a worker behind a proxy's prefix; the router appends the API
    paths to it)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    url = url.rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a valid URL: {exc}") from None
    if "@" in parts.netloc:
        raise ValueError(f"{url!r} has a user name or password: the router authenticates "
                         "to its workers with --worker-api-key")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host")
    if parts.query or parts.fragment or "\\" in url or any(
            c.isspace() or ord(c) < 32 for c in url):
        raise ValueError(f"{url!r} must be scheme://host[:port][/path], with no query, "
                         "fragment, backslash or whitespace")
    return url


def _arg(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class RouterArgs:
    worker_urls: list[str] = _arg(
        None, "the `radixflow serve` workers, e.g. http://10.0.0.1:30001 http://10.0.0.2:30001",
        nargs="+")
    host: str = _arg("127.0.0.1", "HTTP host of the router")
    port: int = _arg(30000, "HTTP port of the router")
    load_balance_method: str = _arg(
        _DEFAULTS.method, "cache_aware (longest prefix match unless loads are imbalanced; "
        "SGLang's router policy), round_robin, or shortest_queue (fewest requests in flight)",
        aliases=("--policy",), choices=METHODS)
    cache_threshold: float = _arg(
        _DEFAULTS.cache_threshold, "cache_aware: the fraction of a prompt a worker's prefix "
        "match must exceed to get it; below it, the worker with the smallest routing tree")
    balance_abs_threshold: int = _arg(
        _DEFAULTS.balance_abs_threshold, "cache_aware: loads are imbalanced (go to the least "
        "loaded worker) when max - min > this and max > min * --balance-rel-threshold")
    balance_rel_threshold: float = _arg(_DEFAULTS.balance_rel_threshold,
                                        "cache_aware: see --balance-abs-threshold")
    eviction_interval: float = _arg(_DEFAULTS.eviction_interval,
                                    "seconds between evictions of the routing trees")
    max_tree_size: int = _arg(_DEFAULTS.max_tree_size,
                              "characters of prompts a worker's routing tree keeps")
    health_check_interval: float = _arg(10.0, "seconds between health checks of the workers")
    health_check_timeout: float = _arg(5.0, "seconds a worker's /health may take")
    health_failure_threshold: int = _arg(
        3, "failed health checks in a row after which a worker is removed (a refused "
        "connection removes it at once)")
    worker_startup_timeout: float = _arg(
        600.0, "seconds to wait at start-up for every worker to be healthy (models load)")
    connect_timeout: float = _arg(5.0, "seconds to connect to a worker")
    api_key: str | None = _arg(
        None, "the clients' key: require 'Authorization: Bearer <key>' on every endpoint but "
        "/health and the management ones (--admin-api-key); never sent to the workers")
    admin_api_key: str | None = _arg(
        None, "the operator's key, required as 'Authorization: Bearer <key>' by "
        "/add_worker, /remove_worker and /flush_cache; without it they are refused")
    worker_api_key: str | None = _arg(
        None, "the key the router sends the workers as 'Authorization: Bearer <key>' (their "
        "--api-key), on requests and health checks; clients' own Authorization headers are "
        "never passed on")
    log_level: str = _arg("info", "logging level")

    def __post_init__(self) -> None:
        if not self.worker_urls:
            raise ValueError("--worker-urls needs one or more worker URLs")
        try:
            urls = [check_worker_url(url) for url in self.worker_urls]
        except ValueError as exc:
            raise ValueError(f"--worker-urls: {exc}") from None
        duplicates = sorted({u for u in urls if urls.count(u) > 1})
        if duplicates:
            raise ValueError(f"--worker-urls lists {', '.join(duplicates)} more than once")
        self.worker_urls = urls
        if self.admin_api_key and self.admin_api_key == self.api_key:
            raise ValueError("--admin-api-key must differ from --api-key: every client would "
                             "be able to add and remove workers")
        self.policy_config()
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        for name in ("health_check_interval", "health_check_timeout",
                     "health_failure_threshold", "worker_startup_timeout", "connect_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got "
                                 f"{getattr(self, name)}")

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(method=self.load_balance_method,
                            cache_threshold=self.cache_threshold,
                            balance_abs_threshold=self.balance_abs_threshold,
                            balance_rel_threshold=self.balance_rel_threshold,
                            eviction_interval=self.eviction_interval,
                            max_tree_size=self.max_tree_size)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            names = ("--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ()))
            kind = str if f.name in STR_FLAGS else type(f.default)
            extra = {k: f.metadata[k] for k in ("nargs", "choices") if k in f.metadata}
            default = "" if f.default is None else f" (default: {f.default})"
            parser.add_argument(*names, type=kind, default=f.default,
                                help=f.metadata["help"] + default, **extra)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> RouterArgs:
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})
