"""The size limits a constraint is held to before anything compiles it, against grammar bombs.
Plain frozen dataclasses (the standard library only), so any process can hold them."""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("regex", "json_schema", "json_object", "ebnf", "choices", "structural_tag")


@dataclass(frozen=True)
class RegexLimits:
    max_length: int = 4096  # characters in the pattern
    max_repeat: int = 1000  # largest finite bound in {n,m}
    max_repeat_product: int = 10_000  # product of finite bounds along one nesting path


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int = 64 * 1024  # length of the schema document
    max_depth: int = 32  # nesting of JSON containers in the document
    max_subschemas: int = 2000
    max_branches: int = 2000  # subschemas of one anyOf / oneOf / allOf / prefixItems
    # Steps (values indexed, branch pairs compared) the oneOf overlap analysis may take over
    # the whole document; it is near-linear, so only contrived schemas reach this.
    max_overlap_steps: int = 200_000
    # Property names times patternProperties patterns to match (Python regexes, each under a
    # deadline, against backtracking bombs).
    max_pattern_matches: int = 20_000


@dataclass(frozen=True)
class GrammarLimits:
    regex: RegexLimits = field(default_factory=RegexLimits)
    schema: SchemaLimits = field(default_factory=SchemaLimits)
    max_ebnf_length: int = 64 * 1024
    max_ebnf_rules: int = 1000  # rules defined (`name ::= ...`) in an EBNF grammar
    max_choices: int = 1024
    max_choices_chars: int = 64 * 1024  # all choices together
