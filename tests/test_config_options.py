"""Engine options come from the config dataclasses: every leaf field is one `LLM` keyword and one
CLI flag. The fields are found here by walking the dataclasses, so a new field is tested too."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from speculant.config import EngineConfig
from speculant.config_options import (
    Option,
    add_engine_arguments,
    build_engine_config,
    engine_config_from_args,
    engine_options,
    resolve_engine_config,
)


def leaf_fields(cls: type, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dataclasses.Field]]:
    """(path from the root, field) of every leaf field of a config tree."""
    hints = typing.get_type_hints(cls)
    leaves = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            leaves += leaf_fields(hints[f.name], path + (f.name,))
        else:
            leaves.append((path + (f.name,), f))
    return leaves


LEAVES = leaf_fields(EngineConfig)
OPTIONS = {opt.path: opt for opt in engine_options()}


def value_at(config: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        config = getattr(config, name)
    return config


def other_values(opt: Option) -> list[Any]:
    """Values unlike the default, in CLI units times the scale (so the CLI can spell them)."""
    if opt.choices is not None:
        return [c for c in opt.choices if c != opt.default]
    if opt.is_flag:
        return [not opt.default]
    base = opt.default if isinstance(opt.default, int | float) else 0
    values: list[Any] = []
    for t in opt.types:
        values += {int: [base + opt.cli_scale, 2 * opt.cli_scale], float: [0.5, base + 1.5], str: [f"{opt.default}-other"]}[t]
    return values


def set_one(opt: Option) -> tuple[Any, EngineConfig]:
    """The first other value the config accepts, and the config holding it."""
    for value in other_values(opt):
        try:
            return value, build_engine_config({opt.name: value})
        except ValueError:  # a cross-field check (e.g. speculative="draft" needs draft_model)
            continue
    raise AssertionError(f"no value other than the default is accepted for {opt.name}")


def test_every_field_is_one_option_named_by_the_rule():
    assert set(OPTIONS) == {path for path, _ in LEAVES}
    for path, f in LEAVES:
        # below a section, nested configs prefix their name: speculative.draft.model -> draft_model
        expected = f.metadata.get("name", "_".join(path[1:-1] + (f.name,)))
        assert OPTIONS[path].name == expected
        assert OPTIONS[path].flag == f.metadata.get("flag", "--" + expected.replace("_", "-"))
        assert OPTIONS[path].default == value_at(EngineConfig(), path)


@pytest.mark.parametrize("path", [path for path, _ in LEAVES], ids=".".join)
def test_each_keyword_sets_its_field_alone(path):
    opt = OPTIONS[path]
    value, config = set_one(opt)
    assert value_at(config, path) == value
    for other, _ in LEAVES:
        if other != path:
            assert value_at(config, other) == value_at(EngineConfig(), other), other


def test_public_keyword_names_are_kept():
    names = {opt.name for opt in engine_options()}
    assert names >= {
        "model", "dtype", "device", "attention_backend", "seed", "speculative", "draft_model",
        "num_draft_tokens", "draft_sampling", "draft_dtype", "draft_weights", "page_size", "kv_cache_bytes",
        "num_pages", "max_num_seqs", "max_num_batched_tokens", "max_waiting", "ngram_max_n", "ngram_min_n",
    }  # fmt: skip
    assert OPTIONS[("speculative", "method")].name == "speculative"
    assert OPTIONS[("cache", "kv_cache_bytes")].flag == "--kv-cache-mb"


def everything_changed() -> EngineConfig:
    """A config where every field that can differ from its default alone does, all at once."""
    return build_engine_config({opt.name: set_one(opt)[0] for opt in engine_options()})


def argv_of(config: EngineConfig) -> list[str]:
    argv = []
    for opt in engine_options():
        value = value_at(config, opt.path)
        if opt.is_flag:
            argv.append(opt.flag if value else "--no-" + opt.flag[2:])
        elif value is not None:
            argv += [opt.flag, str(value // opt.cli_scale if opt.cli_scale != 1 else value)]
    return argv


def engine_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_engine_arguments(parser)
    return parser


def test_cli_round_trips_a_config_with_every_field_changed():
    config = everything_changed()
    assert all(value_at(config, p) != value_at(EngineConfig(), p) for p in OPTIONS)
    assert engine_config_from_args(engine_parser().parse_args(argv_of(config))) == config
    assert engine_config_from_args(engine_parser().parse_args([])) == EngineConfig()


def test_kv_cache_flag_is_in_mib():
    args = engine_parser().parse_args(["--kv-cache-mb", "3"])
    assert engine_config_from_args(args).cache.kv_cache_bytes == 3 << 20


def test_config_or_keywords_not_both():
    assert resolve_engine_config(EngineConfig(), {}) == EngineConfig()
    assert resolve_engine_config(None, {"page_size": 4}).cache.page_size == 4
    with pytest.raises(TypeError, match="page_size"):
        resolve_engine_config(EngineConfig(), {"page_size": 4})


def test_bad_keywords_name_the_keyword():
    with pytest.raises(TypeError, match="'ngram_max'.*did you mean 'ngram_max_n'"):
        build_engine_config({"ngram_max": 3})
    with pytest.raises(TypeError, match="page_size must be int"):
        build_engine_config({"page_size": "16"})
    with pytest.raises(TypeError, match="max_num_seqs must be int"):
        build_engine_config({"max_num_seqs": True})
    with pytest.raises(ValueError, match="speculative must be one of"):
        build_engine_config({"speculative": "eagle9"})
    with pytest.raises(ValueError, match="draft_sampling"):
        build_engine_config({"draft_sampling": "top"})
    with pytest.raises(ValueError, match="ngram_min_n"):
        build_engine_config({"ngram_min_n": 5})  # above the default ngram_max_n
    with pytest.raises(ValueError, match="draft_model"):
        build_engine_config({"speculative": "draft"})


def test_none_keeps_a_default_and_sets_an_optional():
    config = build_engine_config({"speculative": None, "num_pages": None, "draft_model": None})
    assert config == EngineConfig()


# A made-up config tree: a field added with any supported type becomes an option unchanged.


@dataclass(frozen=True)
class Inner:
    depth: int = 2
    mode: Literal["fast", "exact"] = "exact"


@dataclass(frozen=True)
class Section:
    enabled: bool = True
    budget: int | float | None = None
    label: str = field(default="a", metadata={"name": "tag", "help": "a label"})
    inner: Inner = Inner()


@dataclass(frozen=True)
class Tree:
    section: Section = Section()


def test_a_new_field_of_any_supported_type_becomes_an_option():
    options = {opt.path: opt for opt in engine_options(Tree)}
    assert [opt.name for opt in options.values()] == ["enabled", "budget", "tag", "inner_depth", "inner_mode"]
    assert options[("section", "inner", "mode")].choices == ["fast", "exact"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_engine_arguments(parser, Tree)
    argv = ["--no-enabled", "--budget", "0.25", "--tag", "b", "--inner-depth", "5", "--inner-mode", "fast"]
    config = engine_config_from_args(parser.parse_args(argv), Tree())
    assert config == Tree(Section(enabled=False, budget=0.25, label="b", inner=Inner(depth=5, mode="fast")))
    assert engine_config_from_args(parser.parse_args(["--budget", "7"]), Tree()).section.budget == 7
    assert engine_config_from_args(parser.parse_args([]), Tree()) == Tree()
    assert build_engine_config({"inner_depth": 3}, Tree()).section.inner == Inner(depth=3)


@dataclass(frozen=True)
class Listy:
    ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Clash:
    inner_depth: int = 1
    inner: Inner = Inner()


@dataclass(frozen=True)
class ListyTree:
    listy: Listy = Listy()


@dataclass(frozen=True)
class ClashTree:
    clash: Clash = Clash()


def test_an_unsupported_field_type_or_a_name_clash_is_reported():
    with pytest.raises(TypeError, match="listy.ids"):
        engine_options(ListyTree)
    with pytest.raises(TypeError, match="clash.inner_depth and clash.inner.depth"):
        engine_options(ClashTree)


def test_defaults_are_the_fast_exact_path():
    """`LLM()`, the CLI and the server default to quantized GGUF weights kept quantized and n-gram
    speculation with adaptive k (exact in every weight mode on the native kernels)."""
    from speculant.config import EngineConfig

    config = EngineConfig()
    assert config.model.weights == "auto"
    assert config.speculative.method == "ngram" and config.speculative.adaptive_k
