"""One model call, from wire body to recorded row, without network code of its own:
:mod:`~addon.generation.generate` (the :class:`Generator` that answers a call on a response sink and records it),
:mod:`~addon.generation.render` (canonical request -> chat template -> prompt ids), :mod:`~addon.generation.splice`,
:mod:`~addon.generation.lineage` and :mod:`~addon.generation.session_graph` (token-faithful multi-turn prompts over
each session's prefix graph), :mod:`~addon.generation.parser` (sampled text -> canonical stream events),
:mod:`~addon.generation.sampling` (what is applied), :mod:`~addon.generation.sessions` (which session a call belongs
to, its budget) and :mod:`~addon.generation.stats` (the admin counters). It reaches the engine through
:mod:`addon.engine` and stores through :mod:`addon.records`; it imports neither mitmproxy nor aiohttp.
"""
