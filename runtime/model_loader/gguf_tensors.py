"""A GGUF's tensors as stored, under the model's (transformers') names, read one at a time.

A model folder that radixflow prepared from a GGUF holds the config, the tokenizer and
`gguf.json`: where the file is and, for each transformers tensor name, which GGUF tensors make
it (`plan`). No weights are written; `GGUFWeights` reads them from the file when the model
loads:

- `tensor(hf_name)`: the stored blocks (`StoredTensor`: raw bytes row by row, GGUF type),
  llama.cpp's q/k row permutation undone on the raw rows (a row of blocks is a row of
  weights), stacked experts concatenated as transformers stacks them;
- `dequantized()`: every tensor as float32, one at a time (kernels/gguf_blocks: bit for bit
  the `gguf` package's), for loads that keep dense weights (a GPU, --quantization none, tensor
  parallel ranks).

Bytes are read with pread, not through a memory map: the file's pages stay in the page cache
and are not counted in the server's resident memory.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...kernels.gguf_blocks import GGMLType, dequantize, row_bytes
from .cache import SOURCE_FILE

# rows dequantized at a time (a 128k-token vocabulary's head is 2 GB as float32)
CHUNK_ROWS = 4096


@dataclass
class StoredTensor:
    """A 2-D tensor as the GGUF stores it: `raw` uint8 [rows, row_bytes] of `qtype` blocks."""

    qtype: GGMLType
    rows: int
    cols: int
    raw: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    def dequantize(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """float32 rows [start, stop)."""
        stop = self.rows if stop is None else stop
        return dequantize(self.raw[start:stop], self.qtype, (stop - start, self.cols))

    def take_rows(self, index: torch.Tensor) -> StoredTensor:
        return StoredTensor(self.qtype, len(index), self.cols, self.raw[index])

    def slice_rows(self, start: int, stop: int) -> StoredTensor:
        return StoredTensor(self.qtype, stop - start, self.cols, self.raw[start:stop])

    @staticmethod
    def cat(parts: list[StoredTensor]) -> StoredTensor:
        """Rows of parts of one type, one after another."""
        if len({p.qtype for p in parts}) != 1 or len({p.cols for p in parts}) != 1:
            raise ValueError("only tensors of one type and width are stacked as stored")
        return StoredTensor(parts[0].qtype, sum(p.rows for p in parts), parts[0].cols,
                            torch.cat([p.raw for p in parts]))


def unpermute_rows(rows: int, n_head: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's LlamaModel.permute of q/k (weights or biases):
    row i of the result is the stored row index[i]."""
    return (torch.arange(rows).reshape(n_head, rows // n_head // 2, 2)
            .swapaxes(1, 2).reshape(rows))


@dataclass(frozen=True)
class _Info:
    qtype: GGMLType
    shape: tuple[int, ...]  # outermost first
    offset: int
    nbytes: int


class GGUFWeights:
    """The tensors of a prepared folder's GGUF, under the model's names (see the module doc)."""

    def __init__(self, gguf_path: Path, plan: dict[str, dict[str, Any]],
                 infos: dict[str, list] | None = None):
        """`infos`: `tensor_infos(gguf_path)`, as saved in gguf.json (read from the file's
        header when not given: seconds, for a file with a large vocabulary)."""
        self.path = Path(gguf_path)
        self.plan = plan
        infos = tensor_infos(self.path) if infos is None else infos
        self._infos = {name: _Info(GGMLType(t), tuple(shape), offset, nbytes)
                       for name, (t, shape, offset, nbytes) in infos.items()}

    @classmethod
    def of_folder(cls, folder: Path) -> GGUFWeights | None:
        """The folder's GGUF weights; None for a folder of safetensors."""
        source = Path(folder) / SOURCE_FILE
        if not source.is_file():
            return None
        meta = json.loads(source.read_text())
        path = Path(meta["path"])
        path = path if path.is_absolute() else Path(folder) / path
        from ..errors import ModelNotFound

        if not path.is_file() or path.stat().st_size != meta["size"]:
            raise ModelNotFound(f"{folder} was prepared from {path}, which is gone or has "
                                "changed; pass the .gguf file again")
        return cls(path, meta["plan"], meta.get("tensors"))

    def names(self) -> list[str]:
        return list(self.plan)

    def stored_type(self, hf_name: str) -> GGMLType:
        return self._infos[self.plan[hf_name]["tensors"][0]].qtype

    def tensor(self, hf_name: str) -> StoredTensor:
        """The tensor as stored (2-D: a 1-D tensor is one row; stacked experts [E * rows])."""
        entry = self.plan[hf_name]
        parts = [self._read(name) for name in entry["tensors"]]
        if entry.get("stack") == "experts_gate_up":  # [E, I, H] gate, up -> [E, 2I, H]
            experts = self._infos[entry["tensors"][0]].shape[0]
            gate, up = (p.raw.view(experts, -1, p.raw.shape[-1]) for p in parts)
            raw = torch.cat([gate, up], dim=1).reshape(-1, gate.shape[-1])
            t = StoredTensor(parts[0].qtype, raw.shape[0], parts[0].cols, raw)
        else:
            t = StoredTensor.cat(parts) if len(parts) > 1 else parts[0]
        if entry.get("unpermute"):
            order = unpermute_rows(t.cols if t.rows == 1 else t.rows, int(entry["unpermute"]))
            if t.rows == 1:  # a bias: permute its (float) elements
                return StoredTensor(t.qtype, 1, t.cols,
                                    t.raw.view(t.cols, -1)[order].reshape(1, -1))
            t = t.take_rows(order)
        return t

    def hf_shape(self, hf_name: str) -> tuple[int, ...]:
        return tuple(self.plan[hf_name]["shape"])

    def dequantized(self, skip: set[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
        """(hf_name, float32 tensor of the model's shape) for every tensor not in `skip`."""
        for name in self.plan:
            if name not in skip:
                t = self.tensor(name)
                yield name, t.dequantize().reshape(self.hf_shape(name))

    def _read(self, name: str) -> StoredTensor:
        info = self._infos[name]
        data = bytearray(info.nbytes)
        with open(self.path, "rb", buffering=0) as f:
            view, done = memoryview(data), 0
            while done < info.nbytes:
                got = os.preadv(f.fileno(), [view[done:]], info.offset + done)
                if got <= 0:
                    raise OSError(f"{self.path}: tensor {name} is cut short")
                done += got
        cols = info.shape[-1]
        rows = info.nbytes // row_bytes(info.qtype, cols)
        raw = torch.frombuffer(data, dtype=torch.uint8).view(rows, -1)
        return StoredTensor(info.qtype, rows, cols, raw)


def gguf_reader(gguf_path: Path):
    """gguf's GGUFReader of the file, shared by the steps that prepare a folder: parsing the
    header takes seconds for a large vocabulary (its strings one by one). A memory map: only
    the header's pages are read."""
    path = Path(gguf_path).resolve()
    stat = path.stat()
    return _reader(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _reader(path: Path, size: int, mtime_ns: int):
    return _fast_reader_class()(path)


@functools.cache
def _fast_reader_class():
    import numpy as np
    from gguf import GGUFReader

    class FastReader(GGUFReader):
        """GGUFReader whose header parse slices a plain ndarray view of the memory map: the
        same fields, parts and tensors, 3x faster (slicing the np.memmap itself runs
        memmap.__array_finalize__ for each of a vocabulary's ~300k strings and lengths)."""

        def _get(self, offset, dtype, count=1, override_order=None):
            if self.__dict__.get("_mapped") is not self.data:  # (set by GGUFReader.__init__)
                self._plain, self._mapped = self.data.view(np.ndarray), self.data
            count, dtype = int(count), np.dtype(dtype)
            arr = self._plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr.view(arr.dtype.newbyteorder(order))

    return FastReader


def forget_readers() -> None:
    """Drop the shared reader (its parsed header: megabytes for a large vocabulary)."""
    _reader.cache_clear()


def tensor_infos(gguf_path: Path) -> dict[str, list]:
    """name -> [GGML type, shape (outermost first), file offset, bytes] of every tensor."""
    reader = gguf_reader(gguf_path)
    return {t.name: [int(t.tensor_type), list(reversed([int(d) for d in t.shape])),
                     int(t.data_offset), int(t.n_bytes)] for t in reader.tensors}


def write_source(dest: Path, gguf_path: Path, plan: dict[str, dict[str, Any]],
                 relative: bool = False) -> None:
    """`dest`/gguf.json for `gguf_path` (`relative`: the file is inside `dest`)."""
    (Path(dest) / SOURCE_FILE).write_text(json.dumps({
        "path": gguf_path.name if relative else str(gguf_path),
        "size": gguf_path.stat().st_size, "plan": plan,
        "tensors": tensor_infos(gguf_path)}) + "\n")
