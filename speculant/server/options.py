"""The HTTP server's own options (the engine's live in `speculant.config`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <api_key>`
    allowed_origins: tuple[str, ...] = ()  # CORS origins; none by default ("*" allows any)
    enable_docs: bool = False  # serve /docs, /redoc and /openapi.json
    max_body_bytes: int = 4 << 20  # a larger request body is a 413
    header_timeout_s: float = 10.0  # a connection must send a request head within this
    body_timeout_s: float = 30.0  # ... and then its whole body within this
    max_connections: int | None = 512  # beyond this many, requests are answered 503
    drain_timeout_s: float = 30.0  # on SIGTERM/SIGINT, in-flight requests get this long
    tokenizer_threads: int = 2  # HTTP-side workers that tokenize prompts and render chats

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))
        if self.api_key == "":
            raise ValueError("api_key must not be empty")
        for name in ("max_body_bytes", "tokenizer_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
