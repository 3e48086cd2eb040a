// The SDK's error codes are the shared vocabulary (clients/shared/errors.json)
// and the proto's ErrorReason; the committed generated code is current.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import {
  categoryOf,
  CheckpointdCancelledError,
  CheckpointdConflictError,
  CheckpointdDeadlineError,
  CheckpointdNotFoundError,
  CheckpointdUnauthenticatedError,
  CheckpointdUnavailableError,
  codeForStatus,
  deleteCheckpoints,
  ERROR_CODES,
  errorClassFor,
  ErrorReason,
  SandboxCheckpointError,
  SandboxCheckpointInvalidArgumentError,
  SandboxCheckpointWriterConflictError,
  statusForCode,
  toCheckpointdError,
} from "@checkpointd/client";
import * as sdk from "@checkpointd/client";
import { Metadata, status } from "@grpc/grpc-js";

const here = path.dirname(fileURLToPath(import.meta.url));
const packageDir = path.resolve(here, "..");
const vocabulary = JSON.parse(
  readFileSync(path.resolve(packageDir, "..", "shared", "errors.json"), "utf8"),
);

test("the SDK's codes are errors.json's, each with its status and class", () => {
  assert.deepEqual(
    Object.keys(ERROR_CODES).sort(),
    [...Object.keys(vocabulary.reasons), ...Object.keys(vocabulary.sdkReasons)].sort(),
  );
  for (const [code, entry] of Object.entries({ ...vocabulary.reasons, ...vocabulary.sdkReasons })) {
    assert.equal(statusForCode(code), vocabulary.grpcStatus[entry.status], code);
    assert.equal(typeof sdk[entry.class], "function", `${entry.class} is exported`);
    const made = new (errorClassFor(code))("x", { code });
    assert.ok(made instanceof sdk[entry.class], `${code} is a ${entry.class}`);
    assert.equal(made.grpcCode, vocabulary.grpcStatus[entry.status], code);
  }
});

test("errors.json's reasons are the proto's ErrorReason values", () => {
  const proto = Object.keys(ErrorReason).filter(
    (name) => Number.isNaN(Number(name)) && !["ERROR_REASON_UNSPECIFIED", "UNRECOGNIZED"].includes(name),
  );
  assert.deepEqual(proto.sort(), Object.keys(vocabulary.reasons).sort());
});

test("a status without ErrorInfo is the prefix and the gRPC name, as gRPC spells it", () => {
  assert.equal(codeForStatus(status.CANCELLED), "SANDBOX_SNAPSHOT_CANCELLED");
  for (const [name, number] of Object.entries(vocabulary.grpcStatus)) {
    assert.equal(status[name], number, `grpc-js spells ${name} the same`);
    assert.equal(codeForStatus(number), vocabulary.prefix + name);
    // SANDBOX_SNAPSHOT_PERMISSION_DENIED is also a reason (a filesystem refusal,
    // FAILED_PRECONDITION); every other such code keeps its own status.
    const own = vocabulary.reasons[vocabulary.prefix + name]?.status ?? name;
    assert.equal(statusForCode(vocabulary.prefix + name), vocabulary.grpcStatus[own], name);
  }
});

const CATEGORY_CLASSES = {
  cancelled: CheckpointdCancelledError,
  deadline: CheckpointdDeadlineError,
  unauthenticated: CheckpointdUnauthenticatedError,
  unavailable: CheckpointdUnavailableError,
  not_found: CheckpointdNotFoundError,
  conflict: CheckpointdConflictError,
};

function serviceError(code, details = "from the wire") {
  return Object.assign(new Error(details), { code, details, metadata: new Metadata() });
}

test("each category has a class, matched by every status it covers", () => {
  assert.deepEqual(Object.keys(CATEGORY_CLASSES).sort(), Object.keys(vocabulary.categories).sort());
  for (const [category, statuses] of Object.entries(vocabulary.categories)) {
    for (const name of statuses) {
      const error = toCheckpointdError(serviceError(status[name]));
      assert.equal(error.category, category, name);
      assert.equal(categoryOf(status[name]), category);
      assert.ok(error instanceof CATEGORY_CLASSES[category], `${name} is a ${category} error`);
      assert.ok(error instanceof SandboxCheckpointError);
      for (const [other, Class] of Object.entries(CATEGORY_CLASSES)) {
        if (other !== category) assert.ok(!(error instanceof Class), `${name} is no ${other} error`);
      }
    }
  }
  const conflict = new SandboxCheckpointWriterConflictError("busy", { code: "SANDBOX_SNAPSHOT_WRITER_CONFLICT" });
  assert.ok(conflict instanceof CheckpointdConflictError, "a reference class is in its category too");
  assert.equal(toCheckpointdError(serviceError(status.INTERNAL)).category, undefined);
});

test("a cancelled call is an AbortError", () => {
  const error = toCheckpointdError(serviceError(status.CANCELLED, "Cancelled on client"));
  assert.equal(error.name, "AbortError");
  assert.equal(error.code, "SANDBOX_SNAPSHOT_CANCELLED");
  assert.equal(error.grpcCode, 1);
  assert.ok(error instanceof CheckpointdCancelledError);
  assert.equal(toCheckpointdError(serviceError(status.DEADLINE_EXCEEDED)).name, "CheckpointdDeadlineError");
});

test("an argument error the SDK raises carries gRPC code 3", async () => {
  await assert.rejects(deleteCheckpoints({ client: null, threadId: "t", keep: 0 }), (error) => {
    assert.ok(error instanceof SandboxCheckpointInvalidArgumentError);
    assert.equal(error.code, "SANDBOX_SNAPSHOT_INVALID_ARGUMENT");
    assert.equal(error.grpcCode, status.INVALID_ARGUMENT);
    return true;
  });
});

function filesBelow(root) {
  const out = {};
  const walk = (dir) => {
    for (const name of readdirSync(dir)) {
      const full = path.join(dir, name);
      if (statSync(full).isDirectory()) walk(full);
      else out[path.relative(root, full)] = readFileSync(full, "utf8");
    }
  };
  walk(root);
  return out;
}

test("the committed generated code is what `npm run generate` makes", () => {
  const out = mkdtempSync("/tmp/cpd-ts-gen-");
  try {
    const buf = spawnSync(path.join(packageDir, "node_modules", ".bin", "buf"), ["generate", "-o", out], {
      cwd: packageDir,
      encoding: "utf8",
    });
    assert.equal(buf.status, 0, buf.stderr);
    const vocab = spawnSync(process.execPath, ["scripts/generate-vocabulary.mjs", path.join(out, "src", "gen")], {
      cwd: packageDir,
      encoding: "utf8",
    });
    assert.equal(vocab.status, 0, vocab.stderr);
    assert.deepEqual(
      filesBelow(path.join(packageDir, "src", "gen")),
      filesBelow(path.join(out, "src", "gen")),
      "src/gen is stale: run `npm run generate` and commit it",
    );
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});
