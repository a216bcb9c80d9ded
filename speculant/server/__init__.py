"""The OpenAI-compatible HTTP server: `run_server(config, host, port)` or `speculant serve`.

async_engine.py  the engine on its own thread, fed and drained from asyncio
app.py           FastAPI routes: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics
protocol.py      request and response bodies (OpenAI shapes plus the `speculation` extension)
responses.py     engine deltas -> response bodies and stream chunks
streaming.py     server-sent events, and aborting requests whose client went away
metrics.py       Prometheus metrics, speculation counters included
errors.py        errors in the OpenAI shape
options.py       the server's options: limits, API key, CORS, docs, drain
limits.py        body size and read timeouts, request-head timeout
auth.py          Bearer API key on /v1/
prompts.py       tokenization and chat templates in HTTP-side threads
token_bytes.py   each token's exact bytes, for logprobs
runner.py        uvicorn with a graceful drain on SIGTERM / SIGINT
"""

from __future__ import annotations

from speculant.server.app import create_app
from speculant.server.async_engine import AsyncEngine
from speculant.server.options import ServerOptions
from speculant.server.runner import build_server, run_server

__all__ = ["AsyncEngine", "ServerOptions", "build_server", "create_app", "run_server"]
