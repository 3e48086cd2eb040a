#!/usr/bin/env node
// Capture a thread and restore it through the daemon, printing one JSON summary.
//
//   node capture_restore.mjs <address> <thread> [capture|restore|both] [--token T]
//
// <address> is "unix:/abs/path.sock" (the daemon's default) or "host:port".
// Exit code 0 on success; on a gRPC error, prints {"error": {code, reason}} and
// exits 1.
import { CheckpointdClient } from "./client.mjs";

const args = process.argv.slice(2);
const tokenAt = args.indexOf("--token");
const token = tokenAt >= 0 ? args.splice(tokenAt, 2)[1] : process.env.CHECKPOINTD_TOKEN;
const [address, thread, mode = "both"] = args;
if (!address || !thread) {
  console.error("usage: capture_restore.mjs <address> <thread> [capture|restore|both] [--token T]");
  process.exit(2);
}

const client = new CheckpointdClient(address, { token });
const result = { thread };
try {
  result.server = await client.serverInfo();
  if (mode === "capture" || mode === "both") {
    const { events, done } = await client.capture({
      thread_id: thread,
      label: "from node",
      conversation: [JSON.stringify({ role: "user", content: "captured by node" })],
    });
    result.capture = {
      checkpoint_id: done.checkpoint.id,
      started_id: events[0].started.checkpoint_id,
      files: Number(done.checkpoint.file_count),
      progress_events: events.filter((e) => e.event === "progress").length,
    };
  }
  if (mode === "restore" || mode === "both") {
    const { done } = await client.restore({ thread_id: thread });
    result.restore = { restored: done.restored, checkpoint_id: done.checkpoint?.id ?? null };
  }
  console.log(JSON.stringify(result));
} catch (error) {
  console.log(JSON.stringify({ error: { code: error.code, reason: error.reason ?? "", message: error.details } }));
  process.exitCode = 1;
} finally {
  client.close();
}
