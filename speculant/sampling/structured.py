"""What a request's output must match (structured outputs): plain data, checked for shape here;
the grammar itself is compiled and checked against the tokenizer by the engine
(`speculant.engine.grammar`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

# json_schema: a JSON schema (text); json_object: any JSON object (spec unused); regex: a regular
# expression; choice: a JSON list of strings, one of which is the whole output; grammar: a Lark grammar
KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    kind: str
    spec: str = ""  # the schema, regex, choices (JSON list) or grammar, as text

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured_output kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.spec, str):
            raise ValueError(f"structured_output spec must be text, got {type(self.spec).__name__}")
        if self.kind == "choice":
            choices = _json_or_none(self.spec)
            if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
                raise ValueError(f"structured_output choice must be a non-empty JSON list of strings, got {self.spec[:80]!r}")
        if self.kind == "json_schema" and not isinstance(_json_or_none(self.spec), dict | bool):
            raise ValueError(f"structured_output json_schema must be a JSON object, got {self.spec[:80]!r}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> StructuredOutput:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def choice(cls, choices: list[str]) -> StructuredOutput:
        return cls("choice", json.dumps(list(choices)))


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


__all__ = ["KINDS", "StructuredOutput"]
