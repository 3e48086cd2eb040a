/**
 * The seeds' functions (`@tanstack/ai-sandbox`'s names), done by the daemon.
 *
 * Where the seeds take a sandbox handle and stores, these take a connected
 * `client`: the daemon holds the workspace, the checkpoint store and the blobs.
 */
import { status as GrpcStatus } from "@grpc/grpc-js";

import type { CallOptions, CheckpointdClient } from "./client.js";
import {
  SandboxCheckpointError,
  SandboxCheckpointInvalidArgumentError,
  SandboxSnapshotError,
} from "./errors.js";
import type {
  Artifact,
  CaptureDone,
  RestoreDone,
  CheckpointSummary,
  KeptBlob,
  Progress,
  SweepBlobsSummary,
  SweepFailure,
} from "./gen/checkpointd/v1/checkpointd.js";

/** Which files a capture keeps and a restore manages (gitignore dialect). */
export interface SandboxPolicy {
  exclude?: string[];
  include?: string[];
  /** Unset means true: any `.git`, `node_modules` or `.env*` segment is excluded. */
  defaultExcludes?: boolean;
}

export interface CaptureSandboxCheckpointOptions extends CallOptions {
  client: CheckpointdClient;
  threadId: string;
  /** Names the checkpoint; its reason is then `named`. */
  label?: string;
  policy?: SandboxPolicy;
  /**
   * Secret values (at least 4 bytes each); stored files hold zero bytes
   * instead. Named (`{ NAME: value }`), a restore finds them by name.
   */
  secrets?: SandboxSecrets;
  /** Messages to keep with the files, any JSON values (default `[]`). */
  conversation?: unknown[];
  /** Records from `client.uploadArtifactBytes(...)`. */
  artifacts?: Artifact[];
  /** A folder below the daemon's workspace root to capture instead of the root. */
  workspaceSubdir?: string;
  sourceRunId?: string;
  /** Idempotency key (generated when absent); retries reuse it. */
  requestId?: string;
  /**
   * Append nothing when the files, conversation and artifacts equal the head's
   * (and no label is given): the result is then the head, with `unchanged`.
   */
  skipIfUnchanged?: boolean;
  /** Sees every progress event. */
  onProgress?: (progress: Progress) => void;
}

/** The saved checkpoint's summary, with the capture's stats. */
export type CapturedCheckpoint = CheckpointSummary & {
  stats: CaptureDone["stats"];
  /** True when a retry found the checkpoint an earlier attempt committed. */
  replayed: boolean;
  /** True when `skipIfUnchanged` found nothing new: this is the head. */
  unchanged: boolean;
};

function secretBytes(secret: string | Uint8Array): Uint8Array {
  return typeof secret === "string" ? Buffer.from(secret, "utf8") : secret;
}

function conversationDocuments(conversation: unknown[]): string[] {
  return conversation.map((message, index) => {
    const text = JSON.stringify(message);
    if (text === undefined) {
      throw new SandboxCheckpointInvalidArgumentError(
        `conversation[${index}] is not a JSON value`,
        { code: "SANDBOX_SNAPSHOT_INVALID_ARGUMENT", metadata: { index: String(index) } },
      );
    }
    return text;
  });
}

function callOptions(options: CallOptions): CallOptions {
  return {
    timeoutMs: options.timeoutMs,
    signal: options.signal,
    waitForReady: options.waitForReady,
    metadata: options.metadata,
  };
}

/**
 * Saves the daemon's workspace as a new checkpoint at the head of `threadId` and
 * returns its summary. Throws `SandboxCheckpointWriterConflictError` while another
 * writer holds the thread (skip that capture: the next one saves the same files).
 */
