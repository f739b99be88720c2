from __future__ import annotations

import functools

import pytest
from helpers.tiny_models import make_tiny_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixflow.runtime.detokenize import (
    PROMPT_CONTEXT_TOKENS,
    TEXT_LENS_KEPT,
    Detokenizer,
    IncrementalDetokenizer,
    decode_token_texts,
)
from radixflow.runtime.messages import (
    DecodeSpec,
    Finish,
    FlushCacheDone,
    ReqTokenOut,
    TokenBatchOut,
)


@functools.lru_cache(maxsize=1)
def tokenizer():
    return make_tiny_tokenizer()


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def decode(tok, ids, skip_special_tokens: bool = True) -> str:
    return tok.decode(
        ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


def stream(detok: IncrementalDetokenizer, ids: list[int], chunk_sizes=(1,)) -> list[str]:
    """Append `ids` in chunks; check the text only grows by the returned deltas."""
    deltas, pos, turn = [], 0, 0
    while pos < len(ids):
        size = chunk_sizes[turn % len(chunk_sizes)]
        before = detok.text
        delta = detok.append(ids[pos : pos + size])
        assert detok.text == before + delta
        deltas.append(delta)
        pos, turn = pos + size, turn + 1
    return deltas


def earliest_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    found = [(text.find(s), len(s), s) for s in stops if s in text]
    return (min(found)[0], min(found)[2]) if found else None


# Byte-level BPE trained on English: accents, CJK and emoji split into partial-UTF-8 tokens.
PIECES = [
    "é",
    "ü",
    "中文",
    "😀",
    "👍🏽",
    "🇫🇷",
    "\u200d",
    "ß",
    " the",
    " capital",
    "\n",
    "<|im_end|>",
    "STOP",
    "##",
    "\ufffd",
]
texts = st.lists(
    st.one_of(st.text(max_size=6), st.sampled_from(PIECES)), min_size=0, max_size=12
).map("".join)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(text=texts, chunk_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_streamed_text_equals_full_decode(text, chunk_sizes):
    tok = tokenizer()
    ids = encode(tok, text)
    detok = IncrementalDetokenizer(tok)
    deltas = stream(detok, ids, chunk_sizes)
    final = detok.finish()
    assert final == decode(tok, ids)
    assert final.startswith("".join(deltas))
    assert detok.text == final and detok.matched_stop is None


@SETTINGS
@given(
    text=texts,
    data=st.data(),
    no_stop_trim=st.booleans(),
    chunk_sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3),
)
def test_stop_strings_cut_at_the_earliest_occurrence(text, data, no_stop_trim, chunk_sizes):
    tok = tokenizer()
    ids = encode(tok, text)
    full = decode(tok, ids)
    stops = []
    for _ in range(data.draw(st.integers(1, 3))):
        if full and data.draw(st.booleans()):  # a substring of the output, so it does occur
            lo = data.draw(st.integers(0, len(full) - 1))
            hi = data.draw(st.integers(lo + 1, min(len(full), lo + 4)))
            stops.append(full[lo:hi])
        else:
            stops.append(data.draw(st.text(min_size=1, max_size=3)))
    detok = IncrementalDetokenizer(tok, stop=stops, no_stop_trim=no_stop_trim)
    stream(detok, ids, chunk_sizes)
    hit = earliest_stop(full, stops)
    if hit is None:
        assert detok.matched_stop is None
        assert detok.finish() == full
        return
    start, stop = hit
    want = full[: start + len(stop)] if no_stop_trim else full[:start]
    # A real U+FFFD ending the output looks like an unfinished character until finish().
    if not stop.endswith("\ufffd"):
        assert detok.matched_stop == stop
        assert detok.text == want  # known as soon as the stop string is complete
        assert detok.append(encode(tok, "more text")) == "" and detok.text == want
    assert detok.finish() == want
    assert detok.matched_stop == stop


def test_stop_string_spanning_tokens_is_held_back_then_cut():
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok, stop=["capital of"])
    chunks = [encode(tok, "Paris is the")] + [[i] for i in encode(tok, " capital of France")]
    seen = []
    for chunk in chunks:
        seen.append(detok.append(chunk))
        assert "capital" not in detok.text
    assert detok.matched_stop == "capital of"
    assert detok.finish() == "Paris is the "
    assert "".join(seen) == "Paris is the "


