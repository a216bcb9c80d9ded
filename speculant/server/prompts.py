"""Prompts to token ids on the HTTP side, in a small thread pool.

Tokenizing a long prompt or rendering a chat template takes the time of many engine steps, so it
never runs on the engine thread: the engine admits token ids only. The pool has its own copy of
the tokenizer, so its work never shares state with the engine thread's detokenizing. Whatever
the text holds, a failure here is a 400 naming the field, never a 500.
"""

from __future__ import annotations

import asyncio
import copy
from concurrent.futures import ThreadPoolExecutor

from speculant.llm import chat_prompt_ids
from speculant.server.errors import APIError, bad_request
from speculant.server.request_stream import Chat


class PromptEncoder:
    def __init__(self, tokenizer, threads: int) -> None:
        self.tokenizer = copy.deepcopy(tokenizer)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="speculant-tokenize")

    async def encode(self, prompt: str | list[int] | Chat, field: str) -> list[int]:
        """Token ids of a prompt; raises APIError(400) with `param=field`."""
        if isinstance(prompt, list):
            return prompt  # ids are checked against the vocabulary at admission
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self._encode, prompt, field)

    async def decode(self, ids: list[int], field: str) -> str:
        """The text of token ids (special tokens kept); raises APIError(400) with `param=field`."""
        if self.tokenizer is None:
            raise bad_request(f"{field}: this model has no tokenizer", field)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self.tokenizer.decode, ids)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _encode(self, prompt: str | Chat, field: str) -> list[int]:
        if isinstance(prompt, Chat):
            for message in prompt.messages:
                for value in message.values():
                    _check_text(value, field)
        else:
            if not prompt:
                raise bad_request(f"{field} must not be empty", field)
            _check_text(prompt, field)
        if self.tokenizer is None:
            raise bad_request(f"{field}: this model has no tokenizer; send token ids", field)
        try:
            if isinstance(prompt, Chat):
                return chat_prompt_ids(self.tokenizer, prompt.messages, prompt.tools)
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        except APIError:
            raise
        except ValueError as exc:
            raise bad_request(str(exc) if str(exc).startswith(field) else f"{field}: {exc}", field) from None
        except Exception as exc:  # the chat template rejected the conversation (a jinja2 error)
            raise bad_request(f"{field} could not be rendered: {type(exc).__name__}: {exc}", field) from None


def _check_text(value: object, field: str) -> None:
    if not isinstance(value, str):
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = value[exc.start]
        raise bad_request(
            f"{field} contains a lone surrogate (U+{ord(char):04X} at character {exc.start}); "
            "send valid Unicode text",
            field,
        ) from None
