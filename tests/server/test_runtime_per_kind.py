"""Every kind of store is decided by the one runtime, over the group store it calls for:
the suites test what they claim to."""

from __future__ import annotations

from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.store.local import LocalGroups
from tests.server.conftest import StartServer


async def test_each_kind_of_store_is_decided_by_the_one_runtime_over_its_group_store(
    start_server: StartServer, store_kind: str
) -> None:
    server, _ = await start_server()
    runtime = server.runtime
    assert isinstance(runtime, ReplicaRuntime)
    # sqlite and memory: the one-replica case, over this process's own group store (the
    # test's SQLite file behind it, or nothing); redis: the store the replicas share.
    assert isinstance(runtime.shared, LocalGroups) == (store_kind != "redis")
    assert runtime.shared.shared_by_replicas == (store_kind == "redis")
    assert runtime.store.survives_restart == (store_kind != "memory")
