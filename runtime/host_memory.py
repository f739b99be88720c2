"""How much memory this machine can still give without swapping (the CPU KV pool's ceiling)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# what the server still needs beside the KV pool once the weights are in: the HTTP and
# detokenizer processes, prefill activations, the radix tree, request buffers
HEADROOM_BYTES = 2**30
HEADROOM_SHARE = 0.1


# a forward of at least this many tokens gives what its activations freed back (release_freed):
# glibc keeps a prefill's freed activation blocks in its heap for good otherwise (0.13 GB after a
# few 1,000-token prefills of a 1B), and giving them back costs ~1% of such a prefill (the next
# one faults the pages in again)
RELEASE_AFTER_TOKENS = 256


def available_bytes() -> int | None:
    """MemAvailable (free memory plus the page cache the kernel can drop), or None where the
    system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def room_for_kv() -> int | None:
    """Bytes a KV pool can take now without pushing the machine into swap."""
    available = available_bytes()
    if available is None:
        return None
    return max(int(available * (1 - HEADROOM_SHARE)) - HEADROOM_BYTES, 0)


def release_freed() -> None:
    """Give the memory the allocator holds free back to the system (glibc's malloc_trim):
    loading frees many mid-sized buffers (a tensor's blocks, its unpacked chunks) that glibc
    otherwise keeps in its arenas for the server's lifetime. A no-op elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None
