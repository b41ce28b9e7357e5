"""What every harness adapter declares, and what one run of it returns.

Contract
--------
A harness adapter is a frozen, field-less :class:`HarnessSpec` subclass whose class constants pin the package and
version (npm or PyPI), name the executable, the wire format it speaks through the proxy, the CA variables it
honours and its time limit. Three small methods give what differs per harness: ``config_files`` (paths relative to
the private HOME -> content), ``env`` (its own variables, e.g. a dummy API key) and ``command`` (the non-interactive
command line for one instruction). Installing is ``tasks.harnesses.install``'s job.

Running one is ``tasks.harnesses.runner.run_harness``'s job; installing is ``tasks.harnesses.install``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

WireFormat = Literal["anthropic", "responses", "chat", "gemini"]
LimitKind = Literal["time", "memory", "cpu"]
Installer = Literal["npm", "pip"]

SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class HarnessSpec:
    """One harness, pinned. Subclasses set every class constant below and may override the three methods."""

    name: ClassVar[str]
    package: ClassVar[str]
    version: ClassVar[str]
    installer: ClassVar[Installer]
    executable: ClassVar[str]
    wire_format: ClassVar[WireFormat]
    ca_vars: ClassVar[tuple[str, ...]]
    timeout_s: ClassVar[float]
    # Proxy options this harness needs to end on its own (e.g. forced tool calls for a harness that requires one).
    proxy_options: ClassVar[tuple[str, ...]] = ()

    @property
    def pin(self) -> str:
        """The install requirement: ``pkg@ver`` for npm, ``pkg==ver`` for pip."""
        return f"{self.package}@{self.version}" if self.installer == "npm" else f"{self.package}=={self.version}"

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        """Files to write under the private HOME before the run: relative path -> content."""
        return {}

    def env(self) -> Mapping[str, str]:
        """The harness's own environment variables (dummy keys, switches that keep it non-interactive)."""
        return {}

    def command(self, executable: Path, instruction: str) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} must define command()")

    def base_url_env(self, base_url: str) -> Mapping[str, str] | None:
        """Variables that point this harness's model calls at ``base_url`` (the session's root of the vendor routes
        on the proxy's internal server, ``http://127.0.0.1:PORT/s/SESSION``), on top of :meth:`env`.

        None (the default): the harness takes no base URL from its environment alone, so it always runs through
        ``HTTPS_PROXY``. Only harnesses whose base-URL route was run end to end override this."""
        return None


@dataclass(frozen=True)
class HarnessRun:
    """One run. ``exit_code`` is None when it was killed at a limit; ``timed_out`` is then true and ``limit`` says
    which (time, memory or CPU), since each is a budget the harness ran out of."""

    harness: str
    version: str
    exit_code: int | None
    stdout_tail: str
    stderr_tail: str
    duration: float
    timed_out: bool
    limit: LimitKind | None = None


def write_ca_bundle(mitm_ca: Path, dest: Path) -> Path:
    """Write the system roots followed by the mitmproxy CA to ``dest`` and return it."""
    system = SYSTEM_CA_BUNDLE.read_text() if SYSTEM_CA_BUNDLE.exists() else ""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(system.rstrip("\n") + "\n" + mitm_ca.read_text())
    return dest
