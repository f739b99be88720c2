"""Batch plans: what rank 0 tells the other ranks before each forward, as int64 tensors.

A plan is what ModelRunner.forward takes (the mode, each request's part: its req_to_token row,
token ids, first position and wanted logit rows; the batch's KV slots) plus the changes to
req_to_token the workers have not seen. Only the scheduler writes req_to_token (admission,
chunked prefill, the radix cache re-pointing rows at shared slots, decode); rank 0 keeps a
copy of the table as the workers have it and sends, for the rows and positions a forward
reads, the entries that differ (usually one per request in decode): no scheduler code needs
to report its writes, and a worker's table is exact wherever a forward looks.

Two broadcasts per forward: a fixed-size header, then the body.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..forward_batch import ForwardMode
from .parallel_state import TensorParallel

FORWARD, SHUTDOWN = 1, 2
HEADER = 8  # kind, mode, parts, ids, logit rows, slots, table entries, 0
_MODES = (ForwardMode.EXTEND, ForwardMode.DECODE)


@dataclass
class Plan:
    mode: ForwardMode
    parts: list  # BatchRequest
    out_slots: torch.Tensor


class PlanSender:
    """Rank 0's side: broadcast each forward's plan."""

    def __init__(self, tp: TensorParallel, req_to_token: torch.Tensor):
        self.tp = tp
        self.seen = torch.zeros_like(req_to_token)  # req_to_token as the workers have it
        self.entries_sent = 0
        tp.serving = True  # every rank has loaded its shard and waits for plans

    def send(self, mode: ForwardMode, parts: list, out_slots: torch.Tensor,
             req_to_token: torch.Tensor) -> None:
        rows, pos, vals = self._table_changes(parts, req_to_token)
        meta, ids, offsets = [], [], []
        for p in parts:
            meta += (p.req_pool_idx, p.start_pos, len(p.ids), len(p.logit_offsets))
            ids += p.ids
            offsets += p.logit_offsets
        slots = out_slots.reshape(-1).to("cpu", torch.int64)
        header = torch.tensor([FORWARD, _MODES.index(mode), len(parts), len(ids), len(offsets),
                               slots.numel(), rows.numel(), 0], dtype=torch.int64)
        body = torch.cat([torch.tensor(meta + ids + offsets, dtype=torch.int64), slots,
                          rows, pos, vals])
        self.entries_sent += rows.numel()
        self.tp.broadcast(header)
        self.tp.broadcast(body)

    def _table_changes(self, parts: list, table: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, positions, values) of req_to_token entries the forward reads (each part's
        row up to its last position) that the workers' copy lacks; updates the copy."""
        need: dict[int, int] = {}
        for p in parts:
            end = p.start_pos + len(p.ids)
            need[p.req_pool_idx] = max(need.get(p.req_pool_idx, 0), end)
        if not need:
            empty = torch.empty(0, dtype=torch.int64)
            return empty, empty, empty
        idx = torch.tensor(list(need), dtype=torch.int64, device=table.device)
        ends = torch.tensor(list(need.values()), dtype=torch.int64, device=table.device)
        width = int(ends.max())
        now, seen = table[idx, :width], self.seen[idx, :width]
        inside = torch.arange(width, device=table.device)[None, :] < ends[:, None]
        which, pos = ((now != seen) & inside).nonzero(as_tuple=True)
        rows, vals = idx[which], now[which, pos]
        self.seen[rows, pos] = vals
        return rows.cpu(), pos.cpu(), vals.cpu().to(torch.int64)



def send_shutdown(tp: TensorParallel) -> None:
    """Rank 0: tell the workers to leave their loop (they exit)."""
    tp.broadcast(torch.tensor([SHUTDOWN] + [0] * (HEADER - 1), dtype=torch.int64))


def receive(tp: TensorParallel, req_to_token: torch.Tensor) -> Plan | None:
    """A worker's side: the next plan (its table changes already applied), or None when rank 0
    shuts down. Blocks while the server idles."""
    from ..forward_batch import BatchRequest

    header = torch.empty(HEADER, dtype=torch.int64)
    tp.broadcast(header)
    kind, mode, n_parts, n_ids, n_offsets, n_slots, n_entries, _ = header.tolist()
    if kind == SHUTDOWN:
        return None
    body = torch.empty(4 * n_parts + n_ids + n_offsets + n_slots + 3 * n_entries,
                       dtype=torch.int64)
    tp.broadcast(body)
    meta, ids, offsets, slots, rows, pos, vals = body.split(
        [4 * n_parts, n_ids, n_offsets, n_slots, n_entries, n_entries, n_entries])
    if n_entries:
        dev = req_to_token.device
        req_to_token[rows.to(dev), pos.to(dev)] = vals.to(dev, req_to_token.dtype)
    ids, offsets = ids.tolist(), offsets.tolist()
    parts, i, j = [], 0, 0
    for row, start, n, k in meta.view(-1, 4).tolist():
        parts.append(BatchRequest(row, ids[i:i + n], start, offsets[j:j + k]))
        i, j = i + n, j + k
    return Plan(_MODES[mode], parts, slots)
