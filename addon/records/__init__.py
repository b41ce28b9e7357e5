"""Call records, the contract between the proxy and the trainer: one typed row per model call
(:mod:`~addon.records.schema`, with packed token ids from :mod:`~addon.records.token_ids` and zstd JSON blobs from
:mod:`~addon.records.blobs`), written durably by :mod:`~addon.records.store` (a write-ahead log,
:mod:`~addon.records.wal`, in front of Parquet shards and a manifest, :mod:`~addon.records.files`), and turned into
training sequences by :mod:`~addon.records.sequences`. Imports pyarrow, numpy and zstandard, never mitmproxy,
aiohttp or the rest of the proxy, so the trainer's environment reads records without the proxy's dependencies.
"""
