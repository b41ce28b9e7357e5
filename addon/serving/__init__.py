"""The proxy's process: :mod:`~addon.serving.runtime` builds everything once at start-up from the options of
:mod:`~addon.serving.config`; :mod:`~addon.serving.server` is the in-process aiohttp server that model calls are
retargeted to (so answers stream), with the admin routes; :mod:`~addon.serving.base_url` serves the same vendor
routes directly for harnesses that take a base URL; :mod:`~addon.serving.admission` is the one check both front
doors run (route, body size, session attribution, the refusal in the caller's wire format);
:mod:`~addon.serving.routes` maps method and path to a route; :mod:`~addon.serving.memory`,
:mod:`~addon.serving.tuning` and :mod:`~addon.serving.aio` are the process's memory report, GC/allocator tuning and
background tasks.
"""
