"""Thinking, for requests of a reasoning model: those that separate their reasoning
(GenerateReq.reasoning) or set a thinking_budget, on a server with --reasoning-parser.

A request follows the parser's markers token by token (`Thinking.mode`: THINKING, MAY_THINK,
ANSWER, as runtime/reasoning.py reads them off the prompt):

- its constraint applies to the answer only: while it thinks its grammar is dormant (kept in
  `Thinking.grammar`, `req.grammar` None: no mask, no tokens fed, no jump-forward), and the
  scheduler gives it back on the end marker, whose token the grammar never sees; the grammar's
  first token is the one after it. A constrained request may not end (EOS) while it thinks.
- MAY_THINK with a constraint: the first token is the grammar's or the start marker.
- thinking_budget: once the thinking has that many tokens (markers not counted), the next
  token is the end marker (a one-token mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..reasoning import ANSWER, MAY_THINK, THINKING, ReasoningParser

if TYPE_CHECKING:
    from ..constrained import GrammarState
    from .req import Req


@dataclass
class Thinking:
    mode: str
    budget: int | None = None
    num_tokens: int = 0  # thinking tokens so far, markers not counted
    answer_start: int = 0  # output tokens before the answer (before the grammar's first)
    grammar: GrammarState | None = None  # the request's, while it is dormant
    can_jump: bool = False  # req.can_jump, given back with the grammar
    constrained: bool = False


def _bit(token: int) -> tuple[int, int]:
    """(word, int32 value) of `token`'s bit in a packed bitmask row."""
    bit = token % 32
    return token // 32, (1 << bit) - (1 << 32 if bit == 31 else 0)


class SchedulerReasoning:
    def __init__(self, parser: ReasoningParser | None, eos_ids: set[int], vocab_size: int):
        self.parser = parser
        self.eos_ids = sorted(eos_ids)
        self.words = (vocab_size + 31) // 32

    def start(self, req: Req, separate: bool) -> str | None:
        """Give `req` its Thinking if it needs one; the message of a 400 if it cannot have it."""
        budget = req.sampling.thinking_budget
        if not separate and budget is None:
            return None
        if self.parser is None:
            what = "separate_reasoning" if separate else "thinking_budget"
            return f"{what} needs a server started with --reasoning-parser"
        req.thinking = Thinking(self.parser.mode(req.input_ids), budget=budget,
                                constrained=req.sampling.constraint is not None)
        return None

    def grammar_ready(self, req: Req) -> None:
        """Called when the request's grammar compiled: dormant unless the output answers."""
        t = req.thinking
        if t is None or t.mode == ANSWER:
            return
        t.can_jump, req.can_jump = req.can_jump, False  # nothing forced before it thinks
        if t.mode == THINKING:
            t.grammar, req.grammar = req.grammar, None

    def consumes(self, req: Req, token: int) -> bool:
        """Advance past `token`, just appended; True if it belongs to the thinking (the
        markers included), which the grammar must not see."""
        t = req.thinking
        if t is None or t.mode == ANSWER:
            return False
        first = len(req.output_ids) == 1
        if t.mode == MAY_THINK:
            if first and token == self.parser.start_id:
                t.mode = THINKING
                t.grammar, req.grammar = req.grammar, None
                return True
            self._answer(req, 0)
            return False
        if token == self.parser.end_id:
            self._answer(req, len(req.output_ids))
        elif not (first and token == self.parser.start_id):
            t.num_tokens += 1
        return True

    def _answer(self, req: Req, answer_start: int) -> None:
        t = req.thinking
        t.mode, t.answer_start = ANSWER, answer_start
        if t.grammar is not None:
            req.grammar, t.grammar = t.grammar, None
        req.can_jump = t.can_jump if req.grammar is not None else False

    def masks(self, reqs: list[Req], bitmask: torch.Tensor | None, rows: list[int] | None,
              device: torch.device) -> tuple[torch.Tensor | None, list[int] | None]:
        """The batch's bitmask and masked rows with the thinking's edits: the forced end
        marker, no EOS while a constrained request thinks, the start marker allowed beside a
        grammar's first token."""
        if self.parser is None:  # no reasoning model: nothing to edit, no per-row loop
            return bitmask, rows
        edits = []
        for i, r in enumerate(reqs):
            t = r.thinking
            if t is None or t.mode == ANSWER:
                continue
            if t.mode == THINKING:
                if t.budget is not None and t.num_tokens >= t.budget:
                    edits.append((i, "end"))
                elif t.constrained and not r.sampling.ignore_eos:
                    edits.append((i, "no_eos"))
            elif r.grammar is not None:
                edits.append((i, "open"))
        if not edits:
            return bitmask, rows
        if bitmask is None:
            bitmask = torch.full((len(reqs), self.words), -1, dtype=torch.int32, device=device)
            rows = []
        masked = set(range(len(reqs))) if rows is None else set(rows)
        for i, edit in edits:
            if edit == "end":
                word, value = _bit(self.parser.end_id)
                bitmask[i] = 0
                bitmask[i, word] = value
            elif edit == "no_eos":
                bitmask[i] = -1
                for eos in self.eos_ids:
                    word, value = _bit(eos)
                    bitmask[i, word] &= ~value
            else:
                word, value = _bit(self.parser.start_id)
                bitmask[i, word] |= value
            masked.add(i)
        return bitmask, sorted(masked)