def test_a_broken_stop_prefix_is_released():
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok, stop=["world!"])
    detok.append(encode(tok, "hello wor"))
    assert detok.text == "hello "  # "wor" may still become "world!"
    detok.append(encode(tok, "ld"))
    assert detok.text == "hello "
    assert detok.append(encode(tok, "?")) == "world?"
    detok.append(encode(tok, " worl"))
    assert detok.finish() == "hello world? worl" and detok.matched_stop is None


def test_earliest_stop_wins_even_when_a_later_one_completes_first():
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok, stop=["c", "abcd"])
    for char in "xxabcdyy":
        detok.append(encode(tok, char))
    assert detok.matched_stop == "abcd" and detok.finish() == "xx"


def test_incomplete_utf8_is_held_back_until_complete():
    tok = tokenizer()
    ids = encode(tok, "a😀")
    assert len(ids) > 2 and decode(tok, ids[:-1]).endswith("\ufffd")
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.append([i]) for i in ids]
    assert deltas[0] == "a" and all(d == "" for d in deltas[1:-1]) and deltas[-1] == "😀"
    assert "\ufffd" not in detok.text


def test_finish_flushes_an_unfinished_character():
    tok = tokenizer()
    ids = encode(tok, "ok中")[:-1]
    detok = IncrementalDetokenizer(tok)
    stream(detok, ids)
    assert detok.text == "ok"
    assert detok.finish() == decode(tok, ids) and detok.finish().endswith("\ufffd")


def test_special_tokens_skipped_or_kept():
    tok = tokenizer()
    ids = encode(tok, "Hi<|im_end|> there<|im_start|>")
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids
    skipped = IncrementalDetokenizer(tok)
    stream(skipped, ids)
    assert skipped.finish() == "Hi there"
    kept = IncrementalDetokenizer(tok, skip_special_tokens=False, stop=["<|im_start|>"])
    stream(kept, ids)
    assert kept.finish() == "Hi<|im_end|> there" and kept.matched_stop == "<|im_start|>"


def test_prompt_ids_are_context_only():
    tok = tokenizer()
    prompt, output = encode(tok, "The capital of"), encode(tok, " France is Paris é")
    detok = IncrementalDetokenizer(tok, prompt_ids=prompt)
    stream(detok, output)
    assert detok.finish() == decode(tok, prompt + output)[len(decode(tok, prompt)) :]
    assert detok.num_tokens == len(output)


def test_each_append_decodes_a_short_window():
    tok = tokenizer()
    windows = []

    class CountingTokenizer:
        def decode(self, ids, **kwargs):
            windows.append(len(ids))
            return tok.decode(ids, **kwargs)

    ids = encode(tok, "The quick brown fox jumps over the lazy dog. " * 20)
    detok = IncrementalDetokenizer(CountingTokenizer(), stop=["zebra"])
    stream(detok, ids)
    assert detok.finish() == decode(tok, ids)
    assert len(ids) > 100 and max(windows) <= 4


def test_decode_token_texts():
    tok = tokenizer()
    ids = encode(tok, "Hi é<|im_end|>")
    texts = decode_token_texts(tok, ids)
    assert texts == [decode(tok, [i], skip_special_tokens=False) for i in ids]
    assert "<|im_end|>" in texts and "\ufffd" in texts
    assert decode_token_texts(tok, []) == []


@pytest.mark.e2e
def test_default_model_tokenizer(default_model_path):
    from radixflow.runtime.model_loader.hf_folder import load_tokenizer

    tok = load_tokenizer(default_model_path)
    text = "Bonjour! Ça va? 日本語のテキスト 😀👍🏽 — done.\n```python\nprint('ok')\n```"
    ids = encode(tok, text)
    detok = IncrementalDetokenizer(tok)
    stream(detok, ids)
    assert detok.finish() == decode(tok, ids)
    detok = IncrementalDetokenizer(tok, stop=["テキスト"])
    stream(detok, ids + [tok.eos_token_id])
    assert detok.matched_stop == "テキスト"
    assert detok.finish() == "Bonjour! Ça va? 日本語の"


# ---- stop_regex ----


