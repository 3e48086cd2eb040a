/**
 * The daemon's errors as classes with the seeds' names and codes.
 *
 * Every failed call leaves the daemon as a gRPC status whose
 * `grpc-status-details-bin` trailer holds a `google.rpc.Status` with a
 * `google.rpc.ErrorInfo` (domain `checkpointd`, reason = the stable code such as
 * `SANDBOX_SNAPSHOT_WRITER_CONFLICT`, metadata naming the thread, checkpoint or
 * path). {@link toCheckpointdError} turns that into one of the classes below:
 *
 * - `code`: the ErrorInfo reason; for a status without ErrorInfo (the daemon is
 *   unreachable, a deadline passed, the call was cancelled) it is
 *   `SANDBOX_SNAPSHOT_` + the gRPC status name, e.g. `SANDBOX_SNAPSHOT_UNAVAILABLE`.
 * - `metadata`: the ErrorInfo metadata (strings).
 * - `retryAfterMs`: from a `google.rpc.RetryInfo` detail, else from the metadata
 *   key `retry_after_ms`, when the server sent either (WRITER_CONFLICT and
 *   WRITER_LOST do).
 * - `grpcCode`: the numeric gRPC status; `cause`: the grpc-js error itself.
 */
import { Metadata, status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";

import { ErrorInfo, RetryInfo } from "./gen/google/rpc/error_details.js";
import { Status } from "./gen/google/rpc/status.js";

const DETAILS_KEY = "grpc-status-details-bin";
const TYPE_PREFIX = "type.googleapis.com/";

/** Base of every error this package throws for a failed call. */
export class SandboxCheckpointError extends Error {
  /** Stable, machine-readable code (the daemon's ErrorInfo reason). */
  readonly code: string;
  /** ErrorInfo metadata: the thread, checkpoint, path or key involved. */
  readonly metadata: Readonly<Record<string, string>>;
  /** How long the server asks the caller to wait before retrying, when it says. */
  readonly retryAfterMs: number | undefined;
  /** The gRPC status code (`status.ABORTED`, ...). */
  readonly grpcCode: GrpcStatus;

  constructor(
    message: string,
    init: {
      code: string;
      grpcCode?: GrpcStatus;
      metadata?: Record<string, string>;
      retryAfterMs?: number;
      cause?: unknown;
    },
  ) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.grpcCode = init.grpcCode ?? GrpcStatus.UNKNOWN;
    this.metadata = Object.freeze({ ...(init.metadata ?? {}) });
    this.retryAfterMs = init.retryAfterMs;
  }
}

/** The head of the thread moved during the capture (code `SANDBOX_SNAPSHOT_STALE_HEAD`). */
export class SandboxCheckpointConflictError extends SandboxCheckpointError {}
export class SandboxCheckpointDuplicateIdError extends SandboxCheckpointError {}
export class SandboxCheckpointInvalidIdError extends SandboxCheckpointError {}
export class SandboxCheckpointInvalidEntryError extends SandboxCheckpointError {}
export class SandboxCheckpointParentMismatchError extends SandboxCheckpointError {}
export class SandboxCheckpointNotHeadError extends SandboxCheckpointError {}
/** Another writer holds the thread's lease; skip this capture, the next one saves the same files. */
export class SandboxCheckpointWriterConflictError extends SandboxCheckpointError {}
export class SandboxCheckpointWriterLostError extends SandboxCheckpointError {}
export class SandboxCheckpointInvalidArgumentError extends SandboxCheckpointError {}
/**
 * Capture and restore failures; `code` says which: `SANDBOX_SNAPSHOT_MISSING_BLOB`,
 * `SANDBOX_SNAPSHOT_INVALID_BLOB`, `SANDBOX_SNAPSHOT_MISSING_CHECKPOINT`,
 * `SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY`, `SANDBOX_SNAPSHOT_INVALID_PATH`, ...
 */
export class SandboxSnapshotError extends SandboxCheckpointError {}

type ErrorClass = new (
  message: string,
  init: ConstructorParameters<typeof SandboxCheckpointError>[1],
) => SandboxCheckpointError;