export async function captureSandboxCheckpoint(
  options: CaptureSandboxCheckpointOptions,
): Promise<CapturedCheckpoint> {
  const events = options.client.capture(
    {
      threadId: options.threadId,
      label: options.label,
      policy: options.policy,
      ...secretFields(options.secrets),
      conversation: conversationDocuments(options.conversation ?? []),
      artifacts: options.artifacts ?? [],
      workspaceSubdir: options.workspaceSubdir ?? "",
      sourceRunId: options.sourceRunId,
      requestId: options.requestId,
      skipIfUnchanged: options.skipIfUnchanged ?? false,
    },
    callOptions(options),
  );
  let done: CaptureDone | undefined;
  // Read to the end of the stream (its status): never cancel after done.
  for await (const { event } of events) {
    if (event?.$case === "progress") options.onProgress?.(event.value);
    else if (event?.$case === "done") done = event.value;
  }
  if (done?.checkpoint === undefined) {
    // client.capture throws when the stream ends without its done event.
    throw new SandboxCheckpointError("the capture's done event names no checkpoint", {
      code: "SANDBOX_SNAPSHOT_INTERNAL",
      grpcCode: GrpcStatus.INTERNAL,
    });
  }
  const { stats, replayed, unchanged } = done;
  return { ...done.checkpoint, stats, replayed, unchanged };
}

/**
 * Secret values: a list (matched by position with the capture's list) or an
 * object of named values (`{ OPENAI_API_KEY: "sk-..." }`), matched by name, so
 * a restore finds them whatever their order. Strings are sent as UTF-8.
 */
export type SandboxSecrets = Array<string | Uint8Array> | Record<string, string | Uint8Array>;

/** The request fields of a list or of named secrets. */
export function secretFields(secrets: SandboxSecrets | undefined): {
  secrets: Uint8Array[];
  secretNames: string[];
} {
  if (secrets === undefined) return { secrets: [], secretNames: [] };
  if (Array.isArray(secrets)) return { secrets: secrets.map(secretBytes), secretNames: [] };
  const names = Object.keys(secrets);
  return { secrets: names.map((name) => secretBytes(secrets[name]!)), secretNames: names };
}

export interface RestoreSandboxCheckpointOptions extends CallOptions {
  client: CheckpointdClient;
  threadId: string;
  /** Restore this checkpoint of the thread instead of the newest. */
  checkpointId?: string;
  policy?: SandboxPolicy;
  workspaceSubdir?: string;
  /**
   * The values capture zeroed, to write back: the same list (by position) or
   * the same names it was given. Never logged, stored or sent back.
   */
  secrets?: SandboxSecrets;
  /**
   * Plan only: nothing is fetched or changed, and no writer lease is taken.
   * The result carries `plan`: the counts and the paths a restore would write
   * and delete now.
   */
  dryRun?: boolean;
  /**
   * Throw `SANDBOX_SNAPSHOT_UNFILLED_SECRETS` when files were left holding
   * zeros where capture found a secret this restore was not given. The
   * restore has happened by then: give the secrets and restore again.
   */
  requireSecrets?: boolean;
  onProgress?: (progress: Progress) => void;
}

/** What a dry run would do: counts, and the paths it would write and delete. */
export interface RestorePlanResult {
  /** Files and symlinks whose content would be written. */
  filesWritten: number;
  /** Paths the policy manages that the checkpoint lacks. */
  pathsDeleted: number;
  /** Files already identical (at most their mode or mtime is set again). */
  filesKept: number;
  dirsCreated: number;
  bytesToFetch: number;
  blobsToFetch: number;
  written: string[];
  deleted: string[];
}

/** The restored checkpoint's summary, with what the restore could not fill. */
export type RestoredCheckpoint = CheckpointSummary & {
  dryRun: false;
  /**
   * Files left holding zeros where capture found a secret this restore was
   * not given (at most the first 10 000; `unfilledSecretCount` counts all).
   */
  unfilledSecretPaths: string[];
  unfilledSecretCount: number;
  durationMs: number;
};

/** A dry run's result: the checkpoint it planned, and the plan. */
export type PlannedRestore = CheckpointSummary & {
  dryRun: true;
  plan: RestorePlanResult;
  durationMs: number;
};

/**
 * Restores the newest (or the given) checkpoint of `threadId` into the daemon's
 * workspace. Returns the checkpoint, or `null` when the thread has none (the
 * workspace stays as it is). An id not on the thread throws `SandboxSnapshotError`
 * with code `SANDBOX_SNAPSHOT_MISSING_CHECKPOINT`. With `dryRun`, changes
 * nothing and returns the plan.
 */
