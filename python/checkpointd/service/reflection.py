"""Server reflection as both ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection ships only v1alpha, while current tools (grpcurl 1.9, Postman,
grpc-go's reflection client) ask for v1 first. The two protocols are the same
messages under another package name (same fields, same numbers), so one servicer
answers both: v1 calls are decoded and encoded with the v1alpha message classes,
which is byte-for-byte the v1 wire format. The v1 service's own descriptor is
added to the pool (a copy of v1alpha's with the package renamed) so that a
client can also describe it.

A method's name (``checkpointd.v1.Checkpointd.ListThreads``, what ``grpcurl
describe`` of a method and Postman send) is resolved to its service's file:
protobuf's Python pool finds messages, fields, enums and services by name, not
methods.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as v1alpha_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

V1ALPHA_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    copy = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(copy)
    copy.name = _V1_FILE
    copy.package = "grpc.reflection.v1"
    copy.options.Clear()
    # Type references are fully qualified (".grpc.reflection.v1alpha.X").
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    for message in copy.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for service in copy.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    pool.Add(copy)


class _Reflection(ReflectionServicer):
    """grpcio-reflection's servicer, resolving method names too."""

    def _file_containing_symbol(self, request: object, fully_qualified_name: str) -> object:
        service, _, method = fully_qualified_name.rpartition(".")
        try:
            self._pool.FindFileContainingSymbol(fully_qualified_name)
        except KeyError:
            try:
                found = self._pool.FindServiceByName(service)
            except KeyError:
                found = None
            if found is not None and method in found.methods_by_name:
                fully_qualified_name = service
        return super()._file_containing_symbol(request, fully_qualified_name)


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection v1 and v1alpha for ``service_names`` (both reflection
    services are listed too) from the default descriptor pool."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    servicer = _Reflection((*service_names, V1_SERVICE, V1ALPHA_SERVICE))
    v1alpha_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": handler}),)
    )
