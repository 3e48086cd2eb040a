#!/usr/bin/env node
// Capture a thread and restore it through the daemon, printing one JSON summary.
//
//   node capture_restore.mjs <address> <thread> [capture|restore|both|orchestrate] [--token T]
//
// "orchestrate" drives what an orchestrator asks for (after a capture of the
// thread): ListThreads, ListCheckpoints newest first, a Restore dry run, Capture
// skip_if_unchanged, Fork provenance, a SweepBlobs dry run (a stream) and the
// limits in GetServerInfo.
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
  if (mode === "orchestrate") {
    const threads = await client.unary("ListThreads", { page_size: 100 });
    const newest = await client.unary("ListCheckpoints", {
      thread_id: thread, page_size: 1, newest_first: true,
    });
    const plan = await client.restore({ thread_id: thread, dry_run: true });
    const again = await client.capture({
      // No label: a label always asks for a new, named checkpoint.
      thread_id: thread, skip_if_unchanged: true,
      conversation: [JSON.stringify({ role: "user", content: "captured by node" })],
    });
    const fork = await client.unary("Fork", {
      source_thread_id: thread, source_checkpoint_id: newest.checkpoints[0].id,
      destination_thread_id: `${thread}-fork`,
    });
    const sweep = await client.stream("SweepBlobs", { dry_run: true });
    const summary = sweep.events.find((e) => e.event === "summary")?.summary;
    result.orchestrate = {
      threads: threads.threads.map((t) => t.thread_id),
      heads: Object.fromEntries(threads.threads.map((t) => [t.thread_id, t.head_checkpoint_id])),
      newest_id: newest.checkpoints[0].id,
      plan_files_written: Number(plan.done.plan.files_written),
      plan_files_kept: Number(plan.done.plan.files_kept),
      unchanged: again.done.unchanged,
      unchanged_id: again.done.checkpoint.id,
      forked_from_checkpoint_id: fork.checkpoint.forked_from_checkpoint_id,
      sweep_summary: summary ? { listed: Number(summary.listed_count), dry_run: summary.dry_run } : null,
      max_message_bytes: result.server.capabilities.max_message_bytes,
      auth_mode: result.server.capabilities.auth_mode,
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
