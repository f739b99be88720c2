"""Token-granular memory: the request -> KV-slot table and the per-layer K/V slot pools.

Slot 0 of the KV pool is never handed out: padded batch entries write their K/V there.

Everything lives on the pool's device, the free-slot stack too: on CUDA, handing slots out and
taking them back (a finishing request's slots are read from the device table) are kernels
queued on the stream, never a copy the host waits for.
"""

from __future__ import annotations

import torch

from radixflow.kernels import kv_int8

from .errors import InvariantBroken


class ReqToTokenPool:
    """`req_to_token`, [max_running, max_context] int32: (req_pool_idx, position) -> KV slot.

    A running request holds one row, its `req_pool_idx`; a batch lists its requests' rows as
    `req_pool_indices`.
    """

    def __init__(self, max_running: int, max_context: int, device: torch.device | str = "cpu"):
        self.req_to_token = torch.zeros((max_running, max_context), dtype=torch.int32,
                                        device=device)
        self._free_rows = list(range(max_running - 1, -1, -1))
        self.size = max_running

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, req_pool_idx: int) -> None:
        if len(self._free_rows) >= self.size or not 0 <= req_pool_idx < self.size:
            raise InvariantBroken(f"request row {req_pool_idx} freed but not held "
                                  f"({len(self._free_rows)} of {self.size} rows free)")
        self._free_rows.append(req_pool_idx)

    def free_rows(self) -> list[int]:
        """The rows not held (a copy), for failures.py's sweep."""
        return list(self._free_rows)


