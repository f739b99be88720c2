"""/program: a straight-line stretch of a DSL program, run in one request.

wire.py states the format; the server runs it with `execute_program`, and the DSL's backends
without the route run the same executor in the client. select.py scores `select` by prompt
log-probabilities; errors.py holds the errors a run reports and their wire form.
"""

from __future__ import annotations

from .executor import ProgramExecutor, execute_program, run_program_locally
from .wire import validate_program

__all__ = ["ProgramExecutor", "execute_program", "run_program_locally", "validate_program"]
