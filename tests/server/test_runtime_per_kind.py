"""Each kind of store runs the runtime it names: the suites test what they claim to."""

from __future__ import annotations

from genrm_grpc.runtime.engine import CohortRuntime
from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.store.local import LocalGroups
from tests.server.conftest import StartServer


async def test_each_kind_of_store_is_decided_by_the_runtime_it_stands_for(
    start_server: StartServer, store_kind: str
) -> None:
    server, _ = await start_server()
    runtime = server.runtime
    if store_kind in ("sqlite", "memory"):
        assert isinstance(runtime, CohortRuntime)
    else:
        assert isinstance(runtime, ReplicaRuntime)
        # groups: the one-replica case, over this process's own group store, with the
        # test's SQLite file behind it.
        assert isinstance(runtime.shared, LocalGroups) == (store_kind == "groups")
        assert runtime.store.survives_restart
