"""``genrm-grpc judges``: the judge farm as one server sees it, for operators.

Reads the server's own Prometheus endpoint (``metrics_listen``), so it shows exactly
what the server decided (state, load, ejections, hedge point, tokens), not a second
opinion probed from elsewhere. One line per endpoint; ``--json`` for scripts. Exit 0
when at least one endpoint is healthy, 1 when none is, 2 when the endpoint cannot be
read.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_FAMILIES = {
    "genrm_judge_endpoint_in_flight": "in_flight",
    "genrm_judge_endpoint_requests": "requests",
    "genrm_judge_endpoint_failures": "failures",
    "genrm_judge_endpoint_hedges": "hedges",
    "genrm_judge_endpoint_ejections": "ejections",
    "genrm_judge_endpoint_hedge_after_seconds": "hedge_after_s",
    "genrm_judge_endpoint_queue_waiting": "queue_waiting",
}


def farm_view(exposition: str) -> list[dict[str, Any]]:
    """One dict per endpoint from a server's Prometheus exposition."""
    rows: dict[str, dict[str, Any]] = defaultdict(dict)
    for family in text_string_to_metric_families(exposition):
        key = _FAMILIES.get(family.name)
        for sample in family.samples:
            endpoint = sample.labels.get("endpoint")
            if endpoint is None:
                continue
            row = rows[endpoint]
            if key is not None and not sample.name.endswith("_created"):
                row[key] = sample.value
            elif family.name == "genrm_judge_endpoint_state" and sample.value == 1:
                row["state"] = sample.labels["state"]
            elif family.name == "genrm_judge_endpoint_tokens" and sample.name.endswith("_total"):
                row[f"{sample.labels['kind']}_tokens"] = sample.value
            elif family.name == "genrm_judge_endpoint_request_seconds":
                if sample.name.endswith("_count"):
                    row["answered"] = sample.value
                elif sample.name.endswith("_sum"):
                    row["latency_sum_s"] = sample.value
    out = []
    for endpoint, row in sorted(rows.items()):
        answered = row.pop("answered", 0.0)
        total = row.pop("latency_sum_s", 0.0)
        row["mean_latency_s"] = total / answered if answered else None
        inputs = row.get("input_tokens", 0.0)
        row["cached_share"] = row.get("cached_tokens", 0.0) / inputs if inputs else None
        out.append({"endpoint": endpoint, **row})
    return out


def _fmt(value: Any, spec: str = "g") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="genrm-grpc judges",
        description="Show the judge farm as a running server sees it, read from the "
        "server's Prometheus endpoint (its metrics_listen). Exit 0 when an endpoint is "
        "healthy, 1 when none is, 2 when the metrics cannot be read.",
    )
    parser.add_argument(
        "--metrics",
        required=True,
        metavar="HOST:PORT",
        help="the server's metrics_listen address",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    url = f"http://{args.metrics}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as reply:
            text = reply.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"genrm-grpc judges: cannot read {url}: {exc}", file=sys.stderr)
        return 2
    rows = farm_view(text)
    if not rows:
        print(f"genrm-grpc judges: {url} has no judge endpoint metrics", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        header = (
            f"{'endpoint':<40} {'state':<12} {'in_flight':>9} {'requests':>9} "
            f"{'failures':>8} {'ejected':>7} {'hedges':>6} {'hedge_s':>8} {'mean_s':>8} "
            f"{'cached':>7}"
        )
        print(header)
        for r in rows:
            cached = r.get("cached_share")
            print(
                f"{r['endpoint']:<40} {r.get('state', '?'):<12} "
                f"{_fmt(r.get('in_flight'), '.0f'):>9} {_fmt(r.get('requests'), '.0f'):>9} "
                f"{_fmt(r.get('failures'), '.0f'):>8} {_fmt(r.get('ejections'), '.0f'):>7} "
                f"{_fmt(r.get('hedges'), '.0f'):>6} {_fmt(r.get('hedge_after_s'), '.3g'):>8} "
                f"{_fmt(r.get('mean_latency_s'), '.3g'):>8} "
                f"{'-' if cached is None else f'{cached:.0%}':>7}"
            )
    return 0 if any(r.get("state") == "healthy" for r in rows) else 1


__all__ = ["farm_view", "main"]
