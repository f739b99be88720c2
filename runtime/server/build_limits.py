"""What building one OpenAI request may cost, and the server flags it is checked against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RENDER_TIMEOUT = 10.0  # seconds a chat template render may take


@dataclass(frozen=True)
class BuildLimits:
    """What building one request may cost (docs/server-api.md, "Limits"), and the server
    flags it is checked against."""

    max_prompts: int | None = None  # --max-prompts-per-request: prompts x n
    max_rendered_chars: int | None = None  # of a rendered chat prompt
    render_timeout: float = RENDER_TIMEOUT
    priority_scheduling: bool = False  # --enable-priority-scheduling: `priority` may be set

    @classmethod
    def of(cls, args: Any) -> BuildLimits:
        """The limits of a server started with `args` (ServerArgs): a rendered prompt may be
        twice the largest body, plus 64 KiB of template text."""
        return cls(max_prompts=args.max_prompts_per_request,
                   max_rendered_chars=2 * args.max_request_bytes + 65536,
                   priority_scheduling=bool(args.enable_priority_scheduling))


NO_LIMITS = BuildLimits()
