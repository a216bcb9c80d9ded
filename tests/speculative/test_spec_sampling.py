"""Speculative sampling through the engine reproduces the target's own distribution.

Tiny-vocabulary models (V = 16) make the exact law of the first generated tokens computable by
enumeration under the target alone. Token 1 comes from prefill; the first speculative step
(k = 2) emits tokens 2..4 (accepted drafts, then a recovered token, or the bonus token after a
full chain), so the joints of (x1, x2), (x2, x3) and (x3, x4) all depend on the acceptance rule
and the bonus choice. Every speculative step is observed through the request's counters:
  - each bonus token (a full chain accepted) must follow the target's law after its prefix;
  - first-position acceptances must match the exact rate sum_x min(p(x), q(x)) of each step's
    prefix (the greedy draft's q is one-hot: the rate is p(argmax q)), within binomial error.
Pearson chi-square at ALPHA with fixed seeds; deliberately broken rules (always accept; a bonus
drawn from the last draft position's distribution) must fail far below ALPHA.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pytest
import torch
from testkit import chi_square_pvalue, tiny_hf_model, tiny_llm

import speculant.engine.chain_verify as verify_module
import speculant.engine.engine as engine_module
from speculant import SamplingParams
from speculant.sampling.acceptance import AcceptResult, accept_drafts
from speculant.sampling.sampler import SamplingTensors, processed_probs
from speculant.speculative.adaptive import AdaptiveK

ALPHA = 1e-3
MAX_Z = 4.0  # acceptance-rate tolerance in binomial standard errors
VOCAB = 16
NUM_DRAFTS = 2
NUM_SAMPLES = 6000
PROMPT = [3, 5, 7]
TINY = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def models():
    target = tiny_hf_model("llama", seed=1, **TINY)
    with torch.no_grad():  # sharper laws that depend more on the context: a bonus drawn after the
        target.lm_head.weight.mul_(2.5)  # wrong prefix is then far from the right law
    return target, tiny_hf_model("llama", seed=7, num_hidden_layers=1, **TINY)


@dataclass
class SpecRun:
    tokens: torch.Tensor  # [N, NUM_DRAFTS + 2] generated tokens
    steps: list[tuple[tuple[int, ...], int]] = field(default_factory=list)  # (prefix, first draft accepted)
    bonuses: list[tuple[tuple[int, ...], int]] = field(default_factory=list)  # (prefix, bonus token)


def _last_probs(hf_model, prefixes: list[tuple[int, ...]], params: SamplingParams | None) -> torch.Tensor:
    """[n, V] processed next-token distributions (raw logits when params is None)."""
    out = torch.empty(len(prefixes), VOCAB)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prefixes):
        by_length.setdefault(len(p), []).append(i)
    for rows in by_length.values():
        with torch.no_grad():
            logits = hf_model(torch.tensor([prefixes[i] for i in rows])).logits[:, -1].float()
        st = SamplingTensors.from_params([params] * len(rows)) if params is not None else None
        out[rows] = logits if st is None else processed_probs(logits, st)
    return out


def exact_joints(hf_model, params: SamplingParams) -> list[torch.Tensor]:
    """P(x1, x2), P(x2, x3), P(x3, x4) under the target's own sampling, each flattened to [V * V]."""
    v = range(VOCAB)
    p1 = _last_probs(hf_model, [tuple(PROMPT)], params)[0]
    p2 = _last_probs(hf_model, [(*PROMPT, a) for a in v], params)
    p3 = _last_probs(hf_model, [(*PROMPT, a, b) for a in v for b in v], params).view(VOCAB, VOCAB, VOCAB)
    p4 = _last_probs(hf_model, [(*PROMPT, a, b, c) for a in v for b in v for c in v], params)
    joint123 = p1[:, None, None] * p2[:, :, None] * p3
    joint1234 = joint123[..., None] * p4.view(VOCAB, VOCAB, VOCAB, VOCAB)
    return [joint123.sum(2).reshape(-1), joint123.sum(0).reshape(-1), joint1234.sum((0, 1)).reshape(-1)]


def first_acceptance_rates(models, params: SamplingParams, draft_sampling: str, prefixes) -> torch.Tensor:
    """[n] sum_x min(p(x), q(x)) at each prefix: p the target's processed law, q the draft's."""
    target, draft = models
    p = _last_probs(target, prefixes, params)
    if draft_sampling == "sample":
        q = _last_probs(draft, prefixes, params)
    else:
        q = torch.nn.functional.one_hot(_last_probs(draft, prefixes, None).argmax(-1), VOCAB).float()
    return torch.minimum(p, q).sum(-1)


def sample_spec(models, params: SamplingParams, draft_sampling: str, **llm_options) -> SpecRun:
    target, draft = models
    llm = tiny_llm(target, draft, draft_sampling=draft_sampling, **{**SAMPLING_ENGINE, **llm_options})
    try:
        return run_samples(llm, params)
    finally:
        llm.close()


