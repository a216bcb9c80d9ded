"""Tiny random Llama, Qwen2, Qwen3, Gemma 3 and Phi-3 checkpoints, saved as HF folders and
written out as GGUF files.

The GGUF writer here plays llama.cpp's converter: it renames tensors, permutes Llama's q/k rows
and quantizes 2-D weights, and it returns what a correct loader must give back for each tensor
(the stored values dequantized by `gguf.quants`, the reference, with the permutation undone).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from safetensors.torch import load_file
from tokenizers import AddedToken, decoders, pre_tokenizers
from transformers import (
    AutoConfig,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from variant_gguf import (
    GGUF_ARCH,
    TENSOR_NAMES,
    reference,
    rope_theta,
    stored_norm_offset,
    write_variant_metadata,
)

from speculant.loader.fused import split_fused
from speculant.loader.gguf_loader import permute_qk, unpermute_qk
from speculant.loader.gguf_tokenizer import _byte_level_bpe, byte_alphabet
from speculant.loader.hf_loader import load_hf_config

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def tiny_vocab() -> list[str]:
    tokens = list(byte_alphabet().values())
    tokens += ["".join(m.split(" ")) for m in MERGES]
    return SPECIALS + tokens


def _save_tokenizer(folder: pathlib.Path) -> None:
    backend = _byte_level_bpe(tiny_vocab(), MERGES)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)


def _common(tie: bool) -> dict:
    # Rows of 256 so every 2-D weight also fits the K-quants' 256-weight super-blocks.
    return dict(
        vocab_size=len(tiny_vocab()), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def _save_model(folder: pathlib.Path, model: torch.nn.Module) -> pathlib.Path:
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():  # norms are ones by default; make every tensor distinctive
            param.copy_(torch.randn_like(param) * 0.05)
    model.save_pretrained(folder, safe_serialization=True)
    _save_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    torch.manual_seed(0)
    config = LlamaConfig(**_common(tie=False), rope_theta=10000.0)
    return _save_model(tmp_path_factory.mktemp("tiny_llama"), LlamaForCausalLM(config))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    torch.manual_seed(1)
    config = Qwen2Config(**_common(tie=True), rope_theta=1000000.0)
    return _save_model(tmp_path_factory.mktemp("tiny_qwen2"), Qwen2ForCausalLM(config))


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    torch.manual_seed(2)
    config = Qwen3Config(**_common(tie=False), head_dim=64, rope_theta=1000000.0)
    return _save_model(tmp_path_factory.mktemp("tiny_qwen3"), Qwen3ForCausalLM(config))


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Both layers sliding (Gemma 3's five of six), a window of 4 tokens. Untied: with small
    random weights a tied head mostly repeats the scaled input embedding's token."""
    torch.manual_seed(3)
    config = Gemma3TextConfig(**_common(tie=False), head_dim=64, query_pre_attn_scalar=64, sliding_window=4)
    return _save_model(tmp_path_factory.mktemp("tiny_gemma3"), Gemma3ForCausalLM(config))


@pytest.fixture(scope="session")
def tiny_phi3_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    torch.manual_seed(4)
    config = Phi3Config(**_common(tie=False), pad_token_id=0, rope_theta=10000.0)
    return _save_model(tmp_path_factory.mktemp("tiny_phi3"), Phi3ForCausalLM(config))


