"""The vLLM engines the proxy generates from: :mod:`~addon.engine.protocol` (the completions API as typed requests,
results and errors; sans-IO), :mod:`~addon.engine.client` (one async httpx client per server: generate, stream,
pause/reload weights, LoRA) and :mod:`~addon.engine.pool` (several servers behind one proxy with session affinity,
health polling that tells busy from down, and a bounded wait for an engine). httpx only: the trainer's weight sync
uses the same client from the engine environment.
"""
