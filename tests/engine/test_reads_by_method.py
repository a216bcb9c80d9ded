"""What docs/architecture.md says of every decode step, checked for every speculative method
(plain, n-gram, draft model, MTP, EAGLE chain / static / dynamic trees, greedy and sampled):

- it reads the host through `speculant.utils.sync` alone, as often as the page says: once (the
  step's tokens and counts); a dynamic EAGLE tree once more per level past the first (the
  frontier its next level's mask is built from, then the kept tree's parents); DeepSeek-V3 once
  more per MoE layer (the per-expert counts of its dispatch);
- only the executor calls a model's forward.

Reads are checked twice, independently: in strict sync mode (a torch function mode that raises
on any other read, CPU tensors included, and counts the sanctioned ones), and with Tensor's read
methods patched to record the package file that called them, every caller being utils/sync.py,
while `sync.read_all` (the one copy every sanctioned read makes) is counted by the test."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from testkit import fit_head, noisy_copy, strict_decode_step, tiny_hf_model, tiny_llm

import speculant
from speculant import LLM, SamplingParams
from speculant.executor.model_runner import ModelRunner
from speculant.utils import sync

GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=32, temperature=0.8, seed=3, logprobs=True, top_logprobs=2, ignore_eos=True)
TREE = dict(speculative="eagle", tree="static", tree_depth=3, tree_topk=2, num_draft_tokens=5)
CASES = {  # engine options, sampling parameters, expected reads of one decode step
    "none": (dict(speculative="none"), GREEDY, 1),
    "ngram": (dict(speculative="ngram"), GREEDY, 1),
    "draft-greedy": (dict(speculative="draft", num_draft_tokens=3), GREEDY, 1),
    "draft-sampled": (dict(speculative="draft", num_draft_tokens=3, draft_sampling="sample"), SAMPLED, 1),
    "mtp-greedy": (dict(speculative="mtp", num_draft_tokens=3), GREEDY, 1),
    "mtp-sampled": (dict(speculative="mtp", num_draft_tokens=3), SAMPLED, 1),
    "eagle-chain": (dict(speculative="eagle", tree="static", tree_depth=3, tree_topk=1, num_draft_tokens=3), GREEDY, 1),
    "eagle-static-greedy": (TREE, GREEDY, 1),
    "eagle-static-sampled": ({**TREE, "head_sampling": "sample"}, SAMPLED, 1),
    "eagle-static-seeded": (TREE, SEEDED, 1),
    "eagle-dynamic-greedy": ({**TREE, "tree": "dynamic"}, GREEDY, 3),  # 3 levels: 2 reads to draft, then the step's
    "eagle-dynamic-sampled": ({**TREE, "tree": "dynamic"}, SAMPLED, 3),
}
VOCAB = list(range(3, 256))
PROMPTS = [VOCAB[i * 7 :] + VOCAB[: i * 7] for i in range(3)]  # every token once: any n-gram lookup matches
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__")
PACKAGE = Path(speculant.__file__).parent


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def draft(target):
    return noisy_copy(target)


@pytest.fixture(scope="module")
def head(target):
    """A head barely fitted: it drafts (what these tests need), seldom well."""
    return fit_head(target, PROMPTS[:1], steps=5)


def llm_for(case: str, target, draft, head) -> LLM:
    options = dict(CASES[case][0])
    if options["speculative"] == "draft":
        return tiny_llm(target, draft, **options)
    if options["speculative"] in ("mtp", "eagle"):
        options["draft_checkpoint"] = head
    return tiny_llm(target, **options)


@contextlib.contextmanager
def recorded_reads() -> Iterator[tuple[list[str], list[int]]]:
    """(the package file and line of every call of a Tensor read method, the calls of
    `sync.read_all`) while the block runs."""
    callers: list[str] = []
    copies: list[int] = []

    def recording(read):
        def patched(self, *args, **kwargs):
            callers.append(_package_caller())
            return read(self, *args, **kwargs)

        return patched

    read_all = sync.read_all

    def counted_read_all(tensors):
        copies.append(len(tensors))
        return read_all(tensors)

    with pytest.MonkeyPatch.context() as mp:
        for name in READS:
            mp.setattr(torch.Tensor, name, recording(getattr(torch.Tensor, name)))
        mp.setattr(sync, "read_all", counted_read_all)
        with sync.counting_cpu_reads():
            yield callers, copies


def _package_caller() -> str:
    """The innermost frame in the package above the patched method (torch's own frames skipped)."""
    frame = sys._getframe(2)
    while frame is not None and not frame.f_code.co_filename.startswith(str(PACKAGE)):
        frame = frame.f_back
    if frame is None:
        return "outside the package"
    return f"{Path(frame.f_code.co_filename).relative_to(PACKAGE.parent)}:{frame.f_lineno}"


def recorded_step(llm: LLM) -> tuple[list[str], int, int]:
    """One engine step with reads recorded: (callers outside utils/sync.py, sanctioned copies,
    draft steps it added)."""
    drafted = llm.engine.stats.spec_stats.draft_steps
    with recorded_reads() as (callers, copies):
        llm.engine.step()
    outside = [c for c in callers if not c.startswith("speculant/utils/sync.py")]
    return outside, len(copies), llm.engine.stats.spec_stats.draft_steps - drafted


@pytest.mark.parametrize("case", list(CASES))
def test_decode_steps_read_through_sync_alone_as_documented(case, target, draft, head, monkeypatch):
    forwards: list[str] = []
    forward = ModelRunner.forward

    def recording_forward(self, *args, **kwargs):
        forwards.append(sys._getframe(1).f_globals["__name__"])
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "forward", recording_forward)
    llm = llm_for(case, target, draft, head)
    _, params, expected = CASES[case]
    speculative = llm.engine.config.speculative.enabled
    reads, drafted = strict_decode_step(llm, PROMPTS, [params] * len(PROMPTS))
    assert reads == expected
    assert (drafted > 0) == speculative
    outside, copies, drafted = recorded_step(llm)
    assert outside == []
    assert copies == expected and (drafted > 0) == speculative
    assert llm.stats()["host_reads_per_step"] == expected
    assert set(forwards) == {"speculant.executor.executor"}


