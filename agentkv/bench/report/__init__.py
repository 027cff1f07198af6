"""The bench's report: a run's raw results into ``results.json``, ``report.md`` and plots.

``_report`` (aggregation and the markdown page), ``_stats`` and ``_headroom`` (bootstrap
intervals, ratios against B, headroom captured), ``_plots``, ``_manifest``, ``_replicas``
(per-replica figures behind a router), ``_testbedtable`` (the testbed section), and the
simulator check: ``_simcheck`` (the run's own workload through :mod:`agentkv.sim`),
``_simtable`` and ``_calldiff`` (its tables, call by call).
"""
