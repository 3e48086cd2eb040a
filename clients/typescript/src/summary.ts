/**
 * Checkpoints as plain JSON, shaped like TanStack AI's `@tanstack/ai-sandbox`
 * API: numbers, strings and `null`, so `JSON.stringify(checkpoint)` works. The
 * raw replies of the client's RPC methods keep 64-bit integers as `bigint`.
 */
import type {
  Artifact as RawArtifact,
  CaptureStats as RawCaptureStats,
  CheckpointSummary,
  Policy,
} from "./gen/checkpointd/v1/checkpointd.js";

/** Which files a capture keeps and a restore manages (gitignore dialect). */
export interface SandboxPolicy {
  exclude?: string[];
  include?: string[];
  /** Unset means true: any `.git`, `node_modules` or `.env*` segment is excluded. */
  defaultExcludes?: boolean;
}

/** A checkpoint's summary. Counts and times are numbers (`createdAt`: ms since the epoch). */
export interface Checkpoint {
  id: string;
  threadId: string;
  parentCheckpointId: string | null;
  createdAt: number;
  /**
   * `"automatic"`, `"named"`, `"fork-root"`, `"restore"` (appended by a restore
   * with `record`) or `"stash"` (an entry of a thread's stash).
   */
  reason: string;
  label: string | null;
  sourceRunId: string | null;
  entryCount: number;
  fileCount: number;
  /** The sum of the sizes of the file entries. */
  totalBytes: number;
  artifactCount: number;
  conversationCount: number;
  /** The policy the checkpoint was captured with; `null`: the default policy. */
  policy: Required<SandboxPolicy> | null;
  /** The folder of the daemon's workspace it was captured from (`""`: all of it). */
  workspaceSubdir: string;
  /** Set on a fork root: where it was forked from. */
  forkedFromThreadId: string | null;
  forkedFromCheckpointId: string | null;
  /** Set on a checkpoint of reason `restore`: the checkpoint it repeats. */
  restoredFromCheckpointId: string | null;
  /** Set on an entry of a stash: the thread whose stash it is. */
  stashOfThreadId: string | null;
}

/** An artifact record (from `client.uploadArtifactBytes`), as plain JSON. */
export interface CheckpointArtifact {
  artifactId: string;
  name: string;
  mimeType: string;
  size: number;
  blobKey: string;
  createdAt: number;
}

/** What a capture did. Times in ms. */
export interface SandboxCaptureStats {
  entries: number;
  filesHashed: number;
  filesReused: number;
  bytesHashed: number;
  blobsUploaded: number;
  bytesUploaded: number;
  durationMs: number;
  phasesMs: Record<string, number>;
  /** `journal` (only what changed since the last capture was examined) or `full`; `""` when not said. */
  scanMode: string;
  /** Why a full scan ran (`""` for a journal scan). */
  fullScanReason: string;
  /** Entries stat'ed plus directories listed by the scan. */
  entriesExamined: number;
}

/**
 * A 64-bit value as a number: exact below 2^53 (9 PB, or 285,000 years of
 * milliseconds), which every count and time of a checkpoint is.
 */
export function toNumber(value: bigint | number | undefined): number {
  return Number(value ?? 0);
}

function policyOf(policy: Policy | undefined): Required<SandboxPolicy> | null {
  if (policy === undefined) return null;
  return {
    exclude: [...policy.exclude],
    include: [...policy.include],
    defaultExcludes: policy.defaultExcludes ?? true,
  };
}

/** A summary of the wire as plain JSON. */
export function toCheckpoint(summary: CheckpointSummary): Checkpoint {
  return {
    id: summary.id,
    threadId: summary.threadId,
    parentCheckpointId: summary.parentCheckpointId ?? null,
    createdAt: toNumber(summary.createdAt),
    reason: summary.reason,
    label: summary.label ?? null,
    sourceRunId: summary.sourceRunId ?? null,
    entryCount: toNumber(summary.entryCount),
    fileCount: toNumber(summary.fileCount),
    totalBytes: toNumber(summary.totalBytes),
    artifactCount: toNumber(summary.artifactCount),
    conversationCount: toNumber(summary.conversationCount),
    policy: policyOf(summary.policy),
    workspaceSubdir: summary.workspaceSubdir,
    forkedFromThreadId: summary.forkedFromThreadId ?? null,
    forkedFromCheckpointId: summary.forkedFromCheckpointId ?? null,
    restoredFromCheckpointId: summary.restoredFromCheckpointId ?? null,
    stashOfThreadId: summary.stashOfThreadId ?? null,
  };
}

export function toArtifact(artifact: RawArtifact): CheckpointArtifact {
  return {
    artifactId: artifact.artifactId,
    name: artifact.name,
    mimeType: artifact.mimeType,
    size: toNumber(artifact.size),
    blobKey: artifact.blobKey,
    createdAt: toNumber(artifact.createdAt),
  };
}

export function toCaptureStats(stats: RawCaptureStats | undefined): SandboxCaptureStats {
  return {
    entries: toNumber(stats?.entries),
    filesHashed: toNumber(stats?.filesHashed),
    filesReused: toNumber(stats?.filesReused),
    bytesHashed: toNumber(stats?.bytesHashed),
    blobsUploaded: toNumber(stats?.blobsUploaded),
    bytesUploaded: toNumber(stats?.bytesUploaded),
    durationMs: toNumber(stats?.durationMs),
    phasesMs: Object.fromEntries(
      Object.entries(stats?.phasesMs ?? {}).map(([phase, ms]) => [phase, toNumber(ms)]),
    ),
    scanMode: stats?.scanMode ?? "",
    fullScanReason: stats?.fullScanReason ?? "",
    entriesExamined: toNumber(stats?.entriesExamined),
  };
}

/** An artifact record as the wire takes it (from the plain form or a raw reply). */
export function toRawArtifact(artifact: CheckpointArtifact | RawArtifact): RawArtifact {
  return {
    ...artifact,
    size: BigInt(artifact.size),
    createdAt: BigInt(artifact.createdAt),
  };
}
