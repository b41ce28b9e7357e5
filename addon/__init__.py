"""The capture proxy. At this level: the mitmproxy script (``mitmdump -s addon/capture.py``: the hooks that decide,
per flow, whether a request is a model call, a local answer or traffic to leave alone) and its launcher
(:mod:`addon.launch`, which starts and stops mitmdump for tests, benchmarks and collection). The rest lives in four
sub-packages, each importable on its own:

* :mod:`addon.serving` — the in-process HTTP server that answers model calls, the base-URL front door, admission
  (route, size and attribution checks shared by both front doors), the runtime that builds everything at start-up,
  options, memory and GC tuning. With :mod:`addon.engine.client` (its streams), the only place that imports
  aiohttp.
* :mod:`addon.generation` — one model call end to end, sans network: sessions and their budgets, prompt rendering,
  token-faithful splicing over each session's prefix graph, the output parser, sampling, statistics.
* :mod:`addon.engine` — the vLLM client and the engine pool (httpx for control requests, aiohttp's client for the
  streams).
* :mod:`addon.records` — the proxy-trainer contract: the record schema, JSON blobs, write-ahead log, durable store
  and the training-sequence builder (pyarrow only; the trainer imports it).

Import rules (enforced by tests/test_layout.py): converters import nothing of ours; records, engine and generation
reach no mitmproxy, records no aiohttp either, and records imports no other part of the proxy; only this top level
imports mitmproxy; trainer never imports the proxy's serving, generation or mitmproxy code.
"""
