"""agentkv.bench: ``agentkv bench``, trace replay against real vLLM servers, arm by arm.

Three floors, each importing only those below it (a test holds them to it):

- :mod:`agentkv.bench.testbed`: the rig itself: the client path every request takes,
  the calibration probe and the testbed's own costs, CPU layout, counter scraping and
  the served-by tag of each answer;
- :mod:`agentkv.bench.run`: the protocol: arms, server sets (one server per arm, or
  replicas behind vllm-router) and the one pool runner, the replay drivers, progress;
- :mod:`agentkv.bench.report`: ``results.json`` and ``report.md``: statistics,
  headroom, plots, manifest, and the simulator check with its tables (the one place
  the bench imports :mod:`agentkv.sim`).

The workload (trace selection, scaling, arrivals, pool planning, gap-model warm-up)
comes from :mod:`agentkv.workload`, which the simulator shares; ``data/`` holds the
bundled trace. The command is ``_cli.py``.
"""
