"""Test doubles shipped with genrm-grpc: the fake judge and a manual clock.

Nothing in the service imports this package; it exists for the tests, the benchmarks
and the demo. By concern:

* ``heuristic`` — the fake judge's deterministic verdicts (word overlap and length);
* ``faults`` — its configuration, the injectable faults and the request counters;
* ``server`` — the OpenAI-compatible HTTP server and ``FakeJudgeServer`` (in process);
* ``cli`` — ``genrm-grpc fake-judge`` (``python -m genrm_grpc.testing.cli``);
* ``clock`` — ``ManualClock``, time that moves only when a test says so.
"""

from genrm_grpc.testing.clock import ManualClock
from genrm_grpc.testing.faults import (
    FAULT_KINDS,
    RUNTIME_FIELDS,
    FakeJudgeConfig,
    parse_latency_spec,
)
from genrm_grpc.testing.heuristic import fake_score, fake_verdict, pair_key, verdict_text
from genrm_grpc.testing.inprocess import FakeJudgeServer

__all__ = [
    "FAULT_KINDS",
    "RUNTIME_FIELDS",
    "FakeJudgeConfig",
    "FakeJudgeServer",
    "ManualClock",
    "fake_score",
    "fake_verdict",
    "pair_key",
    "parse_latency_spec",
    "verdict_text",
]
