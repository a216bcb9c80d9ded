"""A request's sampling fields, and the checkpoint's generation_config.json defaults standing in
for the ones it leaves unset (as vLLM applies them)."""

from __future__ import annotations

from speculant.server.protocol import ChatCompletionRequest
from speculant.server.request_params import sampling_params


def _request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def test_the_checkpoints_defaults_fill_only_what_a_request_leaves_unset():
    defaults = {"temperature": 0.3, "top_k": 20, "top_p": 0.8}
    unset = sampling_params(_request(), 16, logprobs=False, top_logprobs=0, defaults=defaults)
    assert (unset.temperature, unset.top_k, unset.top_p) == (0.3, 20, 0.8)
    chosen = sampling_params(_request(temperature=0.0, top_p=1.0), 16, logprobs=False, top_logprobs=0, defaults=defaults)
    assert (chosen.temperature, chosen.top_k, chosen.top_p) == (0.0, 20, 1.0)
    plain = sampling_params(_request(), 16, logprobs=False, top_logprobs=0)
    assert plain.temperature == sampling_params(_request(), 16, logprobs=False, top_logprobs=0, defaults={}).temperature
