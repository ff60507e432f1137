"""The serving process freezes its start-up state out of the cyclic GC's way, and
collects its youngest generation less often than CPython's default."""

from __future__ import annotations

import gc
import os
import signal

from genrm_grpc.config import load_settings
from genrm_grpc.server.app import SERVING_GC_THRESHOLD, run


async def test_serve_freezes_its_start_up_objects_before_reporting_ready() -> None:
    settings = load_settings(listen="127.0.0.1:0", judge={"url": "http://127.0.0.1:9"})
    frozen_when_ready: list[int] = []
    threshold_when_ready: list[tuple[int, int, int]] = []

    def ready(port: int) -> None:
        frozen_when_ready.append(gc.get_freeze_count())
        threshold_when_ready.append(gc.get_threshold())
        os.kill(os.getpid(), signal.SIGTERM)  # run()'s own handler drains the server

    gc.unfreeze()
    before = gc.get_threshold()
    try:
        await run(settings, on_ready=ready)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    # Modules, classes and the server's objects: tens of thousands in any real process.
    assert frozen_when_ready and frozen_when_ready[0] > 10_000
    assert threshold_when_ready == [SERVING_GC_THRESHOLD]
    assert SERVING_GC_THRESHOLD[0] > 700  # CPython's default, which this replaces
