/**
 * `captureSandboxCheckpoint` and `restoreSandboxCheckpoint`, with the names and
 * result shapes of TanStack AI's `@tanstack/ai-sandbox` API, done by the daemon.
 *
 * Where the reference API takes a sandbox handle and stores, these take a
 * connected `client`: the daemon holds the workspace, the checkpoint store and
 * the blobs. Both read the daemon's stream to its end, so a success is never
 * logged by the daemon as a cancelled call.
 */
import type { CallOptions, CheckpointdClient } from "./client.js";
import { checkpointdError, invalidArgument, type SandboxCheckpointError } from "./errors.js";
import type { CaptureDone, Progress, RestoreDone } from "./gen/checkpointd/v1/checkpointd.js";
import {
  callOptions,
  checkOptions,
  secretFields,
  workspaceSubdir,
  type SandboxSecrets,
} from "./options.js";
import {
  toCaptureStats,
  toCheckpoint,
  toNumber,
  toRawArtifact,
  type SandboxCaptureStats,
  type Checkpoint,
  type CheckpointArtifact,
  type SandboxPolicy,
} from "./summary.js";
import type { Artifact } from "./gen/checkpointd/v1/checkpointd.js";

/** A progress event (see the contract's ProgressPhase for what each phase counts). */
export interface SandboxProgress {
  /** `lease`, `scan`, `pin`, `upload`, `append`; `resolve`, `plan`, `fetch`, `apply`, `record`. */
  phase: string;
  filesDone: number;
  /** 0 while not known. */
  filesTotal: number;
  bytesDone: number;
  bytesTotal: number;
  /** Scan only: files read and hashed so far (the others' hashes came from the stat cache). */
  filesHashed: number;
}

function toProgress(progress: Progress): SandboxProgress {
  return {
    phase: progress.phase,
    filesDone: toNumber(progress.filesDone),
    filesTotal: toNumber(progress.filesTotal),
    bytesDone: toNumber(progress.bytesDone),
    bytesTotal: toNumber(progress.bytesTotal),
    filesHashed: toNumber(progress.filesHashed),
  };
}

/** Where a capture or restore works: a folder of the daemon's workspace. */
interface WorkspaceOptions {
  /**
   * The folder to capture or restore, as an absolute path within the daemon's
   * workspace (`connect({ workspaceRoot })`, default `/workspace`), as the
   * reference API takes it. Default: the whole workspace (a restore: the
   * folder the checkpoint was captured from).
   */
  workspaceRoot?: string;
  /** The same folder relative to the daemon's workspace root (`"app"`); `"."` is the root. */
  workspaceSubdir?: string;
}

export interface CaptureSandboxCheckpointOptions extends CallOptions, WorkspaceOptions {
  client: CheckpointdClient;
  threadId: string;
  /** Names the checkpoint; its reason is then `named`. An empty label is no label. */
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
  artifacts?: Array<Artifact | CheckpointArtifact>;
  sourceRunId?: string;
  /** Idempotency key (generated when absent); retries reuse it. */
  requestId?: string;
  /**
   * Append nothing when the files, conversation and artifacts equal the head's
   * (and no label is given): the result is then the head, with `unchanged`.
   */
  skipIfUnchanged?: boolean;
  /** Sees every progress event. */
  onProgress?: (progress: SandboxProgress) => void;
}

const CAPTURE_KEYS = [
  "client",
  "threadId",
  "label",
  "policy",
  "secrets",
  "conversation",
  "artifacts",
  "workspaceRoot",
  "workspaceSubdir",
  "sourceRunId",
  "requestId",
  "skipIfUnchanged",
  "onProgress",
];

/** The saved checkpoint's summary, with the capture's stats. */
export type CapturedCheckpoint = Checkpoint & {
  stats: SandboxCaptureStats;
  /** True when a retry found the checkpoint an earlier attempt committed. */
  replayed: boolean;
  /** True when `skipIfUnchanged` found nothing new: this is the head. */
  unchanged: boolean;
};

function conversationDocuments(conversation: unknown): string[] {
  if (!Array.isArray(conversation)) {
    throw invalidArgument("conversation must be a list of JSON values", { field: "conversation" });
  }
  return conversation.map((message, index) => {
    const text = JSON.stringify(message);
    if (text === undefined) {
      throw invalidArgument(`conversation[${index}] is not a JSON value`, { index: String(index) });
    }
    return text;
  });
}

/**
 * Saves the daemon's workspace (or the folder `workspaceRoot` names) as a new
 * checkpoint at the head of `threadId` and returns its summary. Throws
 * `SandboxCheckpointWriterConflictError` while another writer holds the thread
 * (skip that capture: the next one saves the same files).
 */
