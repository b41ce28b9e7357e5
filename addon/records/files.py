"""The durable files of a record folder: a finished Parquet shard and the manifest that indexes the shards.

Contract
--------
* :func:`write_shard` writes one table as ``name.tmp``, fsyncs it, renames it to ``name`` and fsyncs the folder, so
  a shard is either whole on disk or absent; a failure removes the tmp file and raises.
* :func:`write_manifest` does the same for ``manifest.json`` (format, schema version, run id, rows per shard).
* :func:`read_manifest` returns the manifest, or None when it is absent or unreadable (it is only an index: the
  shards are the truth and the store rebuilds it); a manifest of another format or schema version raises
  :class:`RecordStoreError`.

Used by :class:`addon.records.store.RecordStore`, which decides when these run and holds the locks.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from addon.records import wal
from addon.records.schema import SCHEMA_VERSION

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "harnessrl-records"
# Columns with few distinct values per shard; the rest (token ids, logprobs, blobs, ids, timestamps) go plain.
DICTIONARY_COLUMNS = [
    "run_id",
    "session_id",
    "harness",
    "harness_version",
    "wire_format",
    "route",
    "model",
    "served_model",
    "finish_reason",
    "tool_call_names",
    "auxiliary_reason",
    "sampling_requested",
    "sampling_applied",
    "budget_stop",
    "fork_reason",
]


class RecordStoreError(Exception):
    """A record store operation failed; what was acknowledged before stays recoverable."""


def write_shard(path: Path, table: pa.Table, compression_level: int, row_group_rows: int) -> None:
    """Write ``table`` to ``path`` durably: tmp file, fsync, rename, fsync the folder."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(
                table,
                f,
                compression="zstd",
                compression_level=compression_level,
                row_group_size=row_group_rows,
                # Dictionary-encoding token ids and blobs costs ~3x the write time and saves nothing.
                use_dictionary=DICTIONARY_COLUMNS,
            )
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        wal.fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_manifest(folder: Path, run_id: str, shards: dict[str, int]) -> None:
    """Write ``folder/manifest.json`` durably (tmp + fsync + rename), listing ``shards`` (file -> rows)."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "total_rows": sum(shards.values()),
        "shards": [{"file": name, "rows": rows} for name, rows in sorted(shards.items())],
    }
    tmp = folder / f"{MANIFEST}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, folder / MANIFEST)
        wal.fsync_dir(folder)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_manifest(folder: Path) -> dict[str, Any] | None:
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        # Only ever written by rename, so this is outside damage; the shards are the truth: rebuild it.
        log.warning("ignoring unreadable manifest %s: %s", path, e)
        return None
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("schema_version") != SCHEMA_VERSION:
        raise RecordStoreError(f"{path} is not a version-{SCHEMA_VERSION} {MANIFEST_FORMAT} manifest")
    return dict(manifest)
