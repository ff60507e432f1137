"""Server reflection that serves our protos *with their comments*.

grpcio-reflection answers from the descriptor pool, whose Python descriptors carry no
source info, so ``grpcurl describe`` would show bare messages. The proto comments are
the operators' API reference, so for the files in the descriptor set that ``make
proto`` writes (``--include_source_info``) we answer with those documented file
descriptors instead; every other file (health, reflection) comes from the pool as usual.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

DESCRIPTOR_SET = ("genrm.cohort.v1", "cohort_descriptor_set.binpb")


def documented_files() -> dict[str, bytes]:
    """File name → serialized FileDescriptorProto with source info, from the client package."""
    package, name = DESCRIPTOR_SET
    data = resources.files(package).joinpath(name).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    return {f.name: f.SerializeToString() for f in files}


class DocumentedReflectionServicer(reflection.aio.ReflectionServicer):  # type: ignore[misc]
    def __init__(
        self,
        service_names: Iterable[str],
        documented: dict[str, bytes],
        pool: descriptor_pool.DescriptorPool | None = None,
    ) -> None:
        super().__init__(tuple(service_names), pool=pool)
        self._documented = documented

    def _response(self, descriptor: Any, request: Any) -> reflection_pb2.ServerReflectionResponse:
        seen: dict[str, Any] = {}
        stack = [descriptor]
        while stack:
            current = stack.pop()
            if current.name in seen:
                continue
            seen[current.name] = current
            stack.extend(current.dependencies)
        serialized = []
        for name, file in seen.items():
            documented = self._documented.get(name)
            if documented is None:
                proto = descriptor_pb2.FileDescriptorProto()
                file.CopyToProto(proto)
                documented = proto.SerializeToString()
            serialized.append(documented)
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=serialized
            ),
            original_request=request,
        )

    def _not_found(self, request: Any) -> reflection_pb2.ServerReflectionResponse:
        return reflection_pb2.ServerReflectionResponse(
            error_response=reflection_pb2.ErrorResponse(
                error_code=grpc.StatusCode.NOT_FOUND.value[0],
                error_message=grpc.StatusCode.NOT_FOUND.value[1].encode(),
            ),
            original_request=request,
        )

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        try:
            return self._response(self._pool.FindFileByName(filename), request)
        except KeyError:
            return self._not_found(request)

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        # The Python pool does not index methods ("pkg.Service.Method"); their file is
        # the service's, so `grpcurl describe pkg.Service.Method` works too.
        parent = fully_qualified_name.rpartition(".")[0]
        for name in (fully_qualified_name, parent):
            try:
                return self._response(self._pool.FindFileContainingSymbol(name), request)
            except KeyError:
                continue
        return self._not_found(request)


def enable_documented_reflection(service_names: Iterable[str], server: Any) -> None:
    """Register reflection for ``service_names`` (plus reflection itself) on ``server``."""
    names = (*service_names, reflection.SERVICE_NAME)
    servicer = DocumentedReflectionServicer(names, documented_files())
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
