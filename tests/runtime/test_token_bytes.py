"""Each token's own bytes (runtime/token_bytes.py): joined, a text's tokens give the text back,
characters split over several tokens included, for byte-level BPE and SentencePiece vocabs."""

from __future__ import annotations

import gc
import weakref

import pytest
from helpers.test_assets import load_tokenizer
from helpers.tiny_models import make_tiny_tokenizer

from radixflow.runtime.token_bytes import REPLACEMENT_CHAR, TokenBytes, token_bytes, token_display

TEXT = "Hi 😀 café 中文 👩‍👦!"


@pytest.mark.parametrize("name, dummy_prefix", [
    ("tiny", ""),  # byte-level BPE without merges: every byte of an emoji is a token
    ("llama3", ""), ("qwen3", ""),  # byte-level BPE: some emoji whole, some split
    ("mistral", " "),  # SentencePiece with byte fallback (<0xF0>) and "▁" spaces
])
def test_joined_token_bytes_are_the_text(name, dummy_prefix):
    tok = make_tiny_tokenizer() if name == "tiny" else load_tokenizer(name)
    ids = tok.encode(TEXT, add_special_tokens=False)
    raws = [token_bytes(tok).of(i) for i in ids]
    assert b"".join(raws) == (dummy_prefix + TEXT).encode()
    partial = [r for r in raws if REPLACEMENT_CHAR in r.decode("utf-8", "replace")]
    assert partial, "the text should split a character over tokens"
    shown = [token_display(r) for r in raws]
    assert not any(REPLACEMENT_CHAR in s for s in shown)
    assert all("\\x" in token_display(r) for r in partial)


def test_special_tokens_and_spaces_keep_their_text():
    tok = make_tiny_tokenizer()
    bytes_of = token_bytes(tok)
    assert bytes_of.of(tok.eos_token_id) == tok.eos_token.encode()
    (space_ca, *_) = tok.encode(" ca", add_special_tokens=False)
    assert bytes_of.of(space_ca).startswith(b" ")
    assert token_bytes(tok) is bytes_of  # one cache per tokenizer


def test_piece_in_another_alphabet_is_not_trusted():
    """A vocabulary whose pieces are not GPT-2's byte alphabet: the decoded text is kept."""

    class Odd:
        def encode(self, text, add_special_tokens=False):
            return [0]

        def decode(self, ids, **kwargs):
            return "".join({0: "a", 1: "x" + REPLACEMENT_CHAR}[i] for i in ids)

        def convert_ids_to_tokens(self, i):
            return "ĠðŁ"  # would read as b" \xf0\x9f": not what the token decodes to

    odd = Odd()
    assert TokenBytes(odd).of(1) == ("x" + REPLACEMENT_CHAR).encode()


def test_the_cache_does_not_keep_a_tokenizer_alive():
    tok = make_tiny_tokenizer()
    token_bytes(tok).of(5)
    gone = weakref.ref(tok)
    del tok
    gc.collect()
    assert gone() is None
