"""EAGLE trees over a DeepSeek-V3 target drafting with its own MTP layer: greedy output equals
plain output, and after tree steps the target's latent cache (MLA: one row per token whose first
columns are the values, `speculant.kv_cache.cache`) equals a fresh prefill of the same tokens.

The tree's accepted path is compacted in place (`speculant.engine.tree_verify._compact`): a row
can move onto a slot another row of the same move is read from, which is what these tests
exercise by getting paths accepted several levels deep."""

from __future__ import annotations

import pytest
import torch
from testkit import greedy_params, tiny_hf_model, with_mtp_layer

from speculant import LLM
from speculant.executor.plan import TARGET

GREEDY = greedy_params()
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40)), [3], list(range(50, 61))]
TREES = {"static": dict(tree="static", tree_depth=4, tree_topk=3, num_draft_tokens=10),
         "dynamic": dict(tree="dynamic", tree_depth=4, tree_topk=3, num_draft_tokens=10)}
LAYER_SCALE = 0.05  # the target's attention and MLP outputs, scaled: a nearly-bigram target
MTP_SCALE = 0.1  # the same for the MTP layer's own block, so it passes its token through


@pytest.fixture(scope="module")
def target():
    """A tiny DeepSeek-V3 whose layers add little to the residual stream, so its next token
    depends mostly on the current one (still through every layer and the cache)."""
    model = tiny_hf_model("deepseek", seed=3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if _is_output_projection(name):
                p.mul_(LAYER_SCALE)
    return model


@pytest.fixture(scope="module")
def ckpt(target):
    """The target with an MTP layer that predicts it well: the entry's token embedding passes
    through (eh_proj = [I, 0], a damped block) to the target's final norm and lm_head, so entry
    i drafts the target's likely token after t_{i+1}: paths are often accepted several levels
    deep."""
    ckpt = with_mtp_layer(target)
    n, h = target.config.num_hidden_layers, target.config.hidden_size
    prefix, w = f"model.layers.{n}.", ckpt.weights
    for name in [k for k in w if k.startswith(prefix) and _is_output_projection(k)]:
        w[name] = w[name] * MTP_SCALE
    w[prefix + "enorm.weight"] = torch.ones(h)
    w[prefix + "eh_proj.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], 1)  # [h, 2h]
    w[prefix + "shared_head.norm.weight"] = w["model.norm.weight"].clone()
    return ckpt


def _is_output_projection(name: str) -> bool:
    return name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj"))


def eagle_llm(ckpt, **options) -> LLM:
    return LLM(model="tiny", checkpoint=ckpt, speculative="eagle", page_size=4, num_pages=256, adaptive_k=False, **options)


@pytest.mark.parametrize("shape", list(TREES))
def test_tree_greedy_with_the_own_mtp_layer_equals_plain(ckpt, plain_outputs, shape):
    llm = eagle_llm(ckpt, **TREES[shape])
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_outputs
    stats = llm.stats()
    assert stats["tau"] > 1.5 and stats["kv_pages_used"] == 0


def test_latent_cache_after_tree_steps_equals_a_fresh_prefill(ckpt):
    """Dynamic trees keep nodes best first, so a path often takes a slot another path node is
    moved onto (path [0, 2, 5]: node 2's row goes to the second slot after the root while node
    2's own slot takes node 5's row); a move that reads any storage after writing it corrupts
    those rows. (Static trees list the best-child chain first, so their moves never do.)"""
    llm = eagle_llm(ckpt, **TREES["dynamic"])
    engine = llm.engine
    request = engine.add_request(PROMPTS[1], GREEDY)
    for _ in range(6):
        engine.step()
    assert engine.stats.spec_stats.accepted_tokens > 6
    fresh = eagle_llm(ckpt, **TREES["dynamic"]).engine
    again = fresh.add_request(request.all_token_ids[:-1], GREEDY)
    fresh.step()
    assert again.output_token_ids == [request.all_token_ids[-1]]
    length = request.num_computed_tokens
    assert length == again.num_computed_tokens == request.num_tokens - 1
    for model in (TARGET, "head"):
        mine, theirs = _latents(engine, model, request, length), _latents(fresh, model, again, length)
        # Rows written by tree-verify forwards and by one prefill forward may differ by fp32
        # rounding (matmuls of other shapes, where kernels are not batch invariant); a row moved
        # wrong differs by O(1).
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0, msg=lambda m, model=model: f"{model}: {m}")


def _latents(engine, model: str, request, length: int) -> torch.Tensor:  # [layers, length, 1, R + r]
    kv = engine.executor.runner(model).kv
    assert kv.v.data_ptr() == kv.k.data_ptr()  # MLA: the values are the latent's first columns
    slots = torch.tensor(kv.slots(engine.pages.table(request.request_id), length))
    return kv.k[:, slots]
