"""The wire protocol (``docs/protocol.md``): one codec per channel, one strictness rule.

- :mod:`~agentkv.protocol._hints`: request hints in ``vllm_xargs`` (client encodes,
  scheduler plugin decodes);
- :mod:`~agentkv.protocol._events`: lifecycle events on the control route;
- :mod:`~agentkv.protocol._advice`: advice objects, in events and in hints;
- :mod:`~agentkv.protocol._fields`: the rule every decoder applies;
- :mod:`~agentkv.protocol._wire`: names, limits, routes and the envelope.

Internal to agentkv: both sides of the wire import from here, so they cannot drift apart.
"""
