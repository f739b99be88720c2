"""IR -> wire: one program line's IR nodes as /program wire nodes (radixflow.runtime.program).

Roles render here, with the model's chat template and the turns the line has had so far, and a
gen inside an assistant turn gets the template's end of turn as a stop string.
"""

from __future__ import annotations

from radixflow.runtime.program.wire import JOIN_MODES

from .chat_template import ChatTemplate
from .errors import InvalidRequest
from .ir import Gen, Node, RoleBegin, RoleEnd, Select, Text
from .params import NO_LOGPROBS, GenParams, LogprobDefaults


class WireCompiler:
    """Compiles the nodes one line appends, in order; `branch()` continues in a forked branch."""

    def __init__(self, template: ChatTemplate, defaults: GenParams,
                 logprobs: LogprobDefaults = NO_LOGPROBS):
        self.template = template
        self.defaults = defaults
        self.logprobs = logprobs
        self.roles: list[str] = []  # the closed turns so far
        self.open_role: str | None = None

    def branch(self) -> WireCompiler:
        copy = WireCompiler(self.template, self.defaults, self.logprobs)
        copy.roles, copy.open_role = list(self.roles), self.open_role
        return copy

    def compile(self, node: Node) -> dict:
        match node:
            case Text(text=text):
                return {"type": "text", "text": text}
            case RoleBegin(role=role):
                if self.open_role is not None:
                    raise InvalidRequest(f"cannot open a {role!r} turn inside the open "
                                         f"{self.open_role!r} turn")
                begin, _ = self.template.role_texts(role, self.roles)
                self.open_role = role
                return {"type": "role_begin", "role": role, "text": begin}
            case RoleEnd(role=role):
                if self.open_role != role:
                    raise InvalidRequest(f"cannot close a {role!r} turn: the open turn is "
                                         f"{self.open_role!r}")
                _, end = self.template.role_texts(role, self.roles)
                self.roles.append(role)
                self.open_role = None
                return {"type": "role_end", "role": role, "text": end}
            case Gen():
                return self._gen(node)
            case Select(name=name, choices=choices, method=method):
                return {"type": "select", "name": name, "choices": list(choices),
                        "method": method}
        raise InvalidRequest(f"cannot add {type(node).__name__} to a program")

    def _gen(self, node: Gen) -> dict:
        sampling = node.params.merged(self.defaults).to_sampling_params()
        if self.open_role == "assistant":
            end_of_turn = self.template.end_of_turn("assistant", self.roles)
            if end_of_turn and end_of_turn not in sampling["stop"]:
                sampling["stop"].append(end_of_turn)
        if node.regex is not None:
            sampling["regex"] = node.regex
        if node.json_schema is not None:
            sampling["json_schema"] = node.json_schema
        if node.n != 1:
            sampling["n"] = node.n
        if node.thinking_budget is not None:
            sampling["thinking_budget"] = node.thinking_budget
        out = {"type": "gen", "name": node.name, "sampling_params": sampling}
        if node.reasoning:
            out["separate_reasoning"] = True
        if node.tools:
            out["tool_calls"] = True
        run = self.logprobs
        if node.return_logprob or run.return_logprob:
            out.update(return_logprob=True, return_text_in_logprobs=True)
            start = (node.logprob_start_len if node.logprob_start_len is not None
                     else run.logprob_start_len)
            top = node.top_logprobs_num if node.top_logprobs_num is not None else (
                run.top_logprobs_num)
            if start is not None:
                out["logprob_start_len"] = start
            if top is not None:
                out["top_logprobs_num"] = top
        return out


def join_node(mode: str) -> dict:
    """The wire node of `forks.join(mode)`."""
    if mode not in JOIN_MODES:
        raise InvalidRequest(f"join mode must be 'gather' or 'concat', got {mode!r}")
    return {"type": "join", "mode": mode}