def hf_weights(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def gguf_name(hf: str, arch: str = "llama") -> str:
    if hf.startswith("model.layers."):
        _, _, layer, *rest = hf.split(".")
        module, kind = ".".join(rest[:-1]), rest[-1]
        return f"blk.{layer}.{(HF_TO_GGUF | TENSOR_NAMES.get(arch, {}))[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf]  # fmt: skip


# Block types whose float16 scale(s) end the block (Q2_K: d then dmin); the others lead with them.
_SCALES_LAST = {QType.Q6_K: 2, QType.Q3_K: 2, QType.TQ1_0: 2, QType.TQ2_0: 2, QType.Q2_K: 4}
RANDOM_BLOCK_TYPES = frozenset({QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.Q2_K, QType.Q3_K, QType.IQ2_XXS,
                                QType.IQ2_XS, QType.IQ2_S, QType.IQ3_XXS, QType.IQ3_S, QType.IQ1_S,
                                QType.IQ4_NL, QType.IQ4_XS, QType.TQ1_0, QType.TQ2_0})  # fmt: skip


def random_k_blocks(qtype: QType, n_weights: int, seed: int = 0) -> np.ndarray:
    """Random blocks with small float16 scales (gguf.quants cannot quantize these types)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n_weights // block_size, type_size), dtype=np.uint8)
    scales = rng.uniform(1e-4, 2e-3, size=(blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if qtype in _SCALES_LAST:
        blocks[:, -_SCALES_LAST[qtype] :] = scales[:, : _SCALES_LAST[qtype]]
    else:  # d (and dmin) lead the block
        blocks[:, :4] = scales
    return blocks


def _stored(weight: np.ndarray, qtype: QType, name: str) -> tuple[np.ndarray, QType]:
    """The bytes (or floats) written for a tensor, and its ggml type; 1-D tensors stay F32."""
    if weight.ndim == 1 or qtype == QType.F32:
        return weight.astype(np.float32), QType.F32
    if qtype == QType.F16:
        return weight.astype(np.float16), QType.F16
    if qtype in RANDOM_BLOCK_TYPES:
        seed = sum(map(ord, name))
        return random_k_blocks(qtype, weight.size, seed).reshape(weight.shape[0], -1), qtype
    return gguf.quants.quantize(weight, qtype), qtype


def write_gguf(
    hf_dir: pathlib.Path, out: pathlib.Path, qtype: QType, *, skip: str | None = None,
    tokenizer_pre: str = "gpt2", add_bos: bool = False, end_ids: dict[str, int] | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Write `hf_dir`'s model as a GGUF and return the weights a loader must produce from it.
    `end_ids`: {"eos" | "eot" | "eom": id} in place of the default EOS id 2; `extra(writer)`
    writes more keys or tensors."""
    config = AutoConfig.from_pretrained(hf_dir)
    arch = GGUF_ARCH[config.model_type]
    writer = gguf.GGUFWriter(out, arch)
    _write_metadata(writer, config, arch, tokenizer_pre, add_bos, end_ids or {"eos": 2})
    if extra is not None:
        extra(writer)
    expected = {}
    for name, tensor in hf_weights(hf_dir).items():
        if name == skip:
            continue
        expected[name] = _write_tensor(writer, config, arch, name, tensor, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return split_fused(expected, load_hf_config(hf_dir))  # Phi-3's fused products, split as loaded


def _write_tensor(
    writer, config, arch: str, name: str, tensor: torch.Tensor, qtype: QType
) -> torch.Tensor:
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    head_count = (
        next((n for key, n in heads.items() if f".{key}." in name), None)
        if arch == "llama"
        else None
    )
    weight = permute_qk(tensor, head_count) if head_count else tensor
    data, stored_type = _stored(weight.float().numpy() + stored_norm_offset(arch, name), qtype, name)
    writer.add_tensor(
        gguf_name(name, arch), data, raw_dtype=stored_type if stored_type != QType.F32 else None
    )
    stored = torch.from_numpy(
        gguf.quants.dequantize(data, stored_type).reshape(tensor.shape).copy()
    )
    return unpermute_qk(stored, head_count) if head_count else reference(stored, arch, name)


def _write_metadata(writer: gguf.GGUFWriter, config, arch: str, pre: str, add_bos: bool, end_ids: dict[str, int]) -> None:
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(rope_theta(config))
    write_variant_metadata(writer, config, arch)
    tokens = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    for kind, token_id in end_ids.items():
        getattr(writer, f"add_{kind}_token_id")(token_id)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)


@pytest.fixture
def gguf_writer(
    tmp_path: pathlib.Path,
) -> Callable[..., tuple[pathlib.Path, dict[str, torch.Tensor]]]:
    """write(hf_dir, qtype, **options) -> (gguf path, expected weights)."""

    def write(
        hf_dir: pathlib.Path, qtype: QType = QType.F32, **options
    ) -> tuple[pathlib.Path, dict]:
        path = tmp_path / f"{hf_dir.name}-{qtype.name}.gguf"
        return path, write_gguf(hf_dir, path, qtype, **options)

    return write