/** The codes of `checkpointd.errors` and `checkpointd.service.status`, by class. */
const CLASS_BY_CODE: Readonly<Record<string, ErrorClass>> = {
  SANDBOX_SNAPSHOT_STALE_HEAD: SandboxCheckpointConflictError,
  SANDBOX_SNAPSHOT_DUPLICATE_ID: SandboxCheckpointDuplicateIdError,
  SANDBOX_SNAPSHOT_INVALID_ID: SandboxCheckpointInvalidIdError,
  SANDBOX_SNAPSHOT_INVALID_ENTRY: SandboxCheckpointInvalidEntryError,
  SANDBOX_SNAPSHOT_PARENT_MISMATCH: SandboxCheckpointParentMismatchError,
  SANDBOX_SNAPSHOT_NOT_HEAD: SandboxCheckpointNotHeadError,
  SANDBOX_SNAPSHOT_WRITER_CONFLICT: SandboxCheckpointWriterConflictError,
  SANDBOX_SNAPSHOT_WRITER_LOST: SandboxCheckpointWriterLostError,
  SANDBOX_SNAPSHOT_INVALID_ARGUMENT: SandboxCheckpointInvalidArgumentError,
  SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_MISSING_CHECKPOINT: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_MISSING_BLOB: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_INVALID_BLOB: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_INVALID_PATH: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_FILE_CHANGED: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_NO_SPACE: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_NAME_TOO_LONG: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_CROSS_DEVICE: SandboxSnapshotError,
  SANDBOX_SNAPSHOT_PERMISSION_DENIED: SandboxSnapshotError,
};

/** The error class for a code (the base class for codes without their own). */
export function errorClassFor(code: string): ErrorClass {
  return CLASS_BY_CODE[code] ?? SandboxCheckpointError;
}

function isServiceError(error: unknown): error is ServiceError {
  return (
    error instanceof Error &&
    typeof (error as Partial<ServiceError>).code === "number" &&
    (error as Partial<ServiceError>).metadata instanceof Metadata
  );
}

function durationMs(seconds: bigint, nanos: number): number {
  return Number(seconds) * 1000 + Math.round(nanos / 1e6);
}

/** ErrorInfo and RetryInfo from a `grpc-status-details-bin` value, when present. */
export function decodeStatusDetails(raw: Uint8Array): {
  info?: ErrorInfo;
  retryAfterMs?: number;
} {
  const out: { info?: ErrorInfo; retryAfterMs?: number } = {};
  for (const detail of Status.decode(raw).details) {
    const type = detail.typeUrl.startsWith(TYPE_PREFIX)
      ? detail.typeUrl.slice(TYPE_PREFIX.length)
      : detail.typeUrl;
    if (type === "google.rpc.ErrorInfo" && out.info === undefined) {
      out.info = ErrorInfo.decode(detail.value);
    } else if (type === "google.rpc.RetryInfo" && out.retryAfterMs === undefined) {
      const delay = RetryInfo.decode(detail.value).retryDelay;
      if (delay !== undefined) out.retryAfterMs = durationMs(delay.seconds, delay.nanos);
    }
  }
  return out;
}

/**
 * The typed error for anything a call rejected with. A grpc-js status becomes the
 * class its ErrorInfo reason names; an error of this package passes through; any
 * other value is wrapped as a `SANDBOX_SNAPSHOT_UNKNOWN` error.
 */
export function toCheckpointdError(error: unknown): SandboxCheckpointError {
  if (error instanceof SandboxCheckpointError) return error;
  if (!isServiceError(error)) {
    const message = error instanceof Error ? error.message : String(error);
    return new SandboxCheckpointError(message, { code: "SANDBOX_SNAPSHOT_UNKNOWN", cause: error });
  }
  let info: ErrorInfo | undefined;
  let retryAfterMs: number | undefined;
  const raw = error.metadata.get(DETAILS_KEY)[0];
  if (raw instanceof Uint8Array) {
    try {
      ({ info, retryAfterMs } = decodeStatusDetails(raw));
    } catch {
      // A malformed trailer must not hide the status itself.
    }
  }
  const metadata = info?.metadata ?? {};
  if (retryAfterMs === undefined && metadata.retry_after_ms !== undefined) {
    const fromMetadata = Number(metadata.retry_after_ms);
    if (Number.isFinite(fromMetadata) && fromMetadata >= 0) retryAfterMs = fromMetadata;
  }
  const code = info?.reason || `SANDBOX_SNAPSHOT_${GrpcStatus[error.code] ?? "UNKNOWN"}`;
  const ErrorClass = errorClassFor(code);
  return new ErrorClass(error.details || error.message, {
    code,
    grpcCode: error.code,
    metadata,
    retryAfterMs,
    cause: error,
  });
}
