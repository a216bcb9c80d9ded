"""The exact bytes of a token, for logprobs.

Decoding a token alone loses a partial UTF-8 character (it becomes U+FFFD), so the bytes come
from the token's vocabulary entry instead: byte-level BPE vocabularies (GPT-2's scheme: each
byte written as one printable character) are mapped back byte by byte, SentencePiece byte
tokens `<0xNN>` are that byte, and anything else falls back to the decoded text.
"""

from __future__ import annotations

import re

from speculant.loader.gguf_tokenizer import byte_alphabet

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_ALPHABET = {char: byte for byte, char in byte_alphabet().items()}  # character -> byte


class TokenBytes:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        self.special = set(getattr(tokenizer, "all_special_ids", ()) or ())

    def __call__(self, token_id: int) -> bytes:
        if self.tokenizer is None:
            return b""
        piece = self._piece(token_id)
        if piece is not None and token_id not in self.special:
            if self.byte_level and all(c in _ALPHABET for c in piece):
                return bytes(_ALPHABET[c] for c in piece)
            match = _BYTE_TOKEN.fullmatch(piece)
            if match:
                return bytes([int(match.group(1), 16)])
        return self.tokenizer.decode([token_id]).encode("utf-8")

    def _piece(self, token_id: int) -> str | None:
        convert = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        piece = convert(token_id) if convert is not None else None
        return piece if isinstance(piece, str) else None


def token_text(data: bytes) -> str:
    """A token's text as OpenAI shows it: the characters, or `\\xNN` escapes for partial ones."""
    return data.decode("utf-8", errors="backslashreplace")
