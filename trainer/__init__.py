"""The trainer, run in the engine environment: the vLLM engine it starts and feeds (``engine``, ``engine_config``,
``sync``), the collect -> train -> sync loop with TRL's GRPO (``train``, ``loop``, ``grpo``, ``samples``,
``config``), SFT on captured or teacher rollouts (``sft``), held-out evaluation and its before/after comparison
(``evaluate``, ``comparison``), experiment tracking through ``report_to`` (``tracking``), the HTML report
(``report``) and the default model's preparation (``model``). Of the proxy it imports only the records contract
(``addon.records``) and the engine client (``addon.engine``).
"""
