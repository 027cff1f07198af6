"""Client-side advice (pure, no I/O): the Advisor that turns gap forecasts and server load
into CacheAdvice, its retention cost model, KV sizes and the shadow log.

The public names (``agentkv.Advisor``, ``agentkv.CostModel``, ...) are re-exported by
:mod:`agentkv`; the server side of the policy lives in :mod:`agentkv.residency`.
"""
