"""The client side: the OpenAI-client wrapper, backends, lifecycle channel and accounting."""
