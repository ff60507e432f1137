"""What the judge client tests share: one real ``Settings`` built from its own key names,
one comparison to judge, and a retry sleep that does not wait."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from genrm_grpc.config import JudgeSettings, Settings
from genrm_grpc.judge.client import JudgeInput

#: One comparison; ``PLANET_KEYED`` carries a farm affinity key (its cohort).
PLANET = JudgeInput(
    messages=(("user", "Name the largest planet."),),
    response_1="Jupiter is the largest planet.",
    response_2="Mars.",
)
PLANET_KEYED = replace(PLANET, affinity="cohort-1")


async def no_sleep(_seconds: float) -> None:
    """The client's retry sleep, not waiting."""
    return None


def judge_settings(url: str, **keys: Any) -> Settings:
    """``Settings`` with ``judge.url`` = ``url``; each key lands in the ``judge:`` block
    when it is one of that block's keys (``model``, ``max_response_bytes``, …), else at
    the top level (``genrm_parse_retries``, ``judge_request_timeout_s``, …)."""
    block = {k: v for k, v in keys.items() if k in JudgeSettings.model_fields}
    top = {k: v for k, v in keys.items() if k not in block}
    return Settings(judge={"url": url, **block}, **top)
