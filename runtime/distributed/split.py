"""Whether a model splits over --tp-size ranks (sharding.py says how), checked where torch is
not loaded: the server's launcher checks it before starting any rank."""

from __future__ import annotations

from ..models.config import ModelArgs


def split_problems(args: ModelArgs, tp_size: int) -> list[str]:
    """Why `args` cannot be split over `tp_size` ranks (empty when it can)."""
    problems = []
    if args.num_heads % tp_size:
        problems.append(f"its {args.num_heads} attention heads")
    kv = args.num_kv_heads
    if (kv % tp_size if tp_size <= kv else tp_size % kv):
        problems.append(f"its {kv} KV heads (--tp-size must divide them, or be a multiple of "
                        "them to replicate each)")
    has_dense_mlp = not args.num_experts or args.dense_layers
    if has_dense_mlp and args.intermediate_size % tp_size:
        problems.append(f"its intermediate size {args.intermediate_size}")
    if args.num_experts % tp_size:
        problems.append(f"its {args.num_experts} experts (whole experts go to each rank)")
    if args.shared_expert_intermediate_size % tp_size:
        problems.append(f"its shared expert's intermediate size "
                        f"{args.shared_expert_intermediate_size}")
    return problems


def check_split(args: ModelArgs, tp_size: int) -> None:
    """Raise ValueError naming the numbers when the model cannot be split over tp_size ranks."""
    problems = split_problems(args, tp_size)
    if problems:
        raise ValueError(f"--tp-size {tp_size} cannot split this model "
                         f"({args.architecture}): it does not divide {'; nor '.join(problems)}")