def regex_pattern(full: str, data) -> str:
    """A regex that occurs in `full` (or not): escaped characters with some '.' wildcards."""
    import regex

    if full and data.draw(st.booleans()):
        lo = data.draw(st.integers(0, len(full) - 1))
        piece = full[lo : data.draw(st.integers(lo + 1, min(len(full), lo + 4)))]
    else:
        piece = data.draw(st.text(min_size=1, max_size=3))
    return "".join("." if i and data.draw(st.booleans()) else regex.escape(c)
                   for i, c in enumerate(piece))


@SETTINGS
@given(text=texts, data=st.data(), no_stop_trim=st.booleans(),
       chunk_sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_stop_regex_cuts_at_a_match_and_streams_only_what_stays(text, data, no_stop_trim,
                                                                 chunk_sizes):
    import regex

    tok = tokenizer()
    ids = encode(tok, text)
    full = decode(tok, ids)
    patterns = [regex_pattern(full, data) for _ in range(data.draw(st.integers(1, 2)))]
    detok = IncrementalDetokenizer(tok, stop_regex=patterns, no_stop_trim=no_stop_trim)
    seen = []
    pos, turn = 0, 0
    while pos < len(ids):
        size = chunk_sizes[turn % len(chunk_sizes)]
        detok.append(ids[pos : pos + size])
        seen.append(detok.text)
        pos, turn = pos + size, turn + 1
    final = detok.finish()
    assert all(final.startswith(s) for s in seen)  # nothing streamed is cut later
    if detok.matched_stop is None:
        assert final == full
        assert not any(regex.search(p, full) for p in patterns)
        return
    assert detok.matched_stop in patterns
    start = len(final)
    if no_stop_trim:  # the kept match ends the text
        m = next(m for m in regex.finditer(detok.matched_stop, final, overlapped=True)
                 if m.end() == len(final))
        start = m.start()
    assert full.startswith(final[:start])
    assert regex.match(detok.matched_stop, full, pos=start) is not None
    # The cut is at the first match to appear: none ends before it in the text kept.
    assert not any(regex.search(p, final[:start]) for p in patterns)


@SETTINGS
@given(text=texts, data=st.data(), chunk_sizes=st.lists(st.integers(1, 3), min_size=1,
                                                        max_size=3))
def test_an_escaped_stop_regex_is_a_stop_string(text, data, chunk_sizes):
    import regex

    tok = tokenizer()
    ids = encode(tok, text)
    full = decode(tok, ids)
    stop = data.draw(st.sampled_from([full[i : i + 3] for i in range(len(full))] or ["x"]))
    by_string = IncrementalDetokenizer(tok, stop=[stop])
    by_regex = IncrementalDetokenizer(tok, stop_regex=[regex.escape(stop)])
    assert stream(by_string, ids, chunk_sizes) == stream(by_regex, ids, chunk_sizes)
    assert by_string.finish() == by_regex.finish()
    assert (by_string.matched_stop is None) == (by_regex.matched_stop is None)


def test_stop_regex_holds_back_a_possible_match_then_cuts():
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok, stop_regex=[r"\d+\."])
    for i in encode(tok, "The answer is 42. Done"):
        detok.append([i])
        assert "4" not in detok.text
    assert detok.matched_stop == r"\d+\."
    assert detok.finish() == "The answer is "
    kept = IncrementalDetokenizer(tok, stop_regex=[r"\d+\."], no_stop_trim=True)
    stream(kept, encode(tok, "The answer is 42. Done"))
    assert kept.finish() == "The answer is 42."


def test_a_regex_that_could_match_earlier_does_not_block_a_later_match():
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok, stop_regex=[r"x.*z", "c"])
    stream(detok, encode(tok, "ab x "))
    assert detok.text == "ab "  # "x ..." may still become a match of x.*z
    stream(detok, encode(tok, "c and z"))
    assert detok.matched_stop == "c" and detok.finish() == "ab x "


def test_a_stop_string_starting_earlier_wins_over_a_regex():
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok, stop=["abcd"], stop_regex=["c"])
    for char in "xxabcdyy":
        detok.append(encode(tok, char))
    assert detok.matched_stop == "abcd" and detok.finish() == "xx"


def test_a_stop_regex_too_slow_to_search_is_an_error(monkeypatch):
    from radixflow.runtime import stop_search

    monkeypatch.setattr(stop_search, "REGEX_TIMEOUT_S", 1e-7)
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok, stop_regex=[r"(a|aa)+b"])
    for _ in range(5):
        detok.append(encode(tok, "a" * 40))
    assert detok.error is not None and "(a|aa)+b" in detok.error
    assert detok.matched_stop is None and detok.finish() == "a" * 200


