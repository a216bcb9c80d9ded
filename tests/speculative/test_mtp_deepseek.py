"""MTP speculation with a DeepSeek-V3 checkpoint's own MTP module (no head folder): the head's
math against transformers' decoder layer, greedy equality with plain decoding, and speculative
sampling that reproduces the target's law."""

from __future__ import annotations

import pytest
import torch
from test_spec_sampling import (
    ALPHA,
    NUM_DRAFTS,
    SAMPLING_ENGINE,
    VOCAB,
    bonus_pvalue,
    exact_joints,
    run_samples,
)
from testkit import TinyCheckpoint, chi_square_pvalue, tiny_hf_model, with_mtp_layer

from speculant import LLM, SamplingParams
from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan, ModelSpec

GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 40)), [3], list(range(50, 61))]


@pytest.fixture(scope="module", params=[48, None], ids=["q_lora", "plain_q"])
def target(request):
    return tiny_hf_model("deepseek", seed=3, q_lora_rank=request.param)


def _llm(ckpt: TinyCheckpoint, **options) -> LLM:
    return LLM(model="tiny", checkpoint=ckpt, page_size=4, num_pages=256, **{"adaptive_k": False, **options})


def test_own_head_is_transformers_decoder_layer(target):
    """Entry i: eh_proj([enorm(emb(t_{i+1})), hnorm(h_i)]) through transformers' DeepseekV3
    decoder layer with the MTP module's weights, shared_head.norm, the target's lm_head."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3DecoderLayer,
        DeepseekV3RMSNorm,
    )

    ckpt, tokens = with_mtp_layer(target), list(range(40, 58))
    executor = Executor(build_runner(ckpt, ModelConfig(model="tiny")))
    executor.add_model(ModelSpec("head", ModelConfig(model="own"), head_of=TARGET, own_head=True))
    executor.allocate_kv(16, 4)
    hidden = executor.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, list(range(8)), logits="none")])).hidden
    entries = SeqInput([0] * (len(tokens) - 1), 0, list(range(8)), logits="all")
    ours = executor.run(ForwardPlan("head", [entries], input_ids=torch.tensor(tokens[1:]), hidden_states=hidden[:-1])).logits

    config, n = target.config, target.config.num_hidden_layers
    p, w = f"model.layers.{n}.", ckpt.weights
    layer = DeepseekV3DecoderLayer(config, layer_idx=n)
    layer.load_state_dict({k: w[p + k] for k in layer.state_dict()})

    def norm(name, x):
        module = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        module.weight.data = w[p + name]
        return module(x)

    with torch.no_grad():
        x = torch.cat([norm("enorm.weight", target.model.embed_tokens(torch.tensor([tokens[1:]]))), norm("hnorm.weight", hidden[None, :-1])], -1)
        x = x @ w[p + "eh_proj.weight"].T
        t = x.shape[1]
        position_embeddings = target.model.rotary_emb(x, torch.arange(t)[None])
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        out = layer(x, attention_mask=mask, position_embeddings=position_embeddings)
        expected = target.lm_head(norm("shared_head.norm.weight", out))[0]
    torch.testing.assert_close(ours, expected, atol=2e-5, rtol=0)


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_mtp_with_the_checkpoints_own_layer_equals_plain(target, k):
    ckpt = with_mtp_layer(target)
    plain = [o.token_ids for o in _llm(ckpt).generate(PROMPTS, GREEDY)]
    llm = _llm(ckpt, speculative="mtp", num_draft_tokens=k, max_num_batched_tokens=16)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    stats = llm.stats()
    assert stats["draft_tokens"] > 0 and stats["kv_pages_used"] == 0


def test_sampling_with_the_own_layer_matches_the_target():
    """Sampled drafts from the own MTP layer; joints of the first tokens and the bonus tokens
    follow the target's law (the test of test_spec_sampling, V = 16)."""
    target = tiny_hf_model("deepseek", seed=4, vocab_size=VOCAB)
    with torch.no_grad():
        target.lm_head.weight.mul_(2.5)
    params = SamplingParams(max_tokens=NUM_DRAFTS + 2, temperature=0.8, top_k=12, ignore_eos=True)
    ckpt = with_mtp_layer(target)
    # A random module is rarely right; a flatter head law (its final norm scaled down) gets whole
    # chains accepted often enough for the bonus-token test.
    ckpt.weights[f"model.layers.{target.config.num_hidden_layers}.shared_head.norm.weight"] *= 0.1
    llm = LLM(model="tiny", checkpoint=ckpt, speculative="mtp", head_sampling="sample", page_size=4, **SAMPLING_ENGINE)
    out = _law_pvalues(target, llm, params)
    assert min(out.values()) > ALPHA, out


