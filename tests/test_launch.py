"""addon/launch.py with a real mitmdump: a proxy that cannot start exits non-zero with the reason in its output, and
``launch.start`` reports that reason at once instead of waiting out its start-up timeout. No engine is needed: the
start-up fails before the engine is asked anything."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from addon import launch
from addon.records.store import RecordStore

pytestmark = pytest.mark.integration


def test_a_proxy_whose_record_folder_is_locked_exits_non_zero_with_the_reason(tmp_path: Path) -> None:
    """Regression (issue 15): the start-up failure must not leave a proxy that makes every call wait."""
    records = tmp_path / "records"
    holder = RecordStore.open(records, "another-proxy")  # holds the folder's lock, as a running proxy does
    config = launch.ProxyConfig("http://127.0.0.1:9", tmp_path / "proxy", records_dir=records, startup_timeout=120)
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as err:
            launch.start(config)
    finally:
        holder.close()
    assert time.monotonic() - t0 < 30  # seconds, not the 120 s start-up timeout
    report = str(err.value)
    assert report.startswith("mitmdump exited with 1:")
    assert f"harnessrl: cannot start: {records} is already open by another record store" in report


def test_the_command_turns_off_the_per_flow_lines_unless_the_options_set_them(tmp_path: Path) -> None:
    config = launch.ProxyConfig("http://127.0.0.1:9", tmp_path, options=("flow_detail=2",))
    cmd = launch.command(config, 8080, 8081, tmp_path / "records")
    sets = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]
    # mitmproxy applies --set in order: the launcher's default first, the caller's options after it
    assert sets.index("flow_detail=0") < sets.index("flow_detail=2")
    assert "flow_detail=0" in launch.command(launch.ProxyConfig("http://e", tmp_path), 1, 2, tmp_path)
