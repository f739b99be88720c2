"""Independent checks of outputs: jsonschema for schemas, `re` for regexes, and a Python-side
parser for each EBNF grammar in tests/data/grammars."""

from __future__ import annotations

import ast
import csv
import io
import json
import re

import jsonschema


def schema_errors(schema: dict, instance: object) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
    return [e.message for e in validator.iter_errors(instance)]


# ---- formats jsonschema checks only with optional packages (rfc3987, fqdn, isoduration,
# uri-template): strict checks written from the RFCs' ABNF, so no format goes unchecked ----

_PCT = r"%[0-9A-Fa-f]{2}"
_UNRESERVED_SUB = r"A-Za-z0-9\-._~!$&'()*+,;="
_PCHAR = rf"(?:[{_UNRESERVED_SUB}:@]|{_PCT})"
_SEGMENT_NZ_NC = rf"(?:[{_UNRESERVED_SUB}@]|{_PCT})+"
_AUTHORITY = (rf"(?:(?:[{_UNRESERVED_SUB}:]|{_PCT})*@)?"  # userinfo
              rf"(?:\[[0-9A-Fa-f:.]+\]|\[v[0-9A-Fa-f]+\.[{_UNRESERVED_SUB}:]+\]"
              rf"|(?:[{_UNRESERVED_SUB}]|{_PCT})*)"  # IP-literal, IPvFuture, reg-name
              r"(?::[0-9]*)?")
_TAIL = rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"  # query, fragment
_URI = re.compile(rf"[A-Za-z][A-Za-z0-9+\-.]*:(?://{_AUTHORITY}(?:/{_PCHAR}*)*"
                  rf"|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_PCHAR}+(?:/{_PCHAR}*)*|){_TAIL}")
_RELATIVE_REF = re.compile(rf"(?://{_AUTHORITY}(?:/{_PCHAR}*)*|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?"
                           rf"|{_SEGMENT_NZ_NC}(?:/{_PCHAR}*)*|){_TAIL}")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_DURATION = re.compile(
    r"P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:T(?:[0-9]+H"
    r"(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S))?"
    r"|T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)|[0-9]+W)")
_VARSPEC = rf"(?:[A-Za-z0-9_]|{_PCT})(?:\.?(?:[A-Za-z0-9_]|{_PCT}))*(?::[1-9][0-9]{{0,3}}|\*)?"
_URI_TEMPLATE = re.compile(
    rf"(?:[^\x00-\x20\"'%<>\\^`{{|}}\x7f]|{_PCT}"
    rf"|\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\}})*")


def _is_hostname(text: str) -> bool:
    """RFC 1123: dot-separated labels of 1-63 letters, digits and inner hyphens; 253 at most."""
    return len(text) <= 253 and all(_LABEL.fullmatch(label) for label in text.split("."))