def test_a_direct_read_is_caught_and_named(target, draft, head, monkeypatch):
    """A dynamic tree reading its frontier with `.tolist()` instead of through utils/sync.py:
    strict mode raises, and the patched read methods name the lines of eagle.py that read."""
    import speculant.speculative.eagle as eagle

    monkeypatch.setattr(eagle, "to_list", lambda t: t.tolist())
    params = [GREEDY] * len(PROMPTS)
    with pytest.raises(sync.HostReadError, match=r"\.tolist\(\)"):
        strict_decode_step(llm_for("eagle-dynamic-greedy", target, draft, head), PROMPTS, params)
    llm = llm_for("eagle-dynamic-greedy", target, draft, head)
    for prompt, p in zip(PROMPTS, params):
        llm.engine.add_request(prompt, p)
    while not all(r.output_token_ids for r in llm.engine.requests.values()):
        llm.engine.step()
    outside, copies, drafted = recorded_step(llm)
    assert drafted and copies == 1  # the step's own read still goes through sync
    assert len(outside) == 2 and {c.rsplit(":", 1)[0] for c in outside} == {"speculant/speculative/eagle.py"}


def test_deepseek_decode_step_reads_once_more_per_moe_layer():
    """Tiny DeepSeek-V3: one dense layer then two MoE layers, each reading its per-expert counts."""
    model = tiny_hf_model("deepseek", seed=3)
    llm = tiny_llm(model, speculative="none")
    moe_layers = model.config.num_hidden_layers - model.config.first_k_dense_replace
    reads, _ = strict_decode_step(llm, PROMPTS[:2], [GREEDY] * 2)
    assert reads == 1 + moe_layers == 3