export async function captureSandboxCheckpoint(
  options: CaptureSandboxCheckpointOptions,
): Promise<CapturedCheckpoint> {
  checkOptions("captureSandboxCheckpoint", options, CAPTURE_KEYS);
  const events = options.client.capture(
    {
      threadId: options.threadId,
      // An empty label names nothing, as in every other checkpointd SDK.
      label: options.label || undefined,
      policy: options.policy,
      ...secretFields(options.secrets),
      conversation: conversationDocuments(options.conversation ?? []),
      artifacts: (options.artifacts ?? []).map(toRawArtifact),
      workspaceSubdir: workspaceSubdir(options, options.client.workspaceRoot),
      sourceRunId: options.sourceRunId,
      requestId: options.requestId,
      skipIfUnchanged: options.skipIfUnchanged ?? false,
    },
    callOptions(options),
  );
  let done: CaptureDone | undefined;
  // Read to the end of the stream (its status): never cancel after done.
  for await (const { event } of events) {
    if (event?.$case === "progress") options.onProgress?.(toProgress(event.value));
    else if (event?.$case === "done") done = event.value;
  }
  if (done?.checkpoint === undefined) {
    // client.capture throws when the stream ends without its done event.
    throw checkpointdError("the capture's done event names no checkpoint", {
      code: "SANDBOX_SNAPSHOT_INTERNAL",
    });
  }
  return {
    ...toCheckpoint(done.checkpoint),
    stats: toCaptureStats(done.stats),
    replayed: done.replayed,
    unchanged: done.unchanged,
  };
}

export interface RestoreSandboxCheckpointOptions extends CallOptions, WorkspaceOptions {
  client: CheckpointdClient;
  threadId: string;
  /** Restore this checkpoint of the thread instead of the newest. */
  checkpointId?: string;
  policy?: SandboxPolicy;
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
  onProgress?: (progress: SandboxProgress) => void;
}

const RESTORE_KEYS = [
  "client",
  "threadId",
  "checkpointId",
  "policy",
  "secrets",
  "dryRun",
  "requireSecrets",
  "workspaceRoot",
  "workspaceSubdir",
  "onProgress",
];

/** What a dry run would do: counts, and the paths it would write and delete. */
export interface SandboxRestorePlan {
  /** Files and symlinks whose content would be written. */
  filesWritten: number;
  /** Paths the policy manages that the checkpoint lacks. */
  pathsDeleted: number;
  /** Files already identical (at most their mode or mtime is set again). */
  filesKept: number;
  dirsCreated: number;
  bytesToFetch: number;
  blobsToFetch: number;
  /** Relative to the folder restored. */
  written: string[];
  deleted: string[];
}

/** The restored checkpoint's summary, with what the restore could not fill. */
export type RestoredCheckpoint = Checkpoint & {
  dryRun: false;
  /**
   * Files left holding zeros where capture found a secret this restore was
   * not given, relative to the daemon's workspace root (at most the first
   * 10 000; `unfilledSecretCount` counts all).
   */
  unfilledSecretPaths: string[];
  unfilledSecretCount: number;
  durationMs: number;
};

/** A dry run's result: the checkpoint it planned, and the plan. */
export type PlannedRestore = Checkpoint & {
  dryRun: true;
  plan: SandboxRestorePlan;
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
  checkOptions("restoreSandboxCheckpoint", options, RESTORE_KEYS);
  const dryRun = options.dryRun ?? false;
  const events = options.client.restore(
    {
      threadId: options.threadId,
      checkpointId: options.checkpointId,
      policy: options.policy,
      workspaceSubdir: workspaceSubdir(options, options.client.workspaceRoot),
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
    if (event?.$case === "progress") options.onProgress?.(toProgress(event.value));
    else if (event?.$case === "planPaths") {
      written.push(...event.value.written);
      deleted.push(...event.value.deleted);
    } else if (event?.$case === "done") done = event.value;
  }
  if (done === undefined) {
    throw checkpointdError("the restore stream ended without its done event", {
      code: "SANDBOX_SNAPSHOT_UNAVAILABLE",
    });
  }
  if (done.checkpoint === undefined) return null;
  const durationMs = toNumber(done.durationMs);
  if (dryRun) {
    return {
      ...toCheckpoint(done.checkpoint),
      dryRun: true,
      durationMs,
      plan: {
        filesWritten: toNumber(done.plan?.filesWritten),
        pathsDeleted: toNumber(done.plan?.pathsDeleted),
        filesKept: toNumber(done.plan?.filesKept),
        dirsCreated: toNumber(done.plan?.dirsCreated),
        bytesToFetch: toNumber(done.plan?.bytesToFetch),
        blobsToFetch: toNumber(done.plan?.blobsToFetch),
        written,
        deleted,
      },
    };
  }
  if (!done.restored) return null;
  const restored: RestoredCheckpoint = {
    ...toCheckpoint(done.checkpoint),
    dryRun: false,
    durationMs,
    unfilledSecretPaths: done.unfilledSecretPaths,
    unfilledSecretCount: toNumber(done.unfilledSecretCount),
  };
  if (options.requireSecrets && restored.unfilledSecretCount > 0) {
    throw unfilledSecretsError(restored);
  }
  return restored;
}

function unfilledSecretsError(restored: RestoredCheckpoint): SandboxCheckpointError {
  const shown = restored.unfilledSecretPaths.slice(0, 5).join(", ");
  const more = restored.unfilledSecretCount > 5 ? ", ..." : "";
  return checkpointdError(
    `checkpoint ${restored.id} was restored, but ${restored.unfilledSecretCount} file(s) hold ` +
      `zeros where capture found a secret this restore was not given (${shown}${more}); ` +
      "restore again with those secrets",
    {
      code: "SANDBOX_SNAPSHOT_UNFILLED_SECRETS",
      metadata: {
        checkpoint_id: restored.id,
        unfilled_secret_count: String(restored.unfilledSecretCount),
        path: restored.unfilledSecretPaths[0] ?? "",
      },
    },
  );
}
