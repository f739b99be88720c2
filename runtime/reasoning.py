"""Reasoning models (`--reasoning-parser`): the thinking between the think markers, apart from
the answer.

    parser = ReasoningParser("qwen3", tokenizer)
    mode = parser.mode(prompt_ids)                     # THINKING, MAY_THINK or ANSWER
    reasoning, answer = parser.split(text, mode, final=True)

Where an output starts is read off the prompt's last non-blank token: the start marker (the
template opened the thinking: DeepSeek-R1, Qwen3-Thinking) means THINKING, the end marker (it
closed it: Qwen3 with enable_thinking false) ANSWER; otherwise the format decides: DeepSeek-R1
thinks from its first token, Qwen3 thinks when its first token is the start marker (MAY_THINK).
The scheduler follows the same markers as token ids (scheduler/reasoning.py: a constraint
engages after the end marker, thinking_budget forces it); the response side splits the text.
Pure Python: the HTTP process imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

THINKING, MAY_THINK, ANSWER = "thinking", "may_think", "answer"
_BLANK_TAIL = 8  # prompt tokens read back past blank ones ("\n") to find a marker


@dataclass(frozen=True)
class ReasoningFormat:
    think_start: str
    think_end: str
    starts_thinking: bool  # the output thinks from its first token unless the prompt closed it
    models: str


FORMATS: dict[str, ReasoningFormat] = {
    "deepseek-r1": ReasoningFormat("<think>", "</think>", True,
                                   "DeepSeek-R1 and its distills (R1-0528 repeats <think>)"),
    "deepseek-v3": ReasoningFormat("<think>", "</think>", False,
                                   "DeepSeek-V3.1/V3.2 (the 'thinking' template switch)"),
    "qwen3": ReasoningFormat("<think>", "</think>", False,
                             "Qwen3, QwQ (enable_thinking in chat_template_kwargs)"),
    "qwen3-thinking": ReasoningFormat("<think>", "</think>", True,
                                      "Qwen3-*-Thinking-2507 (always thinks)"),
    "glm45": ReasoningFormat("<think>", "</think>", False, "GLM-4.5, GLM-4.6"),
}


def check_parser_name(name: str) -> str:
    """The parser's canonical name (`deepseek_r1` is `deepseek-r1`); ValueError listing the
    choices for an unknown one."""
    key = name.strip().lower().replace("_", "-") if isinstance(name, str) else name
    if key not in FORMATS:
        raise ValueError(f"--reasoning-parser {name!r} is not a reasoning parser; the choices "
                         f"are {', '.join(FORMATS)}")
    return key


def _single_token(tokenizer: Any, marker: str, name: str) -> int:
    ids = list(tokenizer.encode(marker, add_special_tokens=False))
    if len(ids) != 1:
        raise ValueError(f"--reasoning-parser {name}: this model's tokenizer has no single "
                         f"token for {marker!r} (it encodes as {ids}); the parser is for models "
                         "whose think markers are tokens of their own")
    if tokenizer.decode(ids, skip_special_tokens=True) != marker:
        raise ValueError(f"--reasoning-parser {name}: the tokenizer drops {marker!r} when it "
                         "decodes (a special token), so the text would lose the marker")
    return ids[0]


class ReasoningParser:
    """The server's parser, bound to its tokenizer. Raises ValueError for an unknown name or
    a tokenizer without single-token markers."""

    def __init__(self, name: str, tokenizer: Any):
        self.name = check_parser_name(name)
        self.format = FORMATS[self.name]
        self.think_start, self.think_end = self.format.think_start, self.format.think_end
        self.start_id = _single_token(tokenizer, self.think_start, self.name)
        self.end_id = _single_token(tokenizer, self.think_end, self.name)
        self._tokenizer = tokenizer
        self._blank: dict[int, bool] = {}

    @classmethod
    def load(cls, name: str | None, tokenizer: Any) -> ReasoningParser | None:
        return None if name is None else cls(name, tokenizer)

    def _is_blank(self, token: int) -> bool:
        if token not in self._blank:
            self._blank[token] = not self._tokenizer.decode([token]).strip()
        return self._blank[token]

    def mode(self, prompt_ids: list[int]) -> str:
        """Where an output after `prompt_ids` starts (module docstring)."""
        for token in reversed(prompt_ids[-_BLANK_TAIL:]):
            if token == self.start_id:
                return THINKING
            if token == self.end_id:
                return ANSWER
            if not self._is_blank(token):
                break
        return THINKING if self.format.starts_thinking else MAY_THINK

    def split(self, text: str, mode: str, *, final: bool) -> tuple[str | None, str]:
        """(reasoning, answer) of an output's text; reasoning None when the output did not
        think. Not `final` (the output may grow): a tail that may still become a marker is
        held back from both, so each part of a longer text extends the part of a shorter one.
        """
        if mode == ANSWER:
            return None, text
        start, end = self.think_start, self.think_end
        body = text
        if text.startswith(start):  # Qwen3 opens it; R1-0528 repeats the prompt's
            body = text[len(start):]
        elif not final and start.startswith(text):
            return ("" if mode == THINKING else None), ""  # may still open (or be "<think>")
        elif mode == MAY_THINK:
            return None, text
        cut = body.find(end)
        if cut >= 0:
            return body[:cut], body[cut + len(end):]
        if final:
            return body, ""
        held = next((k for k in range(min(len(end) - 1, len(body)), 0, -1)
                     if body.endswith(end[:k])), 0)
        return body[:len(body) - held], ""

    def reasoning_tokens(self, mode: str, output_ids: list[int]) -> int:
        """Output tokens of the thinking, its markers included (0: the output did not think)."""
        if mode == ANSWER or (mode == MAY_THINK and output_ids[:1] != [self.start_id]):
            return 0
        try:
            return output_ids.index(self.end_id) + 1
        except ValueError:
            return len(output_ids)


class ReasoningStream:
    """The new reasoning and answer text each time an output's cumulative text grows; `hold`:
    the reasoning comes in one piece once the thinking is over (SGLang's stream_reasoning
    false)."""

    def __init__(self, parser: ReasoningParser, mode: str, *, hold: bool = False):
        self.parser, self.mode, self.hold = parser, mode, hold
        self._sent_reasoning = self._sent_answer = 0

    def update(self, text: str, *, final: bool) -> tuple[str, str]:
        reasoning, answer = self.parser.split(text, self.mode, final=final)
        reasoning = reasoning or ""
        if self.hold and not final and self.parser.think_end not in text:
            reasoning = reasoning[:self._sent_reasoning]  # still thinking: nothing yet
        new_reasoning = reasoning[self._sent_reasoning:]
        new_answer = answer[self._sent_answer:]
        self._sent_reasoning, self._sent_answer = len(reasoning), len(answer)
        return new_reasoning, new_answer
