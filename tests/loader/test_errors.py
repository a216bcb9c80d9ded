"""Broken checkpoints raise CheckpointError naming the file (and the tensor at fault)."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType

from speculant.loader import CheckpointError, load_checkpoint
from speculant.loader.gguf_file import GGUFFile


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(CheckpointError, match="nope.gguf"):
        load_checkpoint(str(missing))


def test_unknown_registry_name():
    with pytest.raises(ValueError, match="no-such-model.*smollm2-135m"):
        load_checkpoint("no-such-model")


def test_bad_magic(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(CheckpointError, match="bad.gguf.*not a GGUF"):
        load_checkpoint(str(path))


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.gguf"):
        load_checkpoint(str(path))


@pytest.mark.parametrize("keep", [0.5, 0.999, 20 / 1e9])
def test_truncated_gguf(tiny_llama_dir, gguf_writer, keep):
    path, _ = gguf_writer(tiny_llama_dir, QType.Q8_0)
    data = path.read_bytes()
    path.write_bytes(data[: max(10, int(len(data) * keep))])
    with pytest.raises(CheckpointError, match=path.name):
        load_checkpoint(str(path))


def test_truncation_names_the_tensor(tiny_llama_dir, gguf_writer):
    path, _ = gguf_writer(tiny_llama_dir, QType.F32)
    last = max(GGUFFile(path).tensors.values(), key=lambda info: info.offset)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match=f"{path.name}.*{last.name}.*truncated"):
        load_checkpoint(str(path))


def test_missing_tensor(tiny_llama_dir, gguf_writer):
    path, _ = gguf_writer(tiny_llama_dir, QType.F16, skip="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing"):
        load_checkpoint(str(path))


def _write_one_changed(tmp_path, source, change):
    """Copy `source`'s GGUF with `change(name, array) -> (array, raw_dtype)` applied per tensor."""
    src = GGUFFile(source)
    out = tmp_path / "changed.gguf"
    writer = gguf.GGUFWriter(out, src.metadata["general.architecture"])
    for key, value in src.metadata.items():
        if key.startswith(src.metadata["general.architecture"] + ".") or key.startswith(
            "tokenizer."
        ):
            _add_kv(writer, key, value)
    for info in src.tensors.values():
        array = np.frombuffer(src.raw(info.name), dtype=np.float32).reshape(info.shape)
        array, raw_dtype = change(info.name, array)
        writer.add_tensor(info.name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add_kv(writer, key, value):
    if isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)
    elif isinstance(value, np.ndarray):
        writer.add_array(key, value.tolist())
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    else:
        writer.add_float32(key, value)


def test_shape_mismatch(tmp_path, tiny_llama_dir, gguf_writer):
    path, _ = gguf_writer(tiny_llama_dir, QType.F32)

    def shrink(name, array):
        return (array[:-1] if name == "blk.0.ffn_gate.weight" else array), None

    changed = _write_one_changed(tmp_path, path, shrink)
    with pytest.raises(CheckpointError, match=r"changed.gguf.*mlp\.gate_proj\.weight.*shape"):
        load_checkpoint(str(changed))


def test_unsupported_tensor_type(tmp_path, tiny_llama_dir, gguf_writer):
    """Q8_1 (an intermediate type of llama.cpp's kernels) is one gguf.quants does not decode."""
    path, _ = gguf_writer(tiny_llama_dir, QType.F32)
    block_size, type_size = gguf.GGML_QUANT_SIZES[QType.Q8_1]

    def to_q8_1(name, array):
        if name != "blk.1.attn_v.weight":
            return array, None
        blocks = np.zeros(
            (array.shape[0], array.shape[1] // block_size * type_size), dtype=np.uint8
        )
        return blocks, QType.Q8_1

    changed = _write_one_changed(tmp_path, path, to_q8_1)
    with pytest.raises(CheckpointError, match=r"changed.gguf.*blk\.1\.attn_v\.weight.*Q8_1"):
        load_checkpoint(str(changed))


def test_hf_folder_refuses_pickles(tmp_path, tiny_llama_dir):
    folder = tmp_path / "pickled"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickled.*pytorch_model.bin"):
        load_checkpoint(str(folder))


def test_hf_truncated_safetensors(tmp_path, tiny_llama_dir):
    folder = tmp_path / "cut"
    shutil.copytree(tiny_llama_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(str(folder))


def test_hf_missing_config(tmp_path, tiny_llama_dir):
    folder = tmp_path / "noconfig"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(str(folder))


def test_hf_missing_shard(tmp_path, tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_llama_dir).save_pretrained(
        folder, max_shard_size="300KB"
    )
    shard = sorted(folder.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load_checkpoint(str(folder))
