"""/metrics: speculation counters agree exactly with the per-request `speculation` objects."""

from __future__ import annotations

import asyncio

import httpx
from server_helpers import MODEL, stream_sse

REQUESTS = [
    (
        "/v1/completions",
        {
            "prompt": "a b c a b c a b c a b c",
            "max_tokens": 24,
            "temperature": 0,
            "ignore_eos": True,
        },
    ),
    (
        "/v1/completions",
        {"prompt": "1 2 3 1 2 3 1 2 3", "max_tokens": 20, "temperature": 0.7, "seed": 3},
    ),
    (
        "/v1/completions",
        {"prompt": "the cat sat on the mat the cat", "max_tokens": 16, "num_draft_tokens": 1},
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x y x y x y"}], "max_tokens": 24},
    ),
]
SPEC_COUNTERS = (
    "speculant_spec_draft_steps_total",
    "speculant_spec_draft_tokens_total",
    "speculant_spec_accepted_tokens_total",
    "speculant_target_forwards_total",
    "speculant_emitted_tokens_total",
    "speculant_generation_tokens_total",
    "speculant_prompt_tokens_total",
)


def _sum_by_label(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(name + "{"))


def _run(url: str) -> list[tuple[dict, dict]]:
    """(usage, speculation) of each request, run both plain and streamed, all at once."""

    async def one(
        client: httpx.AsyncClient, path: str, body: dict, stream: bool
    ) -> tuple[dict, dict]:
        body = {"model": MODEL, **body}
        if stream:
            result = await stream_sse(
                client, path, {**body, "stream_options": {"include_usage": True}}
            )
            final = next(
                e for e in result.events if e["choices"] and e["choices"][0]["finish_reason"]
            )
            return result.usage, final["speculation"]
        response = (await client.post(path, json=body)).json()
        return response["usage"], response["speculation"]

    async def run_all():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            jobs = [
                one(client, path, body, stream)
                for path, body in REQUESTS
                for stream in (False, True)
            ]
            return await asyncio.gather(*jobs)

    return asyncio.run(run_all())


def test_speculation_counters_agree_with_per_request_stats(ngram_server):
    before = ngram_server.metrics()
    results = _run(ngram_server.url)
    after = ngram_server.wait_for_metric("speculant_kv_pages_used", 0.0)
    delta = {name: after[name] - before[name] for name in SPEC_COUNTERS}

    draft = sum(spec["draft_tokens"] for _, spec in results)
    accepted = sum(spec["accepted_tokens"] for _, spec in results)
    generated = sum(usage["completion_tokens"] for usage, _ in results)
    assert draft > 0 and accepted > 0
    assert delta["speculant_spec_draft_tokens_total"] == draft
    assert delta["speculant_spec_accepted_tokens_total"] == accepted
    assert (
        delta["speculant_generation_tokens_total"]
        == delta["speculant_emitted_tokens_total"]
        == generated
    )
    assert delta["speculant_prompt_tokens_total"] == sum(
        usage["prompt_tokens"] for usage, _ in results
    )
    # tau = 1 + accepted / draft steps: the counters' tau is the draft-step-weighted mean of the
    # requests' taus, so it lies between the smallest and the largest of them
    tau = (
        1
        + delta["speculant_spec_accepted_tokens_total"] / delta["speculant_spec_draft_steps_total"]
    )
    taus = [spec["tau"] for _, spec in results]  # 1.0 where nothing was drafted
    assert min(taus) - 1e-9 <= tau <= max(taus) + 1e-9
    assert (
        delta["speculant_spec_draft_steps_total"]
        <= delta["speculant_target_forwards_total"]
        <= generated
    )
    # the by-position counters add up to the totals
    for by_position, total in (
        ("speculant_spec_accepted_by_position_total", "speculant_spec_accepted_tokens_total"),
        ("speculant_spec_proposed_by_position_total", "speculant_spec_draft_tokens_total"),
    ):
        assert (
            _sum_by_label(after, by_position) - _sum_by_label(before, by_position) == delta[total]
        )
    assert 'speculant_spec_accepted_by_position_total{position="2"}' in after
    chosen = _sum_by_label(after, "speculant_spec_chosen_k_total") - _sum_by_label(before, "speculant_spec_chosen_k_total")
    assert chosen >= delta["speculant_spec_draft_steps_total"] > 0  # every decode step's k, 0 included


def test_metrics_lists_latency_and_capacity(server):
    before = server.metrics()
    httpx.post(
        f"{server.url}/v1/completions",
        json={"model": MODEL, "prompt": "Hi", "max_tokens": 6},
        timeout=30,
    )
    after = server.metrics()
    assert (
        after["speculant_time_to_first_token_seconds_count"]
        == before.get("speculant_time_to_first_token_seconds_count", 0) + 1
    )
    assert after["speculant_inter_token_latency_seconds_count"] > before.get(
        "speculant_inter_token_latency_seconds_count", 0
    )
    assert (
        after["speculant_kv_pages_used"] + after["speculant_kv_pages_free"]
        == after["speculant_kv_pages_total"]
    )
    for name in (
        "speculant_requests_waiting",
        "speculant_requests_running",
        "speculant_request_latency_seconds_count",
    ):
        assert name in after


def test_metrics_report_the_memory_plan(server):
    metrics = server.metrics()
    plan = {k: v for k, v in metrics.items() if k.startswith("speculant_memory_plan_bytes{")}
    total = plan.pop('speculant_memory_plan_bytes{item="total"}')
    assert 'speculant_memory_plan_bytes{item="kv_cache"}' in plan
    assert 'speculant_memory_plan_bytes{item="target_weights"}' in plan
    assert total == sum(plan.values()) > 0
