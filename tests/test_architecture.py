"""docs/architecture.md's claims that code can hold, held: the paths it names exist, its layer
list is the import contract's, proposers reach models only through forward plans, the engine
knows proposers only through their interface and registry, no shared code branches on a method
name, the page allocator is plain Python, an attention backend plans once per forward, and the
classes, methods and functions it names (`Engine._device_stage`, `utils.sync.read_lists`) exist.
(Host reads and forward callers per step, for every method: tests/engine/test_reads_by_method.py.)"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import tomllib

from test_import_graph import PACKAGE, ROOT, import_graph, module_name
from testkit import greedy_params, tiny_hf_model, tiny_llm

from speculant.executor.plan import TARGET
from speculant.speculative.registry import available_methods

PAGE = ROOT / "docs" / "architecture.md"
SPECULATIVE = "speculant.speculative"
# where a method's name may be compared with: the registry that maps names to proposers, the
# config's checks of a method's own options, and the benchmark scripts (a user's face)
NAMES_METHODS = ("speculant.speculative.registry", "speculant.config", "speculant.bench")
FILE_TYPES = {"py", "md", "toml", "json", "jsonl", "csv", "png", "safetensors"}


def sources() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), filename=str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_path_the_page_names_exists():
    named = set()
    prose = re.sub(r"```.*?```", "", PAGE.read_text(), flags=re.S)
    for quoted in re.findall(r"`([^`]+)`", prose):
        named |= {part for part in re.split(r",\s*", quoted) if re.fullmatch(r"[\w/.]+(\.py|/)", part)}
    missing = [p for p in sorted(named) if not ((PACKAGE / p).exists() or (ROOT / p).exists() or (ROOT / "tests" / p).exists()
                                                or any(PACKAGE.rglob(p)) or any((ROOT / "tests").rglob(p)))]
    assert len(named) > 50 and missing == []


def test_every_name_the_page_gives_exists():
    """A dotted name starting with a package class (`Executor.run`) or module (`utils.sync.to_list`)
    resolves; names of other libraries (`torch.tensor`, `F.linear`) are left alone."""
    prose = re.sub(r"```.*?```", "", PAGE.read_text(), flags=re.S)
    names = {q.removesuffix("()") for q in re.findall(r"`([^`]+)`", prose)}
    names = {n for n in names if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", n) and n.rsplit(".", 1)[1] not in FILE_TYPES}
    classes = {node.name: module for module, tree in sources().items() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found = {name: resolves(name.split("."), classes) for name in sorted(names)}
    assert sum(r is not None for r in found.values()) > 10
    assert [name for name, r in found.items() if r is False] == []


def resolves(parts: list[str], classes: dict[str, str]) -> bool | None:
    """Whether the package holds the name (None: it names no class or module of the package)."""
    if parts[0] in classes:
        obj, rest = getattr(importlib.import_module(classes[parts[0]]), parts[0]), parts[1:]
    else:
        for i in range(len(parts), 0, -1):  # the longest prefix that is a module
            try:
                obj, rest = importlib.import_module(".".join(["speculant", *parts[:i]])), parts[i:]
                break
            except ModuleNotFoundError:
                continue
        else:
            return None
    for part in rest:
        fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        if not hasattr(obj, part) and part not in fields:
            return False
        obj = getattr(obj, part, None)
    return True


def test_the_layer_list_is_the_import_contract():
    section = PAGE.read_text().split("## Layers", 1)[1]
    chain = re.search(r"`cli` →.*?`utils`\.", section, re.S).group(0)
    page = [" | ".join(re.findall(r"`(\w+)`", step)) for step in chain.split("→")]
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    assert page == contract


def test_proposers_reach_models_only_through_plans():
    """A proposer imports from the executor only its plans, no model or engine, from the loader
    only the head folders (the MTP proposer names the shipped head it declares), and calls no
    forward: the executor runs every forward it asks for."""
    graph, trees = import_graph(), sources()
    for module, imported in graph.items():
        if not module.startswith(SPECULATIVE):
            continue
        reached = {m for m in imported if m.startswith(("speculant.executor", "speculant.models", "speculant.loader", "speculant.engine"))}
        assert reached <= {"speculant.executor.plan", "speculant.loader.head_file"}, (module, reached)
        calls = [n.lineno for n in ast.walk(trees[module]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "forward"]
        assert calls == [], (module, calls)


def test_the_engine_knows_proposers_through_their_interface_and_registry():
    graph = import_graph()
    for module, imported in graph.items():
        if not module.startswith(SPECULATIVE):
            proposers = {m for m in imported if m.startswith(SPECULATIVE)}
            assert proposers <= {f"{SPECULATIVE}.base", f"{SPECULATIVE}.registry"}, (module, proposers)


def test_no_shared_code_branches_on_a_method_name():
    """No comparison with a proposer's name, or with a `method`, outside NAMES_METHODS."""
    names = set(available_methods()) - {"none"}
    found = []
    for module, tree in sources().items():
        if module.startswith(NAMES_METHODS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                parts = [sub for side in (node.left, *node.comparators) for sub in ast.walk(side)]
                strings = {p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)}
                method = any(isinstance(p, ast.Attribute) and p.attr == "method" or isinstance(p, ast.Name) and p.id == "method" for p in parts)
                if strings & names or method:
                    found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_the_page_allocator_is_plain_python():
    tree = sources()["speculant.kv_cache.allocator"]
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "collections", "dataclasses", "typing", "math", "itertools"}, imported


def test_an_attention_backend_plans_once_per_forward(monkeypatch):
    """`plan` on the host once per forward (then `forward` per layer)."""
    llm = tiny_llm(tiny_hf_model("llama"), speculative="ngram")
    runner, calls = llm.engine.executor.runner(TARGET), []
    forward, plan = runner.forward, runner.backend.plan
    monkeypatch.setattr(runner, "forward", lambda *a, **k: (calls.append("forward"), forward(*a, **k))[1])
    monkeypatch.setattr(runner.backend, "plan", lambda *a, **k: (calls.append("plan"), plan(*a, **k))[1])
    llm.generate([[5, 6, 7, 5, 6, 7, 5, 6]], greedy_params(8))
    assert len(calls) > 4 and calls == ["forward", "plan"] * (len(calls) // 2)
