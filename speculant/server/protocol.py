"""Request bodies of the OpenAI-compatible API, validated by pydantic.

Models are strict (no "5" -> 5 coercion) so a wrong type is a 400 naming the field, as the OpenAI
API does. Every field a request may carry is declared here and an undeclared one is a 400 naming
it: ignoring a field (a response format, a penalty, tools) would silently change the meaning of
the request. Declared OpenAI fields this engine cannot honour in some values (echo, best_of > 1) are refused in `unsupported()`.
`null` means the same as leaving a field out.

Extensions beyond the OpenAI schema: `top_k`, `min_p`, `ignore_eos`, `stop_token_ids`, `num_draft_tokens`,
`repetition_penalty`, `min_tokens` and the
constraints vLLM names (`guided_*`, `structured_outputs`: `structured_fields.py`) in requests
and a `speculation` object in responses (see `responses.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from speculant.server.structured_fields import GuidedFields, ResponseFormat

_SEED_MAX = 2**63 - 1
_INT64_MAX = 2**63 - 1
COMPLETION_MAX_TOKENS_DEFAULT = 16  # the OpenAI default for completions


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool | None = None


class _SamplingFields(GuidedFields):
    """Fields both endpoints share; ranges follow the OpenAI API reference."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None  # None: the served model (OpenAI requires it; curl users forget it)
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=_INT64_MAX)] | None = None  # -1 or 0 disable it (vLLM's spelling is -1)
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=0, le=_SEED_MAX)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None  # choices, each its own engine request
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=_INT64_MAX)]] | None = None
    num_draft_tokens: Annotated[int, Field(ge=0, le=_INT64_MAX)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=100.0)] | None = None  # vLLM's extension
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None  # token id (as text) -> bias
    min_tokens: Annotated[int, Field(ge=0, le=_INT64_MAX)] | None = None  # vLLM's extension
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported(self) -> tuple[str, str] | None:
        """(field, reason) for the first parameter this server cannot honour, else None."""
        return None


TokenIds = list[Annotated[int, Field(ge=0, le=_INT64_MAX)]]


class CompletionRequest(_SamplingFields):
    prompt: str | TokenIds | list[str] | list[TokenIds]
    max_tokens: Annotated[int, Field(ge=1, le=_INT64_MAX)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # N: the chosen token + N alternatives
    echo: bool | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "best_of > 1 is not supported"
        return super().unsupported()

    @property
    def output_limit(self) -> int:
        return self.max_tokens if self.max_tokens is not None else COMPLETION_MAX_TOKENS_DEFAULT

    def single_prompt(self) -> str | list[int]:
        """The one prompt; a batch of several prompts is a 400 (one request per prompt)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ValueError(
                    "prompt: batch prompts are not supported; send one prompt per request"
                )
            prompt = prompt[0]
        return prompt


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None  # an assistant's earlier calls, sent back after a tool round
    tool_call_id: str | None = None  # a tool message: the call it answers
    refusal: str | None = None  # an assistant's earlier refusal

    def template_dict(self) -> dict:
        """What the chat template sees: plain-text content, and tool calls and ids when set."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": self.role, "content": content or self.refusal or ""}
        for key in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, le=_INT64_MAX)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=_INT64_MAX)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: ResponseFormat | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs requires logprobs to be true"
        return super().unsupported()

    @property
    def max_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def output_limit(self) -> int | None:
        """max_completion_tokens supersedes the deprecated max_tokens, as in the OpenAI API."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


# ---- responses ------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Speculation(BaseModel):
    """Extension: this request's speculation figures (all zero when speculation is off)."""

    draft_tokens: int  # tokens proposed for this request
    accepted_tokens: int  # of those, accepted by the target
    acceptance_rate: float  # accepted_tokens / draft_tokens
    tau: float  # tokens emitted per target forward, bonus included


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    text_offset: list[int]  # characters into the completion text where each token starts
    top_logprobs: list[dict[str, float]] | None = None  # with logprobs > 0: token -> logprob


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    """A whole completion, or (streaming) one chunk of it."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    speculation: Speculation | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]  # the token's own bytes, even when they are part of a UTF-8 character
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict] | None = None  # [{"id", "type": "function", "function": {"name", "arguments"}}]


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculation: Speculation | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, Any]  # {"role": "assistant"} first, then {"content": ...} or {"tool_calls": [...]}; {} at the end
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speculation: Speculation | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "speculant"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
