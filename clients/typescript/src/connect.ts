/**
 * `connect()`: the address, token and TLS material from the options or, as the
 * `checkpointd` command line reads them, from the environment; then one health
 * check that fails at once, naming the cause, when the daemon cannot be reached.
 */
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import { homedir } from "node:os";
import { checkServerIdentity, type PeerCertificate } from "node:tls";

import * as grpc from "@grpc/grpc-js";

import {
  CheckpointdClient,
  DEFAULT_DEADLINES,
  grpcTarget,
  type CallKind,
  type ClientSettings,
  type RetryOptions,
} from "./client.js";
import { invalidArgument } from "./errors.js";
import { checkOptions } from "./options.js";

export interface TlsOptions {
  /** PEM root certificates to trust (default: the system's). */
  rootCerts?: string | Uint8Array;
  /** PEM client key and certificate, for mutual TLS. */
  privateKey?: string | Uint8Array;
  certChain?: string | Uint8Array;
  /** Expected server name, when it differs from the address's host. */
  serverName?: string;
}

export interface ConnectOptions {
  /**
   * `unix:///abs/path.sock`, `unix:/abs/path.sock`, `tcp://host:port` or
   * `host:port`. Default: `CHECKPOINTD_ADDRESS`, else the socket in
   * `CHECKPOINTD_DATA_DIR` (`unix://<dir>/checkpointd.sock`), else the default data
   *   dir `~/.local/state/checkpointd`, as the CLI and `make run` use.
   */
  address?: string;
  /**
   * Bearer token, sent as `authorization: Bearer <token>` on every call (TCP
   * needs one). Default: `CHECKPOINTD_TOKEN`.
   */
  token?: string;
  /**
   * TLS for `tcp://` addresses: `true` for the system roots, or options. Default:
   * TLS when `CHECKPOINTD_TLS_CA` (a PEM file to verify the daemon with) or
   * `CHECKPOINTD_TLS_CERT` + `CHECKPOINTD_TLS_KEY` (a client certificate) is set.
   */
  tls?: boolean | TlsOptions;
  /** Where the `CHECKPOINTD_*` variables are read (default `process.env`). */
  env?: Record<string, string | undefined>;
  /**
   * The daemon's workspace as your paths name it (default `/workspace`, the
   * sandbox's): a `workspaceRoot` option below it maps to that folder of the
   * daemon's workspace.
   */
  workspaceRoot?: string;
  /**
   * Wait (up to `connectTimeoutMs`) for a daemon that cannot be reached yet, as
   * one that is starting. Default false: fail at once, naming the cause.
   */
  waitForReady?: boolean;
  /** How long `connect()` waits for the daemon to be SERVING (default 10 000). */
  connectTimeoutMs?: number;
  /** Stops `connect()`'s wait (it rejects with an AbortError). */
  signal?: AbortSignal;
  /** Default deadline per kind of call, in ms (`Infinity`: none). */
  deadlines?: Partial<Record<CallKind, number>>;
  retry?: RetryOptions;
  /** Extra grpc-js channel options. */
  channelOptions?: grpc.ChannelOptions;
}

const CONNECT_OPTION_KEYS = [
  "address",
  "token",
  "tls",
  "env",
  "workspaceRoot",
  "waitForReady",
  "connectTimeoutMs",
  "signal",
  "deadlines",
  "retry",
  "channelOptions",
];

/** The default `workspaceRoot`: the sandbox's workspace in TanStack AI's sandboxes. */
export const DEFAULT_WORKSPACE_ROOT = "/workspace";

function addressFrom(options: ConnectOptions, env: Record<string, string | undefined>): string {
  const address = options.address ?? env.CHECKPOINTD_ADDRESS;
  if (address) return address;
  const dataDir = env.CHECKPOINTD_DATA_DIR || defaultDataDir(env);
  return `unix://${dataDir.replace(/\/+$/, "")}/checkpointd.sock`;
}

/** The data dir `checkpointd serve` (and `make run`) uses when none is given,
 * as the CLI and the Go SDK find it: `~/.local/state/checkpointd`. */
function defaultDataDir(env: Record<string, string | undefined>): string {
  return `${env.HOME || homedir()}/.local/state/checkpointd`;
}

function readPem(variable: string, env: Record<string, string | undefined>): Buffer | undefined {
  const file = env[variable];
  if (!file) return undefined;
  try {
    return readFileSync(file);
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    throw invalidArgument(`${variable}=${file}: cannot read it: ${why}`, { field: variable, path: file });
  }
}

