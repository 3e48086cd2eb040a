/**
 * `@checkpointd/client`: the checkpointd daemon from TypeScript and JavaScript.
 *
 *     const client = await connect({ address: "unix:///run/checkpointd.sock" });
 *     const saved = await captureSandboxCheckpoint({ client, threadId: "t1" });
 *     const restored = await restoreSandboxCheckpoint({ client, threadId: "t1" });
 *
 * @packageDocumentation
 */
export {
  ATTEMPT_METADATA,
  CheckpointdClient,
  DEFAULT_DEADLINES,
  grpcTarget,
  type CallKind,
  type CallOptions,
  type CheckpointdRpcs,
  type ClientSettings,
  type HealthRpcs,
  type RequestOf,
  type ResponseOf,
  type RetryOptions,
  type Rpc,
  type ServiceClient,
} from "./client.js";
export {
  connect,
  DEFAULT_WORKSPACE_ROOT,
  resolveConnectOptions,
  type ConnectOptions,
  type TlsOptions,
} from "./connect.js";
export * from "./errors.js";
export * from "./sandbox.js";
export * from "./maintenance.js";
export * from "./checkpoints.js";
export * from "./summary.js";
export { type SandboxSecrets } from "./options.js";
// The generated messages and enums of the contract (checkpointd.v1): the raw
// replies of the client's RPC methods.
export * from "./gen/checkpointd/v1/checkpointd.js";
export { HealthCheckResponse_ServingStatus as ServingStatus } from "./gen/grpc/health/v1/health.js";
