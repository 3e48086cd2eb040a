/**
 * The daemon's errors as classes with the names and codes of TanStack AI's
 * `@tanstack/ai-sandbox` API, plus one class per category of failure.
 *
 * Every failed call leaves the daemon as a gRPC status whose
 * `grpc-status-details-bin` trailer holds a `google.rpc.Status` with a
 * `google.rpc.ErrorInfo` (domain `checkpointd`, reason = the stable code such as
 * `SANDBOX_SNAPSHOT_WRITER_CONFLICT`, metadata naming the thread, checkpoint or
 * path). {@link toCheckpointdError} turns that into one of the classes below:
 *
 * - `code`: the ErrorInfo reason; for a status without ErrorInfo (the daemon is
 *   unreachable, a deadline passed, the call was cancelled) it is
 *   `SANDBOX_SNAPSHOT_` + the gRPC status name, e.g. `SANDBOX_SNAPSHOT_CANCELLED`.
 * - `grpcCode`: the numeric gRPC status. An error the SDK raises itself carries
 *   the status its code always comes with (a bad argument: 3, INVALID_ARGUMENT).
 * - `category`: `cancelled`, `deadline`, `unauthenticated`, `unavailable`,
 *   `not_found` or `conflict` (from the gRPC status), else `undefined`.
 * - `metadata`: the ErrorInfo metadata (strings).
 * - `retryAfterMs`: from a `google.rpc.RetryInfo` detail, else from the metadata
 *   key `retry_after_ms`, when the server sent either (WRITER_CONFLICT and
 *   WRITER_LOST do).
 * - `cause`: the grpc-js error itself.
 *
 * The codes, their statuses and categories come from `clients/shared/errors.json`,
 * the vocabulary every checkpointd SDK shares.
 */
import { Metadata, status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";

import { ErrorInfo, RetryInfo } from "./gen/google/rpc/error_details.js";
import { Status } from "./gen/google/rpc/status.js";
import { VOCABULARY } from "./gen/vocabulary.js";

const DETAILS_KEY = "grpc-status-details-bin";
const TYPE_PREFIX = "type.googleapis.com/";

/** A group of failures a caller handles alike, whatever their exact code. */
export type ErrorCategory = keyof typeof VOCABULARY.categories;
type StatusName = keyof typeof VOCABULARY.grpcStatus;
type Entry = { readonly status: StatusName; readonly class: string };

/** Every code of the daemon and this SDK, with its gRPC status and reference class. */
export const ERROR_CODES: Readonly<Record<string, Entry>> = {
  ...VOCABULARY.reasons,
  ...VOCABULARY.sdkReasons,
};

const STATUS_NAMES = Object.keys(VOCABULARY.grpcStatus) as StatusName[];
const CATEGORY_BY_STATUS = new Map<number, ErrorCategory>(
  Object.entries(VOCABULARY.categories).flatMap(([category, statuses]) =>
    statuses.map((name) => [VOCABULARY.grpcStatus[name], category as ErrorCategory] as const),
  ),
);

/** The code of a status that came without ErrorInfo: `SANDBOX_SNAPSHOT_CANCELLED`, ... */
export function codeForStatus(grpcCode: number): string {
  return VOCABULARY.prefix + (STATUS_NAMES.find((name) => VOCABULARY.grpcStatus[name] === grpcCode) ?? "UNKNOWN");
}

/** The gRPC status a code always comes with (UNKNOWN for a code of no vocabulary). */
export function statusForCode(code: string): number {
  const entry = ERROR_CODES[code];
  if (entry !== undefined) return VOCABULARY.grpcStatus[entry.status];
  const name = code.slice(VOCABULARY.prefix.length) as StatusName;
  return code.startsWith(VOCABULARY.prefix) && name in VOCABULARY.grpcStatus
    ? VOCABULARY.grpcStatus[name]
    : GrpcStatus.UNKNOWN;
}

/** The category of a gRPC status, when it has one. */
export function categoryOf(grpcCode: number): ErrorCategory | undefined {
  return CATEGORY_BY_STATUS.get(grpcCode);
}

export interface ErrorInit {
  code: string;
  /** Default: the status the code always comes with. */
  grpcCode?: GrpcStatus;
  metadata?: Record<string, string>;
  retryAfterMs?: number;
  cause?: unknown;
}

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
  /** The category of failure, from the gRPC status. */
  readonly category: ErrorCategory | undefined;

  constructor(message: string, init: ErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.code = init.code;
    this.grpcCode = init.grpcCode ?? statusForCode(init.code);
    this.category = categoryOf(this.grpcCode);
    // A cancelled call is an AbortError, as a fetch() that was aborted is.
    this.name = this.category === "cancelled" ? "AbortError" : new.target.name;
    this.metadata = Object.freeze({ ...(init.metadata ?? {}) });
    this.retryAfterMs = init.retryAfterMs;
  }
}

