"""The gRPC daemon (docs/contract.md#the-grpc-service): server, servicer, the one error map, auth, config, client.

The wire contract is ``proto/checkpointd/v1/checkpointd.proto``; its generated
Python code is the package ``checkpointd.v1`` (see ``genproto``).
"""
