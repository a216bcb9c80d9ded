"""Incremental detokenization: each step decodes a short window of recent tokens, not the whole
output, and the text equals what decoding the whole output at once gives.

The window starts a few tokens before the new ones (the prefix), because a token's text can
depend on its left neighbour (a leading-space marker, merged byte sequences); the new text is
what decoding the window adds to decoding its prefix. While that addition ends in U+FFFD (a
character whose UTF-8 bytes are split over tokens), the window is not advanced, so the character
is decoded whole once its last byte arrives; the text reported meanwhile ends in U+FFFD, exactly
as decoding the whole output would give (the output processor does not stream it).
"""

from __future__ import annotations

_REPLACEMENT = "\ufffd"
# Past this many uncommitted tokens, commit up to the last token boundary that is already final
# (steps can keep ending inside a character when its bytes come one token each).
MAX_PENDING_TOKENS = 8


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._committed = ""  # text of token_ids[:_read], final
        self._prefix = 0  # window start: token_ids[_prefix:_read] is context for the new tokens
        self._read = 0  # tokens whose text is committed
        self.text = ""  # text of all tokens seen: committed + a possibly partial tail

    def update(self, token_ids: list[int]) -> str:
        """The decoded text of `token_ids`, the whole output so far (grown since the last call)."""
        window = token_ids[self._prefix :]
        prefix_text = self._decode(window[: self._read - self._prefix])
        text = self._decode(window)
        tail_start = len(prefix_text)
        split = self._final_split(window, prefix_text, text)
        if split is not None:
            num_tokens, num_chars = split
            self._committed += text[tail_start:num_chars]
            self._prefix, self._read = self._read, self._prefix + num_tokens
            tail_start = num_chars
        self.text = self._committed + text[tail_start:]
        return self.text

    def _final_split(self, window: list[int], prefix_text: str, text: str) -> tuple[int, int] | None:
        """(tokens, characters) of the window whose text is final, or None to wait."""
        tail = text[len(prefix_text) :]
        if tail and not tail.endswith(_REPLACEMENT):
            return len(window), len(text)
        num_context = self._read - self._prefix
        pending = len(window) - num_context
        if pending <= MAX_PENDING_TOKENS:
            return None
        if not tail:  # tokens without text (skipped special tokens)
            return len(window), len(text)
        # Only a trailing U+FFFD can still change (its character may complete): a shorter window
        # whose text is a proper prefix of this text ends in characters that are final.
        for end in range(len(window) - 1, num_context, -1):
            part = self._decode(window[:end])
            if len(prefix_text) < len(part) < len(text) and text.startswith(part):
                return end, len(part)
        if pending > 4 * MAX_PENDING_TOKENS:
            # UTF-8 takes at most 4 bytes: an open character this many tokens long is split by
            # skipped special tokens, which no real text does; commit it as decoded.
            return len(window), len(text)
        return None

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)
