"""``FakeJudgeServer``: the fake judge's HTTP server in a daemon thread of this process.

The in-process API of ``genrm_grpc.testing.server`` (what it serves is described
there): start and stop it, read its URL, statistics and node state, change its faults.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Self

from genrm_grpc.testing.faults import (
    FakeJudgeConfig,
    JudgeState,
)
from genrm_grpc.testing.server import _FakeJudgeHTTPServer


class FakeJudgeServer:
    """A fake GenRM judge (TEST DOUBLE, not a model) served from a daemon thread.

    ``start()`` binds (port 0 = any free port) and serves; ``url`` is the base URL to
    give the judge client. ``stop()`` releases hung requests and closes connections.
    """

    def __init__(self, config: FakeJudgeConfig | None = None) -> None:
        self._config = config or FakeJudgeConfig()
        self._state = JudgeState(self._config)
        self._httpd: _FakeJudgeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        if self._httpd is not None:
            raise RuntimeError("fake judge already started")
        self._state.stopping.clear()
        self._state.node.start()
        httpd = _FakeJudgeHTTPServer((self._config.host, self._config.port), self._state)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-judge:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._state.stopping.set()
        self._state.node.stop()
        httpd.shutdown()
        httpd.drop_connections()
        httpd.server_close()
        if thread is not None:
            thread.join()
        self._state.node.close()
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("fake judge not started")
        return int(self._httpd.server_address[1])

    @property
    def host(self) -> str:
        if self._httpd is None:
            raise RuntimeError("fake judge not started")
        return str(self._httpd.server_address[0])

    @property
    def url(self) -> str:
        """Base URL (no ``/v1``), e.g. ``http://127.0.0.1:38123``."""
        return f"http://{self.host}:{self.port}"

    def stats(self) -> dict[str, Any]:
        """The same JSON object that ``GET /stats`` returns."""
        return self._state.snapshot()

    def reset_stats(self) -> None:
        self._state.reset()

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault rates, first-n counts, latency or retry_after_s at runtime."""
        return self._state.set_faults(changes)

    def control(self, **changes: Any) -> dict[str, Any]:
        """Change the node's mode, served models, slots, speed… (as ``POST /control``)."""
        return self._state.control(changes)

    def node_stats(self) -> dict[str, Any]:
        """The farm-node counters (``GET /stats``'s ``node``)."""
        return self._state.node.snapshot()

    def wait_for_node(self, timeout: float = 30.0, **targets: int) -> dict[str, Any]:
        """Block until every named node counter is >= its target; raise on timeout."""
        met, stats = self._state.node.wait_for(targets, timeout)
        if not met:
            raise TimeoutError(f"node counters {stats} never reached {targets}")
        return stats

    def wait_for_requests(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` judge requests were counted (for tests)."""
        state = self._state
        with state.counted:
            return state.counted.wait_for(lambda: state.total >= count, timeout)
