"""Everything radixflow does because of what one xgrammar version gets wrong, in one place.

Measured against xgrammar XGRAMMAR_VERSION by walking its token masks: every output the masks
allow must validate against the schema the client sent. Pure Python (xgrammar is not
imported), so the HTTP process can check constraints.

    gaps.py             keywords and formats the masks do not enforce (refused)
    keyword_checks.py   the refusals of one schema node, in a fixed order
    one_of.py, shapes   oneOf branches that overlap (xgrammar reads oneOf as anyOf)
    schema_rewrite.py   schemas rewritten to an exact equivalent (enum/const beside type,
                        oneOf of values, untyped string/number keywords, `(...)?` patterns)
    format_patterns.py  exact patterns for the formats whose grammar admits invalid strings
    unicode_fix.py      compiled grammars kept to valid UTF-8 and valid JSON strings

On an xgrammar upgrade, re-measure, then set XGRAMMAR_VERSION:
1. tests/runtime/constrained/test_schema_honesty.py: `test_refusal_is_needed` fails for a
   refusal the new masks no longer need (drop it from gaps.py / keyword_checks.py);
   `test_rewrite_closes_a_hole` for a rewrite no longer needed;
   `test_optional_groups_match_as_re_does` for fix_pattern; the random walks find new holes.
2. tests/runtime/constrained/test_unicode_fix.py: the surrogate and control-character fixes.
3. Outside this package, code that reads xgrammar's internals: alphabet.py (its serialized
   expression types), completion.py (the matcher's debug print of its parser state),
   backend.build_tokenizer_info (special tokens read as text),
   grammar_build.xgrammar_message (its error text), the pythonic tool parser (its printed
   JSON grammar); their tests are tests/runtime/constrained/test_closing.py, test_backend.py and
   tests/runtime/server/test_tool_parsers.py.
"""

from __future__ import annotations

from importlib import metadata

from .format_patterns import FORMAT_PATTERNS
from .schema_rewrite import fix_pattern, rewrite_schema
from .unicode_fix import fix_printed_grammar, fix_regex

XGRAMMAR_VERSION = "0.2.9"

__all__ = [
    "FORMAT_PATTERNS",
    "XGRAMMAR_VERSION",
    "fix_pattern",
    "fix_printed_grammar",
    "fix_regex",
    "installed_version",
    "unmeasured_version",
    "rewrite_schema",
]


def installed_version() -> str | None:
    """The installed xgrammar's version (None if it is not installed)."""
    try:
        return metadata.version("xgrammar")
    except metadata.PackageNotFoundError:
        return None


def unmeasured_version() -> str | None:
    """The installed xgrammar's version when its major.minor is not the one measured (the
    workarounds here may then be wrong or unneeded), else None. A patch release counts as
    measured."""
    installed = installed_version()
    if installed is None or _minor(installed) == _minor(XGRAMMAR_VERSION):
        return None
    return installed


def _minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])
