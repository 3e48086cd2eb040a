// The committed API reference (docs/api, TypeDoc) is what `npm run docs` makes
// from the sources, and the README's links into it resolve.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

const packageDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

function markdownFiles(dir) {
  return Object.fromEntries(
    readdirSync(dir, { recursive: true })
      .filter((name) => name.endsWith(".md"))
      .map((name) => [name, readFileSync(path.join(dir, name), "utf8")]),
  );
}

test("docs/api is current", () => {
  const out = mkdtempSync("/tmp/cpd-ts-docs-");
  try {
    const typedoc = spawnSync(path.join(packageDir, "node_modules", ".bin", "typedoc"), ["--out", out], {
      cwd: packageDir,
      encoding: "utf8",
    });
    assert.equal(typedoc.status, 0, typedoc.stdout + typedoc.stderr);
    assert.deepEqual(
      markdownFiles(path.join(packageDir, "docs", "api")),
      markdownFiles(out),
      "docs/api is stale: run `npm run docs` and commit it",
    );
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});

test("every exported function and class has its section", () => {
  const reference = readFileSync(path.join(packageDir, "docs", "api", "README.md"), "utf8");
  for (const name of ["captureSandboxCheckpoint", "restoreSandboxCheckpoint", "getCheckpoint",
    "listCheckpoints", "getHead", "forkCheckpoint", "deleteHead", "deleteCheckpoints",
    "sweepSandboxBlobs", "connect", "CheckpointdCancelledError", "SandboxCheckpointError"]) {
    assert.match(reference, new RegExp(`^### ${name}(\\(\\))?$`, "m"), name);
  }
  const readme = readFileSync(path.join(packageDir, "README.md"), "utf8");
  assert.ok(readme.includes("(docs/api/README.md)"), "the README links the reference");
});
