"""The bench's testbed: what a replay runs on and how it is observed.

``_client`` (one streamed token-id completion through the product's client, the path of
every bench request), ``_probe`` (the calibration requests) and ``_costs`` (the
testbed's figures and the processes' CPU time), ``_cpulayout`` (where a CPU server's
processes run), ``_scrape`` (vLLM's and the plugin's counters, per replica) and
``_servedby`` (each answer tagged with the replica that served it). Imports nothing
from :mod:`agentkv.bench.run` or :mod:`agentkv.bench.report`.
"""
