"""Wire-format converters: the four vendor APIs to and from one canonical model (sans-IO).

``dialect_for(format)`` returns the :class:`~converters.base.Dialect` for a wire format. The modules are
``chat`` (OpenAI Chat Completions), ``responses`` (OpenAI Responses), ``anthropic`` (Anthropic Messages) and
``gemini`` (Google Gemini); ``canonical`` holds the shared typed model and ``base`` the interface.
"""

from __future__ import annotations

import importlib
from functools import cache

from converters.base import Dialect
from converters.canonical import WIRE_FORMATS, WireFormat

_MODULES: dict[WireFormat, str] = {
    "chat": "converters.chat",
    "responses": "converters.responses",
    "anthropic": "converters.anthropic",
    "gemini": "converters.gemini",
}


@cache
def dialect_for(format: WireFormat) -> Dialect:
    """The dialect instance for ``format`` (stateless, so one per process is enough)."""
    if format not in _MODULES:
        raise ValueError(f"unknown wire format {format!r}; expected one of {', '.join(WIRE_FORMATS)}")
    module = importlib.import_module(_MODULES[format])
    dialect: Dialect = module.DIALECT
    return dialect


__all__ = ["Dialect", "WIRE_FORMATS", "WireFormat", "dialect_for"]
