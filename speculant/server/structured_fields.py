"""The request fields that constrain the output to a grammar, and the `StructuredOutput` they
ask for: OpenAI's `response_format` (`json_object`, `json_schema`) on chat, and the extensions vLLM
names (`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, or one
`structured_outputs` object with `json`, `regex`, `choice`, `grammar` or `json_object`) on both
endpoints. At most one may be set; the engine compiles it and a grammar that does not compile is
a 400 naming the field that carried it."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from speculant.sampling.structured import StructuredOutput


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # None: any JSON value
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs` object: exactly one of its fields."""

    model_config = ConfigDict(strict=True, extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class GuidedFields(BaseModel):
    """Mixed into both endpoints' request bodies."""

    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputsField | None = None


def requested_structure(body: GuidedFields) -> tuple[StructuredOutput | None, str | None]:
    """(the constraint, the field that set it); ValueError naming the field when two fields set
    one or a value is malformed."""
    found = [(field, so) for field, so in _candidates(body) if so is not None]
    if len(found) > 1:
        raise ValueError(f"{found[1][0]}: only one of {', '.join(f for f, _ in found)} may constrain the output")
    return found[0][::-1] if found else (None, None)


def _candidates(body: GuidedFields):
    response_format = getattr(body, "response_format", None)
    if response_format is not None:
        yield "response_format", _checked("response_format", lambda: _from_response_format(response_format))
    yield "guided_json", _checked("guided_json", lambda: _schema(body.guided_json))
    yield "guided_regex", _checked("guided_regex", lambda: _plain("regex", body.guided_regex))
    yield "guided_choice", _checked("guided_choice", lambda: _choice(body.guided_choice))
    yield "guided_grammar", _checked("guided_grammar", lambda: _plain("grammar", body.guided_grammar))
    so = body.structured_outputs
    if so is not None:
        picked = [s for s in (_schema(so.json_), _plain("regex", so.regex), _choice(so.choice), _plain("grammar", so.grammar),
                              StructuredOutput("json_object") if so.json_object else None) if s is not None]  # fmt: skip
        if len(picked) != 1:
            raise ValueError("structured_outputs: set exactly one of json, regex, choice, grammar, json_object")
        yield "structured_outputs", picked[0]


def _checked(field: str, build):
    try:
        return build()
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


def _from_response_format(rf: ResponseFormat) -> StructuredOutput | None:
    if rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredOutput("json_object")
    if rf.json_schema is None:
        raise ValueError("type json_schema needs a json_schema object")
    schema = rf.json_schema.schema_
    return StructuredOutput.json_schema(schema if schema is not None else {})


def _schema(value: dict | str | None) -> StructuredOutput | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("the JSON schema is not valid JSON") from None
    return StructuredOutput.json_schema(value)


def _plain(kind: str, value: str | None) -> StructuredOutput | None:
    return None if value is None else StructuredOutput(kind, value)


def _choice(value: list[str] | None) -> StructuredOutput | None:
    return None if value is None else StructuredOutput.choice(value)


__all__ = ["GuidedFields", "ResponseFormat", "requested_structure"]
