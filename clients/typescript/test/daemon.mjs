// Test helpers: a real checkpointd daemon (`python -m checkpointd serve`) in a
// fresh /tmp directory, a writer-lease holder, and a TCP proxy that can lose a reply.
//
// The Python that runs the daemon is $CHECKPOINTD_PYTHON, else the repository's
// .venv (made by `make build`).
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { connect } from "@checkpointd/client";

const here = path.dirname(fileURLToPath(import.meta.url));
export const PYTHON =
  process.env.CHECKPOINTD_PYTHON ?? path.resolve(here, "..", "..", "..", ".venv", "bin", "python");

function cleanEnv(extra = {}) {
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([key]) => !key.startsWith("CHECKPOINTD_")),
  );
  return { ...env, ...extra };
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Starts a daemon and waits until it is SERVING; `stop()` ends it and removes its files. */
export async function startDaemon({ tcp = false, token } = {}) {
  const base = mkdtempSync("/tmp/cpd-ts-");
  const workspace = path.join(base, "ws");
  const dataDir = path.join(base, "data");
  const blobsDir = path.join(base, "blobs");
  for (const dir of [workspace, dataDir, blobsDir]) mkdirSync(dir);
  const store = `sqlite://${path.join(base, "checkpoints.db")}`;
  const address = tcp
    ? `tcp://127.0.0.1:${await freePort()}`
    : `unix://${path.join(dataDir, "checkpointd.sock")}`;
  const logPath = path.join(base, "daemon.log");
  const log = openSync(logPath, "w");
  const proc = spawn(
    PYTHON,
    ["-m", "checkpointd", "serve", "--workspace", workspace, "--data-dir", dataDir,
      "--store", store, "--blobs", `file://${blobsDir}`, "--listen", address,
      "--grace-period", "5s"],
    { stdio: ["ignore", log, log], env: cleanEnv(token ? { CHECKPOINTD_TOKEN: token } : {}) },
  );
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  const daemon = {
    address, token, workspace, dataDir, blobsDir, store, base,
    log: () => readFileSync(logPath, "utf8"),
    async stop() {
      if (proc.exitCode === null) {
        proc.kill("SIGTERM");
        const timer = setTimeout(() => proc.kill("SIGKILL"), 15_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(base, { recursive: true, force: true });
    },
  };
  try {
    const client = await connect({ address, token, connectTimeoutMs: 30_000 });
    client.close();
  } catch (error) {
    const text = daemon.log();
    await daemon.stop();
    throw new Error(`daemon did not start: ${error.message}\n${text}`);
  }
  return daemon;
}

/** Holds the writer lease of `threadId` in the daemon's store until `release()`. */
export async function holdLease(daemon, threadId) {
  const script = [
    "import asyncio, sys",
    "from checkpointd import open_store",
    "async def main():",
    "    store = await open_store(sys.argv[1])",
    "    lease = await store.acquire_writer(sys.argv[2])",
    "    print('held', flush=True)",
    "    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)",
    "    await lease.release()",
    "    await store.aclose()",
    "asyncio.run(main())",
  ].join("\n");
  const proc = spawn(PYTHON, ["-c", script, daemon.store, threadId], {
    stdio: ["pipe", "pipe", "inherit"],
    env: cleanEnv(),
  });
  await new Promise((resolve, reject) => {
    proc.stdout.on("data", (chunk) => String(chunk).includes("held") && resolve());
    proc.once("exit", (code) => reject(new Error(`lease holder exited with ${code}`)));
  });
  return {
    release: () =>
      new Promise((resolve) => {
        proc.once("exit", resolve);
        proc.stdin.end();
      }),
  };
}

/**
 * A TCP proxy to `target` (host:port). `loseReplyContaining(bytes)` arms it: the
 * first chunk from the daemon that holds those bytes is dropped and every
 * connection is cut, as when a reply is lost on the network after the daemon
 * committed the work.
 */
export async function startProxy(target) {
  const [host, port] = target.split(":");
  const sockets = new Set();
  let armed = null;
  let cuts = 0;
  const server = net.createServer((downstream) => {
    const upstream = net.connect(Number(port), host);
    for (const socket of [downstream, upstream]) {
      sockets.add(socket);
      socket.on("close", () => sockets.delete(socket));
      socket.on("error", () => undefined);
    }
    downstream.pipe(upstream);
    upstream.on("data", (chunk) => {
      if (armed !== null && chunk.includes(armed)) {
        armed = null;
        cuts += 1;
        for (const socket of sockets) socket.destroy();
        return;
      }
      downstream.write(chunk);
    });
    upstream.on("end", () => downstream.end());
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    address: `tcp://127.0.0.1:${server.address().port}`,
    loseReplyContaining(bytes) {
      armed = Buffer.from(bytes);
    },
    get cuts() {
      return cuts;
    },
    close: () =>
      new Promise((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(resolve);
      }),
  };
}

/** Writes `{ relativePath: content }` below `root`. */
export function writeTree(root, files) {
  for (const [relative, content] of Object.entries(files)) {
    const file = path.join(root, relative);
    mkdirSync(path.dirname(file), { recursive: true });
    writeFileSync(file, content);
  }
}