export async function restoreSandboxCheckpoint(
  options: RestoreSandboxCheckpointOptions & { dryRun: true },
): Promise<PlannedRestore | null>;
export async function restoreSandboxCheckpoint(
  options: RestoreSandboxCheckpointOptions & { dryRun?: false },
): Promise<RestoredCheckpoint | null>;
export async function restoreSandboxCheckpoint(
  options: RestoreSandboxCheckpointOptions,
): Promise<RestoredCheckpoint | PlannedRestore | null>;
export async function restoreSandboxCheckpoint(
  options: RestoreSandboxCheckpointOptions,
): Promise<RestoredCheckpoint | PlannedRestore | null> {
  const dryRun = options.dryRun ?? false;
  const events = options.client.restore(
    {
      threadId: options.threadId,
      checkpointId: options.checkpointId,
      policy: options.policy,
      workspaceSubdir: options.workspaceSubdir ?? "",
      dryRun,
      ...secretFields(options.secrets),
    },
    callOptions(options),
  );
  const written: string[] = [];
  const deleted: string[] = [];
  let done: RestoreDone | undefined;
  // Read to the end of the stream (its status), never cancel after done: the
  // daemon would log a cancelled call for a restore that succeeded.
  for await (const { event } of events) {
    if (event?.$case === "progress") options.onProgress?.(event.value);
    else if (event?.$case === "planPaths") {
      written.push(...event.value.written);
      deleted.push(...event.value.deleted);
    } else if (event?.$case === "done") done = event.value;
  }
  if (done === undefined) {
    throw new SandboxCheckpointError("the restore stream ended without its done event", {
      code: "SANDBOX_SNAPSHOT_UNAVAILABLE",
      grpcCode: GrpcStatus.UNAVAILABLE,
    });
  }
  if (done.checkpoint === undefined) return null;
  const durationMs = Number(done.durationMs);
  if (dryRun) {
    const plan = done.plan;
    return {
      ...done.checkpoint,
      dryRun: true,
      durationMs,
      plan: {
        filesWritten: Number(plan?.filesWritten ?? 0n),
        pathsDeleted: Number(plan?.pathsDeleted ?? 0n),
        filesKept: Number(plan?.filesKept ?? 0n),
        dirsCreated: Number(plan?.dirsCreated ?? 0n),
        bytesToFetch: Number(plan?.bytesToFetch ?? 0n),
        blobsToFetch: Number(plan?.blobsToFetch ?? 0n),
        written,
        deleted,
      },
    };
  }
  if (!done.restored) return null;
  const restored: RestoredCheckpoint = {
    ...done.checkpoint,
    dryRun: false,
    durationMs,
    unfilledSecretPaths: done.unfilledSecretPaths,
    unfilledSecretCount: Number(done.unfilledSecretCount),
  };
  if (options.requireSecrets && restored.unfilledSecretCount > 0) {
    throw unfilledSecretsError(restored);
  }
  return restored;
}

function unfilledSecretsError(restored: RestoredCheckpoint): SandboxSnapshotError {
  const shown = restored.unfilledSecretPaths.slice(0, 5).join(", ");
  const more = restored.unfilledSecretCount > 5 ? ", ..." : "";
  return new SandboxSnapshotError(
    `checkpoint ${restored.id} was restored, but ${restored.unfilledSecretCount} file(s) hold ` +
      `zeros where capture found a secret this restore was not given (${shown}${more}); ` +
      "restore again with those secrets",
    {
      code: "SANDBOX_SNAPSHOT_UNFILLED_SECRETS",
      grpcCode: GrpcStatus.FAILED_PRECONDITION,
      metadata: {
        checkpoint_id: restored.id,
        unfilled_secret_count: String(restored.unfilledSecretCount),
        path: restored.unfilledSecretPaths[0] ?? "",
      },
    },
  );
}

export interface DeleteCheckpointsOptions extends CallOptions {
  client: CheckpointdClient;
  threadId: string;
  /** Keep the head and its `keep - 1` nearest ancestors (at least 1). */
  keep: number;
  /** Report what would be deleted, delete nothing. */
  dryRun?: boolean;
}

