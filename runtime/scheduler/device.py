"""Which CUDA device a scheduler thread works on. A new host thread's current device is cuda:0,
while data-parallel replica k's weights are on cuda:k (server/data_parallel.py sets the
scheduler process's main thread to it): every thread that runs the scheduler's forward passes
or steps calls `use_device` first, with the device `concrete_device` pinned at start-up."""

from __future__ import annotations

import torch


def concrete_device(device: torch.device) -> torch.device:
    """`device` with its index: a bare "cuda" means the calling thread's current device."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def use_device(device: torch.device) -> None:
    """Make `device` the calling thread's current CUDA device (a no-op elsewhere)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
