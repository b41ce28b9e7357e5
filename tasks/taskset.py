"""Task sets in the Harbor task format: the typed :class:`Task`, the loader, and named subsets.

Contract
--------
A task is a directory (its name is the task id) holding::

    instruction.md        the prompt the agent gets (required)
    task.toml             Harbor configuration (required; see docs/tasks.md for the honoured fields)
    environment/          files copied into the agent's workspace; a Dockerfile there is recorded, not built
    tests/test.sh         the verifier (required); never copied into the workspace
    solution/solve.sh     the oracle solution (optional)

``load_task(dir)`` reads one task; ``load_taskset(dir)`` reads a single task directory or a directory of them
(hidden directories skipped) and sorts them by id. Anything missing or malformed raises :class:`TaskFormatError`
naming the file and the field. Fields Harbor defines that this runner does not honour (resource limits, network
policy, MCP servers, ...) are logged once per task and kept in ``Task.metadata``/``Task.environment``; fields
unknown to Harbor go to a :class:`converters.base.UnknownFields` sink. Multi-step tasks (``steps/``) are rejected.

``TaskSet.subset(name)`` selects ``all``, a difficulty (``easy``/``medium``/``hard``) or the tasks tagged ``name``;
``builtin_taskset(subset)`` loads the set shipped in ``tasks/builtin`` (``smoke`` is the CPU default for
``make collect``). Stdlib only: this module runs in the proxy env (3.12) and the engine env (3.11).
"""

from __future__ import annotations

import logging
import math
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, cast, get_args

from converters.base import UnknownFields

log = logging.getLogger("harnessrl.tasks")

Difficulty = Literal["easy", "medium", "hard", "unknown"]
DIFFICULTIES: tuple[str, ...] = get_args(Difficulty)
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"

# Harbor's defaults (docs: "Task Structure", task.toml reference).
DEFAULT_TIMEOUT_S = 600.0
_TOP_LEVEL = frozenset({"version", "schema_version", "source", "task", "metadata", "verifier", "agent", "solution",
                        "environment"})  # fmt: skip
_VERIFIER_KEYS = frozenset({"timeout_sec", "env", "user"})
_AGENT_KEYS = frozenset({"timeout_sec", "user"})
_SOLUTION_KEYS = frozenset({"env"})
# Recorded in Task.environment but not enforced by the workspace runner (no container, no cgroup limits here).
_ENV_NOT_HONOURED = frozenset({"build_timeout_sec", "docker_image", "cpus", "memory_mb", "storage_mb", "memory",
                               "storage", "gpus", "gpu_types", "allow_internet", "mcp_servers"})  # fmt: skip


class TaskFormatError(ValueError):
    """A task directory or task.toml is missing something or holds a malformed value."""


@dataclass(frozen=True)
class Task:
    """One task, as loaded from its directory. Paths are absolute; mappings are read-only (and left out of the hash)."""

    id: str
    path: Path
    instruction: str
    version: str
    difficulty: Difficulty = "unknown"
    category: str = ""
    tags: tuple[str, ...] = ()
    agent_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    solution_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    max_reward: float = 1.0
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    environment: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_script(self) -> Path | None:
        script = self.path / "solution" / "solve.sh"
        return script if script.is_file() else None

    @property
    def dockerfile(self) -> Path | None:
        """The task's environment/Dockerfile, if any. The workspace runner records it as not applied."""
        df = self.environment_dir / "Dockerfile"
        return df if df.is_file() else None


@dataclass(frozen=True)
class TaskSet:
    """An ordered set of tasks with unique ids."""

    name: str
    tasks: tuple[Task, ...]

    def __post_init__(self) -> None:
        ids = [t.id for t in self.tasks]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise TaskFormatError(f"task set {self.name!r}: duplicate task ids {dupes}")

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def get(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"task set {self.name!r} has no task {task_id!r}")

    def subset_names(self) -> tuple[str, ...]:
        """Every name :meth:`subset` accepts for this set."""
        tags = {tag for t in self.tasks for tag in t.tags}
        diffs = {t.difficulty for t in self.tasks}
        return ("all", *sorted(diffs), *sorted(tags - diffs - {"all"}))

    def subset(self, name: str) -> TaskSet:
        """``all``, a difficulty, or the tasks tagged ``name``. An empty selection is an error."""
        if name == "all":
            return self
        if name in DIFFICULTIES:
            chosen = tuple(t for t in self.tasks if t.difficulty == name)
        else:
            chosen = tuple(t for t in self.tasks if name in t.tags)
        if not chosen:
            raise KeyError(f"task set {self.name!r} has no subset {name!r}; known: {', '.join(self.subset_names())}")
        return TaskSet(f"{self.name}:{name}", chosen)


# ------------------------------------------------------------------------------------------------ loading


