"""Judge client settings for tests: one real ``Settings``, built from its own key names."""

from __future__ import annotations

from typing import Any

from genrm_grpc.config import JudgeSettings, Settings


def judge_settings(url: str, **keys: Any) -> Settings:
    """``Settings`` with ``judge.url`` = ``url``; each key lands in the ``judge:`` block
    when it is one of that block's keys (``model``, ``max_response_bytes``, …), else at
    the top level (``genrm_parse_retries``, ``judge_request_timeout_s``, …)."""
    block = {k: v for k, v in keys.items() if k in JudgeSettings.model_fields}
    top = {k: v for k, v in keys.items() if k not in block}
    return Settings(judge={"url": url, **block}, **top)
