"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

FastAPI answers malformed bodies with 422 and its own shape; OpenAI clients expect 400 and this
one, so request validation errors are rewritten here.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from speculant.scheduler.scheduler import QueueFull
from speculant.server.request_stream import EngineDead, EngineFailed, ShuttingDown

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what a 429 suggests; the queue drains at the speed of a few steps


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str = "invalid_request",
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status,
            message,
            param,
            code,
            type,
        )
        self.headers = headers

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> Response:
        # ASCII JSON: a message may quote client text holding lone surrogates, which UTF-8 cannot carry.
        content = json.dumps(self.body(), separators=(",", ":"))
        return Response(content, self.status, self.headers, media_type="application/json")


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def from_engine_error(
    exc: BaseException, fields: set[str], prompt_field: str = "prompt"
) -> APIError:
    """Map what admission raised to an HTTP error. ValueError messages start with the field."""
    if isinstance(exc, QueueFull):
        return APIError(
            429,
            f"{exc}; retry later",
            code="queue_full",
            type="rate_limit_error",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if isinstance(exc, ShuttingDown):
        return APIError(503, str(exc), code="shutting_down", type="service_unavailable")
    if isinstance(exc, EngineDead):
        return APIError(503, str(exc), code="engine_unavailable", type="service_unavailable")
    if isinstance(exc, EngineFailed):
        return APIError(500, str(exc), code="engine_error", type="server_error")
    if isinstance(exc, ValueError):
        return bad_request(str(exc), _field_named(str(exc), fields, prompt_field))
    logger.exception("unexpected error while admitting a request", exc_info=exc)
    return APIError(500, "internal error", code="internal_error", type="server_error")


def _field_named(message: str, fields: set[str], prompt_field: str) -> str | None:
    first = message.split(" ", 1)[0].rstrip(":")
    if first == "prompt":
        return prompt_field
    return first if first in fields else None


def install_error_handlers(app: FastAPI, record_error) -> None:
    """`record_error(code)` counts each error response in the metrics."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        record_error(exc.code)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        err = _from_validation(exc)
        record_error(err.code)
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else "http_error"
        return APIError(exc.status_code, str(exc.detail), code=code).response()


def _from_validation(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return bad_request(
            f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(
                ": "
            )
        )
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if not loc:  # the body itself: missing, or not an object
        return bad_request(f"the request body must be a JSON object: {first.get('msg', '')}")
    param = loc[0]  # the top-level field; deeper parts name union members as often as fields
    if first.get("type") == "extra_forbidden":
        return bad_request(f"'{'.'.join(loc)}' is not supported", param)
    return bad_request(f"invalid value for '{param}': {first.get('msg', '')}", param)
