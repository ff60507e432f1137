"""Small helpers shared by the benchmark sections: statistics, tables, the machine."""

from __future__ import annotations

import math
import os
import pathlib
import platform
import statistics
from collections.abc import Sequence
from importlib import metadata
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 1]) of ``values``."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def num(value: float | None, digits: int = 1) -> str:
    """A figure for a report table: thousands separated, ``n/a`` for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def mark(ok: bool) -> str:
    """A target's cell: met or missed."""
    return "✔" if ok else "✘"


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, rule, *body])


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (first column left-aligned, the rest right)."""
    align = [":--", *("--:" for _ in headers[1:])]
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join(align) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    mem_gib = math.nan
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    versions = {}
    for dist in ("grpcio", "protobuf", "httpx", "aiohttp", "orjson"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "?"
    return {
        "cpu": cpu_model(),
        "cores": cores,
        "mem_gib": mem_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "grpcio": versions["grpcio"],
        "protobuf": versions["protobuf"],
        "httpx": versions["httpx"],
        "aiohttp": versions["aiohttp"],
        "orjson": versions["orjson"],
        "loadavg_start": list(os.getloadavg()),
    }


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc/self/statm``)."""
    fields = pathlib.Path("/proc/self/statm").read_text().split()
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