/**
 * Deletes all but the newest `keep` checkpoints of the head chain; returns the
 * deleted ids, oldest first (at most the first 10 000: `idsTruncated`), and
 * how many there were in all.
 */
export async function deleteCheckpoints(
  options: DeleteCheckpointsOptions,
): Promise<{ deleted: string[]; deletedCount: number; idsTruncated: boolean; dryRun: boolean }> {
  if (!Number.isInteger(options.keep) || options.keep < 1) {
    throw new SandboxCheckpointInvalidArgumentError(
      `keep must be an integer of at least 1, not ${options.keep}`,
      { code: "SANDBOX_SNAPSHOT_INVALID_ARGUMENT", metadata: { keep: String(options.keep) } },
    );
  }
  const reply = await options.client.prune(
    { threadId: options.threadId, keep: options.keep, dryRun: options.dryRun ?? false },
    callOptions(options),
  );
  return {
    deleted: reply.deletedCheckpointIds,
    deletedCount: Number(reply.deletedCount),
    idsTruncated: reply.idsTruncated,
    dryRun: reply.dryRun,
  };
}

export interface SweepSandboxBlobsOptions extends CallOptions {
  client: CheckpointdClient;
  /**
   * Only blobs uploaded at least this long ago are deleted; longer than your
   * longest capture. Unset: the daemon's default (1 hour).
   */
  olderThanMs?: number;
  dryRun?: boolean;
  /**
   * Repack a pack whose live blobs fill less than this percentage of it (0-100;
   * 0 never repacks). Unset: the daemon's default, 50.
   */
  repackBelowPercent?: number;
}

/** The deleted keys (as in the seeds), with what was kept and why, failures and the daemon's summary. */
export type SweepResult = string[] & {
  kept: KeptBlob[];
  failures: SweepFailure[];
  dryRun: boolean;
  summary: SweepBlobsSummary;
};

/**
 * Deletes blobs no checkpoint uses that are at least `olderThanMs` old; returns
 * the deleted keys. The daemon streams its results in batches; this gathers
 * them (use `client.sweepBlobs()` to handle a huge bucket batch by batch).
 */
export async function sweepSandboxBlobs(options: SweepSandboxBlobsOptions): Promise<SweepResult> {
  const olderThanMs = options.olderThanMs;
  if (olderThanMs !== undefined && (!Number.isSafeInteger(olderThanMs) || olderThanMs < 0)) {
    throw new SandboxCheckpointInvalidArgumentError(
      `olderThanMs must be a non-negative integer, not ${olderThanMs}`,
      { code: "SANDBOX_SNAPSHOT_INVALID_ARGUMENT", metadata: { older_than_ms: String(olderThanMs) } },
    );
  }
  const repackBelowPercent = options.repackBelowPercent;
  if (
    repackBelowPercent !== undefined &&
    (!Number.isSafeInteger(repackBelowPercent) || repackBelowPercent < 0 || repackBelowPercent > 100)
  ) {
    throw new SandboxCheckpointInvalidArgumentError(
      `repackBelowPercent must be an integer in [0, 100], not ${repackBelowPercent}`,
      {
        code: "SANDBOX_SNAPSHOT_INVALID_ARGUMENT",
        metadata: { field: "repack_below_percent", value: String(repackBelowPercent) },
      },
    );
  }
  const deleted: string[] = [];
  const kept: KeptBlob[] = [];
  const failures: SweepFailure[] = [];
  const events = options.client.sweepBlobs(
    { olderThanMs, dryRun: options.dryRun ?? false, repackBelowPercent },
    callOptions(options),
  );
  for await (const { event } of events) {
    if (event?.$case === "batch") {
      deleted.push(...event.value.deleted);
      kept.push(...event.value.kept);
      failures.push(...event.value.failures);
    } else if (event?.$case === "summary") {
      return Object.assign(deleted, { kept, failures, dryRun: event.value.dryRun, summary: event.value });
    }
  }
  throw new SandboxCheckpointError("the sweep stream ended without its summary", {
    code: "SANDBOX_SNAPSHOT_UNAVAILABLE",
    metadata: { deleted_count: String(deleted.length) },
  });
}
