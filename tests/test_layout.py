"""The layout by role (issue 37), read from the code's own imports (ast): packages in one order, every import
pointing down (or within its package), no import cycles, no private name taken from another module, and the
names seed 004 made public still importable from `rlvr`."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rlvr"
# bottom to top: a module may import from its own package and from the packages before it
LAYERS = ["core", "sandbox", "grading", "tasks", "environments", "engines", "algorithms", "config", "serve",
          "stages", "distributed", "training", "experiments", "cli"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path):
    """(imported rlvr module, names taken from it, line) for every import in the module, lazy ones too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "rlvr":
                    yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] != "rlvr":
                continue
            for alias in node.names:  # `from rlvr.pkg import module` imports that module
                sub = f"{base}.{alias.name}"
                yield (sub, [], node.lineno) if sub in MODULES else (base, [alias.name], node.lineno)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_is_in_a_layer():
    assert not [m for m in MODULES if m != "rlvr" and _layer(m) is None]


def test_imports_point_down_never_up():
    upward = []
    for name, path in MODULES.items():
        mine = _layer(name)
        for target, _, line in _imports(name, path):
            theirs = _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({LAYERS[theirs]} is above "
                              f"{LAYERS[mine]})")
    assert not upward, "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = {name: {t for t, _, _ in _imports(name, path) if t in MODULES and t != name}
             for name, path in MODULES.items()}
    assert not _cycles(graph), "import cycles: " + "; ".join(" <-> ".join(c) for c in _cycles(graph))


def _private_uses(path: Path, name: str = ""):
    """Private names (one leading underscore) this file takes from another rlvr module: imported by name, or
    read as an attribute of an imported rlvr module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rlvr"):
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlvr") and not node.level:
            for alias in node.names:
                module = f"{node.module}.{alias.name}"
                if module in MODULES:
                    aliases[alias.asname or alias.name] = module
                elif alias.name.startswith("_") and not alias.name.startswith("__") and node.module != name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_takes_a_private_name_from_another():
    found = [use for name, path in MODULES.items() for use in _private_uses(path, name)]
    assert not found, "\n".join(found)


def test_bench_and_examples_use_public_names_only():
    found = [use for folder in ("bench", "examples") for path in sorted((ROOT / folder).glob("*.py"))
             for use in _private_uses(path)]
    assert not found, "\n".join(found)


def test_no_module_is_over_400_lines():
    # no exception left: the sandbox's harness is a package now (rlvr/sandbox/inside, bound read-only as one
    # directory), no longer one long file
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not long, long


def test_every_package_says_what_lives_there_and_what_it_may_import():
    for layer in LAYERS[:-1]:
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "May import" in doc, layer


@pytest.mark.parametrize("alias", ["rlvr.grpo", "rlvr.train", "rlvr.loop_common", "rlvr.rl", "rlvr.hf_engine"])
def test_the_old_flat_modules_are_gone(alias):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(alias)


def test_seed_004s_public_names_import_from_rlvr():
    import inspect

    import rlvr

    for name in rlvr.__all__:
        assert getattr(rlvr, name) is not None, name
    from rlvr import compute_group_normalized_rewards, get_response_log_probs, grpo_train_step, r1_zero_reward_fn

    assert list(inspect.signature(compute_group_normalized_rewards).parameters) == [  # seed 004's interface
        "raw_rewards", "group_size", "baseline", "advantage_eps", "advantage_normalizer"]
    assert list(inspect.signature(get_response_log_probs).parameters)[:4] == [
        "model", "input_ids", "labels", "return_token_entropy"]
    assert callable(grpo_train_step) and r1_zero_reward_fn("2+3 </think> <answer> 5 </answer>", "5")["reward"] == 1.0


def test_every_rlvr_import_names_something_that_exists():
    """A lazy import of a module that moved fails only when its line runs: check every one, everywhere."""
    import importlib.util

    missing = []
    for folder in ("src/rlvr", "tests", "bench", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    targets = [(a.name, None) for a in node.names if a.name.startswith("rlvr")]
                elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("rlvr"):
                    targets = [(node.module, a.name) for a in node.names]
                else:
                    continue
                for module, name in targets:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    if importlib.util.find_spec(module) is None:
                        missing.append(f"{where} {module}")
                    elif name and not hasattr(importlib.import_module(module), name):
                        try:
                            importlib.import_module(f"{module}.{name}")  # `from package import submodule`
                        except ModuleNotFoundError:
                            missing.append(f"{where} {module}.{name}")
    assert not missing, "\n".join(missing)
