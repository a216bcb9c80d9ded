"""DeepSeek-V3 GGUF files (llama.cpp's `deepseek2`), written from tiny random transformers models as
llama.cpp's converter writes them: the weights come back exactly, the logits equal transformers'
within float32 tolerance, greedy generation equals the HF-folder load; older files with an unsplit
`attn_kv_b`, a Q8_0 file, the MTP layer, and the errors for what does not map."""

from __future__ import annotations

import dataclasses
import json
import shutil

import gguf
import pytest
import torch
from deepseek_gguf_writer import write_deepseek_gguf
from gguf import GGMLQuantizationType as QType
from testkit import tiny_hf_model, with_mtp_layer

from speculant import LLM, SamplingParams
from speculant.attention.batch import SeqInput
from speculant.config import ModelConfig
from speculant.executor.executor import Executor
from speculant.executor.loading import build_runner
from speculant.executor.plan import TARGET, ForwardPlan
from speculant.loader import CheckpointError, load_checkpoint
from speculant.loader.gguf_deepseek_arch import deepseek2_arch
from speculant.loader.gguf_file import GGUFFile
from speculant.loader.hf_loader import arch_from_hf_config

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], list(range(30, 52))]
ATOL = 2e-5  # float32 logits, as in tests/models/test_deepseek_vs_transformers.py
# GGUF keeps only mscale_all_dim (llama.cpp runs with mscale equal to it), as DeepSeek's configs have.
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}  # fmt: skip


def _hf(tiny_llama_dir, q_lora_rank=48):
    vocab = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    return tiny_hf_model("deepseek", seed=4, vocab_size=vocab, q_lora_rank=q_lora_rank, rope_parameters=YARN)


@pytest.fixture(scope="module", params=[48, None], ids=["q_lora", "plain_q"])
def hf(request, tiny_llama_dir):
    return _hf(tiny_llama_dir, request.param)


def _write(tmp_path, hf_model, qtype=QType.F32, **options):
    path = tmp_path / f"ds-{qtype.name}.gguf"
    state = {k: v for k, v in hf_model.state_dict().items()}
    return path, write_deepseek_gguf(hf_model.config, state, path, qtype, **options)


