"""ServerArgs: the one configuration object. The CLI is generated from its fields."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

# Leaves only (tests/test_layers.py): the configuration every process reads loads no feature.
from .balance.config import PolicyConfig
from .chat_template import chat_template_text
from .parallel_flags import check_parallel_flags
from .reasoning import check_parser_name as check_reasoning_parser
from .speculative.config import SpeculationConfig
from .tool_call_formats import check_parser_name as check_tool_call_parser


def _arg(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class ServerArgs:
    model: str | None = _arg(
        None, "HF folder, .gguf file, or None for the default SmolLM2-135M-Instruct (also "
        "`radixflow serve MODEL`)", aliases=("--model-path",))
    tokenizer: str | None = _arg(None, "tokenizer folder, if not the model's own",
                                 aliases=("--tokenizer-path",))
    served_model_name: str | list[str] | None = _arg(
        None, "model name(s) the APIs answer to; the first is the one they report", nargs="+")
    chat_template: str | None = _arg(
        None, "chat template instead of the model's: a Jinja file, or the template itself")
    tool_call_parser: str | None = _arg(
        None, "the format tool calls are written and parsed in: hermes, llama3, mistral, "
        "pythonic or qwen3_coder (vLLM's and SGLang's names work too); default: the one the "
        "chat template shows, else hermes")
    reasoning_parser: str | None = _arg(
        None, "the model thinks between think markers: its reasoning goes to reasoning_content "
        "(OpenAI chat) or meta_info (/generate with separate_reasoning) and a constraint applies "
        "to the answer after it; one of deepseek-r1, deepseek-v3, qwen3, qwen3-thinking, glm45")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = _arg(
        "auto", "auto: bf16 on GPUs and CPUs with AVX512-BF16/AMX, else fp32")
    kv_cache_dtype: Literal["auto", "bfloat16", "float16", "float32", "int8"] = _arg(
        "auto", "dtype of the KV cache; auto: the model's, except bf16 on a CPU whose C decode "
        "step runs (it reads 16-bit K/V at every CPU level); int8: codes with an fp16 scale per "
        "token and KV head, ~1.9x the tokens in the same --kv-cache-gb")
    cpu_isa: Literal["auto", "avx512", "avx2", "generic"] = _arg(
        "auto", "instruction-set level of radixflow's CPU kernels; a level below the CPU's "
        "best runs exactly what a CPU of that level would (generic: torch's kernels only)")
    device: Literal["auto", "cpu", "cuda"] = _arg("auto", "auto: cuda when available")
    quantization: Literal["auto", "none", "int4"] = _arg(
        "auto", "int4: weight-only 4-bit linear layers (CPU), ~3x fewer bytes per decode step; "
        "auto: int4 layers and a Q8_0 head where that is lossless (a CPU whose level has "
        "radixflow's kernels, weights already 4-bit/8-bit groups as in the default model's GGUF)")
    cpu_dense_weights: Literal["auto", "on", "off"] = _arg(
        "auto", "a bf16 model's quantized layers (CPU): on keeps a bf16 copy of each for "
        "products of many rows (prefill, large decode batches: 2 bytes per weight on top of the "
        "4-bit ones), off keeps none (those products dequantize blocks of rows from the "
        "quantized weights as they go), auto keeps the copies while they total at most 1 GiB")
    cpu_batch_int8_rows: int = _arg(
        3, "from how many requests decoding together the CPU's 4-/6-bit products take their "
        "activations as int8 per group of 32 (llama.cpp's precision; ~1.7x faster batch decode "
        "steps at avx512, where fewer rows get exact 16-bit ones; avx2 always takes int8): a "
        "batch's outputs then differ slightly from each request's alone; 0: never (batch-"
        "invariant products)")
    context_length: int | None = _arg(None, "max tokens per request (default: the model's)",
                                      aliases=("--max-model-len",))
    kv_cache_gb: float = _arg(1.0, "KV cache size in GiB on CPU")
    mem_fraction: float = _arg(0.85, "fraction of free GPU memory for weights + KV cache",
                               aliases=("--mem-fraction-static", "--gpu-memory-utilization"))
    max_total_tokens: int | None = _arg(None, "KV pool size in tokens (overrides kv_cache_gb)")
    max_running_requests: int = _arg(64, "max requests decoding at once",
                                     aliases=("--max-num-seqs",))
    max_prefill_tokens: int = _arg(4096, "token budget of one prefill batch")
    chunked_prefill_size: int = _arg(1024, "longest prefill chunk of one request (-1: off)")
    prefill_budget_while_decoding: int | None = _arg(
        None, "prefill tokens of one step while requests are decoding, so that their streams "
        "keep their pace as long prompts arrive (a prompt is then computed in chunks of this "
        "size between decode steps); default: 256 on a CPU, --max-prefill-tokens on a GPU")
    schedule_policy: Literal["lpm", "fcfs"] = _arg(
        "lpm", "waiting-queue order: longest prefix match first, or first come first served")
    disable_radix_cache: bool = _arg(False, "do not reuse KV across requests",
                                     aliases=("--no-enable-prefix-caching",))
    attention_backend: Literal["auto", "torch_native", "triton"] = _arg(
        "auto", "auto: triton on CUDA, torch_native on CPU")
    sampling_backend: Literal["auto", "torch", "triton"] = _arg(
        "auto", "top-k/top-p sampling kernel; auto: triton on CUDA, torch on CPU")
    disable_jump_forward: bool = _arg(False, "sample every token of a constrained output")
    disable_overlap_schedule: bool = _arg(
        False, "run each decode step's CPU work (stops, grammars, outputs, the next batch) "
        "between forward passes instead of during the next one (runtime/scheduler/decode.py)")
    enable_overlap_schedule: bool = _arg(
        False, "overlap scheduling even on a CPU whose every core runs the forward (by default "
        "it is on where the scheduler has a core of its own: a GPU, or a CPU with more cores "
        "than --num-threads)")
    speculative_algorithm: str | None = _arg(
        None, "ngram (SGLang's NGRAM): speculative decoding without a draft model; each step "
        "drafts the tokens that followed the latest earlier match of the output's last n-gram "
        "(in the prompt, the output, a request's prediction), drops those its grammar rejects "
        "and verifies them in the same pass; greedy outputs are unchanged, sampled ones keep "
        "their distribution. Off by default; a request may turn it on or off (speculative)")
    speculative_num_draft_tokens: int = _arg(
        4, "tokens drafted per request and step, at most (fewer while its acceptance is low)")
    speculative_prediction_draft_tokens: int = _arg(
        16, "tokens drafted per request and step from a request's prediction (OpenAI's "
        "Predicted Outputs), at most: a prediction's drafts are mostly accepted whole, so "
        "longer drafts pay")
    speculative_ngram_min_match_window_size: int = _arg(
        2, "the shortest n-gram whose match drafts tokens")
    speculative_ngram_max_match_window_size: int = _arg(
        5, "the longest n-gram looked up (the longest match wins)")
    disable_budget_safe_close: bool = _arg(
        False, "let constrained outputs run out of max_tokens unfinished: no closing with the "
        "grammar's shortest completion when the budget gets tight (per request: budget_safe)")
    enable_torch_compile: bool = _arg(
        False, "compile the single-request decode step with torch.compile (torch_native "
        "attention): faster single-stream decode, about a minute more at start-up")
    disable_cpu_decode: bool = _arg(
        False, "run decode steps as torch ops instead of radixflow's one-call C decode step "
        "(CPU at level avx512 or avx2, quantized layers as the default model's, up to 64 "
        "requests a step)", deprecated_aliases=("--disable-native-decode",))
    grammar_compile_timeout: float = _arg(10.0, "seconds before a grammar compile gives up")
    num_threads: int | None = _arg(None, "torch CPU threads (default: all cores)")
    tp_size: int = _arg(1, "tensor parallel size: the model's heads, MLP and vocabulary split "
                        "over this many ranks (processes; one GPU each on CUDA), Megatron-style",
                        aliases=("--tensor-parallel-size",))
    nnodes: int = _arg(1, "machines the --tp-size ranks span (tp_size / nnodes ranks each)")
    node_rank: int = _arg(0, "this machine's index in 0..nnodes-1: node 0 runs the scheduler "
                          "and the HTTP server, the others only model ranks")
    dist_init_addr: str | None = _arg(
        None, "host:port where rank 0 meets the other ranks (torch.distributed's store); "
        "needed with --nnodes > 1 (default: a free port on 127.0.0.1)")
    dist_trusted_network: bool = _arg(
        False, "allow a --dist-init-addr that is not a loopback address: torch.distributed's "
        "store has no authentication, so every host that can reach it can join the job")
    dist_timeout: float = _arg(
        300.0, "seconds to wait for every rank to join at start-up, and, while serving, for "
        "a rank that is there but does not answer (a rank on another node silent for this "
        "long, at most 10 s, stops the server)")
    dp_size: int = _arg(1, "data parallel size: scheduler replicas, each with its own model "
                        "copy, KV pool and radix cache, behind this one HTTP server",
                        aliases=("--data-parallel-size",))
    load_balance_method: Literal["cache_aware", "round_robin", "shortest_queue"] = _arg(
        "cache_aware", "how --dp-size replicas share requests: cache_aware (the replica with "
        "the longest prefix match, unless loads are imbalanced; SGLang's router policy), "
        "round_robin, or shortest_queue (fewest requests in flight)")
    cache_threshold: float = _arg(
        0.5, "cache_aware: the fraction of a prompt a replica's prefix match must exceed to "
        "get it; below it, the replica with the fewest cached prompt tokens")
    balance_abs_threshold: int = _arg(
        32, "cache_aware: loads are imbalanced (go to the least loaded replica) when "
        "max - min > this and max > min * --balance-rel-threshold")
    balance_rel_threshold: float = _arg(1.0001, "cache_aware: see --balance-abs-threshold")
    host: str = _arg("127.0.0.1", "HTTP host")
    port: int = _arg(30000, "HTTP port")
    api_key: str | None = _arg(
        None, "require 'Authorization: Bearer <key>' on every endpoint but /health")
    # Limits at the door (docs/server-api.md, "Limits"): each refusal is a 4xx naming its flag.
    max_request_bytes: int = _arg(
        8 * 1024 * 1024, "largest request body in bytes (a larger one is a 413)")
    http_header_timeout: float = _arg(
        10.0, "seconds a client has to send a request's headers (slow clients are cut off)")
    max_connections: int = _arg(
        2048, "open HTTP connections at most; past it a new one is a 503 with Retry-After")
    max_queued_requests: int = _arg(
        4096, "requests waiting or running at most; past it a request is a 503 with "
        "Retry-After")
    max_prompts_per_request: int = _arg(
        1024, "prompts x n of one /generate or completions call at most (a 400 past it)")
    max_select_choices: int = _arg(1024, "choices of one /program select at most")
    max_open_sessions: int = _arg(256, "sessions open at once at most (a 429 past it)")
    max_session_requests: int = _arg(1024, "requests one session may hold at most")
    max_session_timeout: float = _arg(
        3600.0, "seconds an idle session lives at most (its own `timeout` may be shorter; "
        "`timeout: null` means this)")
    max_stream_buffer_bytes: int = _arg(
        4 * 1024 * 1024, "output a stream may have waiting for a slow client; past it the "
        "request is aborted")
    grammar_compile_threads: int = _arg(
        2, "threads compiling grammars; a compile past --grammar-compile-timeout gives its "
        "thread back to the others")
    seed: int = _arg(0, "seed of the draws of requests that carry no seed of their own: the "
                     "same requests in the same order and batching give the same outputs",
                     aliases=("--random-seed",))
    # The APIs (docs/server-api.md).
    is_embedding: bool = _arg(
        False, "serve embeddings (/v1/embeddings, /encode) instead of generations: the "
        "prompt's final hidden states pooled as the model's config says (vLLM: --task embed)")
    enable_priority_scheduling: bool = _arg(
        False, "honour requests' `priority`: lower values are admitted first and, when the KV "
        "pool or the running slots are full, retract running requests of higher values")
    max_stored_responses: int = _arg(
        1024, "/v1/responses kept for previous_response_id and retrieval (the oldest go "
        "first; store: false keeps none)")
    sampling_defaults: Literal["model", "openai"] = _arg(
        "model", "defaults of temperature, top_p, top_k, min_p and repetition_penalty for "
        "requests that leave them unset: model, the model's generation_config.json (or its "
        "GGUF's general.sampling.* metadata), as SGLang's --sampling-defaults model and vLLM's "
        "--generation-config auto; openai: radixflow's constants (1, 1, off, 0, 1). "
        "/get_model_info shows those in force (default_sampling_params)")
    log_level: str = _arg("info", "logging level")

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")

        for name in ("context_length", "kv_cache_gb", "max_total_tokens",
                     "max_running_requests", "max_prefill_tokens",
                     "prefill_budget_while_decoding", "tp_size", "dp_size",
                     "num_threads", "grammar_compile_timeout", "nnodes", "dist_timeout",
                     "max_request_bytes", "http_header_timeout", "max_connections",
                     "max_queued_requests", "max_prompts_per_request", "max_select_choices",
                     "max_open_sessions", "max_session_requests", "max_session_timeout",
                     "max_stream_buffer_bytes", "grammar_compile_threads",
                     "max_stored_responses"):
            positive(name)
        if self.cpu_batch_int8_rows < 0:
            raise ValueError(f"--cpu-batch-int8-rows must be >= 0 (0: never), got "
                             f"{self.cpu_batch_int8_rows}")
        if not 0.0 < self.mem_fraction < 1.0:
            raise ValueError(f"--mem-fraction must be in (0, 1), got {self.mem_fraction}")
        if self.disable_overlap_schedule and self.enable_overlap_schedule:
            raise ValueError("--disable-overlap-schedule and --enable-overlap-schedule "
                             "contradict each other")
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            raise ValueError("--chunked-prefill-size must be -1 (off) or > 0")
        check_parallel_flags(self)
        self.speculation_config()  # bad --speculative-* flags: start-up errors naming them
        self.policy_config()  # bad routing flags: start-up errors naming them
        if self.cpu_isa != "auto" and self.device != "cuda":
            from radixflow.kernels.cpu.features import check_level

            check_level(self.cpu_isa)  # a level the CPU lacks: a start-up error, never SIGILL
        if isinstance(self.served_model_name, list | tuple):
            if not self.served_model_name or not all(self.served_model_name):
                raise ValueError("--served-model-name needs one or more non-empty names")
            self.served_model_name = list(self.served_model_name)
        if self.chat_template is not None:
            chat_template_text(self.chat_template)  # a bad template: a start-up error
        if self.tool_call_parser is not None:
            self.tool_call_parser = check_tool_call_parser(self.tool_call_parser)
        if self.reasoning_parser is not None:
            self.reasoning_parser = check_reasoning_parser(self.reasoning_parser)
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        for name, hint in typing.get_type_hints(type(self)).items():
            choices = typing.get_args(hint)
            if typing.get_origin(hint) is Literal and getattr(self, name) not in choices:
                raise ValueError(f"--{name.replace('_', '-')} must be one of "
                                 f"{choices}, got {getattr(self, name)!r}")

    @property
    def served_model_names(self) -> list[str]:
        """The names given with --served-model-name (may be empty)."""
        name = self.served_model_name
        return [name] if isinstance(name, str) else list(name or [])

    def speculation_config(self) -> SpeculationConfig:
        """--speculative-*, checked: which requests speculate, and how far."""
        return SpeculationConfig.from_args(self)

    def policy_config(self) -> PolicyConfig:
        """How the HTTP process routes requests over the --dp-size replicas."""
        return PolicyConfig(method=self.load_balance_method,
                            cache_threshold=self.cache_threshold,
                            balance_abs_threshold=self.balance_abs_threshold,
                            balance_rel_threshold=self.balance_rel_threshold)

    @property
    def chunk_size(self) -> int:
        """Longest prefill chunk, in tokens, with 'off' turned into 'no limit'."""
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else 1 << 30

    def replace(self, **changes: Any) -> ServerArgs:
        return dataclasses.replace(self, **changes)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        from .server_flags import add_flags

        add_flags(cls, parser)

    def public_info(self) -> dict[str, Any]:
        """The arguments as /get_server_info shows them: every field but the API key, which
        is only said to be set or not."""
        info = {k: v for k, v in dataclasses.asdict(self).items() if k != "api_key"}
        info["api_key_set"] = self.api_key is not None
        return info

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> ServerArgs:
        from .server_flags import args_from_flags

        return args_from_flags(cls, ns)


def server_args_from(model_path: str | None, kwargs: dict[str, Any], *, who: str) -> ServerArgs:
    """ServerArgs of a Python constructor (`Engine`, `Runtime`): `model_path` (SGLang's name) or
    `model=`, plus field keywords. Raises ValueError naming unknown or conflicting keywords."""
    known = {f.name for f in dataclasses.fields(ServerArgs)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError(f"unknown {who} argument(s) {unknown}; the options are ServerArgs "
                         "fields (`radixflow serve --help` lists them as flags)")
    if model_path is not None and kwargs.get("model") is not None:
        raise ValueError(f"{who}: pass model_path or model, not both")
    if model_path is not None:
        kwargs = {**kwargs, "model": model_path}
    args = ServerArgs(**kwargs)
    if who == "Engine" and args.dp_size > 1:
        raise ValueError("Engine runs one model replica in this process; for dp_size > 1 use "
                         "the server (`radixflow serve --dp-size N`, or rf.Runtime(dp_size=N))")
    return args

