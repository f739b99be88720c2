"""Exact patterns for the `format` values whose xgrammar grammar admits strings that are not
valid: days past the end of a month, second 60, year 0000, IPv4 octets with leading zeros,
surrogate code points in JSON pointers. schema_rewrite puts them in place of the format; they
agree exactly with jsonschema's format checker
(tests/runtime/constrained/test_schema_honesty.py)."""

from __future__ import annotations

_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_MONTH_DAY = (r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
              r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
# No second 60: RFC 3339 allows a leap second, jsonschema's checker (rfc3339-validator) not.
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?"
         r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_JSON_POINTER = r"(?:/(?:[^/~]|~[01])*)*"


def _ipv6() -> str:
    """RFC 4291 text forms: eight groups, or `a` groups, '::', then at most 7 - a groups (an
    IPv4 tail counting as two)."""
    h16 = "[0-9A-Fa-f]{1,4}"
    forms = [f"(?:{h16}:){{7}}{h16}", f"(?:{h16}:){{6}}{_IPV4}"]
    for left in range(8):
        head = "" if left == 0 else f"(?:{h16}:){{{left - 1}}}{h16}"
        tails = []
        if left < 7:
            tails.append(f"{h16}(?::{h16}){{0,{6 - left}}}")
        if left <= 5:
            tails.append(f"(?:{h16}:){{0,{5 - left}}}{_IPV4}")
        forms.append(f"{head}::" + (f"(?:{'|'.join(tails)})?" if tails else ""))
    return "(?:" + "|".join(forms) + ")"


FORMAT_PATTERNS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "ipv4": _IPV4,
    "ipv6": _ipv6(),
    "json-pointer": _JSON_POINTER,
    # jsonschema's checker refuses a digit after a 0 ("100"), so the integer is [1-9]+0? or 0
    "relative-json-pointer": rf"(?:0|[1-9]+0?)(?:#|{_JSON_POINTER})",
}
FORMAT_PATTERNS = {name: f"^{body}$" for name, body in FORMAT_PATTERNS.items()}
