"""Checks a user regex with interegular before xgrammar sees it: a clear 400 for bad syntax,
unsupported features and repetition bombs."""

from __future__ import annotations

import interegular
from interegular import patterns as ip

from ..errors import GrammarError
from .limits import RegexLimits


def strip_anchors(pattern: str) -> str:
    """The output must match the pattern whole, so outer ^ and $ add nothing."""
    body = pattern.removeprefix("^")
    if body.endswith("$") and not _is_escaped(body, len(body) - 1):
        body = body[:-1]
    return body


def normalize_regex(pattern: str) -> str:
    """The pattern as xgrammar should compile it to mean what Python's `re` means: no outer
    anchors, named groups as plain groups, and '.' excluding newline as in `re`."""
    body = _strip_group_names(strip_anchors(pattern))
    out: list[str] = []
    last = 0
    for i, c, in_class in _scan(body):
        if c == "." and not in_class:
            out.append(body[last:i])
            out.append("[^\\n]")
            last = i + 1
    out.append(body[last:])
    return "".join(out)


def check_regex(pattern: str, limits: RegexLimits, *, param: str = "regex",
                what: str | None = None) -> None:
    """Raise GrammarError saying why `pattern` cannot constrain generation. `what` names the
    pattern in messages (default: `param`)."""
    what = what or param
    if not isinstance(pattern, str):
        raise GrammarError(f"{what} must be a string", param=param)
    if not pattern:
        raise GrammarError(f"{what} is empty", param=param)
    if len(pattern) > limits.max_length:
        raise GrammarError(
            f"{what} is {len(pattern)} characters long; the limit is {limits.max_length}",
            param=param)
    body = _strip_group_names(strip_anchors(pattern))
    try:
        parsed = interegular.parse_pattern(body)
    except ip.Unsupported as exc:
        raise GrammarError(f"unsupported {what} {pattern!r}: {exc}", param=param) from None
    except (ip.InvalidSyntax, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else "invalid syntax"
        raise GrammarError(f"invalid {what} {pattern!r}: {why}", param=param) from None
    _walk(parsed, pattern, limits, param, what, product=1)
    if _has_inline_flags(body):
        raise GrammarError(
            f"unsupported {what} {pattern!r}: inline flags such as (?i) are not supported",
            param=param)


def _walk(node: object, pattern: str, limits: RegexLimits, param: str, what: str,
          product: int) -> None:
    if isinstance(node, ip._NonCapturing):
        kind = "lookbehind" if node.backwards else "lookahead"
        raise GrammarError(f"unsupported {what} {pattern!r}: {kind} assertions are not supported",
                           param=param)
    if isinstance(node, ip._Repeated):
        bound = node.max if node.max is not None else node.min
        if bound > limits.max_repeat:
            raise GrammarError(
                f"{what} {pattern!r} repeats up to {bound} times; the limit is "
                f"{limits.max_repeat}", param=param)
        if node.max is not None and node.max > 1:
            product *= node.max
            if product > limits.max_repeat_product:
                raise GrammarError(
                    f"{what} {pattern!r} nests bounded repetitions up to {product} times; the "
                    f"limit is {limits.max_repeat_product}", param=param)
        _walk(node.base, pattern, limits, param, what, product)
    elif isinstance(node, ip.Pattern):
        for option in node.options:
            _walk(option, pattern, limits, param, what, product)
    elif isinstance(node, ip._Concatenation):
        for part in node.parts:
            _walk(part, pattern, limits, param, what, product)


def _is_escaped(text: str, index: int) -> bool:
    backslashes = 0
    while index - 1 - backslashes >= 0 and text[index - 1 - backslashes] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _scan(body: str):
    """Yield (index, char, in_class) for unescaped characters outside escapes."""
    in_class = False
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            # NOTE: a ']' right after '[' or '[^' is a literal, not the end of the class.
            j = i + 1 + (body[i + 1:i + 2] == "^")
            if body[j:j + 1] == "]":
                i = j
        yield i, c, in_class
        i += 1


def _strip_group_names(body: str) -> str:
    out: list[str] = []
    last = 0
    for i, c, in_class in _scan(body):
        if c == "(" and not in_class and body.startswith("(?P<", i):
            end = body.find(">", i)
            if end != -1:
                out.append(body[last:i + 1])
                last = end + 1
    out.append(body[last:])
    return "".join(out)


def _has_inline_flags(body: str) -> bool:
    for i, c, in_class in _scan(body):
        if c == "(" and not in_class and body.startswith("(?", i):
            nxt = body[i + 2:i + 3]
            if nxt and nxt in "aiLmsux-":
                return True
    return False