def test_a_head_folder_with_deepseek_mtp_names_runs_the_same_block(tmp_path):
    """The MTP module saved as a head folder (DeepSeek names) drafts exactly as the own layer."""
    from speculant.loader.head_file import HeadFileConfig, checkpoint_sha256, save_head

    target = tiny_hf_model("deepseek", seed=6)
    ckpt = with_mtp_layer(target)
    prefix = f"model.layers.{target.config.num_hidden_layers}."
    mtp = {k: v for k, v in ckpt.weights.items() if k.startswith(prefix)}
    save_head(tmp_path / "head", mtp, HeadFileConfig("normed", "tiny", checkpoint_sha256(ckpt), target.config.hidden_size))
    runs = []
    for head in (None, str(tmp_path / "head")):
        llm = _llm(ckpt, speculative="mtp", num_draft_tokens=2, head=head)
        runs.append(([o.token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.stats()["accepted_tokens"]))
    assert runs[0] == runs[1]
    assert runs[0][0] == [o.token_ids for o in _llm(ckpt).generate(PROMPTS, GREEDY)]


def test_sampling_with_a_trained_head_matches_the_target(tmp_path):
    """A head trained for the target by head training's own stages (hidden states through the
    executor, then the trainer: the MLA + MoE block on trainable tensors), drafting by sampling:
    the first tokens and the bonus tokens follow the target's law."""
    from speculant.training.hidden import HiddenOptions, Sequence, precompute
    from speculant.training.target import target_tensors
    from speculant.training.trainer import TrainOptions, train

    target = tiny_hf_model("deepseek", seed=9, vocab_size=VOCAB)
    with torch.no_grad():
        target.lm_head.weight.mul_(2.5)
    ckpt = TinyCheckpoint(target)
    g = torch.Generator().manual_seed(0)
    sequences = [Sequence(torch.randint(3, VOCAB, (24,), generator=g).tolist(), prompt_len=2) for _ in range(24)]
    precompute(ckpt, ModelConfig(model="tiny"), sequences, tmp_path / "hidden", HiddenOptions(top_k=VOCAB, page_size=4), progress=False)
    options = TrainOptions(steps=60, batch_tokens=256, lr=3e-3, warmup_steps=5, checkpoint_every=60, unroll=2)
    train(tmp_path / "hidden", tmp_path / "train", target_tensors(ckpt, "tiny"), options, progress=False)
    params = SamplingParams(max_tokens=NUM_DRAFTS + 2, temperature=0.8, top_k=12, ignore_eos=True)
    llm = LLM(model="tiny", checkpoint=ckpt, speculative="mtp", head=str(tmp_path / "train" / "head"),
              head_sampling="sample", page_size=4, **SAMPLING_ENGINE)
    out = _law_pvalues(target, llm, params)
    assert min(out.values()) > ALPHA, out
    assert llm.stats()["accepted_tokens"] > 0.3 * llm.stats()["draft_tokens"]  # trained: often right


def _law_pvalues(target, llm: LLM, params: SamplingParams) -> dict[str, float]:
    """Chi-square p-values of the joints of consecutive first tokens, and of the bonus tokens,
    against the target's exact law (the test of test_spec_sampling, V = 16)."""
    run = run_samples(llm, params)
    x = run.tokens
    pairs = [x[:, 0] * VOCAB + x[:, 1], x[:, 1] * VOCAB + x[:, 2], x[:, 2] * VOCAB + x[:, 3]]
    out = {f"x{i + 1}x{i + 2}": chi_square_pvalue(c, j) for i, (c, j) in enumerate(zip(pairs, exact_joints(target, params)))}
    out["bonus"] = bonus_pvalue(target, params, run.bonuses)
    return out
