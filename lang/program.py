"""@rf.function: a program function with run, run_batch (threads, progress bar) and trace."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from .backends.default import as_backend, get_default_backend
from .chat_template import chat_template_of
from .errors import InvalidRequest, ProgramError, TraceError
from .graph import Graph
from .params import DEFAULT_PARAMS, FIELDS, SAMPLING_NAMES, GenParams, LogprobDefaults
from .placeholder import Placeholder
from .state import ProgramState
from .tracer import StopTrace, TraceState

logger = logging.getLogger(__name__)

GEN_OPTIONS = frozenset(FIELDS) | frozenset(SAMPLING_NAMES.values())  # gen names, wire names
MIN_PREFIX_CHARS = 64  # shorter shared prefixes are not worth a warm-up request (SGLang's rule)


class Program:
    """A decorated program function `def prog(s, **args)`.

    `prog.run(**args)` runs it and returns its ProgramState; `prog.run_batch([...])` runs many
    concurrently; `prog.trace(**args)` builds its graph without a model. Sampling options
    (max_tokens, temperature, stop, ...) given to run/run_batch are defaults for every gen, and
    so are SGLang's return_logprob / logprob_start_len / top_logprobs_num.
    """

    def __init__(self, func: Callable[..., Any]):
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY,
                                                 params[0].POSITIONAL_OR_KEYWORD):
            raise InvalidRequest(f"{func.__name__} must take the program state as its first "
                                 f"argument: def {func.__name__}(s, ...)")
        self.func = func
        self.name = func.__name__
        self._signature = inspect.signature(func)
        self.arg_names = [p.name for p in params[1:]
                          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        self._takes_var_kwargs = any(p.kind == p.VAR_KEYWORD for p in params)
        functools.update_wrapper(self, func)

    def __repr__(self) -> str:
        return f"<rf.function {self.name}({', '.join(self.arg_names)})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """With a state first, call the function inside another program; else `run`."""
        if args and isinstance(args[0], (ProgramState, TraceState)):
            return self.func(*args, **kwargs)
        return self.run(*args, **kwargs)

    # ---- running ----

    def run(self, *args: Any, backend: Any = None, stream: bool = False,
            **kwargs: Any) -> ProgramState:
        """Run once. Returns the state; with stream=True, at once (read it with text_iter).

        Raises what the program raised: VariableNotFound, InvalidRequest, GrammarError,
        ServerUnavailable, ...
        """
        backend = self._backend(backend)
        logprobs = LogprobDefaults.take(kwargs, keep=self.arg_names)
        program_kwargs, defaults = self._split(kwargs)
        self._check_args(args, program_kwargs)
        state = ProgramState(backend, defaults=defaults, logprobs=logprobs, stream=stream)
        if not stream:
            self.func(state, *args, **program_kwargs)
            state._run_to_end()
            return state

        def target() -> None:
            try:
                self.func(state, *args, **program_kwargs)
                state._run_to_end()
            except BaseException as exc:  # handed to the reader through text_iter / sync
                state._finish(exc)
            else:
                state._finish()

        state._thread = threading.Thread(target=target, name=f"rf-{self.name}", daemon=True)
        state._thread.start()
        return state

    async def arun(self, *args: Any, **kwargs: Any) -> ProgramState:
        """`run` for asyncio code (an agent running many programs in one event loop): the
        program runs on a worker thread; with stream=True the state comes back at once and
        `async for piece in state.text_aiter()` reads it."""
        return await asyncio.to_thread(self.run, *args, **kwargs)

    async def arun_batch(self, batch_kwargs: list[dict[str, Any]],
                         **kwargs: Any) -> list[ProgramState]:
        """`run_batch` for asyncio code (the whole list: generator_style would block the loop
        while it waits for each state)."""
        if kwargs.get("generator_style"):
            raise InvalidRequest("arun_batch returns the list of states; generator_style=True "
                                 "is for run_batch, outside the event loop")
        return await asyncio.to_thread(self.run_batch, batch_kwargs, **kwargs)

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  generator_style: bool = False,
                  **defaults: Any) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per dict of arguments, concurrently; states in input order.

        Before the batch, the static prefix every program shares (found by tracing) is sent
        once so every program hits the cache. A program that raises does not stop the others:
        its state has `.error`, a ProgramError naming its index, raised again when it is read.
        `generator_style=True` (SGLang's): an iterator that yields each state, in input order,
        as soon as it and those before it are done (the batch starts on the first next()).
        """
        if not isinstance(batch_kwargs, (list, tuple)) or not all(
                isinstance(item, dict) for item in batch_kwargs):
            raise InvalidRequest("run_batch takes a list of dicts of program arguments")
        backend = self._backend(backend)
        logprobs = LogprobDefaults.take(defaults)
        extra, gen_defaults = self._split(defaults)
        if extra:
            raise InvalidRequest(f"run_batch options must be sampling options, got "
                                 f"{sorted(extra)}; put program arguments in the dicts")
        for item in batch_kwargs:
            self._check_args((), item)
        if not batch_kwargs:
            return iter([]) if generator_style else []
        if len(batch_kwargs) > 1:
            self._cache_prefix(batch_kwargs, backend)
        if num_threads == "auto":
            num_threads = min(len(batch_kwargs), 4 * (os.cpu_count() or 1) + 32, 128)
        states: list[ProgramState | None] = [None] * len(batch_kwargs)

        def one(i: int) -> None:
            state = ProgramState(backend, defaults=gen_defaults, logprobs=logprobs)
            state.index = i
            states[i] = state
            try:
                self.func(state, **batch_kwargs[i])
                state._run_to_end()
            except Exception as exc:
                logger.warning("run_batch: program %d of %d failed: %s: %s", i,
                               len(batch_kwargs), type(exc).__name__, exc)
                error = ProgramError(
                    f"program {i} of run_batch failed: {type(exc).__name__}: {exc}", index=i)
                error.__cause__ = exc
                state._error = error

        def batch() -> Iterator[ProgramState]:
            progress = None
            if progress_bar:
                from tqdm.auto import tqdm

                progress = tqdm(total=len(batch_kwargs), desc=self.name)
            try:
                with ThreadPoolExecutor(max_workers=max(1, int(num_threads)),
                                        thread_name_prefix=f"rf-{self.name}") as pool:
                    futures = [pool.submit(one, i) for i in range(len(batch_kwargs))]
                    for i, future in enumerate(futures if generator_style
                                               else as_completed(futures)):
                        future.result()
                        if progress is not None:
                            progress.update(1)
                        if generator_style:
                            yield states[i]  # type: ignore[misc]
                if not generator_style:
                    yield from states  # type: ignore[misc]
            finally:
                if progress is not None:
                    progress.close()

        return batch() if generator_style else list(batch())

    # ---- tracing ----

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """The program graph, built without calling a model.

        Required arguments not given become placeholders (so are the values of variables the
        program reads). If the program raises on a placeholder, the graph ends there and
        `graph.stopped` says why.
        """
        return self._trace(args, kwargs, stop_at_model=False)

    def _trace(self, args: tuple, kwargs: dict, *, stop_at_model: bool) -> Graph:
        graph = Graph(name=self.name)
        bound = self._signature.bind_partial(None, *args, **kwargs)
        for name in self.arg_names[len(args):]:
            param = self._signature.parameters[name]
            if name not in bound.arguments and param.default is param.empty:
                kwargs = {**kwargs, name: Placeholder("arg", name)}
                graph.placeholder_args.append(name)
        state = TraceState(graph, stop_at_model=stop_at_model)
        try:
            self.func(state, *args, **kwargs)
        except StopTrace:
            pass
        except TraceError:
            raise
        except Exception as exc:
            if not graph.placeholder_args and "read" not in graph.kinds():
                raise
            graph.stopped = f"{type(exc).__name__}: {exc}"
        return graph

    def _cache_prefix(self, batch_kwargs: list[dict], backend: Any) -> None:
        template = chat_template_of(backend)
        candidates = []
        for item in [None, *batch_kwargs[:4]]:
            try:
                graph = self._trace((), item or {}, stop_at_model=True)
            except Exception as exc:  # a program that needs real values before its first gen
                logger.debug("prefix trace of %s failed: %s", self.name, exc)
                continue
            if graph.stopped is None:
                candidates.append(graph.static_prefix(template))
        if len(candidates) < 2:
            return
        prefix = os.path.commonprefix(candidates)
        if len(prefix) >= MIN_PREFIX_CHARS:
            backend.cache_prefix(prefix)

    # ---- helpers ----

    @staticmethod
    def _backend(backend: Any) -> Any:
        return get_default_backend() if backend is None else as_backend(backend)

    def _split(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], GenParams]:
        """(program arguments, sampling defaults) out of run()'s keywords."""
        program, options = {}, {}
        for key, value in kwargs.items():
            if key in self.arg_names or (key not in GEN_OPTIONS and self._takes_var_kwargs):
                program[key] = value
            elif key in GEN_OPTIONS:
                options[key] = value
            else:
                raise InvalidRequest(f"{self.name}() got an unexpected argument {key!r}; it takes "
                                     f"{self.arg_names} and sampling options")
        return program, GenParams.make(**options).merged(DEFAULT_PARAMS)

    def _check_args(self, args: tuple, kwargs: dict[str, Any]) -> None:
        try:
            self._signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise InvalidRequest(f"{self.name}: {exc}") from None


def function(func: Callable[..., Any] | None = None) -> Any:
    """Decorator: `@rf.function def prog(s, question): s += ...`."""
    if func is None:
        return function
    return Program(func)
