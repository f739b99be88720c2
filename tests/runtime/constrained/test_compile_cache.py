"""CompileCache: deadlines, shared in-flight compiles, cached errors, eviction."""

from __future__ import annotations

import threading

import pytest

from radixflow.runtime.constrained.compile_cache import CompileCache
from radixflow.runtime.errors import GrammarError


class SlowCompiler:
    """compile_fn whose calls block until released, counting calls per key."""

    def __init__(self):
        self.release = threading.Event()
        self.calls: list[str] = []

    def __call__(self, key):
        self.calls.append(key)
        if key.startswith("slow"):
            self.release.wait(timeout=30)
        if key.startswith("bad"):
            raise GrammarError(f"bad grammar {key}")
        return f"compiled:{key}"


def test_timeout_is_a_grammar_error_and_the_key_fails_fast():
    compiler = SlowCompiler()
    cache = CompileCache(compiler, timeout=0.05, max_workers=2)
    try:
        with pytest.raises(GrammarError, match="longer than 0.05s"):
            cache.get("slow-bomb")
        pending = cache.submit("slow-bomb")  # still compiling: rejected at once
        assert pending.done()
        with pytest.raises(GrammarError, match="longer than"):
            pending.result()
        assert cache.get("fast") == "compiled:fast"  # the other worker still serves
        compiler.release.set()
        cache._entries["slow-bomb"][0].result(timeout=30)
        assert cache.get("slow-bomb") == "compiled:slow-bomb"  # finished late: now a hit
        assert compiler.calls.count("slow-bomb") == 1
    finally:
        compiler.release.set()
        cache.shutdown()


def test_concurrent_requests_share_one_compile():
    compiler = SlowCompiler()
    cache = CompileCache(compiler, timeout=30, max_workers=2)
    try:
        first, second = cache.submit("slow-a"), cache.submit("slow-a")
        assert not first.done()
        compiler.release.set()
        assert first.result() == second.result() == "compiled:slow-a"
        assert compiler.calls == ["slow-a"]
        assert cache.num_compiles == 1 and cache.num_hits == 1
    finally:
        compiler.release.set()
        cache.shutdown()


def test_errors_are_cached():
    compiler = SlowCompiler()
    cache = CompileCache(compiler, timeout=5)
    try:
        for _ in range(3):
            with pytest.raises(GrammarError, match="bad grammar bad-1"):
                cache.get("bad-1")
        assert compiler.calls == ["bad-1"]
    finally:
        cache.shutdown()


def test_lru_eviction_by_count_and_bytes():
    compiler = SlowCompiler()
    cache = CompileCache(compiler, timeout=5, max_entries=2)
    try:
        for key in ("a", "b", "c"):
            cache.get(key)
        cache.get("a")  # evicted as least recently used: compiles again
        assert compiler.calls == ["a", "b", "c", "a"]
        assert len(cache) <= 2
    finally:
        cache.shutdown()
    sized = CompileCache(compiler, timeout=5, max_bytes=100, size_fn=lambda value: 60)
    try:
        sized.get("x")
        sized.get("y")
        assert len(sized) == 1
    finally:
        sized.shutdown()
