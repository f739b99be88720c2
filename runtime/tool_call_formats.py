"""The tool-call formats' names (--tool-call-parser) and where each one's parser lives.

A leaf (no import at all): ServerArgs checks the flag with `check_parser_name`;
runtime/server/tool_parsers/ imports these tables and holds the parsers themselves.
"""

from __future__ import annotations

PARSERS = {  # name -> "module:class" in runtime/server/tool_parsers/
    "hermes": "hermes:HermesParser",
    "llama3": "llama3:Llama3Parser",
    "mistral": "mistral:MistralParser",
    "pythonic": "pythonic:PythonicParser",
    "qwen3_coder": "qwen3_coder:Qwen3CoderParser",
}
# vLLM's and SGLang's names for the same formats
ALIASES = {"qwen": "hermes", "qwen25": "hermes", "qwen3": "hermes", "llama3_json": "llama3",
           "llama": "llama3", "llama4_pythonic": "pythonic", "qwen3coder": "qwen3_coder",
           "qwen3_xml": "qwen3_coder"}
DEFAULT = "hermes"


def check_parser_name(name: str) -> str:
    """The canonical name of a parser; ValueError listing the choices for an unknown one."""
    key = name.strip().lower().replace("-", "_") if isinstance(name, str) else name
    key = ALIASES.get(key, key)
    if key not in PARSERS:
        raise ValueError(f"--tool-call-parser {name!r} is not a tool-call parser; the choices "
                         f"are {', '.join(PARSERS)} (or vLLM's/SGLang's names "
                         f"{', '.join(ALIASES)})")
    return key