def test_spaces_between_special_tokens_reaches_the_tokenizer():
    tok = tokenizer()
    seen = []

    class RecordingTokenizer:
        def decode(self, ids, **kwargs):
            seen.append(kwargs.get("spaces_between_special_tokens"))
            return tok.decode(ids, **kwargs)

    ids = encode(tok, "Hi<|im_end|> there")
    for flag in (True, False):
        seen.clear()
        detok = IncrementalDetokenizer(RecordingTokenizer(), skip_special_tokens=False,
                                       spaces_between_special_tokens=flag)
        stream(detok, ids)
        # A fast tokenizer has no such option: the text is the same either way (as in SGLang).
        assert detok.finish() == "Hi<|im_end|> there"
        assert set(seen) == ({None} if flag else {False})


# ---- what the scheduler's stop checker tells the detokenizer ----


def test_a_stop_checker_knows_its_text_after_each_recent_token():
    tok = tokenizer()
    ids = encode(tok, "hello wor") + encode(tok, "ld?")
    detok = IncrementalDetokenizer(tok, stop=["world!"])
    lengths = []
    for i in ids:
        detok.append([i])
        lengths.append(len(detok.text))
    assert [detok.text_len_at(n + 1) for n in range(len(ids))] == lengths
    assert detok.text_len_at(0) == 0
    many = IncrementalDetokenizer(tok, stop=["zebra"])
    long_ids = encode(tok, "the cat sat on the mat " * 10)
    many.append(long_ids)  # one append: its last TEXT_LENS_KEPT tokens still count one by one
    for n in range(len(long_ids) - TEXT_LENS_KEPT + 1, len(long_ids) + 1):
        assert many.text_len_at(n) == len(decode(tok, long_ids[:n]))
    with pytest.raises(ValueError):
        many.text_len_at(1)


def test_finish_with_searches_the_tokens_that_ended_the_output():
    tok = tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = encode(tok, "Hi there") + [eos]
    checker = IncrementalDetokenizer(tok, stop=["<|im_"], skip_special_tokens=False)
    stream(checker, ids[:-1])  # the scheduler ends on the EOS before its stop check
    assert checker.finish_with(ids) == "Hi there" and checker.matched_stop == "<|im_"
    assert checker.matched_end == len("Hi there<|im_")
    assert checker.finish_with(ids) == "Hi there"  # again: the same


def first_output(rid: str, new_ids: list[int], **fields) -> ReqTokenOut:
    return ReqTokenOut(rid=rid, new_ids=new_ids, prompt_tokens=3, cached_tokens=0,
                       completion_tokens=len(new_ids), **fields)


def test_the_detokenizer_needs_no_announcement():
    tok = tokenizer()
    prompt, output = encode(tok, "The capital of"), encode(tok, " France is Paris é")
    detok = Detokenizer(tok)
    spec = DecodeSpec(context_ids=prompt[-PROMPT_CONTEXT_TOKENS:])
    texts, forward = detok.handle(TokenBatchOut(outputs=[
        first_output("a", output[:3], decode=spec)]))
    assert forward is None and texts[0].text == decode(tok, output[:3])
    texts, _ = detok.handle(TokenBatchOut(outputs=[
        first_output("a", output[3:], finish=Finish(type="length", length=9))]))
    assert texts[0].text == decode(tok, prompt + output)[len(decode(tok, prompt)):]
    assert detok.states == {}
    # nothing of a request follows its finish: a stray output is dropped, not kept
    assert detok.handle(TokenBatchOut(outputs=[first_output("a", [5])])) == ([], None)
    assert detok.states == {}


def test_the_detokenizer_cuts_where_the_scheduler_says():
    tok = tokenizer()
    ids = encode(tok, "Paris is the capital")
    detok = Detokenizer(tok)
    texts, _ = detok.handle(TokenBatchOut(outputs=[
        first_output("a", ids, decode=DecodeSpec(context_ids=[], skip_special_tokens=False),
                     text_len=5)]))
    assert texts[0].text == "Paris"
    passed = FlushCacheDone(success=True)
    assert detok.handle(passed) == ([], passed)
