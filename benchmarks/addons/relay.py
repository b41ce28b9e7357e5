"""A mitmproxy addon for ``benchmarks/mitm_floor.py`` only: every request goes to the fake engine on
``$RELAY_ENGINE_PORT`` (its vendor routes), the answer streamed back chunk by chunk. No harnessrl code."""

from __future__ import annotations

import os

from mitmproxy import http

PORT = int(os.environ["RELAY_ENGINE_PORT"])


class Relay:
    def request(self, flow: http.HTTPFlow) -> None:
        flow.request.scheme, flow.request.host, flow.request.port = "http", "127.0.0.1", PORT

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            flow.response.stream = True


addons = [Relay()]
