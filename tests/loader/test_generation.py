"""Stop ids and sampling defaults come from the checkpoint: every EOS id config.json and
generation_config.json list, GGUF's eos/eot/eom ids; generation stops at each of them, from a HF
folder and from a GGUF file of every family."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
from gguf import GGMLQuantizationType as QType

from speculant import LLM
from speculant.config import GenerationDefaults
from speculant.loader import CheckpointError, load_checkpoint
from speculant.sampling.params import SamplingParams

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3", "phi3"]
PROMPT = [1, 40, 41, 42, 60, 61, 70]


def _edit_json(path: pathlib.Path, **changes) -> None:
    config = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(config | changes))


def _copy(hf_dir: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "copy"
    shutil.copytree(hf_dir, folder)
    return folder


def test_every_listed_eos_id_and_the_sampling_defaults(tmp_path, tiny_llama_dir):
    folder = _copy(tiny_llama_dir, tmp_path)
    _edit_json(folder / "config.json", eos_token_id=[7, 9])
    _edit_json(folder / "generation_config.json", eos_token_id=[9, 11], temperature=0.6, top_p=0.9, top_k=20)
    arch = load_checkpoint(str(folder)).arch
    assert arch.eos_token_id == 7 and arch.eos_token_ids == (7, 9, 11)
    assert arch.stop_token_ids == {7, 9, 11}
    assert arch.generation == GenerationDefaults(temperature=0.6, top_p=0.9, top_k=20)


def test_defaults_apply_to_requests_without_parameters(tmp_path, tiny_llama_dir):
    folder = _copy(tiny_llama_dir, tmp_path)
    _edit_json(folder / "generation_config.json", temperature=0.0, top_k=5)
    llm = LLM(model=str(folder), page_size=4, num_pages=32)
    assert llm.engine.default_params == SamplingParams(temperature=0.0, top_k=5)
    request = llm.engine.add_request(PROMPT)
    assert request.params.temperature == 0.0 and request.params.top_k == 5


@pytest.mark.parametrize("field, value", [("top_p", 2.0), ("eos_token_id", "x")])
def test_bad_generation_config_names_file_and_field(tmp_path, tiny_llama_dir, field, value):
    folder = _copy(tiny_llama_dir, tmp_path)
    _edit_json(folder / "generation_config.json", **{field: value})
    with pytest.raises(CheckpointError, match=rf"generation_config.json.*{field}"):
        load_checkpoint(str(folder))


def test_gguf_eos_eot_eom_and_end_of_turn_texts(tiny_llama_dir, gguf_writer):
    path, _ = gguf_writer(tiny_llama_dir, QType.F16, end_ids={"eos": 7, "eot": 9, "eom": 11})
    arch = load_checkpoint(str(path)).arch
    # 0 and 2 are <|endoftext|> and <|im_end|>, which llama.cpp ends generation on by their text.
    assert arch.eos_token_id == 7 and arch.stop_token_ids == {7, 9, 11, 0, 2}


def test_gguf_eos_outside_the_vocabulary(tiny_llama_dir, gguf_writer):
    path, _ = gguf_writer(tiny_llama_dir, QType.F16, end_ids={"eos": 2, "eot": 100000})
    with pytest.raises(CheckpointError, match="eot_token_id 100000"):
        load_checkpoint(str(path))


def _greedy(model: str, prompt: list[int], **kwargs):
    llm = LLM(model=model, page_size=4, num_pages=64)
    return llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, **kwargs))[0]


def _stop_candidates(tokens: list[int], count: int = 3) -> list[int]:
    """Positions of tokens whose first occurrence they are, none of them a special token."""
    positions = [p for p, t in enumerate(tokens) if t > 2 and t not in tokens[:p]]
    if len(positions) < count:
        pytest.skip(f"greedy run has only {len(positions)} distinct tokens")
    return positions[:count]


@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("family", FAMILIES)
def test_generation_stops_at_each_listed_eos_id(request, tmp_path, gguf_writer, family, source):
    hf_dir = request.getfixturevalue(f"tiny_{family}_dir")
    tokens = _greedy(str(hf_dir), PROMPT, ignore_eos=True).token_ids
    positions = _stop_candidates(tokens)
    ends = [tokens[p] for p in positions]
    if source == "hf":
        model = _copy(hf_dir, tmp_path)
        _edit_json(model / "config.json", eos_token_id=ends[:2])
        _edit_json(model / "generation_config.json", eos_token_id=ends[2:])
    else:
        model, _ = gguf_writer(hf_dir, QType.F32, end_ids=dict(zip(("eos", "eot", "eom"), ends, strict=True)))
    assert load_checkpoint(str(model)).arch.stop_token_ids >= set(ends)
    for position, end in zip(positions, ends, strict=True):
        # Continuing the greedy run just before `end`: the next token is `end`, and it stops there.
        out = _greedy(str(model), PROMPT + tokens[:position])
        assert (out.token_ids, out.finish_reason) == ([end], "stop"), (family, source, end)
