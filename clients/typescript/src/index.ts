/**
 * `@checkpointd/client`: the checkpointd daemon from TypeScript.
 *
 *     const client = await connect({ address: "unix:///run/checkpointd.sock" });
 *     const saved = await captureSandboxCheckpoint({ client, threadId: "t1" });
 *     const restored = await restoreSandboxCheckpoint({ client, threadId: "t1" });
 */
export {
  CheckpointdClient,
  connect,
  grpcTarget,
  type CallOptions,
  type CheckpointdRpcs,
  type ConnectOptions,
  type HealthRpcs,
  type RequestOf,
  type ResponseOf,
  type RetryOptions,
  type Rpc,
  type ServiceClient,
  type TlsOptions,
} from "./client.js";
export * from "./errors.js";
export * from "./sandbox.js";
// The generated messages and enums of the contract (checkpointd.v1).
export * from "./gen/checkpointd/v1/checkpointd.js";
export {
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "./gen/grpc/health/v1/health.js";
