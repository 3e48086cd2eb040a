"""Gateway mode (docs/gateway.md): sidecars without store credentials.

* ``tokens`` — scoped, signed, expiring tokens (``checkpointd token mint``);
* ``servicer`` / ``server`` — ``checkpointd gateway``: the store and the bucket
  behind the Gateway gRPC service, every call checked against its token;
* ``remote`` — the sidecar's ``RemoteCheckpointStore`` and ``RemoteBlobStore``
  (``checkpointd serve --gateway grpcs://…``).
"""
