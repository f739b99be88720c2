"""Planning a Triton decode-attention launch: the split count and the shared-prefix groups.

The split count is a grid size, but it also reaches the kernels' compiled variants (the merge
kernel's NUM_SPLITS, and strides that triton specialises on), so it is taken from the small
fixed set KV_SPLIT_CHOICES: every variant a batch can ask for is known up front and compiled
at start-up (`decode_variants`, `decode_attention.warm_up_decode_attention`), never mid-serving.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Powers of two: rounding the wanted split count down to one costs at most half the programs.
KV_SPLIT_CHOICES = (1, 2, 4, 8, 16, 32, 64)
CPU_SPLIT_CHOICES = (1, 2)  # the interpreter: few splits, few Python-level steps
MAX_KV_SPLITS = KV_SPLIT_CHOICES[-1]
MIN_SPLIT_LEN = 256  # tokens: shorter splits cost more in the merge than they win
PROGRAMS_PER_SM = 8  # enough resident programs per SM to keep loads in flight
MAX_HEADS_PER_PROGRAM = 64
MIN_SHARED_PREFIX = 64  # shared prefixes shorter than this attend per request
SHARED_ROWS = 64  # query rows (members x query heads of a KV head) per prefix program


def heads_per_program(num_heads: int, num_kv_heads: int) -> int:
    """Query heads of one stage-1 program (all that share its KV head, up to a limit)."""
    return min(num_heads // num_kv_heads, MAX_HEADS_PER_PROGRAM)


def programs_per_split(bs: int, num_heads: int, num_kv_heads: int) -> int:
    """Stage-1 programs of a batch per split: requests x KV heads x head blocks."""
    group = num_heads // num_kv_heads
    per_program = heads_per_program(num_heads, num_kv_heads)
    return bs * num_kv_heads * -(-group // per_program)


def num_kv_splits_for(num_sms: int, programs: int, max_seq_len: int) -> int:
    """The largest of KV_SPLIT_CHOICES within both what fills `num_sms` SMs with `programs`
    programs per split and what keeps every split at least MIN_SPLIT_LEN tokens long."""
    wanted = -(-PROGRAMS_PER_SM * num_sms // max(1, programs))
    by_length = max_seq_len // MIN_SPLIT_LEN
    limit = min(wanted, by_length)
    return max(n for n in KV_SPLIT_CHOICES if n <= max(1, limit))


def choose_num_kv_splits(device: torch.device, programs: int, max_seq_len: int) -> int:
    """The split count of a decode launch on `device` (a member of the set it compiles)."""
    if device.type != "cuda":
        return CPU_SPLIT_CHOICES[0] if max_seq_len <= 64 else CPU_SPLIT_CHOICES[1]
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    return num_kv_splits_for(num_sms, programs, max_seq_len)


def shares_prefixes(num_heads: int, num_kv_heads: int) -> bool:
    """Whether the cascade can run: a KV head's query heads fit one prefix program's rows."""
    return num_heads // num_kv_heads <= SHARED_ROWS


def decode_variants(device: torch.device, num_heads: int, num_kv_heads: int,
                    num_kv_splits: int | None = None) -> list[tuple[int, bool]]:
    """(split count, shared prefix) of every decode launch a serving backend can make on
    `device`: the ones to compile at start-up. num_kv_splits: a backend's fixed split count."""
    if num_kv_splits is not None:
        splits: tuple[int, ...] = (num_kv_splits,)
    else:
        splits = KV_SPLIT_CHOICES if device.type == "cuda" else CPU_SPLIT_CHOICES
    shared = (False, True) if shares_prefixes(num_heads, num_kv_heads) else (False,)
    return [(n, s) for n in splits for s in shared]


@dataclass
class SharedPrefix:
    """Which requests of a decode batch attend over a shared prefix together (`plan_shared_prefix`):
    int64 device tensors [bs]."""

    lens: torch.Tensor  # its group's shared prefix, in keys; 0: it attends alone
    group_start: torch.Tensor  # its group's first request (batch index)
    group_end: torch.Tensor  # one past its group's last


def plan_shared_prefix(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                       seq_lens: torch.Tensor, *, max_seq_len: int | None = None,
                       min_shared_prefix: int = MIN_SHARED_PREFIX) -> SharedPrefix | None:
    """Groups of consecutive requests whose slot rows begin alike, with torch ops on the
    device (no host sync): request r + 1 joins request r's group when their rows share at least
    `min_shared_prefix` leading slots; a group's prefix is the shortest such run in it. None
    when no group can form (a single request, sharing off, rows too short). Compute it once per
    forward and pass it to every layer's `decode_attention_triton`."""
    bs = req_pool_indices.numel()
    width = req_to_token.shape[1] if max_seq_len is None else min(max_seq_len,
                                                                   req_to_token.shape[1])
    if bs < 2 or min_shared_prefix <= 0 or width < min_shared_prefix:
        return None
    device = req_to_token.device
    rows = req_to_token[req_pool_indices.long(), :width]  # [bs, width]
    lens = seq_lens.to(torch.int64)
    limit = torch.minimum(lens[1:], lens[:-1])
    pos = torch.arange(width, device=device)
    same = (rows[1:] == rows[:-1]) & (pos[None, :] < limit[:, None])
    common = same.to(torch.int32).cumprod(1).sum(1)  # [bs - 1]: r + 1's run alike with r
    link = common >= min_shared_prefix
    idx = torch.arange(bs, device=device)
    starts = torch.ones(bs, dtype=torch.bool, device=device)
    starts[1:] = ~link
    group = starts.to(torch.int64).cumsum(0) - 1
    none = torch.iinfo(torch.int64).max
    shortest = torch.full((bs,), none, dtype=torch.int64, device=device).scatter_reduce(
        0, group[1:], torch.where(link, common.to(torch.int64), none), "amin")[group]
    last = torch.zeros(bs, dtype=torch.int64, device=device).scatter_reduce(
        0, group, idx, "amax")[group]
    return SharedPrefix(torch.where(shortest == none, 0, shortest),
                        torch.where(starts, idx, 0).cummax(0).values, last + 1)


def shared_prefix_warps(block_m: int, block_d: int) -> int:
    """Warps of a shared-prefix program: 8 from a 64 x 128 accumulator on (at 4, sm_90's ptxas
    spills registers there: bench/kernel_registers.py)."""
    return 8 if block_m * block_d >= 64 * 128 else 4
