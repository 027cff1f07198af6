"""Prefixes: stable tool schemas, prompt rendering, lint, cache namespace and block hashes."""