SAMPLING_ENGINE = dict(num_draft_tokens=NUM_DRAFTS, adaptive_k=False, seed=11, num_pages=4096, max_num_seqs=1024, max_num_batched_tokens=8192)


def run_samples(llm, params: SamplingParams) -> SpecRun:
    """NUM_SAMPLES generations of PROMPT, observing every speculative step."""
    engine, requests, run = llm.engine, [], SpecRun(torch.empty(0))

    def params_of(i: int) -> SamplingParams:  # a seeded case: request i has seed + i
        return params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)

    while len(requests) < NUM_SAMPLES or engine.has_unfinished():
        room = engine.config.scheduler.max_waiting - len(engine.scheduler.waiting)
        new = range(len(requests), len(requests) + min(room, NUM_SAMPLES - len(requests)))
        requests += [engine.add_request(PROMPT, params_of(i)) for i in new]
        before = {r: (r.spec_stats.draft_tokens, r.spec_stats.accepted_tokens, r.num_tokens) for r in engine.scheduler.running}
        engine.step()
        for r, counters in before.items():
            _observe(run, r, *counters)
    stats = llm.stats()
    assert stats["draft_steps"] == len(run.steps) > 0
    assert stats["acceptance_by_position"][0] == pytest.approx(sum(a for _, a in run.steps) / len(run.steps))
    run.tokens = torch.tensor([r.output_token_ids for r in requests])
    return run


def _observe(run: SpecRun, request, draft_tokens: int, accepted_tokens: int, num_tokens: int) -> None:
    """Record a speculative step of `request` from its counters before and after the step."""
    proposed = request.spec_stats.draft_tokens - draft_tokens
    if proposed == 0:
        return  # a plain step (prefill, or a batch mixing prefills)
    accepted = request.spec_stats.accepted_tokens - accepted_tokens
    tokens = request.all_token_ids
    run.steps.append((tuple(tokens[:num_tokens]), int(accepted > 0)))
    if accepted == proposed and len(tokens) == num_tokens + proposed + 1:  # bonus not cut by max_tokens
        run.bonuses.append((tuple(tokens[:-1]), tokens[-1]))


def bonus_pvalue(target, params: SamplingParams, bonuses: list[tuple[tuple[int, ...], int]]) -> float:
    """Chi-square of (token before the bonus, bonus) pairs; expected counts sum each bonus's own
    law after its prefix (Pearson on a sum of unequal categoricals is conservative)."""
    assert len(bonuses) >= 200, len(bonuses)  # enough full chains to test
    law = _last_probs(target, [p for p, _ in bonuses], params)  # [n, V]
    before = torch.tensor([p[-1] for p, _ in bonuses])
    expected = torch.zeros(VOCAB, VOCAB).index_add_(0, before, law) / len(bonuses)  # [V, V]
    return chi_square_pvalue(before * VOCAB + torch.tensor([b for _, b in bonuses]), expected.reshape(-1))


def p_values(models, params: SamplingParams, draft_sampling: str, **llm_options) -> dict[str, float]:
    run = sample_spec(models, params, draft_sampling, **llm_options)
    x = run.tokens
    pairs = [x[:, 0] * VOCAB + x[:, 1], x[:, 1] * VOCAB + x[:, 2], x[:, 2] * VOCAB + x[:, 3]]
    out = {f"x{i + 1}x{i + 2}": chi_square_pvalue(c, j) for i, (c, j) in enumerate(zip(pairs, exact_joints(models[0], params)))}
    out["bonus"] = bonus_pvalue(models[0], params, run.bonuses)
    rates = first_acceptance_rates(models, params, draft_sampling, [p for p, _ in run.steps])
    accepted = sum(a for _, a in run.steps)
    out["first_acceptance_z"] = (accepted - rates.sum().item()) / math.sqrt((rates * (1 - rates)).sum().item())
    return out


CASES = {
    "t1-sampled-draft": (SamplingParams(max_tokens=NUM_DRAFTS + 2, temperature=1.0, ignore_eos=True), "sample", "weak"),
    # A weak draft's argmax is rarely the target's choice: the target's own argmax drafts, so
    # that full chains (and bonus tokens) are frequent enough to test.
    "t0.7-topk-topp-greedy-self-draft": (
        SamplingParams(max_tokens=NUM_DRAFTS + 2, temperature=0.7, top_k=10, top_p=0.9, ignore_eos=True),
        "greedy",
        "self",
    ),
    "t0.7-minp-sampled-draft": (
        SamplingParams(max_tokens=NUM_DRAFTS + 2, temperature=0.7, min_p=0.05, ignore_eos=True),
        "sample",
        "weak",
    ),
}