def load_task(directory: str | Path, fields: UnknownFields | None = None) -> Task:
    """Load one task directory. Raises :class:`TaskFormatError` naming the file and field on any problem."""
    path = Path(directory).resolve()
    if not path.is_dir():
        raise TaskFormatError(f"{path}: not a task directory")
    if (path / "steps").is_dir():
        raise TaskFormatError(f"{path / 'steps'}: multi-step Harbor tasks are not supported")
    instruction_file = path / "instruction.md"
    if not instruction_file.is_file():
        raise TaskFormatError(f"{instruction_file}: missing (every task needs an instruction)")
    instruction = instruction_file.read_text(encoding="utf-8")
    if not instruction.strip():
        raise TaskFormatError(f"{instruction_file}: empty")
    test_sh = path / "tests" / "test.sh"
    if not test_sh.is_file():
        raise TaskFormatError(f"{test_sh}: missing (the verifier entry point)")
    toml_file = path / "task.toml"
    if not toml_file.is_file():
        raise TaskFormatError(f"{toml_file}: missing")
    try:
        raw = tomllib.loads(toml_file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(f"{toml_file}: not valid TOML: {e}") from e
    return _task_from_toml(path, instruction, raw, _Reader(toml_file, fields or UnknownFields(log)))


def load_taskset(directory: str | Path, name: str | None = None) -> TaskSet:
    """Load a single task directory, or every task directory directly inside ``directory`` (sorted by id)."""
    root = Path(directory).resolve()
    if not root.is_dir():
        raise TaskFormatError(f"{root}: no such task directory")
    sink = UnknownFields(log)
    if (root / "task.toml").exists() or (root / "instruction.md").exists():
        return TaskSet(name or root.name, (load_task(root, sink),))
    children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not children:
        raise TaskFormatError(f"{root}: holds no task directories (each needs task.toml and instruction.md)")
    return TaskSet(name or root.name, tuple(load_task(child, sink) for child in children))


def builtin_taskset(subset: str = "all") -> TaskSet:
    """The task set shipped in tasks/builtin, or one of its subsets (e.g. ``smoke``)."""
    return load_taskset(BUILTIN_DIR, name="builtin").subset(subset)


@dataclass(frozen=True)
class _Reader:
    """Typed access to task.toml values; every error names the file and the dotted field."""

    file: Path
    fields: UnknownFields

    def fail(self, key: str, why: str) -> TaskFormatError:
        return TaskFormatError(f"{self.file}: field {key!r} {why}")

    def table(self, raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = raw.get(key.rsplit(".", 1)[-1], {})
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {type(value).__name__}")
        return value

    def string(self, raw: Mapping[str, Any], key: str, default: str | None = None) -> str:
        value = raw.get(key.rsplit(".", 1)[-1], default)
        if not isinstance(value, str):
            raise self.fail(key, "is required" if value is None else f"must be a string, got {value!r}")
        return value

    def seconds(self, raw: Mapping[str, Any], key: str) -> float:
        value = raw.get(key.rsplit(".", 1)[-1], DEFAULT_TIMEOUT_S)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise self.fail(key, f"must be a positive number of seconds, got {value!r}")
        return float(value)

    def env(self, raw: Mapping[str, Any], key: str) -> Mapping[str, str]:
        value = raw.get(key.rsplit(".", 1)[-1], {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.fail(key, f"must be a table of strings, got {value!r}")
        return MappingProxyType(dict(value))

    def tags(self, raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
        value = raw.get(key.rsplit(".", 1)[-1], [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"must be a list of strings, got {value!r}")
        return tuple(value)


def _task_from_toml(path: Path, instruction: str, raw: dict[str, Any], r: _Reader) -> Task:
    where = f"task.toml[{path.name}]"
    r.fields.check(where, raw, _TOP_LEVEL)
    version = raw.get("version", raw.get("schema_version"))
    if not isinstance(version, str):
        raise r.fail("version", f'is required (a string such as "1.0"), got {version!r}')
    metadata, verifier, agent = r.table(raw, "metadata"), r.table(raw, "verifier"), r.table(raw, "agent")
    solution, environment, task_table = r.table(raw, "solution"), r.table(raw, "environment"), r.table(raw, "task")
    r.fields.check(f"{where}.verifier", verifier, _VERIFIER_KEYS)
    r.fields.check(f"{where}.agent", agent, _AGENT_KEYS)
    r.fields.check(f"{where}.solution", solution, _SOLUTION_KEYS)
    r.fields.check(f"{where}.environment", environment, _ENV_NOT_HONOURED)
    not_honoured = [f"environment.{k}" for k in sorted(set(environment) & _ENV_NOT_HONOURED)]
    not_honoured += [f"{name}.user" for name, table in (("verifier", verifier), ("agent", agent)) if "user" in table]
    if not_honoured:
        log.info("%s: recorded but not enforced by the workspace runner: %s", path.name, ", ".join(not_honoured))
    difficulty = metadata.get("difficulty", "unknown")
    if difficulty not in DIFFICULTIES:
        raise r.fail("metadata.difficulty", f"must be one of easy, medium, hard; got {difficulty!r}")
    max_reward = metadata.get("max_reward", 1.0)
    if isinstance(max_reward, bool) or not isinstance(max_reward, int | float) or not max_reward > 0:
        raise r.fail("metadata.max_reward", f"must be a positive number, got {max_reward!r}")
    tags = r.tags(metadata, "metadata.tags") + r.tags(task_table, "task.keywords")
    return Task(
        id=path.name,
        path=path,
        instruction=instruction,
        version=version,
        difficulty=cast(Difficulty, difficulty),
        category=r.string(metadata, "metadata.category", ""),
        tags=tuple(dict.fromkeys(tags)),
        agent_timeout_s=r.seconds(agent, "agent.timeout_sec"),
        verifier_timeout_s=r.seconds(verifier, "verifier.timeout_sec"),
        verifier_env=r.env(verifier, "verifier.env"),
        solution_env=r.env(solution, "solution.env"),
        max_reward=float(max_reward),
        metadata=MappingProxyType(dict(metadata)),
        environment=MappingProxyType(dict(environment)),
    )
