"""Events: the trajectory context, the decorators, the event schema and where events go."""
