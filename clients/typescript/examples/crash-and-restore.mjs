// node crash-and-restore.mjs unix:///path/to/checkpointd.sock my-thread
import { captureSandboxCheckpoint, connect, restoreSandboxCheckpoint,
  SandboxCheckpointWriterConflictError } from "@checkpointd/client";

const [address, threadId] = process.argv.slice(2);
// The token (TCP) comes from CHECKPOINTD_TOKEN, as for the checkpointd command.
const client = await connect({ address });

// A fresh sandbox (or one after a crash): bring back the newest checkpoint first.
const restored = await restoreSandboxCheckpoint({ client, threadId });
console.log(restored === null ? "New thread" : `Restored ${restored.id}`);

// ... the agent works; save between its steps ...
try {
  const saved = await captureSandboxCheckpoint({ client, threadId, label: "step done" });
  console.log(`Saved ${saved.id} (${saved.fileCount} files)`);
} catch (error) {
  // Another capture of the thread is running: skip, the next one saves the same files.
  if (!(error instanceof SandboxCheckpointWriterConflictError)) throw error;
}
client.close();
