/**
 * Reading and rearranging a thread's checkpoints, shaped like the checkpoint
 * store of TanStack AI's `@tanstack/ai-sandbox` API: `getCheckpoint` returns
 * `null` for a missing id, `listCheckpoints` iterates every page, `getHead`,
 * `forkCheckpoint` and `deleteHead`. Results are plain JSON.
 */
import type { CallOptions, CheckpointdClient } from "./client.js";
import { checkpointdError, SandboxCheckpointError } from "./errors.js";
import type { CheckpointSummary } from "./gen/checkpointd/v1/checkpointd.js";
import { callOptions, checkOptions } from "./options.js";
import { toArtifact, toCheckpoint, type Checkpoint, type CheckpointArtifact } from "./summary.js";

export interface GetCheckpointOptions extends CallOptions {
  client: CheckpointdClient;
  checkpointId: string;
  /** Also fetch the conversation (it can be large). */
  includeConversation?: boolean;
}

/** A checkpoint with its artifact records and (when asked for) its conversation. */
export type CheckpointDetail = Checkpoint & {
  artifacts: CheckpointArtifact[];
  /** The messages, parsed (`[]` unless `includeConversation`). */
  conversation: unknown[];
};

/** The codes that mean "no such checkpoint" for a read by id. */
const MISSING = new Set(["SANDBOX_SNAPSHOT_MISSING_CHECKPOINT"]);

/**
 * The checkpoint with this id, or `null` when there is none (a missing id does
 * not throw). An empty or malformed id throws `SandboxCheckpointInvalidIdError`.
 */
export async function getCheckpoint(options: GetCheckpointOptions): Promise<CheckpointDetail | null> {
  checkOptions("getCheckpoint", options, ["client", "checkpointId", "includeConversation"]);
  let reply;
  try {
    reply = await options.client.getCheckpoint(
      { checkpointId: options.checkpointId, includeConversation: options.includeConversation ?? false },
      callOptions(options),
    );
  } catch (error) {
    if (error instanceof SandboxCheckpointError && MISSING.has(error.code)) return null;
    throw error;
  }
  if (reply.checkpoint === undefined) return null;
  return {
    ...toCheckpoint(reply.checkpoint),
    artifacts: reply.artifacts.map(toArtifact),
    conversation: reply.conversation.map((text, index) => parseMessage(text, index)),
  };
}

function parseMessage(text: string, index: number): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw checkpointdError(`conversation[${index}] of the checkpoint is not JSON`, {
      code: "SANDBOX_SNAPSHOT_INVALID_ENTRY",
      metadata: { index: String(index) },
    });
  }
}

export interface ListCheckpointsOptions extends CallOptions {
  client: CheckpointdClient;
  threadId: string;
  /** Newest first (default: oldest first). */
  newestFirst?: boolean;
  /** Checkpoints per request (default 100, at most the daemon's `maxPageSize`). */
  pageSize?: number;
  /** Only those listed before this checkpoint (older, with `newestFirst` the ones after it). */
  before?: string;
  /**
   * List the thread's stash instead: the live trees its restores replaced,
   * newest last ({@link undoRestore} restores the newest).
   */
  stash?: boolean;
}

/**
 * Every checkpoint of a thread, also the ones off the head's chain, oldest
 * first (or newest first), fetched a page at a time as you iterate:
 *
 *     for await (const checkpoint of listCheckpoints({ client, threadId })) ...
 *     const all = await listCheckpoints({ client, threadId }).toArray();
 *     for await (const page of listCheckpoints({ client, threadId }).pages()) ...
 *
 * An unknown thread has none.
 */
export function listCheckpoints(options: ListCheckpointsOptions): CheckpointList {
  checkOptions("listCheckpoints", options, ["client", "threadId", "newestFirst", "pageSize", "before", "stash"]);
  return new CheckpointList(options);
}

/** The checkpoints of one thread, as an async iterable (see {@link listCheckpoints}). */
export class CheckpointList implements AsyncIterable<Checkpoint> {
  readonly #options: ListCheckpointsOptions;

  constructor(options: ListCheckpointsOptions) {
    this.#options = options;
  }

  /** One array per page the daemon sends. */
  async *pages(): AsyncGenerator<Checkpoint[]> {
    const { client, threadId, newestFirst, pageSize, before, stash } = this.#options;
    let pageToken = "";
    do {
      const reply = await client.listCheckpoints(
        { threadId, newestFirst: newestFirst ?? false, pageSize: pageSize ?? 0, before, stash: stash ?? false, pageToken },
        callOptions(this.#options),
      );
      yield reply.checkpoints.map((summary: CheckpointSummary) => toCheckpoint(summary));
      pageToken = reply.nextPageToken;
    } while (pageToken !== "");
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Checkpoint> {
    for await (const page of this.pages()) yield* page;
  }

  /** All of them in one array. */
  async toArray(): Promise<Checkpoint[]> {
    const all: Checkpoint[] = [];
    for await (const page of this.pages()) all.push(...page);
    return all;
  }
}

export interface ThreadOptions extends CallOptions {
  client: CheckpointdClient;
  threadId: string;
}

/** The id of the thread's head checkpoint, or `null` when it has none. */
export async function getHead(options: ThreadOptions): Promise<string | null> {
  checkOptions("getHead", options, ["client", "threadId"]);
  const reply = await options.client.getHead({ threadId: options.threadId }, callOptions(options));
  return reply.checkpointId ?? null;
}

export interface ForkCheckpointOptions extends CallOptions {
  client: CheckpointdClient;
  sourceThreadId: string;
  sourceCheckpointId: string;
  /** A thread with no checkpoints yet. */
  destinationThreadId: string;
}

/**
 * Starts `destinationThreadId` from a checkpoint of another thread: returns its
 * first checkpoint (reason `fork-root`, with `forkedFromThreadId` and
 * `forkedFromCheckpointId`). The files are not copied: both use the same blobs.
 * Throws `SANDBOX_SNAPSHOT_FORK_SOURCE_NOT_FOUND`, `..._FORK_SOURCE_THREAD_MISMATCH`
 * or `..._FORK_DESTINATION_NOT_EMPTY`.
 */
export async function forkCheckpoint(options: ForkCheckpointOptions): Promise<Checkpoint> {
  checkOptions("forkCheckpoint", options, [
    "client",
    "sourceThreadId",
    "sourceCheckpointId",
    "destinationThreadId",
  ]);
  const reply = await options.client.fork(
    {
      sourceThreadId: options.sourceThreadId,
      sourceCheckpointId: options.sourceCheckpointId,
      destinationThreadId: options.destinationThreadId,
    },
    callOptions(options),
  );
  if (reply.checkpoint === undefined) {
    throw checkpointdError("Fork returned no checkpoint", { code: "SANDBOX_SNAPSHOT_INTERNAL" });
  }
  return toCheckpoint(reply.checkpoint);
}

export interface DeleteHeadOptions extends CallOptions {
  client: CheckpointdClient;
  threadId: string;
  /** Must be the thread's head (else `SandboxCheckpointNotHeadError`). */
  checkpointId: string;
}

/**
 * Removes the thread's head checkpoint; its parent becomes the head. Returns
 * the new head's id, or `null` when the thread has none left.
 */
export async function deleteHead(options: DeleteHeadOptions): Promise<string | null> {
  checkOptions("deleteHead", options, ["client", "threadId", "checkpointId"]);
  const reply = await options.client.deleteHead(
    { threadId: options.threadId, checkpointId: options.checkpointId },
    callOptions(options),
  );
  return reply.headCheckpointId ?? null;
}
