"""The bench's protocol: which servers run, in which order, and the replays on them.

``_runner`` (the configuration, the pool runner and the run's raw results), ``_servers``
(the server-set interface and one server per arm), ``_replicas`` (replicas behind
vllm-router), ``_arms`` (each arm's server profile), ``_driver`` and ``_synth`` (the
replayed trajectories and their prompts) and ``_progress`` (the progress display).
Builds on :mod:`agentkv.bench.testbed`; imports nothing from :mod:`agentkv.bench.report`.
"""