// ---------------------------------------------------------------- the reference classes

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

// ---------------------------------------------------------------- the category classes

/**
 * `error instanceof CheckpointdConflictError` holds for every error of that
 * category, whatever its reference class: a WRITER_CONFLICT is both a
 * `SandboxCheckpointWriterConflictError` and a `CheckpointdConflictError`.
 */
function isOfCategory(value: unknown, category: ErrorCategory): boolean {
  return value instanceof SandboxCheckpointError && value.category === category;
}

/** The call was cancelled (an `AbortSignal` fired, or the channel closed): `name` is `"AbortError"`. */
export class CheckpointdCancelledError extends SandboxCheckpointError {
  static [Symbol.hasInstance](value: unknown): boolean {
    return isOfCategory(value, "cancelled");
  }
}
/** The call's deadline passed (`timeoutMs`, or the default deadline of its kind). */
export class CheckpointdDeadlineError extends SandboxCheckpointError {
  static [Symbol.hasInstance](value: unknown): boolean {
    return isOfCategory(value, "deadline");
  }
}
/** A missing or wrong token, or a client certificate the daemon refused. */
export class CheckpointdUnauthenticatedError extends SandboxCheckpointError {
  static [Symbol.hasInstance](value: unknown): boolean {
    return isOfCategory(value, "unauthenticated");
  }
}
/** The daemon (or its store) cannot be reached, is starting or draining: retry later. */
export class CheckpointdUnavailableError extends SandboxCheckpointError {
  static [Symbol.hasInstance](value: unknown): boolean {
    return isOfCategory(value, "unavailable");
  }
}
/** No such checkpoint, fork source, entry or artifact. */
export class CheckpointdNotFoundError extends SandboxCheckpointError {
  static [Symbol.hasInstance](value: unknown): boolean {
    return isOfCategory(value, "not_found");
  }
}
/** Another writer, a moved head, a used id or a file that kept changing: try again. */
export class CheckpointdConflictError extends SandboxCheckpointError {
  static [Symbol.hasInstance](value: unknown): boolean {
    return isOfCategory(value, "conflict");
  }
}

type ErrorClass = new (message: string, init: ErrorInit) => SandboxCheckpointError;

/** The classes errors.json names, by name. */
const REFERENCE_CLASSES: Readonly<Record<string, ErrorClass>> = {
  SandboxCheckpointError,
  SandboxCheckpointConflictError,
  SandboxCheckpointDuplicateIdError,
  SandboxCheckpointInvalidIdError,
  SandboxCheckpointInvalidEntryError,
  SandboxCheckpointParentMismatchError,
  SandboxCheckpointNotHeadError,
  SandboxCheckpointWriterConflictError,
  SandboxCheckpointWriterLostError,
  SandboxCheckpointInvalidArgumentError,
  SandboxSnapshotError,
};

const CATEGORY_CLASSES: Readonly<Record<ErrorCategory, ErrorClass>> = {
  cancelled: CheckpointdCancelledError,
  deadline: CheckpointdDeadlineError,
  unauthenticated: CheckpointdUnauthenticatedError,
  unavailable: CheckpointdUnavailableError,
  not_found: CheckpointdNotFoundError,
  conflict: CheckpointdConflictError,
};

/**
 * The class an error of `code` is made with: its reference class when the
 * vocabulary names one other than the base, else its category's class, else
 * the base class.
 */
export function errorClassFor(code: string, grpcCode: number = statusForCode(code)): ErrorClass {
  const named = REFERENCE_CLASSES[ERROR_CODES[code]?.class ?? ""];
  if (named !== undefined && named !== SandboxCheckpointError) return named;
  const category = categoryOf(grpcCode);
  return category === undefined ? SandboxCheckpointError : CATEGORY_CLASSES[category];
}

/** A new error of `code`, of the class the vocabulary gives it. */
export function checkpointdError(message: string, init: ErrorInit): SandboxCheckpointError {
  const ErrorClass = errorClassFor(init.code, init.grpcCode ?? statusForCode(init.code));
  return new ErrorClass(message, init);
}

/** A bad argument found by the SDK before any call: INVALID_ARGUMENT (3). */
export function invalidArgument(
  message: string,
  metadata: Record<string, string> = {},
  code = "SANDBOX_SNAPSHOT_INVALID_ARGUMENT",
): SandboxCheckpointError {
  return checkpointdError(message, { code, metadata });
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
  const code = info?.reason || codeForStatus(error.code);
  const ErrorClass = errorClassFor(code, error.code);
  return new ErrorClass(error.details || error.message, {
    code,
    grpcCode: error.code,
    metadata,
    retryAfterMs,
    cause: error,
  });
}