def _case(models, name: str) -> tuple[tuple, SamplingParams, str]:
    """(target, draft) models, sampling params and draft sampling of a case."""
    params, draft_sampling, draft = CASES[name]
    target, weak = models
    return (target, target if draft == "self" else weak), params, draft_sampling


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_target(models, case):
    out = p_values(*_case(models, case))
    z = out.pop("first_acceptance_z")
    assert min(out.values()) > ALPHA and abs(z) < MAX_Z, (out, z)


def test_speculative_sampling_matches_target_at_tensor_parallel_2(models):
    """The target sharded over two ranks (gathered logits, summed partial products), the draft
    on the leader: the same law."""
    out = p_values(*_case(models, "t1-sampled-draft"), tensor_parallel_size=2)
    z = out.pop("first_acceptance_z")
    assert min(out.values()) > ALPHA and abs(z) < MAX_Z, (out, z)


def test_speculative_sampling_matches_target_with_adaptive_k(models, monkeypatch):
    """k chosen per request and step from the request's past outcomes keeps the target's law.
    The step cost is a fixed function (a step per request, a verified token 0.3 of one) so the
    choices, and the test, do not depend on the machine's load."""
    monkeypatch.setattr(AdaptiveK, "cost_of", lambda self, context, num_seqs: lambda ks: len(ks) + 0.3 * sum(k + 1 for k in ks))
    pair, params, draft_sampling = _case(models, "t0.7-topk-topp-greedy-self-draft")
    params = dataclasses.replace(params, max_tokens=NUM_DRAFTS + 3)  # room for a full chain after a plain step
    run_ks = []
    record_ks = engine_module.EngineStats.record_ks
    monkeypatch.setattr(engine_module.EngineStats, "record_ks", lambda self, ks: (run_ks.extend(ks), record_ks(self, ks)))
    out = p_values(pair, params, draft_sampling, adaptive_k=True)
    assert {1, 2} <= set(run_ks)  # k varied with the requests' outcomes
    z = out.pop("first_acceptance_z")
    assert min(out.values()) > ALPHA and abs(z) < MAX_Z, (out, z)


@pytest.mark.parametrize("draft_sampling", ["sample", "greedy"])
def test_seeded_speculative_sampling_matches_target(models, draft_sampling):
    """Seeded requests (each its own seed) take the keyed path: the target's own keyed samples,
    drafts accepted when equal. Their joints and bonus tokens follow the target's law."""
    params = SamplingParams(max_tokens=NUM_DRAFTS + 2, temperature=0.9, top_p=0.95, seed=1000, ignore_eos=True)
    target, weak = models  # greedy: the target's own argmax drafts, so full chains are frequent
    out = p_values((target, weak if draft_sampling == "sample" else target), params, draft_sampling)
    out.pop("first_acceptance_z")  # sum min(p, q) is the unseeded rule's rate, not the keyed one's
    assert min(out.values()) > ALPHA, out


def _always_accept(draft_token_ids, num_draft, draft_probs, target_probs, noise, positions, default_generator):
    """A broken rule: every draft is accepted, the bonus drawn from the target."""
    rows = torch.arange(draft_token_ids.shape[0])
    bonus = torch.multinomial(target_probs[rows, num_draft], 1, generator=default_generator)[:, 0]
    tokens = torch.cat([draft_token_ids, torch.full_like(bonus[:, None], -1)], dim=1)
    tokens[rows, num_draft] = bonus
    return AcceptResult(token_ids=tokens, num_emitted=num_draft + 1, num_accepted=num_draft.clone())


def _bonus_from_last_draft_position(draft_token_ids, num_draft, draft_probs, target_probs, noise, positions, default_generator):
    """A broken bonus: after a full chain, drawn from p at the last draft's position, not after it."""
    result = accept_drafts(draft_token_ids, num_draft, draft_probs, target_probs, noise, positions, default_generator)
    for b in torch.nonzero((result.num_accepted == num_draft) & (num_draft > 0))[:, 0].tolist():
        k = int(num_draft[b])
        result.token_ids[b, k] = torch.multinomial(target_probs[b, k - 1], 1, generator=default_generator)[0]
    return result


def test_broken_acceptance_rule_is_detected(models, monkeypatch):
    monkeypatch.setattr(verify_module, "accept_drafts", _always_accept)
    out = p_values(*_case(models, "t1-sampled-draft"))
    assert min(out["x1x2"], out["x2x3"]) < 1e-9 and out["first_acceptance_z"] > 10, out


def test_broken_bonus_is_detected(models, monkeypatch):
    monkeypatch.setattr(verify_module, "accept_drafts", _bonus_from_last_draft_position)
    out = p_values(*_case(models, "t1-sampled-draft"))
    assert out["bonus"] < 1e-9 and abs(out["first_acceptance_z"]) < MAX_Z, out
