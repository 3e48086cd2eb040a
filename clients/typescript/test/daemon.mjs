// Test helpers: a real checkpointd daemon (`python -m checkpointd serve`) in a
// fresh /tmp directory, a writer-lease holder, and a TCP proxy that can lose a reply.
//
// The Python that runs the daemon is $CHECKPOINTD_PYTHON, else the repository's
// .venv (made by `make build`).
import { spawn, spawnSync } from "node:child_process";
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
export async function startDaemon({ tcp = false, token, extra = [], tls } = {}) {
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
      "--grace-period", "5s", ...extra],
    { stdio: ["ignore", log, log], env: cleanEnv(token ? { CHECKPOINTD_TOKEN: token } : {}) },
  );
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  const daemon = {
    address, token, workspace, dataDir, blobsDir, store, base,
    log: () => readFileSync(logPath, "utf8"),
    /** SIGSTOP: the daemon answers nothing until `resume()` (a call's deadline must pass). */
    pause: () => proc.kill("SIGSTOP"),
    resume: () => proc.kill("SIGCONT"),
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
    // A daemon that exits (a bad flag, a crash) fails the start at once.
    const gone = new AbortController();
    exited.then(() => gone.abort(new Error("the daemon exited")));
    const client = await connect({ address, token, tls, connectTimeoutMs: 30_000, waitForReady: true,
      signal: gone.signal });
    client.close();
  } catch (error) {
    const text = daemon.log();
    await daemon.stop();
    const why = proc.exitCode === null ? error.message : `it exited with ${proc.exitCode}`;
    throw new Error(`daemon did not start: ${why}\n${text}`);
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

/**
 * A test PKI in `dir` (made with Python's `cryptography`, which the daemon's test
 * extra installs): a CA, a server certificate for 127.0.0.1/localhost and a
 * client certificate. Returns the PEM file paths.
 */
export function makePki(dir) {
  const script = [
    "import datetime as dt, ipaddress, sys",
    "from pathlib import Path",
    "from cryptography import x509",
    "from cryptography.hazmat.primitives import hashes, serialization",
    "from cryptography.hazmat.primitives.asymmetric import ec",
    "from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID",
    "out = Path(sys.argv[1])",
    "now = dt.datetime.now(dt.timezone.utc)",
    "def cert(cn, key, issuer, issuer_key, usage=None, ca=False):",
    "    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])",
    "    b = (x509.CertificateBuilder().subject_name(name)",
    "         .issuer_name(issuer.subject if issuer else name).public_key(key.public_key())",
    "         .serial_number(x509.random_serial_number())",
    "         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))",
    "         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))",
    "    if usage == 'server':",
    "        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName('localhost'),",
    "            x509.IPAddress(ipaddress.ip_address('127.0.0.1'))]), critical=False)",
    "        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)",
    "    elif usage == 'client':",
    "        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)",
    "    return b.sign(issuer_key, hashes.SHA256())",
    "def save(name, obj):",
    "    data = obj.public_bytes(serialization.Encoding.PEM) if isinstance(obj, x509.Certificate) else \\",
    "        obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())",
    "    (out / name).write_bytes(data)",
    "ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))",
    "ca = cert('checkpointd test CA', ca_key, None, ca_key, ca=True)",
    "save('ca.pem', ca)",
    "save('server.pem', cert('localhost', server_key, ca, ca_key, 'server')); save('server.key', server_key)",
    "save('client.pem', cert('client', client_key, ca, ca_key, 'client')); save('client.key', client_key)",
  ].join("\n");
  const result = spawnSync(PYTHON, ["-c", script, dir], { encoding: "utf8" });
  if (result.status !== 0) throw new Error(`making the test PKI failed: ${result.stderr}`);
  const file = (name) => path.join(dir, name);
  return {
    ca: file("ca.pem"), serverCert: file("server.pem"), serverKey: file("server.key"),
    clientCert: file("client.pem"), clientKey: file("client.key"),
  };
}
