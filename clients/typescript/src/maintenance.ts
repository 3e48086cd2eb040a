/**
 * `deleteCheckpoints` and `sweepSandboxBlobs`: keeping storage small, with the
 * names and result shapes of TanStack AI's `@tanstack/ai-sandbox` API.
 */
import type { CallOptions, CheckpointdClient } from "./client.js";
import { checkpointdError, invalidArgument } from "./errors.js";
import { callOptions, checkOptions } from "./options.js";
import type { SweepBlobsSummary } from "./gen/checkpointd/v1/checkpointd.js";
import { toNumber } from "./summary.js";

export interface DeleteCheckpointsOptions extends CallOptions {
  client: CheckpointdClient;
  threadId: string;
  /** Keep the head and its `keep - 1` nearest ancestors (at least 1). */
  keep: number;
  /** Report what would be deleted, delete nothing. */
  dryRun?: boolean;
}

export interface DeletedCheckpoints {
  /** The deleted ids, oldest first (at most the first 10 000: `idsTruncated`). */
  deleted: string[];
  deletedCount: number;
  idsTruncated: boolean;
  dryRun: boolean;
}

/**
 * Deletes all but the newest `keep` checkpoints of the head chain; returns the
 * deleted ids, oldest first (at most the first 10 000: `idsTruncated`), and
 * how many there were in all.
 */
export async function deleteCheckpoints(options: DeleteCheckpointsOptions): Promise<DeletedCheckpoints> {
  checkOptions("deleteCheckpoints", options, ["client", "threadId", "keep", "dryRun"]);
  if (!Number.isInteger(options.keep) || options.keep < 1) {
    throw invalidArgument(`keep must be an integer of at least 1, not ${options.keep}`, {
      field: "keep",
      keep: String(options.keep),
    });
  }
  const reply = await options.client.prune(
    { threadId: options.threadId, keep: options.keep, dryRun: options.dryRun ?? false },
    callOptions(options),
  );
  return {
    deleted: reply.deletedCheckpointIds,
    deletedCount: toNumber(reply.deletedCount),
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

/** The sweep's counts. */
export interface SweepSummary {
  listedCount: number;
  deletedCount: number;
  keptCount: number;
  failedCount: number;
  dryRun: boolean;
  /** Kept keys per reason (`referenced`, `too-young`, ...). */
  keptByReason: Record<string, number>;
  durationMs: number;
  /** The `olderThanMs` the sweep used (the daemon's default when unset). */
  olderThanMs: number;
  /** The `repackBelowPercent` the sweep used. */
  repackBelowPercent: number;
}

/** The deleted keys (an array, as the reference API returns), with what was kept and why, failures and the daemon's summary. */
export type SweepResult = string[] & {
  kept: Array<{ key: string; reason: string }>;
  failures: Array<{ key: string; message: string }>;
  dryRun: boolean;
  summary: SweepSummary;
};

function toSweepSummary(summary: SweepBlobsSummary): SweepSummary {
  return {
    listedCount: toNumber(summary.listedCount),
    deletedCount: toNumber(summary.deletedCount),
    keptCount: toNumber(summary.keptCount),
    failedCount: toNumber(summary.failedCount),
    dryRun: summary.dryRun,
    keptByReason: Object.fromEntries(
      Object.entries(summary.keptByReason).map(([reason, count]) => [reason, toNumber(count)]),
    ),
    durationMs: toNumber(summary.durationMs),
    olderThanMs: toNumber(summary.olderThanMs),
    repackBelowPercent: summary.repackBelowPercent,
  };
}

function checkSweepOptions(options: SweepSandboxBlobsOptions): void {
  checkOptions("sweepSandboxBlobs", options, ["client", "olderThanMs", "dryRun", "repackBelowPercent"]);
  const { olderThanMs, repackBelowPercent } = options;
  if (olderThanMs !== undefined && (!Number.isSafeInteger(olderThanMs) || olderThanMs < 0)) {
    throw invalidArgument(`olderThanMs must be a non-negative integer, not ${olderThanMs}`, {
      field: "older_than_ms",
      value: String(olderThanMs),
    });
  }
  if (
    repackBelowPercent !== undefined &&
    (!Number.isSafeInteger(repackBelowPercent) || repackBelowPercent < 0 || repackBelowPercent > 100)
  ) {
    throw invalidArgument(`repackBelowPercent must be an integer in [0, 100], not ${repackBelowPercent}`, {
      field: "repack_below_percent",
      value: String(repackBelowPercent),
    });
  }
}

/**
 * Deletes blobs no checkpoint uses that are at least `olderThanMs` old; returns
 * the deleted keys. The daemon streams its results in batches; this gathers
 * them (use `client.sweepBlobs()` to handle a huge bucket batch by batch).
 */
export async function sweepSandboxBlobs(options: SweepSandboxBlobsOptions): Promise<SweepResult> {
  checkSweepOptions(options);
  const deleted: string[] = [];
  const kept: Array<{ key: string; reason: string }> = [];
  const failures: Array<{ key: string; message: string }> = [];
  let summary: SweepBlobsSummary | undefined;
  const events = options.client.sweepBlobs(
    {
      olderThanMs: options.olderThanMs,
      dryRun: options.dryRun ?? false,
      repackBelowPercent: options.repackBelowPercent,
    },
    callOptions(options),
  );
  for await (const { event } of events) {
    if (event?.$case === "batch") {
      deleted.push(...event.value.deleted);
      kept.push(...event.value.kept.map(({ key, reason }) => ({ key, reason })));
      failures.push(...event.value.failures.map(({ key, message }) => ({ key, message })));
    } else if (event?.$case === "summary") {
      summary = event.value;
    }
  }
  if (summary === undefined) {
    throw checkpointdError("the sweep stream ended without its summary", {
      code: "SANDBOX_SNAPSHOT_UNAVAILABLE",
      metadata: { deleted_count: String(deleted.length) },
    });
  }
  return Object.assign(deleted, { kept, failures, dryRun: summary.dryRun, summary: toSweepSummary(summary) });
}
