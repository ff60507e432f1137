"""The fake judge node's ``/metrics``: Prometheus text under vLLM's metric names.

A TEST DOUBLE: every value is simulated (``genrm_grpc.testing.node``). The series are
a table, one row per metric, in the order they are written.
"""

from __future__ import annotations

from collections.abc import Mapping

#: (name, type, help, the sample: ``running``, ``waiting``, ``usage`` or a counter name).
_SERIES: tuple[tuple[str, str, str, str], ...] = (
    ("vllm:num_requests_running", "gauge", "Requests in a slot (simulated).", "running"),
    ("vllm:num_requests_waiting", "gauge", "Requests waiting for a slot (simulated).", "waiting"),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 = 100% (simulated).", "usage"),
    (
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "Older name of vllm:kv_cache_usage_perc (simulated).",
        "usage",
    ),
    ("vllm:prompt_tokens_total", "counter", "Prompt tokens (simulated).", "prompt_tokens"),
    (
        "vllm:generation_tokens_total",
        "counter",
        "Generated tokens (simulated).",
        "generation_tokens",
    ),
    (
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache (simulated).",
        "prefix_cache_queries",
    ),
    (
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache (simulated).",
        "prefix_cache_hits",
    ),
)


def vllm_metrics_text(
    model: str, counters: Mapping[str, int], running: int, waiting: int, usage: float
) -> str:
    """The exposition of one node's state (read under its lock by the caller)."""
    label = 'model_name="' + model.replace("\\", "\\\\").replace('"', '\\"') + '"'
    lines = ["# fake-genrm-judge: a test double; every value below is simulated"]

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{{{labels}}} {value:g}")

    gauges: dict[str, float] = {"running": running, "waiting": waiting, "usage": usage}
    for name, kind, help_text, sample in _SERIES:
        value = gauges[sample] if sample in gauges else counters[sample]
        metric(name, kind, help_text, [(label, value)])
    metric(
        "vllm:request_success_total",
        "counter",
        "Finished requests (simulated).",
        [
            (f'{label},finished_reason="stop"', counters["finished_stop"]),
            (f'{label},finished_reason="length"', counters["finished_length"]),
        ],
    )
    metric(
        "fake_judge_requests_aborted_total",
        "counter",
        "Requests whose client closed the connection while waiting or generating.",
        [(label, counters["aborted"])],
    )
    return "\n".join(lines) + "\n"
