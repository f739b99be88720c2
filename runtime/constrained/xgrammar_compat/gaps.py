"""What xgrammar's JSON Schema masks do not enforce (measured: see __init__.py's version and
how to re-measure), as tables the keyword checks read."""

from __future__ import annotations

from ..schema_terms import ANNOTATIONS
from .format_patterns import FORMAT_PATTERNS

# Keywords xgrammar accepts but does not enforce; outputs could then fail validation.
UNENFORCED_KEYWORDS = {
    "not": "negation",
    "if": "conditional subschemas (if/then/else)",
    "then": "conditional subschemas (if/then/else)",
    "else": "conditional subschemas (if/then/else)",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "dependencies": "dependencies",
    "$dynamicRef": "$dynamicRef",
    "$recursiveRef": "$recursiveRef",
    "contains": "contains",  # dropped by xgrammar when items are also given
    "minContains": "contains",
    "maxContains": "contains",
    "additionalItems": "additionalItems (draft-7 tuples; use prefixItems and items)",
}
# Formats xgrammar enforces as they are; FORMAT_PATTERNS lists those rewritten to a pattern.
ENFORCED_FORMATS = frozenset({"email", "uuid", "uri", "uri-reference", "uri-template",
                              "duration"})
SUPPORTED_FORMATS = ENFORCED_FORMATS | FORMAT_PATTERNS.keys()
FORMAT_GAPS = {
    "hostname": "xgrammar bounds neither a label (63) nor the name (253)",
    "idn-email": "xgrammar compiles it to an unchecked string",
    "idn-hostname": "xgrammar compiles it to an unchecked string",
    "iri": "xgrammar compiles it to an unchecked string",
    "iri-reference": "xgrammar compiles it to an unchecked string",
    "regex": "xgrammar compiles it to an unchecked string",
}
# The keywords of a propertyNames schema that xgrammar applies to the keys it writes.
PROPERTY_NAME_KEYWORDS = frozenset({"type", "pattern", "minLength", "maxLength", "format",
                                    "enum", "const"}) | ANNOTATIONS
# xgrammar's limits for integer multipleOf (larger values are silently dropped).
MAX_MULTIPLE_OF = 1024
MAX_MULTIPLE_OF_RANGE = 10_000
