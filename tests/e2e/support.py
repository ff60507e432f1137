"""Helpers shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2


def error_reason(exc: grpc.RpcError) -> str:
    """The ``google.rpc.ErrorInfo`` reason of a failed call ("" when it carries none)."""
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info.reason
    return ""


def until(condition: Callable[[], object], timeout: float = 60.0) -> None:
    """Poll ``condition`` (a read of the system's own state) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@contextlib.contextmanager
def running(servers: list[Any]) -> Iterator[list[Any]]:
    """Start every server (``start()``), and close them all (``close()``) afterwards."""
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.close()
