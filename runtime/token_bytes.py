"""A token's own bytes, for OpenAI's logprobs (`bytes`, and a `token` text that keeps them).

OpenAI's `bytes` field exists so that clients can join tokens back into text, characters split
over tokens included. A token decoded on its own is not that: one holding part of a UTF-8
character (an emoji over byte-level BPE tokens, a SentencePiece byte-fallback ``<0xF0>``)
decodes to U+FFFD, and a SentencePiece ``▁c`` to "c" where it adds " c" to a text. Here a
token's text is what it adds after another token, and where that holds U+FFFD its bytes are
read from the vocabulary piece (the GPT-2 byte alphabet of byte-level BPE, or ``<0xNN>``).
"""

from __future__ import annotations

import functools
import re
import weakref
from typing import Any

from .detokenize import REPLACEMENT_CHAR

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's `bytes_to_unicode`), inverted.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes map to U+0100 onwards."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF_CHAR = _gpt2_byte_alphabet()


def _piece_bytes(piece: str) -> bytes | None:
    """The bytes a vocabulary piece stands for, when it is a byte-fallback or byte-level one."""
    match = _BYTE_PIECE.fullmatch(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    try:
        return bytes(_BYTE_OF_CHAR[c] for c in piece)
    except KeyError:
        return None


class TokenBytes:
    """Token id -> the bytes that token adds to a text, for one tokenizer (cached).

    A token is decoded after an anchor token (``a``) and the anchor's text cut off, as
    incremental detokenizers do: a SentencePiece ``▁c`` adds " c" inside a text although it
    decodes to "c" alone. Where that text holds U+FFFD the vocabulary piece gives the bytes.
    """

    def __init__(self, tokenizer: Any, cache_size: int = 1 << 16):
        # weak: _BY_TOKENIZER's values must not keep their keys alive
        self._tokenizer_ref = weakref.ref(tokenizer)
        anchor = tokenizer.encode("a", add_special_tokens=False)[:1]
        self._anchor = anchor
        self._anchor_text = self._decode(anchor) if anchor else ""
        self.of = functools.lru_cache(maxsize=cache_size)(self._bytes)

    @property
    def _tokenizer(self) -> Any:
        return self._tokenizer_ref()

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False,
                                      clean_up_tokenization_spaces=False)

    def _text(self, token_id: int) -> str:
        with_anchor = self._decode([*self._anchor, token_id])
        if self._anchor and with_anchor.startswith(self._anchor_text):
            return with_anchor[len(self._anchor_text):]
        return self._decode([token_id])

    def _bytes(self, token_id: int) -> bytes:
        text = self._text(int(token_id))
        if REPLACEMENT_CHAR not in text:
            return text.encode("utf-8")
        piece = self._tokenizer.convert_ids_to_tokens(int(token_id))
        raw = _piece_bytes(piece) if isinstance(piece, str) else None
        # A piece read with the wrong alphabet decodes to other characters: not used then.
        if raw is not None and (raw.decode("utf-8", "replace").replace(REPLACEMENT_CHAR, "")
                                == text.replace(REPLACEMENT_CHAR, "")):
            return raw
        return text.encode("utf-8")


_BY_TOKENIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_bytes(tokenizer: Any) -> TokenBytes:
    """The (shared, cached) TokenBytes of `tokenizer`."""
    found = _BY_TOKENIZER.get(tokenizer)
    if found is None:
        found = _BY_TOKENIZER[tokenizer] = TokenBytes(tokenizer)
    return found


def token_display(raw: bytes) -> str:
    """The token's text with the bytes that are not whole characters written as ``\\xNN`` (as
    DeepSeek's OpenAI-compatible API shows them): distinct partial tokens stay distinct, and
    nothing reads as U+FFFD that the token does not hold."""
    return raw.decode("utf-8", "backslashreplace")
