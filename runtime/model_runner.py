"""ModelRunner: loads the model and its memory pools, turns a planned batch into logits."""

from __future__ import annotations

import logging

import torch

from radixflow.kernels import cpu as cpu_kernels
from radixflow.kernels.cpu.features import cpu_features, set_level

from . import host_memory
from .attention import check_backend_fits_device, create_attention_backend, warm_up_attention
from .forward_batch import BatchRequest, ForwardBatch, ForwardMode
from .memory_pool import HiddenSumPool, KVPool, ReqToTokenPool
from .model_building import load_model
from .model_loader.pooling import PoolingConfig, read_pooling
from .models.compiled_decode import SingleRequestDecode
from .models.config import ModelArgs
from .models.cpu_decode import CpuDecode
from .models.quant_linear import dense_weights_of
from .models.stored_linears import decode_step_bytes, weight_formats
from .server_args import ServerArgs

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was given but no CUDA device is available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda" or cpu_features().bf16:
            return torch.bfloat16
        return torch.float32
    return DTYPES[name]


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ModelRunner:
    """The model, its KV pool and attention. With --tp-size > 1, one rank's: `tp_rank` 0 is
    the scheduler's (its forward first sends the batch plan to the others, and returns the
    logits), the others run runtime/distributed/worker.py's loop.

    With --is-embedding, an extend forward returns the wanted rows' final normed hidden states
    (lm_head is not run) and `pooling` says how the scheduler pools them (read from the
    folder once, here); no decode paths are built."""

    def __init__(self, args: ServerArgs, model_folder, hf_config: dict, tp_rank: int = 0):
        self.args = args
        self.model_args = ModelArgs.from_hf_config(hf_config)
        self.pooling: PoolingConfig | None = None
        if args.is_embedding:
            if args.tp_size > 1:
                raise ValueError("--is-embedding does not run with --tp-size > 1 (its ranks "
                                 "would gather logits the embedding forward never computes)")
            self.pooling = read_pooling(model_folder)
            logger.info("embeddings: %s", self.pooling.describe())
        self.tp = self.plan_sender = None
        if args.tp_size > 1:
            from .distributed import TensorParallel

            self.tp = TensorParallel.connect(args, tp_rank, self.model_args)
        self.device = self.tp.device if self.tp else resolve_device(args.device)
        check_backend_fits_device(args.attention_backend, self.device)  # before the weights load
        if self.device.type == "cpu":
            self.cpu = set_level(args.cpu_isa)
            cpu_kernels.set_batch_int8_rows(args.cpu_batch_int8_rows)
            self.kernel_level = cpu_kernels.active_level()
            logger.info("CPU: %s; kernels: %s", self.cpu.describe(),
                        f"radixflow C ({self.kernel_level})" if self.kernel_level else "torch's")
        self.dtype = resolve_dtype(args.dtype, self.device)
        if args.num_threads and self.device.type == "cpu" and self.tp is None:
            torch.set_num_threads(args.num_threads)  # (a rank's share: TensorParallel)
        ma = self.model_args
        local = self.tp.spec.local_args(ma) if self.tp else ma  # this rank's heads
        self.context_len = min(args.context_length or ma.max_position_embeddings,
                               ma.max_position_embeddings)
        self.model, self.quantization = load_model(args, self.model_args, model_folder,
                                                   self.device, self.dtype, self.tp,
                                                   self._most_servable(local))
        self.kv_dtype = self._kv_dtype()
        per_token = KVPool.bytes_per_token(ma.num_layers, local.num_kv_heads, ma.head_dim,
                                           self.kv_dtype)
        if self.pooling is not None and self.pooling.pooling != "last":
            per_token += HiddenSumPool.bytes_per_token(ma.hidden_size)  # (scheduler/embedding)
        num_slots = args.max_total_tokens or self._default_num_slots(per_token)
        if self.device.type == "cpu":
            num_slots = self._within_memory(num_slots, per_token)
        if self.tp:  # every rank's pool has the same slots
            num_slots = self.tp.agree_min(num_slots)
        served = self._context_within(num_slots, per_token)
        if served < self.context_len:
            self.context_len = served
            self.model.reset_rope_tables(self.device, context_len=served)
        self.kv_pool = KVPool(num_slots, ma.num_layers, local.num_kv_heads, ma.head_dim,
                              self.kv_dtype, self.device)
        self.req_to_token_pool = ReqToTokenPool(args.max_running_requests, self.context_len,
                                                self.device)
        self.attn = create_attention_backend(args.attention_backend, self.device,
                                             local.num_heads, local.num_kv_heads, ma.head_dim,
                                             ma.attn_scale, dtype=self.dtype,
                                             windowed=bool(ma.window_layers))
        warm_up_attention(self.attn, self.kv_pool, self.req_to_token_pool.req_to_token)
        decodes = not (args.is_embedding or args.disable_cpu_decode)
        self.cpu_decode = self._cpu_decode() if decodes else None
        self.compiled_decode = (self._compile_decode()
                                if args.enable_torch_compile and self.cpu_decode is None
                                and not args.is_embedding else None)
        self._calibrate_kv(model_folder)
        host_memory.release_freed()  # what loading freed (~0.15 GB at 1B) back to the system
        if self.tp and self.tp.is_driver:
            from .distributed.plan import PlanSender

            self.plan_sender = PlanSender(self.tp, self.req_to_token_pool.req_to_token)
        logger.info("model %s loaded: %s on %s, KV pool %d tokens of %s (%.2f GiB)",
                    ma.architecture, self.dtype, self.device, num_slots, self.kv_dtype,
                    num_slots * per_token / 2**30)

    def _calibrate_kv(self, model_folder) -> None:
        """An int8 pool's key offsets (kv_calibration.py), set before any request (on every
        tensor-parallel rank, before rank 0 starts sending plans)."""
        from . import kv_calibration

        why = kv_calibration.why_not(self)
        if why is not None:
            if self.kv_pool.is_int8:
                logger.info("int8 KV cache: keys stored uncentred: %s", why)
            return
        from .chat_template import chat_template_text
        from .model_loader import load_tokenizer

        tokenizer = load_tokenizer(self.args.tokenizer or model_folder)
        if self.args.chat_template is not None:
            tokenizer.chat_template = chat_template_text(self.args.chat_template)
        kv_calibration.calibrate(self, kv_calibration.calibration_ids(tokenizer))

    def _kv_dtype(self) -> torch.dtype:
        """--kv-cache-dtype; auto: the model's, but 16-bit where the C decode step can run
        (its K/V are bf16 at every CPU level; an fp32 model at level avx2 keeps fp32
        arithmetic and halves the bytes attention reads)."""
        if self.args.kv_cache_dtype == "int8":
            return torch.int8  # codes + fp16 scales (memory_pool.KVPool)
        if self.args.kv_cache_dtype != "auto":
            return DTYPES[self.args.kv_cache_dtype]
        if (self.device.type == "cpu" and self.quantization != "none" and self.tp is None
                and not self.args.disable_cpu_decode and cpu_kernels.available()):
            return torch.bfloat16
        return self.dtype

    def cpu_info(self) -> dict | None:
        """The CPU level and the kernels chosen (start-up log, /get_server_info)."""
        if self.device.type != "cpu":
            return None
        return {**self.cpu.as_dict(), "kernels": self.kernel_level or "torch",
                "decode_step": "C" if self.cpu_decode is not None else "torch ops",
                "batch_int8_rows": cpu_kernels.batch_int8_rows(),
                "weights": weight_formats(self.model),
                "decode_step_weight_bytes": decode_step_bytes(self.model),
                "dense_weights": dense_weights_of(self.model,
                                                  self.args.cpu_dense_weights).as_dict()}

    def _default_num_slots(self, per_token: int) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = free * self.args.mem_fraction
        else:  # the node's ranks share its memory: --kv-cache-gb is theirs together
            budget = self.args.kv_cache_gb * 2**30 / (self.tp.layout.per_node if self.tp else 1)
        return max(int(budget // per_token), 2)

    def _most_servable(self, local: ModelArgs) -> int:
        """The most positions the KV pool could serve, known before the weights load (their
        rope tables are built then: Llama 3's 131,072 positions are ~0.2 GB at 8B, for a
        1 GiB pool that serves 8,192): the pool's tokens at bf16 K/V, the least a token can
        take (an int8 one's with --kv-cache-dtype int8), or the model's context if that is
        less. The tables shrink again once the pool is sized."""
        if self.device.type != "cpu":
            return self.context_len
        least = KVPool.bytes_per_token(self.model_args.num_layers, local.num_kv_heads,
                                       self.model_args.head_dim,
                                       torch.int8 if self.args.kv_cache_dtype == "int8"
                                       else torch.bfloat16)
        return min(self.context_len, self.args.max_total_tokens or self._default_num_slots(least))

    def _within_memory(self, num_slots: int, per_token: int) -> int:
        """`num_slots`, or fewer when the pool would not fit the memory left after the weights
        (with room for the server's other processes): the default pool shrinks, with a warning;
        a size asked for is refused, naming what is free."""
        room = host_memory.room_for_kv()
        per_node = self.tp.layout.per_node if self.tp else 1  # ranks of a node share it
        if room is None or num_slots * per_token * per_node <= room:
            return num_slots
        asked = num_slots * per_token * per_node / 2**30
        free = f"{room / 2**30:.2f} GiB free for it after the weights"
        fit = room // per_token // per_node
        if self.args.max_total_tokens or self.args.kv_cache_gb != ServerArgs.kv_cache_gb:
            raise ValueError(f"a KV pool of {num_slots} tokens ({asked:.2f} GiB) does not fit "
                             f"this machine's memory: {free}, {fit} tokens; lower "
                             "--kv-cache-gb or --max-total-tokens")
        if fit < 2:
            raise ValueError(f"no memory left for a KV pool after the weights ({free})")
        logger.warning("the default KV pool of %.2f GiB does not fit the memory left (%s): "
                       "%d tokens instead", asked, free, fit)
        return fit

    def _context_within(self, num_slots: int, per_token: int) -> int:
        """The longest request the KV pool can hold (a slot per token; the padding slot is
        extra): the model's context, or less when the pool is smaller. The pool is sized by
        --kv-cache-gb / --max-total-tokens (--mem-fraction on a GPU), never by the model's
        context length (131,072 tokens for Llama 3.2 would be 4 GiB at 1B)."""
        if num_slots >= self.context_len:
            return self.context_len
        pool = f"the KV pool of {num_slots} tokens ({num_slots * per_token / 2**30:.2f} GiB)"
        if self.args.context_length:
            raise ValueError(
                f"--context-length {self.args.context_length} does not fit {pool}: raise "
                f"--kv-cache-gb or --max-total-tokens, or lower --context-length")
        logger.warning("the model's context of %d tokens does not fit %s: requests are limited "
                       "to %d tokens (raise --kv-cache-gb or --max-total-tokens for more)",
                       self.context_len, pool, num_slots)
        return num_slots

    def _cpu_decode(self) -> CpuDecode | None:
        from .attention.torch_native import TorchNativeAttnBackend

        if not isinstance(self.attn, TorchNativeAttnBackend):
            return None
        if self.tp:
            if self.device.type == "cpu" and cpu_kernels.available():
                logger.info("decode runs as torch ops: the C decode step runs every layer in "
                            "one call, with no all-reduce between a rank's layers (--tp-size "
                            "%d)%s", self.args.tp_size,
                            "; int4 layers still use radixflow's kernels"
                            if self.quantization == "int4" else "")
            return None
        c_step, why_not = CpuDecode.build(self.model, self.kv_pool, self.attn.scale,
                                             self.context_len)
        if c_step is None:
            logger.info("decode runs as torch ops: the C decode step needs "
                        "what this model lacks (%s)", why_not)
        else:
            logger.info("decode steps of up to %d requests run in radixflow's C decode step "
                        "(%s kernels)", c_step.max_batch, cpu_kernels.active_level())
        return c_step

    def _compile_decode(self) -> SingleRequestDecode | None:
        from .attention.torch_native import TorchNativeAttnBackend

        if not isinstance(self.attn, TorchNativeAttnBackend):
            logger.warning("--enable-torch-compile covers the torch_native attention backend "
                           "only; running %s uncompiled", type(self.attn).__name__)
            return None
        if self.tp:
            logger.warning("--enable-torch-compile does not cover --tp-size > 1 (collectives "
                           "inside the graph); running uncompiled")
            return None
        if self.kv_pool.is_int8:
            logger.warning("--enable-torch-compile does not cover --kv-cache-dtype int8 (its "
                           "graph reads 16/32-bit K/V); running uncompiled")
            return None
        compiled = SingleRequestDecode(self.model, self.attn.scale)
        try:
            compiled.warm_up(self.kv_pool)
        except Exception as exc:  # a model torch.compile cannot take still serves, eagerly
            logger.warning("torch.compile of the decode step failed; running uncompiled: %s: %s",
                           type(exc).__name__, exc)
            return None
        return compiled

    @property
    def vocab_size(self) -> int:
        return self.model_args.vocab_size

    @property
    def is_embedding(self) -> bool:
        return self.pooling is not None

    def embedding_info(self) -> dict | None:
        """What the HTTP side needs of an embedding server (model_info["embedding"]); None
        on a generation server."""
        if self.pooling is None:
            return None
        return {"pooling": self.pooling.pooling, "normalize": self.pooling.normalize,
                "hidden_size": self.model_args.hidden_size}

    def forward(self, mode: ForwardMode, parts: list[BatchRequest],
                out_slots: torch.Tensor) -> torch.Tensor:
        """Run one forward; returns float32 logits of every wanted position, in part order
        (None on tensor-parallel ranks other than 0); on an embedding server their final
        hidden states instead."""
        if self.plan_sender is not None:
            self.plan_sender.send(mode, parts, out_slots, self.req_to_token_pool.req_to_token)
        c_step = self.cpu_decode
        if c_step is not None and mode == ForwardMode.DECODE and c_step.accepts(parts):
            # one token a row: no batch tensors to build, one C call
            return c_step.run(parts, out_slots, self.req_to_token_pool.req_to_token)
        input_ids, positions, logits_indices = [], [], []
        seq_lens, prefix_lens, ext_lens, req_pool_indices = [], [], [], []
        offset = 0
        for part in parts:
            n = len(part.ids)
            input_ids += part.ids
            positions += range(part.start_pos, part.start_pos + n)
            logits_indices += [offset + o for o in part.logit_offsets]
            prefix_lens.append(part.start_pos)
            ext_lens.append(n)
            seq_lens.append(part.start_pos + n)
            req_pool_indices.append(part.req_pool_idx)
            offset += n
        dev = self.device

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=dev)

        batch = ForwardBatch(
            mode=mode, input_ids=t(input_ids), positions=t(positions),
            out_slots=out_slots.to(dev), req_pool_indices=t(req_pool_indices), seq_lens=t(seq_lens),
            prefix_lens=t(prefix_lens), extend_lens=t(ext_lens), seq_lens_cpu=seq_lens,
            prefix_lens_cpu=prefix_lens, extend_lens_cpu=ext_lens,
            logits_indices=t(logits_indices), req_to_token=self.req_to_token_pool.req_to_token,
            kv_pool=self.kv_pool,
        )
        if self.compiled_decode is not None and self.compiled_decode.accepts(batch):
            return self.compiled_decode(batch)  # plans its own attention inside the graph
        self.attn.prepare(batch)
        out = self.model(batch, self.attn, hidden=True) if self.pooling is not None \
            else self.model(batch, self.attn)
        if dev.type == "cpu" and offset >= host_memory.RELEASE_AFTER_TOKENS:
            host_memory.release_freed()  # the prefill's activations (glibc keeps them)
        return out