_STRICT_FORMATS = {
    "uri": lambda text: _URI.fullmatch(text) is not None,
    "uri-reference": lambda text: (_URI.fullmatch(text) or _RELATIVE_REF.fullmatch(text))
    is not None,
    "hostname": _is_hostname,
    "duration": lambda text: _DURATION.fullmatch(text) is not None,
    "uri-template": lambda text: _URI_TEMPLATE.fullmatch(text) is not None,
}


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(())
    checker.checkers = dict(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    for name, check in _STRICT_FORMATS.items():
        if name not in checker.checkers:
            checker.checks(name)(lambda instance, check=check:
                                 not isinstance(instance, str) or check(instance))
    return checker


FORMAT_CHECKER = _format_checker()


def _arithmetic(text: str) -> bool:
    operand = r"\(*(0|[1-9][0-9]{0,3})\)*"
    if not re.fullmatch(rf"{operand}( [-+*/] {operand})*", text):
        return False
    tree = ast.parse(text, mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)
    return all(isinstance(node, allowed) for node in ast.walk(tree))


def _json_value(text: str) -> bool:
    json.loads(text)
    outside_strings = re.sub(r'"[^"]*"', '""', text)
    return " " not in re.sub(r"[,:] ", "", outside_strings) and not re.search(
        r"[,:](?! )", outside_strings)


def _csv_table(text: str) -> bool:
    rows = list(csv.reader(io.StringIO(text)))
    if rows[0] != ["name", "age", "city"] or not 2 <= len(rows) <= 4 or not text.endswith("\n"):
        return False
    word = r"[A-Z][a-z]{1,12}"
    return all(len(r) == 3 and re.fullmatch(word, r[0]) and re.fullmatch(r"[1-9][0-9]?", r[1])
               and re.fullmatch(rf"{word}( {word})?", r[2]) for r in rows[1:])


_IDENT = r"[a-z_][a-z0-9_]{0,15}"
_SQL = re.compile(
    rf"SELECT (\*|{_IDENT}(, {_IDENT})*) FROM {_IDENT}"
    rf"( WHERE {_IDENT} (=|<|>|<=|>=|!=) ([0-9]{{1,6}}|'[A-Za-z0-9 ]{{0,20}}'))?"
    r"( LIMIT [1-9][0-9]{0,3})?;")


def _sexpr(text: str) -> bool:
    tokens = re.findall(r"\(|\)|[^\s()]+|\s", text)
    if "".join(tokens) != text:
        return False
    pos = 0

    def parse_list() -> None:
        nonlocal pos
        if tokens[pos] != "(":
            raise ValueError("expected (")
        pos += 1
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,8}", tokens[pos]):
            raise ValueError("expected an operator")
        pos += 1
        while tokens[pos] == " ":
            pos += 1
            if tokens[pos] == "(":
                parse_list()
            elif re.fullmatch(r"[a-z][a-z0-9-]{0,8}|-?[0-9]{1,5}", tokens[pos]):
                pos += 1
            else:
                raise ValueError(f"bad item {tokens[pos]!r}")
        if tokens[pos] != ")":
            raise ValueError("expected )")
        pos += 1

    parse_list()
    return pos == len(tokens)


def _function_call(text: str) -> bool:
    call = ast.parse(text, mode="eval").body
    if not isinstance(call, ast.Call) or call.args or not isinstance(call.func, ast.Name):
        return False
    if call.func.id not in ("get_weather", "search", "send_email"):
        return False
    for kwarg in call.keywords:
        value = kwarg.value
        if kwarg.arg not in ("city", "days", "query", "limit", "to", "subject"):
            return False
        if not isinstance(value, ast.Constant):
            return False
        if isinstance(value.value, str) and not re.fullmatch(r"[A-Za-z0-9 ,.@_-]{0,30}",
                                                               value.value):
            return False
    return True


def _multiple_choice(text: str) -> bool:
    return re.fullmatch(r"Answer: [A-D]\nReason: [A-Z][a-zA-Z0-9 ,']{0,60}\.", text) is not None


GRAMMAR_VALIDATORS = {
    "arithmetic": _arithmetic,
    "json_value": _json_value,
    "csv_table": _csv_table,
    "sql_select": lambda text: _SQL.fullmatch(text) is not None,
    "sexpr": _sexpr,
    "function_call": _function_call,
    "multiple_choice": _multiple_choice,
}

GRAMMAR_EXAMPLES = {
    "arithmetic": (["1 + 2", "(3 * 4) - 5 / 6", "((7))"], ["1+2", "1 +", "01 + 2"]),
    "json_value": (['{"a": [1, true, null]}', '"x y"', "-0.5"], ['{"a":1}', "[1,]", "tru"]),
    "csv_table": (["name,age,city\nAnn,31,New York\n"], ["name,age,city\n", "name,age\nAnn,3\n"]),
    "sql_select": (["SELECT a, b FROM t WHERE a >= 3 LIMIT 10;", "SELECT * FROM users;"],
                   ["SELECT FROM t;", "select * from t;"]),
    "sexpr": (["(add 1 (mul 2 -3))", "(f)"], ["(1 2)", "(add 1", "(add  1)"]),
    "function_call": (['search(query="cats", limit=5)', "get_weather()"],
                      ["search(cats)", "delete(city=1)", "search(size=1)"]),
    "multiple_choice": (["Answer: B\nReason: It is the only prime."],
                        ["Answer: E\nReason: No.", "Answer: A\nReason: no capital."]),
}


def grammar_ok(name: str, text: str) -> bool:
    try:
        return bool(GRAMMAR_VALIDATORS[name](text))
    except (SyntaxError, ValueError, IndexError):
        return False
