"""Generated gRPC code for checkpointd.v1 (see checkpointd.service.genproto)."""
