// Type-checked by tests/service/test_typescript_client.py inside a project that installed
// the packed tarball: the published .d.ts give these types (never run).
import { connect, captureSandboxCheckpoint, restoreSandboxCheckpoint, SandboxCheckpointWriterConflictError,
  SandboxSnapshotError, type CheckpointSummary } from "@checkpointd/client";

async function main(): Promise<void> {
  const client = await connect({ address: "unix:///tmp/x.sock", token: "t" });
  const saved = await captureSandboxCheckpoint({ client, threadId: "t", label: "l", conversation: [{ a: 1 }] });
  const id: string = saved.id;
  const bytes: bigint = saved.totalBytes;
  for await (const { event } of client.capture({ threadId: "t" })) {
    if (event?.$case === "progress") { const n: bigint = event.value.filesDone; void n; }
  }
  const head = await client.getHead({ threadId: "t" });
  const maybe: string | undefined = head.checkpointId;
  for await (const chunk of client.listEntries({ checkpointId: id })) { const m: bigint = chunk.entries[0].mtimeNs; void m; }
  const r: CheckpointSummary | null = await restoreSandboxCheckpoint({ client, threadId: "t" });
  try { await client.fork({ sourceThreadId: "t", sourceCheckpointId: id, destinationThreadId: "u" }); }
  catch (e) { if (e instanceof SandboxCheckpointWriterConflictError) console.log(e.retryAfterMs, e.metadata.thread_id);
    if (e instanceof SandboxSnapshotError && e.code === "SANDBOX_SNAPSHOT_MISSING_BLOB") console.log(e.cause); }
  // @ts-expect-error: not a field of the request
  await client.getHead({ threadIdd: "t" });
  void bytes; void maybe; void r;
}
void main;
