from __future__ import annotations

import functools

import pytest
from helpers.tiny_models import make_tiny_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixflow.runtime.detokenize import IncrementalDetokenizer, decode_token_texts


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
