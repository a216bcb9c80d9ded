"""Bearer-token authentication for the API routes (`--api-key` / SPECULANT_API_KEY).

/health, /metrics and /version stay open (probes and scrapers carry no key); every /v1/ route,
/tokenize and /detokenize need `Authorization: Bearer <key>`, compared in constant time. A miss is a 401 in the OpenAI shape.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from speculant.server.errors import APIError

_PROTECTED = ("/v1/", "/tokenize", "/detokenize")


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, api_key: str, record_error: Callable[[str], None]) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.record_error = record_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_PROTECTED) and not self._authorized(scope):
            self.record_error("invalid_api_key")
            error = APIError(
                401,
                "Incorrect or missing API key: send `Authorization: Bearer <key>`",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return hmac.compare_digest(given, self.expected)