class KVPool:
    """Per layer K and V, [num_slots, num_kv_heads, head_dim]; one slot holds one token.

    dtype torch.int8 (--kv-cache-dtype int8) keeps K and V as int8 codes with an fp16 scale
    per slot and KV head (kernels/kv_int8.py), `k_scales` / `v_scales` [num_slots, kv_heads]
    per layer, quantized by `write` (keys rotated, kv_int8.rotate, then less the layer's
    `k_offsets`, kv_int8.key_offset: zeros until runtime/kv_calibration.py sets them);
    readers take `layer(i)`'s pair, whose int8 form (kv_int8.QuantizedRows) each attention
    path dequantizes as it reads, with its queries rotated (`rotate_queries`)."""

    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (num_slots + 1, num_kv_heads, head_dim)  # +1: the padding slot 0
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.is_int8 = dtype == torch.int8
        self.k_scales = self.v_scales = self.k_offsets = None
        if self.is_int8:
            self.k_scales, self.v_scales = (
                [torch.zeros(shape[:2], dtype=kv_int8.SCALE_DTYPE, device=device)
                 for _ in range(num_layers)] for _ in range(2))
            # filled in place (the C decode step holds pointers to them)
            self.k_offsets = [torch.zeros(shape[1:], dtype=torch.float32, device=device)
                              for _ in range(num_layers)]
        self._key_log: dict[int, list[torch.Tensor]] | None = None
        self.num_slots = num_slots
        self.device = torch.device(device)
        # A stack whose top is its end; popped slots are handed out in ascending order, so a
        # request decoding on a quiet pool gets consecutive slots (attention can then read its
        # K/V as a view instead of gathering it). Its fill level is a host int: no sync.
        self._free = torch.arange(num_slots, 0, -1, dtype=torch.int64, device=self.device)
        self._num_free = num_slots

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        scale = kv_int8.SCALE_DTYPE.itemsize if dtype == torch.int8 else 0
        return 2 * num_layers * num_kv_heads * (head_dim * itemsize + scale)

    def rotate_queries(self, q: torch.Tensor) -> torch.Tensor:
        """q [..., head_dim] as it meets this pool's stored keys: rotated in an int8 pool."""
        return kv_int8.rotate(q) if self.is_int8 else q

    def layer(self, layer_id: int) -> tuple:
        """Layer layer_id's (K, V): tensors, or kv_int8.QuantizedRows in an int8 pool."""
        if self.is_int8:
            return (kv_int8.QuantizedRows(self.k[layer_id], self.k_scales[layer_id]),
                    kv_int8.QuantizedRows(self.v[layer_id], self.v_scales[layer_id]))
        return self.k[layer_id], self.v[layer_id]

    @property
    def num_free(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        """n free slots (int64, on the pool's device), or None when fewer than n are free."""
        if n > self._num_free:
            return None
        start = self._num_free - n
        slots = self._free[start:self._num_free].flip(0)
        self._num_free = start
        return slots

    def free(self, slots: torch.Tensor | list[int]) -> None:
        """Take slots back; slots on another device (or a list) are copied to the pool's."""
        if not isinstance(slots, torch.Tensor):
            slots = torch.tensor(slots, dtype=torch.int64, device=self.device)
        n = slots.numel()
        if n == 0:
            return
        if self._num_free + n > self.num_slots:
            raise InvariantBroken(f"{n} KV slots freed with {self._num_free} of "
                                  f"{self.num_slots} free: some were freed twice")
        self._free[self._num_free:self._num_free + n] = slots.flip(0)  # first out: slots[0]
        self._num_free += n

    def free_slots(self) -> torch.Tensor:
        """The free slots (a view on the pool's device: copy before changing the pool), for
        failures.py's sweep."""
        return self._free[:self._num_free]

    def write(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # (a 16-bit pool under an fp32 model rounds K/V here)
        pool_k, pool_v = self.k[layer_id], self.v[layer_id]
        if self.is_int8:
            if self._key_log is not None:
                self._key_log.setdefault(layer_id, []).append(kv_int8.rotate(k).float())
            for x, codes, scales in ((self._stored_keys(layer_id, k), pool_k,
                                      self.k_scales[layer_id]),
                                     (v, pool_v, self.v_scales[layer_id])):
                c, s = kv_int8.quantize(x)
                codes.index_copy_(0, slots, c)
                scales.index_copy_(0, slots, s)
            return
        if k.dtype != pool_k.dtype:
            k, v = k.to(pool_k.dtype), v.to(pool_v.dtype)
        pool_k.index_copy_(0, slots, k)
        pool_v.index_copy_(0, slots, v)

    def _stored_keys(self, layer_id: int, k: torch.Tensor) -> torch.Tensor:
        """An int8 pool's keys before they are quantized: rotated, less the layer's offset."""
        return kv_int8.rotate(k).float() - self.k_offsets[layer_id]

    def as_stored(self, layer_id: int, k: torch.Tensor, v: torch.Tensor,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens' K and V [tokens, kv_heads, head_dim] as this int8 pool holds them,
        dequantized to `dtype`: for an attention path that reads them from its inputs rather
        than from the pool."""
        return tuple(kv_int8.dequantize(*kv_int8.quantize(x), dtype)
                     for x in (self._stored_keys(layer_id, k), v))

    def record_keys(self) -> dict[int, list[torch.Tensor]]:
        """Start logging, per layer, every key an int8 pool is given, as stored before the
        offset (fp32, rotated): runtime/kv_calibration.py's; `stop_recording` ends it."""
        self._key_log = {}
        return self._key_log

    def stop_recording(self) -> None:
        self._key_log = None


class HiddenSumPool:
    """Per KV slot, float32 [hidden_size]: the sum of the final hidden states of positions
    0 .. that slot's token, of the sequence the token was computed in (an embedding server
    pooling mean or cls: scheduler/embedding.py). A token's hidden state depends only on its
    prefix, so, like its K/V, the sum is valid for every sequence the radix tree maps to the
    slot. Slot 0 (the padding slot) is never read."""

    def __init__(self, num_slots: int, hidden_size: int, device: torch.device | str = "cpu"):
        self.sums = torch.zeros((num_slots + 1, hidden_size), dtype=torch.float32,
                                device=device)
        self.device = torch.device(device)
        # the running sum within a chunk: float64 where the device has it (MPS has not)
        self.acc_dtype = torch.float64 if self.device.type in ("cpu", "cuda") else torch.float32

    @staticmethod
    def bytes_per_token(hidden_size: int) -> int:
        return 4 * hidden_size

    @property
    def nbytes(self) -> int:
        return self.sums.numel() * self.sums.element_size()

    def write_cumsum(self, slots: torch.Tensor, hidden: torch.Tensor,
                     before: torch.Tensor | None) -> None:
        """slots[i] gets `before` (the sum at the slot before slots[0]; None: slots[0] is
        position 0) plus hidden[0] + ... + hidden[i]."""
        sums = hidden.to(self.acc_dtype).cumsum(0)
        if before is not None:
            sums += self.sums[before.long()].to(self.acc_dtype)
        self.sums.index_copy_(0, slots.to(self.device), sums.float())

    def at(self, slot: torch.Tensor) -> torch.Tensor:
        """The sum at one slot (a 0-d int tensor, on any device), float32 [hidden_size]."""
        return self.sums[slot.to(self.device).long()]
