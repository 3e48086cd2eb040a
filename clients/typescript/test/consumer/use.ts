// Type-checked by tests/service/test_typescript_client.py inside a project that installed
// the packed tarball: the published .d.ts give these types (never run).
import {
  connect,
  captureSandboxCheckpoint,
  CheckpointdConflictError,
  deleteHead,
  forkCheckpoint,
  getCheckpoint,
  listCheckpoints,
  restoreSandboxCheckpoint,
  SandboxCheckpointWriterConflictError,
  SandboxSnapshotError,
  type Checkpoint,
  type PlannedRestore,
  type RestoredCheckpoint,
} from "@checkpointd/client";

async function main(): Promise<void> {
  const client = await connect({ address: "unix:///tmp/x.sock", token: "t" });
  const saved = await captureSandboxCheckpoint({ client, threadId: "t", label: "l", conversation: [{ a: 1 }],
    secrets: { API_KEY: "sk-1234" }, workspaceRoot: "/workspace/app" });
  const id: string = saved.id;
  const bytes: number = saved.totalBytes;
  const created: number = saved.createdAt;
  JSON.stringify(saved);
  // The raw RPCs keep 64-bit integers as bigint.
  for await (const { event } of client.capture({ threadId: "t" })) {
    if (event?.$case === "progress") { const n: bigint = event.value.filesDone; void n; }
  }
  const head = await client.getHead({ threadId: "t" });
  const maybe: string | undefined = head.checkpointId;
  for await (const chunk of client.listEntries({ checkpointId: id })) { const m: bigint = chunk.entries[0].mtimeNs; void m; }
  const r: RestoredCheckpoint | null = await restoreSandboxCheckpoint({ client, threadId: "t", secrets: ["sk-1234"] });
  const unfilled: string[] | undefined = r?.unfilledSecretPaths;
  const plan: PlannedRestore | null = await restoreSandboxCheckpoint({ client, threadId: "t", dryRun: true });
  const written: string[] | undefined = plan?.plan.written;
  const found = await getCheckpoint({ client, checkpointId: id, includeConversation: true });
  const messages: unknown[] | undefined = found?.conversation;
  for await (const checkpoint of listCheckpoints({ client, threadId: "t" })) { const c: Checkpoint = checkpoint; void c; }
  const forked: Checkpoint = await forkCheckpoint({ client, sourceThreadId: "t", sourceCheckpointId: id,
    destinationThreadId: "u" });
  const newHead: string | null = await deleteHead({ client, threadId: "u", checkpointId: forked.id });
  try { await client.fork({ sourceThreadId: "t", sourceCheckpointId: id, destinationThreadId: "u" }); }
  catch (e) { if (e instanceof SandboxCheckpointWriterConflictError) console.log(e.retryAfterMs, e.metadata.thread_id);
    if (e instanceof CheckpointdConflictError) console.log(e.category);
    if (e instanceof SandboxSnapshotError && e.code === "SANDBOX_SNAPSHOT_MISSING_BLOB") console.log(e.cause); }
  // @ts-expect-error: not a field of the request
  await client.getHead({ threadIdd: "t" });
  // @ts-expect-error: the reference API's handle is not an option here
  await captureSandboxCheckpoint({ client, threadId: "t", handle: {} });
  void bytes; void created; void maybe; void unfilled; void written; void messages; void newHead;
}
void main;
