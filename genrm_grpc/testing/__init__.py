"""Test doubles shipped with genrm-grpc: the fake judge and a manual clock.

Nothing in the service imports this package. It exists for the tests, the benchmarks and
the demo (``genrm-grpc fake-judge`` serves the fake judge from the command line).
"""

from genrm_grpc.testing.clock import ManualClock
from genrm_grpc.testing.server import (
    FAULT_KINDS,
    RUNTIME_FIELDS,
    FakeJudgeConfig,
    FakeJudgeServer,
    fake_score,
    fake_verdict,
    main,
    pair_key,
    parse_latency_spec,
    verdict_text,
)

__all__ = [
    "FAULT_KINDS",
    "RUNTIME_FIELDS",
    "FakeJudgeConfig",
    "FakeJudgeServer",
    "ManualClock",
    "fake_score",
    "fake_verdict",
    "main",
    "pair_key",
    "parse_latency_spec",
    "verdict_text",
]
