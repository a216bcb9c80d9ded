"""The exact bytes of a token, for logprobs.

Decoding a token alone loses a partial UTF-8 character (it becomes U+FFFD), so the bytes come
from the token's vocabulary entry instead: byte-level BPE vocabularies (GPT-2's scheme: each
byte written as one printable character) are mapped back byte by byte, SentencePiece byte
tokens `<0xNN>` are that byte, and anything else falls back to the decoded text.
"""

from __future__ import annotations

import re

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """Character -> byte of the byte-level BPE alphabet: printable Latin-1 bytes stand for
    themselves, the other bytes for the characters from U+0100 upwards, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    alphabet = {chr(b): b for b in printable}
    alphabet.update({chr(0x100 + i): b for i, b in enumerate(others)})
    return alphabet


_ALPHABET = _byte_level_alphabet()


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
