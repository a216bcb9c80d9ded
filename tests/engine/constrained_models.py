"""Tiny models for constrained-decoding tests, read through SmolLM2's tokenizer.

The target's vocabulary is the tokenizer's (49,152 ids): a grammar's masks name tokens by the
tokenizer's ids, and llguidance only allows the tokenization it would force (after "al" of
"alpha", the one token "pha"), so a model that can emit only part of the vocabulary may find
nothing allowed. Each speculative method drafts for this target: the draft model is a noisy copy,
MTP and EAGLE use a head fitted to its outputs.

Import it from a test in tests/engine as `from constrained_models import ...`.
"""

from __future__ import annotations

from testkit import TinyCheckpoint, fit_head, noisy_copy, tiny_hf_model

from speculant import LLM, SamplingParams, StructuredOutput

VOCAB = 49152
METHODS = {
    "ngram": dict(speculative="ngram", num_draft_tokens=4),
    "draft": dict(speculative="draft", num_draft_tokens=3, draft_model="tiny-draft"),
    "mtp": dict(speculative="mtp", num_draft_tokens=2),
    "eagle": dict(speculative="eagle", tree_depth=3, tree_topk=2, num_draft_tokens=6, tree="static"),
}
CONSTRAINTS = [
    StructuredOutput("json_object"),
    StructuredOutput.json_schema({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "yy"]}}, "required": ["a", "b"]}),
    StructuredOutput("regex", "[a-c]{3,8}(-[0-9]+)?"),
    StructuredOutput.choice(["alpha", "beta", "gamma"]),
    StructuredOutput("grammar", 'start: "(" item ("," item)* ")"\nitem: /[a-z]+/'),
    StructuredOutput("regex", "(ab|ba)+"),
    StructuredOutput.json_schema({"type": "array", "items": {"type": "boolean"}, "maxItems": 4}),
    StructuredOutput("json_object"),
]
PROMPTS = [[40, 50, 60, 40, 50, 60, 40, 50], [70, 71, 72, 73, 70, 71, 72], [90] * 6, [33, 44, 55, 66, 33, 44],
           [20, 30, 40], [1000, 2000, 1000, 2000], [5, 6, 7, 8, 5, 6, 7], [300, 301, 302]]  # fmt: skip


def build_models(tokenizer, seed: int = 2):
    """(target, draft, head, tokenizer): the head is fitted to the target's constrained outputs."""
    target = tiny_hf_model("llama", seed=seed, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)
    models = (target, noisy_copy(target, scale=0.01), None, tokenizer)
    params = [SamplingParams(max_tokens=24, temperature=0.0, structured_output=c) for c in CONSTRAINTS]
    plain = make_llm(models).generate(PROMPTS, params)
    head = fit_head(target, [p + o.token_ids for p, o in zip(PROMPTS, plain)], steps=100)
    return target, models[1], head, tokenizer


def make_llm(models, method: str | None = None, **options) -> LLM:
    target, draft, head, tokenizer = models
    options = dict(METHODS[method], **options) if method else options
    if options.get("speculative") == "draft":
        options["draft_checkpoint"] = TinyCheckpoint(draft, tokenizer)
    elif options.get("speculative") in ("mtp", "eagle"):
        options["draft_checkpoint"] = head
    return LLM(model="tiny", checkpoint=TinyCheckpoint(target, tokenizer), adaptive_k=False, page_size=4, num_pages=512, **options)
