"""The house's plan, enforced: which package may import what, no import cycles, no module over 500 lines, and a
docstring on every package and module.

Read statically (``ast`` over the source, every ``import`` wherever it sits, ``TYPE_CHECKING`` blocks included), so a
rule holds for code paths no test happens to import. Rules (the map is in ``addon/__init__.py``):

* ``converters`` imports nothing of ours (it is sans-IO and stands alone);
* ``addon.records`` imports no other part of the proxy (``converters``, the canonical model, is not the proxy);
* ``addon.records``, ``addon.engine`` and ``addon.generation`` reach no mitmproxy, even through other modules of
  ours; aiohttp is imported only by ``addon.serving`` (its HTTP servers) and ``addon.engine.client`` (its client,
  for the streams), so records reach no aiohttp at all and generation only through the engine client;
* only ``addon/capture.py`` imports mitmproxy;
* ``trainer`` reaches only ``addon.records`` and ``addon.engine`` of the proxy (the proxy-trainer contract);
* our modules form no import cycle.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("addon", "converters", "trainer", "tasks")
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    found = (p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")))
    # tasks/builtin holds the task folders' own code (the repositories the harnesses work on), not ours
    return {module_name(p): p for p in found if not p.is_relative_to(ROOT / "tasks" / "builtin")}


@cache
def imports(name: str) -> frozenset[str]:
    """Every module ``name`` imports (ours resolved to a module of ours, others by their top-level package)."""
    tree = ast.parse(modules()[name].read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(_resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from addon.records import wal` imports the module addon.records.wal
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules() else _resolve(node.module))
    found.discard(name)
    return frozenset(found)


def _resolve(dotted: str) -> str:
    if dotted.split(".")[0] not in PACKAGES:
        return dotted.split(".")[0]
    while dotted and dotted not in modules():
        dotted = dotted.rpartition(".")[0]
    return dotted


def reach(name: str) -> set[str]:
    """Everything ``name`` imports, directly or through modules of ours."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for dep in imports(todo.pop()):
            if dep not in seen:
                seen.add(dep)
                if dep in modules():
                    todo.append(dep)
    return seen


def ours(names: set[str] | frozenset[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in PACKAGES}


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def of_package(package: str) -> list[str]:
    return [m for m in modules() if in_package(m, package)]


def test_the_resolver_sees_the_real_graph() -> None:
    """Guards the rules below against passing vacuously: known edges must be found."""
    assert "addon.records.wal" in imports("addon.records.store")
    assert "mitmproxy" in imports("addon.capture")
    assert "aiohttp" in reach("addon.serving.runtime")
    assert "addon.records.schema" in reach("trainer.samples")


@pytest.mark.parametrize("name", of_package("converters"))
def test_converters_import_nothing_of_ours_outside_converters(name: str) -> None:
    assert {m for m in ours(imports(name)) if not in_package(m, "converters")} == set()


@pytest.mark.parametrize("name", of_package("addon.records"))
def test_records_import_no_other_part_of_the_proxy(name: str) -> None:
    allowed = ("addon.records", "converters")  # converters: the canonical model, sans-IO and standalone
    assert {m for m in ours(reach(name)) if not any(in_package(m, p) for p in allowed) and m != "addon"} == set()


@pytest.mark.parametrize(
    "name", of_package("addon.records") + of_package("addon.engine") + of_package("addon.generation")
)
def test_records_engine_and_generation_reach_no_mitmproxy(name: str) -> None:
    assert "mitmproxy" not in reach(name)


@pytest.mark.parametrize("name", sorted(modules()))
def test_aiohttp_is_imported_only_by_the_servers_and_the_engine_client(name: str) -> None:
    if not (in_package(name, "addon.serving") or name == "addon.engine.client"):
        assert "aiohttp" not in imports(name)


@pytest.mark.parametrize("name", of_package("addon.records"))
def test_records_reach_no_aiohttp(name: str) -> None:
    assert "aiohttp" not in reach(name)


@pytest.mark.parametrize("name", sorted(modules()))
def test_only_the_capture_script_imports_mitmproxy(name: str) -> None:
    if name != "addon.capture":
        assert "mitmproxy" not in imports(name)


@pytest.mark.parametrize("name", of_package("trainer"))
def test_trainer_reaches_only_the_records_and_engine_of_the_proxy(name: str) -> None:
    proxy = {m for m in ours(reach(name)) if in_package(m, "addon") and m != "addon"}
    assert {m for m in proxy if not (in_package(m, "addon.records") or in_package(m, "addon.engine"))} == set()
    assert "mitmproxy" not in reach(name)


def test_no_import_cycles() -> None:
    graph = {m: ours(imports(m)) & set(modules()) for m in modules()}
    # a package's __init__ is imported by every module below it; an edge into a package's own __init__ is not a cycle
    graph = {m: {d for d in deps if not in_package(m, d)} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert cycles == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_is_under_the_line_limit_and_says_what_it_is(name: str) -> None:
    path = modules()[name]
    text = path.read_text()
    assert text.count("\n") <= MAX_LINES, f"{path.relative_to(ROOT)}: split it (style guide: under ~500 lines)"
    if text.strip():
        assert ast.get_docstring(ast.parse(text)), f"{path.relative_to(ROOT)} has no module docstring"
