// How the daemon learns what changed, as the SDK shows it (docs/design.md, "The
// change journal"): the server's watch mode and why, each capture's scan mode
// with its reason and the entries it examined, and the chunks a large file is
// stored as. Real daemons, one watching with inotify and one not watching.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import path from "node:path";
import { after, before, describe, test } from "node:test";

import { captureSandboxCheckpoint, connect, EntryKind } from "@checkpointd/client";

import { startDaemon, writeTree } from "./daemon.mjs";

/** A daemon started with `extra` flags before the suite's tests, stopped after them. */
function startedDaemon(extra) {
  const started = {};
  before(async () => {
    started.daemon = await startDaemon({ extra });
    started.client = await connect({ address: started.daemon.address });
  });
  after(async () => {
    started.client?.close();
    await started.daemon?.stop();
  });
  return started;
}

async function entriesOf(client, checkpointId) {
  const entries = [];
  for await (const page of client.listEntries({ checkpointId })) entries.push(...page.entries);
  return Object.fromEntries(entries.map((entry) => [entry.path, entry]));
}

describe("a daemon watching with inotify", () => {
  const started = startedDaemon(["--watch", "inotify"]);

  test("server info says the watch mode and why", async () => {
    const { capabilities } = await started.client.getServerInfo();
    assert.equal(capabilities.watchMode, "inotify");
    assert.match(capabilities.watchDetail, /inotify/);
  });

  test("a first capture scans in full and says why; the next one follows the journal", async () => {
    const { daemon, client } = started;
    writeTree(daemon.workspace, { "a.txt": "alpha", "dir/b.txt": "beta" });
    const first = await captureSandboxCheckpoint({ client, threadId: "t-journal" });
    assert.equal(first.stats.scanMode, "full");
    assert.notEqual(first.stats.fullScanReason, "", "a full scan says why it ran");
    // Every entry stat'ed, plus the directories listed.
    assert.ok(first.stats.entriesExamined >= first.stats.entries, JSON.stringify(first.stats));

    writeTree(daemon.workspace, { "dir/c.txt": "gamma" });
    const second = await captureSandboxCheckpoint({ client, threadId: "t-journal" });
    assert.equal(second.parentCheckpointId, first.id);
    assert.equal(second.stats.scanMode, "journal");
    assert.equal(second.stats.fullScanReason, "");
    assert.equal(second.stats.entries, first.stats.entries + 1);
    assert.ok(second.stats.entriesExamined > 0, JSON.stringify(second.stats));
    assert.ok(second.stats.entriesExamined < first.stats.entriesExamined,
      `the journal examines only what changed: ${JSON.stringify([first.stats, second.stats])}`);
    assert.deepEqual(JSON.parse(JSON.stringify(second.stats)), second.stats, "plain JSON");
  });

  test("the raw capture stream carries the same stats", async () => {
    const { daemon, client } = started;
    writeTree(daemon.workspace, { "raw.txt": "raw" });
    let done;
    for await (const { event } of client.capture({ threadId: "t-journal" })) {
      if (event?.$case === "done") done = event.value;
    }
    assert.equal(done.stats.scanMode, "journal");
    assert.equal(done.stats.fullScanReason, "");
    assert.equal(typeof done.stats.entriesExamined, "bigint");
    assert.ok(done.stats.entriesExamined > 0n);
  });

  test("entries say how many chunks a file above the threshold is stored as", async () => {
    const { daemon, client } = started;
    // The default threshold is 1 MiB and the average chunk 64 KiB.
    writeTree(daemon.workspace, { "large.bin": randomBytes(1536 * 1024), "small.txt": "small" });
    const saved = await captureSandboxCheckpoint({ client, threadId: "t-chunks" });
    const entries = await entriesOf(client, saved.id);
    assert.equal(entries["large.bin"].kind, EntryKind.ENTRY_KIND_FILE);
    assert.ok(entries["large.bin"].chunkCount > 1, `chunkCount ${entries["large.bin"].chunkCount}`);
    assert.equal(entries["small.txt"].chunkCount, 0, "a file stored whole");
    assert.equal(entries.dir.chunkCount, 0, "a directory has no chunks");
  });
});

describe("a daemon that does not watch", () => {
  const started = startedDaemon(["--watch", "off"]);

  test("server info says watching is off, and every capture scans in full saying why", async () => {
    const { daemon, client } = started;
    const { capabilities } = await client.getServerInfo();
    assert.equal(capabilities.watchMode, "off");
    assert.notEqual(capabilities.watchDetail, "");
    for (const content of ["one", "two"]) {
      writeTree(path.join(daemon.workspace, "w"), { "a.txt": content });
      const saved = await captureSandboxCheckpoint({ client, threadId: "t-off" });
      assert.equal(saved.stats.scanMode, "full");
      assert.notEqual(saved.stats.fullScanReason, "");
      assert.ok(saved.stats.entriesExamined >= saved.stats.entries, JSON.stringify(saved.stats));
    }
  });
});
