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
import type {
  Artifact,
  CaptureDone,
  CheckpointSummary,
  Progress,
  RestoreDone,
  RestoreEvent,
  RestorePlanPaths,
} from "./gen/checkpointd/v1/checkpointd.js";
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
  /**
   * Do not save the live changes the restore overwrites to the thread's stash
   * (where {@link undoRestore} finds them): they are lost.
   */
  discardLiveChanges?: boolean;
  /**
   * When the checkpoint restored is not the head, append a checkpoint that
   * repeats it (reason `restore`), so the head describes the workspace. Unset,
   * the head never moves, as in the reference API.
   */
  record?: boolean;
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
  "discardLiveChanges",
  "record",
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
  /** Of the paths written or deleted, those holding live changes the restore would stash first. */
  pathsStashed: number;
  bytesStashed: number;
  /** Relative to the folder restored. */
  written: string[];
  deleted: string[];
  stashed: string[];
}

/** The stash entry a restore saved the live tree to before it changed anything. */
export interface SandboxSavedBeforeRestore {
  /** The entry (its thread is the stash's, `<thread>~stash`). */
  checkpoint: Checkpoint;
  /** What the live changes added to the bucket. */
  blobsUploaded: number;
  bytesUploaded: number;
  /** True when an earlier, interrupted run of the same restore saved it. */
  resumed: boolean;
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
  /** Where the live tree was saved before the restore changed it (`null`: nothing needed saving). */
  savedBeforeRestore: SandboxSavedBeforeRestore | null;
  /** The checkpoint `record` appended (the thread's new head), else `null`. */
  recorded: Checkpoint | null;
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
  const events = options.client.restore(
    {
      threadId: options.threadId,
      checkpointId: options.checkpointId,
      policy: options.policy,
      workspaceSubdir: workspaceSubdir(options, options.client.workspaceRoot),
      dryRun: options.dryRun ?? false,
      discardLiveChanges: options.discardLiveChanges ?? false,
      record: options.record ?? false,
      ...secretFields(options.secrets),
    },
    callOptions(options),
  );
  return readRestore(events, options);
}

export interface UndoRestoreOptions extends CallOptions, WorkspaceOptions {
  client: CheckpointdClient;
  threadId: string;
  /** The secrets, as for {@link restoreSandboxCheckpoint}. */
  secrets?: SandboxSecrets;
  dryRun?: boolean;
  requireSecrets?: boolean;
  /** The head follows the workspace, as a restore's `record`. */
  record?: boolean;
  onProgress?: (progress: SandboxProgress) => void;
}

/**
 * Undoes the thread's last restore: restores the newest entry of its stash
 * (the live tree a restore replaced), saving what that overwrites to the stash
 * first, so an undo of an undo is a redo. Returns the stash entry restored,
 * shaped as {@link restoreSandboxCheckpoint}'s result. An empty stash throws
 * `SandboxSnapshotError` with code `SANDBOX_SNAPSHOT_MISSING_CHECKPOINT`.
 */
export async function undoRestore(
  options: UndoRestoreOptions & { dryRun: true },
): Promise<PlannedRestore | null>;
export async function undoRestore(
  options: UndoRestoreOptions & { dryRun?: false },
): Promise<RestoredCheckpoint | null>;
export async function undoRestore(
  options: UndoRestoreOptions,
): Promise<RestoredCheckpoint | PlannedRestore | null>;
export async function undoRestore(
  options: UndoRestoreOptions,
): Promise<RestoredCheckpoint | PlannedRestore | null> {
  checkOptions("undoRestore", options, [
    "client",
    "threadId",
    "secrets",
    "dryRun",
    "requireSecrets",
    "record",
    "workspaceRoot",
    "workspaceSubdir",
    "onProgress",
  ]);
  const events = options.client.undo(
    {
      threadId: options.threadId,
      workspaceSubdir: workspaceSubdir(options, options.client.workspaceRoot),
      dryRun: options.dryRun ?? false,
      record: options.record ?? false,
      ...secretFields(options.secrets),
    },
    callOptions(options),
  );
  return readRestore(events, options);
}

/**
 * A Restore's or an Undo's events, read to the end of the stream (its status),
 * never cancelled after done: the daemon would log a cancelled call for a
 * restore that succeeded.
 */
async function readRestore(
  events: AsyncIterable<RestoreEvent>,
  options: { dryRun?: boolean; requireSecrets?: boolean; onProgress?: (progress: SandboxProgress) => void },
): Promise<RestoredCheckpoint | PlannedRestore | null> {
  const paths: RestorePlanPaths = { written: [], deleted: [], stashed: [] };
  let done: RestoreDone | undefined;
  for await (const { event } of events) {
    if (event?.$case === "progress") options.onProgress?.(toProgress(event.value));
    else if (event?.$case === "planPaths") {
      paths.written.push(...event.value.written);
      paths.deleted.push(...event.value.deleted);
      paths.stashed.push(...event.value.stashed);
    } else if (event?.$case === "done") done = event.value;
  }
  if (done === undefined) {
    throw checkpointdError("the restore stream ended without its done event", {
      code: "SANDBOX_SNAPSHOT_UNAVAILABLE",
    });
  }
  if (done.checkpoint === undefined) return null;
  if (options.dryRun) return planned(done, done.checkpoint, paths);
  if (!done.restored) return null;
  const saved = done.savedBeforeRestore;
  const restored: RestoredCheckpoint = {
    ...toCheckpoint(done.checkpoint),
    dryRun: false,
    durationMs: toNumber(done.durationMs),
    unfilledSecretPaths: done.unfilledSecretPaths,
    unfilledSecretCount: toNumber(done.unfilledSecretCount),
    savedBeforeRestore:
      saved?.checkpoint === undefined
        ? null
        : {
            checkpoint: toCheckpoint(saved.checkpoint),
            blobsUploaded: toNumber(saved.blobsUploaded),
            bytesUploaded: toNumber(saved.bytesUploaded),
            resumed: saved.resumed,
          },
    recorded: done.recorded === undefined ? null : toCheckpoint(done.recorded),
  };
  if (options.requireSecrets && restored.unfilledSecretCount > 0) {
    throw unfilledSecretsError(restored);
  }
  return restored;
}

function planned(done: RestoreDone, checkpoint: CheckpointSummary, paths: RestorePlanPaths): PlannedRestore {
  const plan = done.plan;
  return {
    ...toCheckpoint(checkpoint),
    dryRun: true,
    durationMs: toNumber(done.durationMs),
    plan: {
      filesWritten: toNumber(plan?.filesWritten),
      pathsDeleted: toNumber(plan?.pathsDeleted),
      filesKept: toNumber(plan?.filesKept),
      dirsCreated: toNumber(plan?.dirsCreated),
      bytesToFetch: toNumber(plan?.bytesToFetch),
      blobsToFetch: toNumber(plan?.blobsToFetch),
      pathsStashed: toNumber(plan?.pathsStashed),
      bytesStashed: toNumber(plan?.bytesStashed),
      ...paths,
    },
  };
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