def _our_logits(ckpt, tokens: list[int]) -> torch.Tensor:
    executor = Executor(build_runner(ckpt, ModelConfig(model="gguf", dtype="float32")))
    executor.allocate_kv(16, 4)
    pages = list(range(-(-len(tokens) // 4)))
    return executor.run(ForwardPlan(TARGET, [SeqInput(tokens, 0, pages, logits="all")])).logits


def _hf_greedy(hf_model, prompt):
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(GREEDY.max_tokens):
            tokens.append(int(hf_model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


@pytest.mark.parametrize("split_kv_b", [True, False], ids=["k_b_v_b", "kv_b"])
def test_f32_file_gives_transformers_weights_and_logits(tmp_path, hf, split_kv_b):
    path, _ = _write(tmp_path, hf, split_kv_b=split_kv_b)
    ckpt = load_checkpoint(str(path))
    state = hf.state_dict()
    assert ckpt.weights.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(ckpt.weights[name], tensor), name
    assert ckpt.weights["model.layers.1.mlp.gate.weight"].dtype == torch.float32
    tokens = list(range(3, 40))
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(_our_logits(ckpt, tokens), expected, atol=ATOL, rtol=0)


def test_arch_equals_the_hf_config_reading(tmp_path, hf):
    path, _ = _write(tmp_path, hf)
    ours = load_checkpoint(str(path)).arch
    from_config = arch_from_hf_config(hf.config.to_dict())
    assert ours.rms_norm_eps == pytest.approx(from_config.rms_norm_eps)
    # The file's EOS (2), then <|endoftext|> (0), which llama.cpp also ends generation on.
    assert ours.eos_token_ids == (2, 0) and from_config.eos_token_ids == (2,)
    same = dict(rms_norm_eps=from_config.rms_norm_eps, eos_token_ids=from_config.eos_token_ids)
    assert dataclasses.replace(ours, **same) == from_config


def test_greedy_equals_the_hf_folder_load(tmp_path, tiny_llama_dir):
    hf_model = _hf(tiny_llama_dir)
    path, _ = _write(tmp_path, hf_model)
    folder = tmp_path / "folder"
    hf_model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama_dir / name, folder / name)
    from_gguf = LLM(model=str(path), page_size=4, num_pages=64).generate(PROMPTS, GREEDY)
    from_folder = LLM(model=str(folder), page_size=4, num_pages=64).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in from_gguf] == [o.token_ids for o in from_folder]
    assert [o.token_ids for o in from_gguf] == [_hf_greedy(hf_model, p) for p in PROMPTS]


def test_q8_0_file_is_dequantized(tmp_path, tiny_llama_dir):
    """Q8_0 (F16 where rows do not fill 32-weight blocks, F32 router and norms, as the converter
    writes): weights equal `gguf.quants`' dequantization bit for bit, and the model generates as
    transformers does on those weights."""
    hf_model = _hf(tiny_llama_dir)
    path, expected = _write(tmp_path, hf_model, QType.Q8_0)
    types = {t.name: t.ggml_type for t in GGUFFile(path).tensors.values()}
    assert types["blk.1.ffn_gate_exps.weight"] == QType.Q8_0 and types["blk.1.attn_k_b.weight"] == QType.Q8_0
    assert types["blk.1.attn_q_b.weight"] == QType.F16 and types["blk.1.ffn_gate_inp.weight"] == QType.F32
    ckpt = load_checkpoint(str(path), keep_quantized=True)  # experts are not kept quantized: all dense
    for name, tensor in expected.items():
        assert torch.equal(ckpt.weights[name], tensor), name
    reference = _hf(tiny_llama_dir)
    reference.load_state_dict(expected)
    generated = LLM(model=str(path), page_size=4, num_pages=64).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in generated] == [_hf_greedy(reference, p) for p in PROMPTS]


def test_mtp_layer_loads_as_the_own_head(tmp_path, tiny_llama_dir):
    hf_model = _hf(tiny_llama_dir)
    mtp = with_mtp_layer(hf_model)
    path = tmp_path / "mtp.gguf"
    expected = write_deepseek_gguf(hf_model.config, mtp.weights, path, mtp_layers=1)
    ckpt = load_checkpoint(str(path))
    assert ckpt.arch.eos_token_ids == (2, 0)  # 0: <|endoftext|>, an end of turn by its text
    assert ckpt.arch == dataclasses.replace(mtp.arch, rms_norm_eps=ckpt.arch.rms_norm_eps, eos_token_ids=(2, 0))
    assert ckpt.weights.keys() == expected.keys() and "model.layers.3.eh_proj.weight" in expected
    assert all(torch.equal(ckpt.weights[n], mtp.weights[n]) for n in expected)
    plain = LLM(model=str(path), page_size=4, num_pages=64).generate(PROMPTS, GREEDY)
    spec = LLM(model=str(path), page_size=4, num_pages=64, speculative="mtp", num_draft_tokens=2, adaptive_k=False).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]


def test_deepseek_v3_pre_tokenizer(tmp_path, tiny_llama_dir):
    """`deepseek-v3` splits digits in runs of three (the tiny vocab's "12" merge would join
    "1212" into two tokens under GPT-2's split) and apart from the letters and spaces before them."""
    hf_model = _hf(tiny_llama_dir)
    path = tmp_path / "tok.gguf"
    write_deepseek_gguf(hf_model.config, {}, path, tokenizer_pre="deepseek-v3")
    from speculant.loader.gguf_tokenizer import gguf_tokenizer

    tokenizer = gguf_tokenizer(GGUFFile(path))
    assert tokenizer.convert_ids_to_tokens(tokenizer("a 1212")["input_ids"]) == ["a", "Ġ", "12", "1", "2"]


# ---- what does not map ------------------------------------------------------------------------


def _rewrite(tmp_path, source, *, drop_key=None, set_keys=None, extra_tensor=None, drop_tensor=None):
    """A copy of GGUF `source` with one metadata key dropped or changed, or one tensor added/dropped."""
    reader = gguf.GGUFReader(source)
    out = tmp_path / "edited.gguf"
    writer = gguf.GGUFWriter(out, "deepseek2")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", drop_key) or key in (set_keys or {}):
            continue
        value = field.contents()
        writer.add_key_value(key, value, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    for key, (value, kind) in (set_keys or {}).items():
        writer.add_key_value(key, value, kind)
    for t in reader.tensors:
        if t.name != drop_tensor:
            writer.add_tensor(t.name, t.data)  # the source file is all F32
    if extra_tensor:
        writer.add_tensor(extra_tensor, torch.zeros(4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def small_file(tmp_path_factory, tiny_llama_dir):
    tmp = tmp_path_factory.mktemp("ds_gguf")
    return _write(tmp, _hf(tiny_llama_dir))[0]


@pytest.mark.parametrize(
    "edit, message",
    [
        (dict(extra_tensor="blk.1.attn_sinks.weight"), r"tensor 'blk\.1\.attn_sinks\.weight': unknown tensor"),
        (dict(drop_tensor="blk.2.attn_v_b.weight"), r"tensor 'blk\.2\.attn_v_b\.weight': missing tensor"),
        (dict(drop_tensor="blk.0.ffn_norm.weight"), r"tensor 'blk\.0\.ffn_norm\.weight': missing tensor"),
        (dict(drop_key="deepseek2.attention.kv_lora_rank"), r"deepseek2\.attention\.kv_lora_rank is missing"),
        (dict(drop_key="deepseek2.expert_gating_func"), r"expert_gating_func = 1: only sigmoid"),
    ],
    ids=["unknown", "half_split", "missing", "no_key", "softmax"],
)
def test_what_does_not_map_is_named(tmp_path, small_file, edit, message):
    path = _rewrite(tmp_path, small_file, **edit)
    with pytest.raises(CheckpointError, match=rf"edited\.gguf: .*{message}"):
        load_checkpoint(str(path))


def test_deepseek_v3_metadata_as_the_converter_writes_it(tmp_path, tiny_llama_dir):
    """DeepSeek-V3's own config.json through the converter's metadata: the same ArchConfig as
    reading config.json."""
    config = json.loads(json.dumps(_hf(tiny_llama_dir).config.to_dict()))
    config |= {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
               "n_routed_experts": 256, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
               "first_k_dense_replace": 3, "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
               "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                                   "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                   "original_max_position_embeddings": 4096}}  # fmt: skip
    hf_config = type(_hf(tiny_llama_dir).config)(**config)
    path = tmp_path / "v3.gguf"
    write_deepseek_gguf(hf_config, {}, path)
    ours = deepseek2_arch(GGUFFile(path))
    expected = arch_from_hf_config(hf_config.to_dict())
    # No tensors in this file: no `output.weight`, so it reads as tied.
    # The file also ends generation on <|endoftext|> (0), by its text, as llama.cpp does.
    assert ours.eos_token_ids == (2, 0)
    assert dataclasses.replace(ours, rms_norm_eps=expected.rms_norm_eps, tie_word_embeddings=False, eos_token_ids=(2,)) == expected
    assert (ours.mla.qk_nope_head_dim, ours.mla.v_head_dim, ours.moe.num_groups, ours.rope_scaling.mscale_all_dim) == (128, 128, 8, 1.0)