function tlsFrom(
  options: ConnectOptions,
  env: Record<string, string | undefined>,
  address: string,
): TlsOptions | undefined {
  if (options.tls !== undefined) return options.tls === false ? undefined : options.tls === true ? {} : options.tls;
  if (address.startsWith("unix:") || address.startsWith("/")) return undefined;
  const rootCerts = readPem("CHECKPOINTD_TLS_CA", env);
  const certChain = readPem("CHECKPOINTD_TLS_CERT", env);
  const privateKey = readPem("CHECKPOINTD_TLS_KEY", env);
  if ((certChain === undefined) !== (privateKey === undefined)) {
    throw invalidArgument("CHECKPOINTD_TLS_CERT and CHECKPOINTD_TLS_KEY go together", {
      field: "CHECKPOINTD_TLS_CERT",
    });
  }
  if (rootCerts === undefined && certChain === undefined) return undefined;
  return { rootCerts, certChain, privateKey };
}

/** The host of a TCP address (`tcp://h:p`, `h:p`, `[v6]:p`). */
function hostOf(address: string): string {
  const target = grpcTarget(address).replace(/^(dns|ipv4|ipv6):(\/\/\/)?/, "");
  const bracketed = /^\[([^\]]+)\]/.exec(target);
  if (bracketed) return bracketed[1]!;
  const colon = target.lastIndexOf(":");
  return colon === -1 ? target : target.slice(0, colon);
}

/**
 * A DNS name for an IP address (its reverse-lookup name): TLS must not send an
 * IP address as the server name (RFC 6066), and grpc-js would.
 */
function reverseName(ip: string): string {
  if (isIP(ip) === 4) return `${ip.split(".").reverse().join(".")}.in-addr.arpa`;
  const groups = ip.split("::");
  const head = groups[0] ? groups[0].split(":") : [];
  const tail = groups[1] ? groups[1].split(":") : [];
  const zeros = groups.length === 2 ? Array(8 - head.length - tail.length).fill("0") : [];
  const hex = [...head, ...zeros, ...tail].map((group) => group.padStart(4, "0")).join("");
  return `${[...hex].reverse().join(".")}.ip6.arpa`;
}

function toBuffer(value: string | Uint8Array | undefined): Buffer | null {
  if (value === undefined) return null;
  return Buffer.from(value);
}

function credentialsFor(
  tls: TlsOptions | undefined,
  address: string,
): { credentials: grpc.ChannelCredentials; channelOptions: grpc.ChannelOptions } {
  if (tls === undefined) return { credentials: grpc.credentials.createInsecure(), channelOptions: {} };
  const expected = tls.serverName || hostOf(address);
  const verify: grpc.VerifyOptions = {};
  let serverName = tls.serverName;
  if (isIP(expected)) {
    // The certificate is checked against the IP address itself; the name sent
    // is one that denotes the same address without being an IP literal.
    serverName = reverseName(expected);
    verify.checkServerIdentity = (_name: string, cert: PeerCertificate) => checkServerIdentity(expected, cert);
  }
  return {
    credentials: grpc.credentials.createSsl(
      toBuffer(tls.rootCerts),
      toBuffer(tls.privateKey),
      toBuffer(tls.certChain),
      verify,
    ),
    channelOptions: serverName ? { "grpc.ssl_target_name_override": serverName } : {},
  };
}

/** The settings a client is made from: the options, then the environment, then defaults. */
export function resolveConnectOptions(options: ConnectOptions = {}): ClientSettings {
  checkOptions("connect", options, CONNECT_OPTION_KEYS, false);
  const env = options.env ?? process.env;
  const address = addressFrom(options, env);
  const { credentials, channelOptions } = credentialsFor(tlsFrom(options, env, address), address);
  return {
    address,
    credentials,
    token: options.token ?? (env.CHECKPOINTD_TOKEN || undefined),
    workspaceRoot: options.workspaceRoot ?? DEFAULT_WORKSPACE_ROOT,
    connectTimeoutMs: options.connectTimeoutMs ?? 10_000,
    deadlines: { ...DEFAULT_DEADLINES, ...options.deadlines },
    retry: {
      maxAttempts: options.retry?.maxAttempts ?? 5,
      initialBackoffMs: options.retry?.initialBackoffMs ?? 100,
      maxBackoffMs: options.retry?.maxBackoffMs ?? 2000,
    },
    channelOptions: { ...channelOptions, ...options.channelOptions },
  };
}

/**
 * Connects to the daemon and checks it is SERVING. A daemon that cannot be
 * reached (no socket, connection refused, a TLS error) fails at once with
 * `SANDBOX_SNAPSHOT_UNAVAILABLE` naming the cause, unless `waitForReady`; a
 * missing or wrong token is `SANDBOX_SNAPSHOT_UNAUTHENTICATED`.
 */
export async function connect(options: ConnectOptions = {}): Promise<CheckpointdClient> {
  const settings = resolveConnectOptions(options);
  const client = new CheckpointdClient(settings);
  try {
    const { waitForReady, signal } = options;
    await client.waitServing(settings.connectTimeoutMs, { waitForReady, signal });
    // Health answers without a token (probes cannot send one); GetServerInfo
    // is behind it, so a missing or wrong token is found here.
    await client.getServerInfo({}, { timeoutMs: settings.connectTimeoutMs, signal });
  } catch (error) {
    client.close();
    throw error;
  }
  return client;
}
