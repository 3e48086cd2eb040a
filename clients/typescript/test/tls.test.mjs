// The SDK over TLS: server-verified TLS with a token, and mutual TLS.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { after, before, test } from "node:test";

import { captureSandboxCheckpoint, connect, SandboxCheckpointError } from "@checkpointd/client";

import { makePki, startDaemon, writeTree } from "./daemon.mjs";

const TOKEN = "tok-tls-123";
let dir;
let pki;
const daemons = [];
// Node warns once per process when TLS is given an IP address as server name.
const warnings = [];
process.on("warning", (warning) => warnings.push(warning));

before(() => {
  dir = mkdtempSync("/tmp/cpd-ts-pki-");
  pki = makePki(dir);
});

after(async () => {
  for (const daemon of daemons) await daemon.stop();
  rmSync(dir, { recursive: true, force: true });
});

test("TLS with a token: capture and read back", async () => {
  const tls = { rootCerts: readFileSync(pki.ca) };
  const daemon = await startDaemon({
    tcp: true, token: TOKEN, tls,
    extra: ["--tls-cert", pki.serverCert, "--tls-key", pki.serverKey],
  });
  daemons.push(daemon);
  const client = await connect({ address: daemon.address, token: TOKEN, tls });
  try {
    writeTree(daemon.workspace, { "a.txt": "over TLS" });
    const saved = await captureSandboxCheckpoint({ client, threadId: "t-tls" });
    assert.equal(saved.fileCount, 1);
    const info = await client.getServerInfo();
    assert.equal(info.capabilities.tls, true);
  } finally {
    client.close();
  }
  // The daemon's certificate is not trusted without the CA: connect fails at
  // once, and says why.
  const started = performance.now();
  await assert.rejects(connect({ address: daemon.address, token: TOKEN, tls: true }), (error) => {
    assert.ok(error instanceof SandboxCheckpointError);
    assert.equal(error.code, "SANDBOX_SNAPSHOT_UNAVAILABLE");
    assert.match(error.message, /certificate/);
    assert.match(error.message, /CHECKPOINTD_TLS_CA/, "the hint names the setting");
    return true;
  });
  assert.ok(performance.now() - started < 1_000, "a TLS error fails at once");
});

test("TLS from CHECKPOINTD_TLS_CA, and never an IP address as the server name", async () => {
  const daemon = await startDaemon({
    tcp: true, token: TOKEN, tls: { rootCerts: readFileSync(pki.ca) },
    extra: ["--tls-cert", pki.serverCert, "--tls-key", pki.serverKey],
  });
  daemons.push(daemon);
  assert.match(daemon.address, /^tcp:\/\/127\.0\.0\.1:/);
  const client = await connect({
    env: { CHECKPOINTD_ADDRESS: daemon.address, CHECKPOINTD_TOKEN: TOKEN, CHECKPOINTD_TLS_CA: pki.ca },
  });
  try {
    assert.equal((await client.getServerInfo()).capabilities.tls, true);
  } finally {
    client.close();
  }
  // The certificate is still checked against the address: reached through
  // 127.0.0.2, which it does not name, the daemon is refused.
  const port = Number(daemon.address.split(":").at(-1));
  const relay = net.createServer((socket) => socket.pipe(net.connect(port, "127.0.0.1")).pipe(socket));
  await new Promise((resolve) => relay.listen(0, "127.0.0.2", resolve));
  try {
    await assert.rejects(
      connect({ address: `tcp://127.0.0.2:${relay.address().port}`, token: TOKEN,
        tls: { rootCerts: readFileSync(pki.ca) } }),
      (error) => /127\.0\.0\.2 is not in the cert's list/.test(error.message),
    );
  } finally {
    relay.close();
  }
  await new Promise((resolve) => setImmediate(resolve));
  assert.deepEqual(warnings.map((w) => w.message).filter((m) => /ServerName|RFC 6066/.test(m)), []);
  await assert.rejects(
    connect({ env: { CHECKPOINTD_ADDRESS: daemon.address, CHECKPOINTD_TLS_CA: "/nonexistent/ca.pem" } }),
    (error) => error.code === "SANDBOX_SNAPSHOT_INVALID_ARGUMENT" && /CHECKPOINTD_TLS_CA/.test(error.message),
  );
});

test("mutual TLS: the client certificate is the credential", async () => {
  const tls = {
    rootCerts: readFileSync(pki.ca),
    certChain: readFileSync(pki.clientCert),
    privateKey: readFileSync(pki.clientKey),
  };
  const daemon = await startDaemon({
    tcp: true, tls,
    extra: ["--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--tls-client-ca", pki.ca],
  });
  daemons.push(daemon);
  const client = await connect({ address: daemon.address, tls });
  try {
    writeTree(daemon.workspace, { "m.txt": "mutual" });
    const saved = await captureSandboxCheckpoint({ client, threadId: "t-mtls" });
    assert.ok(saved.id);
    assert.equal((await client.getServerInfo()).capabilities.mutualTls, true);
  } finally {
    client.close();
  }
});
