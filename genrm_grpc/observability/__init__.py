"""Observability: the hooks the core calls, and their Prometheus and OpenTelemetry backends.

``hooks`` has no third-party imports, so the runtime and the judge client stay free of
prometheus-client and OpenTelemetry; ``metrics`` and ``tracing`` implement the hooks.
"""
