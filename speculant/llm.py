"""The offline Python API: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

from tqdm import tqdm

from speculant.config import EngineConfig
from speculant.config_options import engine_options, resolve_engine_config
from speculant.core import RequestOutput
from speculant.engine.engine import Engine
from speculant.sampling.params import SamplingParams

Prompt = str | list[int]


class LLM:
    """An engine over one model: `LLM(model, **engine options)` or `LLM(config=EngineConfig(...))`.

    The engine options are the fields of `EngineConfig` (see `speculant.config_options`):
    `dtype`, `device`, `speculative`, `draft_model`, `num_draft_tokens`, `ngram_max_n`,
    `page_size`, `kv_cache_bytes`, `max_num_seqs`, ...; `inspect.signature(LLM)` lists them all
    with their defaults. `checkpoint` / `draft_checkpoint` pass weights already in memory.
    """

    user = "local"  # the offline API serves one user: its requests share cross-request state (the n-gram store)

    def __init__(
        self,
        model: str | None = None,
        *,
        config: EngineConfig | None = None,
        checkpoint=None,
        draft_checkpoint=None,
        **options: Any,
    ) -> None:
        if model is not None:
            options["model"] = model
        self.config = resolve_engine_config(config, options)
        self.engine = Engine(self.config, checkpoint=checkpoint, draft_checkpoint=draft_checkpoint)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One finished output per prompt, in prompt order."""
        prompts = _as_list(prompts)
        params_list = list(params) if isinstance(params, Sequence) else [params or self.engine.default_params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"params: got {len(params_list)} for {len(prompts)} prompts")
        for p, sp in zip(prompts, params_list):  # validate everything before running anything
            self.engine.check_request(p, sp)
        pending = iter(zip(prompts, params_list))
        ids: list[str] = []
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(prompts), disable=not use_tqdm, desc="generate") as bar:
            while len(done) < len(prompts):
                self._fill_queue(pending, ids)
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        return [done[i] for i in ids]

    def _fill_queue(self, pending, ids: list[str]) -> None:
        """Add requests while the waiting queue has room (it is bounded for servers)."""
        room = self.config.scheduler.max_waiting - len(self.engine.scheduler.waiting)
        for _ in range(room):
            item = next(pending, None)
            if item is None:
                return
            ids.append(self.engine.add_request(*item, user=self.user).request_id)

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Yield this request's output after every step that adds to it, the last one finished."""
        request_id = self.engine.add_request(prompt, params, user=self.user).request_id
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == request_id and (out.new_token_ids or out.finished):
                        yield out
                        if out.finished:
                            return
        finally:
            self.engine.abort_request(request_id)

    def chat(
        self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        return self.generate([self.apply_chat_template(c) for c in conversations], params)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, messages)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (they also stop when the process exits)."""
        self.engine.close()

    def stats(self) -> dict:
        stats = self.engine.stats.as_dict()
        stats["kv_pages_total"] = self.engine.num_pages
        stats["kv_pages_used"] = self.engine.pages.allocator.num_used
        stats.update(self.engine.proposer.stats())
        stats.update(self.engine.timeline.as_dict())  # host-stage time, and how much of it overlap hid
        stats["memory"] = self.engine.memory.as_dict()  # the memory plan: bytes by item, with "total"
        return stats


def _init_signature() -> inspect.Signature:
    """`LLM.__init__` with every engine option spelled out, for `help(LLM)` and editors."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for opt in engine_options():
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if opt.name == "model" else kw
        annotation = " | ".join([t.__name__ for t in opt.types] + ["None"] * opt.optional)
        params.append(inspect.Parameter(opt.name, kind, default=opt.default, annotation=annotation))
    params.sort(key=lambda p: p.kind)  # `model` stays the one positional argument
    params += [inspect.Parameter(n, kw, default=None) for n in ("config", "checkpoint", "draft_checkpoint")]
    return inspect.Signature(params, return_annotation="None")


LLM.__init__.__signature__ = _init_signature()


def chat_prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """Token ids of a conversation under the model's chat template, ready for the reply.

    Shared by `LLM.chat` and the server so both build exactly the same prompt.
    """
    if not messages:
        raise ValueError("messages must not be empty")
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("messages: this model has no chat template")
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _as_list(prompts) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], int):
        return [prompts]
    return list(prompts)
