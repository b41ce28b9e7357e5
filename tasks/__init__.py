"""Task sets and collection, run in the proxy environment: Harbor-compatible task folders and the built-in sets
(``taskset``, ``builtin/``), each rollout's workspace and verifier (``workspace``, ``oracle``), the sandbox and the
relay that lets a sandboxed harness reach only the proxy (``sandbox``, ``relay``), the harness adapters
(``harnesses/``), rewards (``rewards``), ``make collect`` (``collect``, ``collect_plan``) and its episodes table and
figures (``episodes``, ``figures``), and the ``harnessrl`` console script (``cli``). Of the proxy it uses the
launcher (``addon.launch``), the engine pool's URL checks and the records (``addon.records``).
"""
