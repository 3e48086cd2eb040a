/**
 * The typed client of the daemon (made by `connect()`, in connect.ts).
 *
 * Transport: `@grpc/grpc-js`, which dials `unix:///abs/path.sock` natively, so the
 * daemon's default Unix socket needs nothing extra. Every RPC of the generated
 * service definitions (ts-proto `generic-definitions`) becomes a method: unary
 * calls return promises, server streams are async iterables of typed messages,
 * client streams take an (async) iterable of requests. Requests are partial
 * objects (`{ threadId: "t" }`); 64-bit integers are `bigint` in replies and
 * accept `number | string | bigint` in requests.
 *
 * Deadlines: every call has one, by its kind ({@link DEFAULT_DEADLINES}), unless
 * the call gives `timeoutMs` (`Infinity`: none).
 *
 * Retries: read-only RPCs are retried by grpc-js itself on UNAVAILABLE (a service
 * config retry policy). `capture` is retried here, because a lost reply may come
 * after the append committed: it sends a `requestId` (generated when the caller
 * gives none) and retries with the same id on UNAVAILABLE, on a stream that ended
 * without its done event, and, after such a loss, on WRITER_CONFLICT (the lease
 * may still be held by the abandoned attempt); the daemon then returns the
 * committed checkpoint (`done.replayed`) instead of making a second one. A retry
 * carries `checkpointd-attempt: <n>`, so the daemon waits for an earlier attempt
 * that still holds the lease instead of answering WRITER_CONFLICT; a first
 * attempt fails fast, as TanStack AI's `@tanstack/ai-sandbox` API wants.
 */
import { randomUUID } from "node:crypto";

import * as grpc from "@grpc/grpc-js";

import {
  checkpointdError,
  SandboxCheckpointError,
  SandboxCheckpointWriterConflictError,
  toCheckpointdError,
} from "./errors.js";
import {
  CheckpointdDefinition,
  type Artifact,
  type CaptureEvent,
  type CaptureRequest,
} from "./gen/checkpointd/v1/checkpointd.js";
import {
  HealthCheckResponse_ServingStatus,
  HealthDefinition,
} from "./gen/grpc/health/v1/health.js";

// ---------------------------------------------------------------- typed surface

interface MessageType<T = unknown, P = unknown> {
  encode(message: T): { finish(): Uint8Array };
  decode(input: Uint8Array): T;
  fromPartial(object: P): T;
}

interface MethodDefinition {
  readonly name: string;
  readonly requestType: MessageType<any, any>;
  readonly requestStream: boolean;
  readonly responseType: MessageType<any, any>;
  readonly responseStream: boolean;
}

interface ServiceDefinition {
  readonly fullName: string;
  readonly methods: { readonly [name: string]: MethodDefinition };
}

/** The partial form a request may be given in (what `fromPartial` accepts). */
export type RequestOf<M> = M extends { requestType: { fromPartial(object: infer P): unknown } }
  ? P
  : never;
/** The decoded reply message of a method. */
export type ResponseOf<M> = M extends {
  responseType: { decode(input: any, length?: number): infer R };
}
  ? R
  : never;

export interface CallOptions {
  /**
   * Deadline for the whole call, in ms from now (`Infinity`: none). Default: the
   * client's deadline for the call's kind ({@link DEFAULT_DEADLINES}).
   */
  timeoutMs?: number;
  /**
   * Cancels the call: it rejects with a `CheckpointdCancelledError` whose `name`
   * is `"AbortError"` and whose code is `SANDBOX_SNAPSHOT_CANCELLED`.
   */
  signal?: AbortSignal;
  /** Queue the call while the daemon is unreachable instead of failing at once. */
  waitForReady?: boolean;
  /** Extra request metadata (headers) for this call. */
  metadata?: Record<string, string>;
}

/** The metadata a retried capture carries (the attempt number, 2 and up): only a
 * marked retry waits for an earlier attempt still holding the lease elsewhere. */
export const ATTEMPT_METADATA = "checkpointd-attempt";

type Requests<M> = Iterable<RequestOf<M>> | AsyncIterable<RequestOf<M>>;

/** One RPC as a method, by its streaming shape. */
export type Rpc<M> = M extends { requestStream: false; responseStream: false }
  ? (request?: RequestOf<M>, options?: CallOptions) => Promise<ResponseOf<M>>
  : M extends { requestStream: false; responseStream: true }
    ? (request?: RequestOf<M>, options?: CallOptions) => AsyncIterable<ResponseOf<M>>
    : M extends { requestStream: true; responseStream: false }
      ? (requests: Requests<M>, options?: CallOptions) => Promise<ResponseOf<M>>
      : (requests: Requests<M>, options?: CallOptions) => AsyncIterable<ResponseOf<M>>;

/** Every RPC of a service definition as a method. */
export type ServiceClient<D extends ServiceDefinition> = {
  -readonly [K in keyof D["methods"]]: Rpc<D["methods"][K]>;
};

export type CheckpointdRpcs = ServiceClient<typeof CheckpointdDefinition>;
export type HealthRpcs = ServiceClient<typeof HealthDefinition>;

// ---------------------------------------------------------------- settings

export interface RetryOptions {
  /** Attempts in all, the first included (default 5). */
  maxAttempts?: number;
  /** First back-off, doubled on each retry up to `maxBackoffMs` (defaults 100 and 2000). */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
}

/** The kinds of call, each with its own default deadline. */
export type CallKind = "unary" | "read" | "operation" | "watch";

/**
 * Default deadlines, in ms: `unary` calls answer at once; `read` streams
 * (ListEntries, Diff, ReadFile, ReadArtifact, UploadArtifact) move bytes;
 * `operation`s (Capture, Restore, SweepBlobs, Check) may take long; a health
 * `watch` lasts until it is cancelled.
 */
export const DEFAULT_DEADLINES: Readonly<Record<CallKind, number>> = Object.freeze({
  unary: 30_000,
  read: 10 * 60_000,
  operation: 60 * 60_000,
  watch: Infinity,
});

const CALL_KINDS: Readonly<Record<string, CallKind>> = {
  Capture: "operation",
  Restore: "operation",
  Undo: "operation",
  SweepBlobs: "operation",
  Check: "operation",
  ListEntries: "read",
  Diff: "read",
  ReadFile: "read",
  ReadArtifact: "read",
  UploadArtifact: "read",
  Watch: "watch",
};

/** What a client is made from (see `connect()`, which resolves these). */
export interface ClientSettings {
  /** The address as given (`unix:///...`, `tcp://host:port`, `host:port`). */
  address: string;
  credentials: grpc.ChannelCredentials;
  token?: string;
  /** The daemon's workspace root as the caller's paths name it (`workspaceRoot` options). */
  workspaceRoot: string;
  connectTimeoutMs: number;
  deadlines: Readonly<Record<CallKind, number>>;
  retry: Required<RetryOptions>;
  channelOptions: grpc.ChannelOptions;
}

const READ_ONLY_METHODS = [
  "GetCheckpoint",
  "ListCheckpoints",
  "ListThreads",
  "GetHead",
  "ListEntries",
  "Diff",
  "ReadFile",
  "ReadArtifact",
  "GetServerInfo",
];

/** grpc-js's own target syntax for our address forms. */
export function grpcTarget(address: string): string {
  if (address.startsWith("unix:")) return address; // unix:/abs and unix:///abs both work
  if (address.startsWith("tcp://")) return address.slice("tcp://".length);
  if (address.startsWith("/")) return `unix://${address}`;
  return address;
}

function serviceConfig(retry: Required<RetryOptions>): string {
  return JSON.stringify({
    methodConfig: [
      {
        name: READ_ONLY_METHODS.map((method) => ({
          service: CheckpointdDefinition.fullName,
          method,
        })),
        retryPolicy: {
          maxAttempts: Math.min(retry.maxAttempts, 5),
          initialBackoff: `${retry.initialBackoffMs / 1000}s`,
          maxBackoff: `${retry.maxBackoffMs / 1000}s`,
          backoffMultiplier: 2,
          retryableStatusCodes: ["UNAVAILABLE"],
        },
      },
    ],
  });
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------- the client

/** A connected client: every RPC as a typed method, plus `health`. Make one with `connect()`. */
export class CheckpointdClient {
  /** `grpc.health.v1.Health`: `check()` and `watch()`. */
  readonly health: HealthRpcs;
  readonly address: string;
  /** The daemon's workspace root as the caller names it (`workspaceRoot` options map below it). */
  readonly workspaceRoot: string;
  readonly #channel: grpc.Client;
  readonly #metadata: grpc.Metadata;
  readonly #settings: ClientSettings;
  readonly #rpcs: CheckpointdRpcs;

  constructor(settings: ClientSettings) {
    this.address = settings.address;
    this.workspaceRoot = settings.workspaceRoot;
    this.#settings = settings;
    this.#channel = new grpc.Client(grpcTarget(settings.address), settings.credentials, {
      "grpc.service_config": serviceConfig(settings.retry),
      ...settings.channelOptions,
    });
    this.#metadata = new grpc.Metadata();
    if (settings.token) this.#metadata.set("authorization", `Bearer ${settings.token}`);
    this.#rpcs = this.#bind(CheckpointdDefinition);
    this.health = this.#bind(HealthDefinition);
    // Every RPC of the contract (also ones added to the proto later) is a method.
    for (const [name, rpc] of Object.entries(this.#rpcs)) {
      if (!(name in this)) Object.defineProperty(this, name, { value: rpc, enumerable: false });
    }
  }

  /** Closes the channel; calls in flight are cancelled. */
  close(): void {
    this.#channel.close();
  }

  /**
   * Waits until the daemon's health check says SERVING (a starting or draining
   * daemon says NOT_SERVING), at most `timeoutMs` (default: `connectTimeoutMs`).
   * A daemon that cannot be reached (no socket, connection refused, a TLS
   * error) fails at once, naming the cause, unless `waitForReady` is set: then
   * it is tried again until the time is up (for a daemon that is starting).
   * `signal` stops the wait (an AbortError).
   */
  async waitServing(
    timeoutMs: number = this.#settings.connectTimeoutMs,
    { waitForReady = false, signal }: { waitForReady?: boolean; signal?: AbortSignal } = {},
  ): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last: SandboxCheckpointError | undefined;
    for (;;) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        const why = last === undefined ? "" : `: ${last.message}`;
        throw checkpointdError(`the daemon at ${this.address} is not SERVING after ${timeoutMs} ms${why}`, {
          code: "SANDBOX_SNAPSHOT_UNAVAILABLE",
          cause: last,
        });
      }
      try {
        const reply = await this.health.check({}, { timeoutMs: remaining, signal });
        if (reply.status === HealthCheckResponse_ServingStatus.SERVING) return;
        last = checkpointdError(`the daemon at ${this.address} is not serving yet (starting or draining)`, {
          code: "SANDBOX_SNAPSHOT_DRAINING",
        });
      } catch (error) {
        const typed = toCheckpointdError(error);
        if (typed.category === "cancelled") throw typed;
        if (typed.grpcCode === grpc.status.UNAVAILABLE) {
          last = unreachable(this.address, typed);
          if (!waitForReady) throw last;
        } else if (typed.grpcCode !== grpc.status.DEADLINE_EXCEEDED) {
          throw typed;
        }
      }
      await sleep(50);
    }
  }

  /**
   * Capture, with progress: `for await (const ev of client.capture({ threadId }))`.
   * Events: `started` (the checkpoint id), `progress`, `done` (summary and stats).
   * After a lost reply it retries with the same `requestId`; the retried
   * attempt's events start again from `started`, with the same checkpoint id.
   */
  async *capture(
    request: RequestOf<typeof CheckpointdDefinition.methods.capture>,
    options?: CallOptions,
  ): AsyncGenerator<CaptureEvent> {
    const withId = { ...request, requestId: request.requestId ?? randomUUID() };
    let backoff = this.#settings.retry.initialBackoffMs;
    for (let attempt = 1; ; attempt++) {
      let failure: SandboxCheckpointError;
      try {
        const marked =
          attempt === 1
            ? options
            : { ...options, metadata: { ...options?.metadata, [ATTEMPT_METADATA]: String(attempt) } };
        let done = false;
        try {
          for await (const event of this.#rpcs.capture(withId, marked)) {
            done ||= event.event?.$case === "done";
            yield event;
          }
        } catch (error) {
          // The checkpoint is committed once done arrived; a broken trailer
          // after it changes nothing.
          if (!done) throw error;
        }
        if (done) return;
        failure = checkpointdError("the capture stream ended without its done event", {
          code: "SANDBOX_SNAPSHOT_UNAVAILABLE",
        });
      } catch (error) {
        failure = toCheckpointdError(error);
      }
      const lost = failure.grpcCode === grpc.status.UNAVAILABLE;
      // Once an attempt was lost, its lease may outlive it for a moment.
      const ownConflict = attempt > 1 && failure instanceof SandboxCheckpointWriterConflictError;
      if (!(lost || ownConflict) || attempt >= this.#settings.retry.maxAttempts || options?.signal?.aborted) {
        throw failure;
      }
      await sleep(Math.min(failure.retryAfterMs ?? backoff, this.#settings.retry.maxBackoffMs));
      backoff = Math.min(backoff * 2, this.#settings.retry.maxBackoffMs);
      if (lost) await this.waitServing(undefined, { waitForReady: true }).catch(() => undefined);
    }
  }

  /** Uploads an artifact's bytes (one buffer or an async iterable of chunks). */
  async uploadArtifactBytes(
    name: string,
    mimeType: string,
    data: Uint8Array | string | AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
    options?: CallOptions,
  ): Promise<Artifact> {
    const CHUNK = 256 * 1024;
    async function* parts() {
      yield { part: { $case: "metadata" as const, value: { name, mimeType } } };
      if (typeof data === "string" || data instanceof Uint8Array) {
        const bytes = typeof data === "string" ? Buffer.from(data) : data;
        for (let start = 0; start < bytes.length; start += CHUNK) {
          yield { part: { $case: "chunk" as const, value: bytes.subarray(start, start + CHUNK) } };
        }
      } else {
        for await (const chunk of data) yield { part: { $case: "chunk" as const, value: chunk } };
      }
    }
    const reply = await this.#rpcs.uploadArtifact(parts(), options);
    if (reply.artifact === undefined) {
      throw checkpointdError("UploadArtifact returned no artifact", { code: "SANDBOX_SNAPSHOT_INTERNAL" });
    }
    return reply.artifact;
  }

  // ---------------------------------------------------------------- plumbing

  #bind<D extends ServiceDefinition>(definition: D): ServiceClient<D> {
    const out: Record<string, unknown> = {};
    for (const [key, method] of Object.entries(definition.methods)) {
      const rpc: BoundMethod = {
        path: `/${definition.fullName}/${method.name}`,
        kind: CALL_KINDS[method.name] ?? "unary",
        serialize: (value: unknown) =>
          Buffer.from(method.requestType.encode(method.requestType.fromPartial(value ?? {})).finish()),
        deserialize: (bytes: Buffer) => method.responseType.decode(bytes),
      };
      if (!method.requestStream && !method.responseStream) {
        out[key] = (request?: unknown, options?: CallOptions) => this.#unary(rpc, request ?? {}, options);
      } else if (!method.requestStream) {
        out[key] = (request?: unknown, options?: CallOptions) =>
          this.#serverStream(rpc, request ?? {}, options);
      } else if (!method.responseStream) {
        out[key] = (requests: Iterable<unknown> | AsyncIterable<unknown>, options?: CallOptions) =>
          this.#clientStream(rpc, requests, options);
      } else {
        out[key] = () => {
          throw new SandboxCheckpointError(`${method.name}: bidirectional streams are not supported`, {
            code: "SANDBOX_SNAPSHOT_UNIMPLEMENTED",
          });
        };
      }
    }
    return out as ServiceClient<D>;
  }

  #call(kind: CallKind, options: CallOptions | undefined): [grpc.Metadata, grpc.CallOptions] {
    const metadata = this.#metadata.clone();
    if (options?.waitForReady) metadata.setOptions({ waitForReady: true });
    for (const [key, value] of Object.entries(options?.metadata ?? {})) metadata.set(key, value);
    const callOptions: grpc.CallOptions = {};
    const timeoutMs = options?.timeoutMs ?? this.#settings.deadlines[kind];
    if (Number.isFinite(timeoutMs)) callOptions.deadline = Date.now() + timeoutMs;
    return [metadata, callOptions];
  }

  #unary(rpc: BoundMethod, request: unknown, options: CallOptions | undefined): Promise<unknown> {
    const [metadata, callOptions] = this.#call(rpc.kind, options);
    return new Promise((resolve, reject) => {
      const call = this.#channel.makeUnaryRequest(
        rpc.path,
        rpc.serialize,
        rpc.deserialize,
        request,
        metadata,
        callOptions,
        (error, reply) => (error ? reject(toCheckpointdError(error)) : resolve(reply)),
      );
      cancelOnAbort(call, options?.signal);
    });
  }

  async *#serverStream(
    rpc: BoundMethod,
    request: unknown,
    options: CallOptions | undefined,
  ): AsyncGenerator<unknown> {
    const [metadata, callOptions] = this.#call(rpc.kind, options);
    const call = this.#channel.makeServerStreamRequest(
      rpc.path,
      rpc.serialize,
      rpc.deserialize,
      request,
      metadata,
      callOptions,
    );
    const release = cancelOnAbort(call, options?.signal);
    const messages = call[Symbol.asyncIterator]();
    let ended = false;
    let last: unknown;
    try {
      for (;;) {
        const next = await messages.next();
        if (next.done) break;
        last = next.value;
        yield next.value;
      }
      ended = true;
    } catch (error) {
      ended = true;
      throw toCheckpointdError(error);
    } finally {
      release();
      if (!ended) {
        // The caller stopped reading. After the stream's last message (a
        // capture's or restore's done, a sweep's summary) only the status is
        // left: read it, so the daemon sees a call that succeeded. Anywhere
        // else, cancel: that stops the daemon's work.
        if (isFinalMessage(last)) await drain(messages);
        else call.cancel();
      }
    }
  }

  #clientStream(
    rpc: BoundMethod,
    requests: Iterable<unknown> | AsyncIterable<unknown>,
    options: CallOptions | undefined,
  ): Promise<unknown> {
    const [metadata, callOptions] = this.#call(rpc.kind, options);
    return new Promise((resolve, reject) => {
      const call = this.#channel.makeClientStreamRequest(
        rpc.path,
        rpc.serialize,
        rpc.deserialize,
        metadata,
        callOptions,
        (error, reply) => (error ? reject(toCheckpointdError(error)) : resolve(reply)),
      );
      cancelOnAbort(call, options?.signal);
      (async () => {
        for await (const message of requests) {
          if (!call.write(message)) await new Promise((drained) => call.once("drain", drained));
        }
        call.end();
      })().catch((error: unknown) => {
        call.cancel();
        reject(toCheckpointdError(error));
      });
    });
  }
}

interface BoundMethod {
  path: string;
  kind: CallKind;
  serialize: (value: unknown) => Buffer;
  deserialize: (bytes: Buffer) => unknown;
}

/**
 * The error for a daemon that cannot be reached, with grpc-js's cause (`connect
 * ENOENT /path.sock`, `connect ECONNREFUSED 127.0.0.1:7`, a TLS failure) and a
 * hint at what to check.
 */
function unreachable(address: string, error: SandboxCheckpointError): SandboxCheckpointError {
  const match = /Last error: (?:Error: )?(.*?)\.?(?: Resolution note:.*)?$/s.exec(error.message);
  const cause = (match?.[1] ?? error.message).trim();
  let hint = "";
  if (/ENOENT/.test(cause)) hint = " (no socket there: is the daemon running, and is this its address?)";
  else if (/ECONNREFUSED/.test(cause)) hint = " (nothing listens there: is the daemon running?)";
  else if (/wrong version number|packet length too long/i.test(cause)) {
    hint = " (TLS: the daemon does not answer TLS there; drop `tls`, or start it with --tls-cert and --tls-key)";
  } else if (/TLS|SSL|certificate|self.signed|altname|ERR_TLS/i.test(cause)) {
    hint = " (TLS: is the daemon's CA given, tls.rootCerts or CHECKPOINTD_TLS_CA, and does its certificate name this host?)";
  }
  return checkpointdError(`cannot reach the daemon at ${address}: ${cause}${hint}`, {
    code: "SANDBOX_SNAPSHOT_UNAVAILABLE",
    metadata: { address },
    cause: error,
  });
}

// Every RPC of the contract as a typed method (bound in the constructor).
export interface CheckpointdClient extends Omit<CheckpointdRpcs, "capture"> {}

/** The last message of its stream: `done` (capture, restore) or `summary` (sweep, check). */
function isFinalMessage(message: unknown): boolean {
  const kind = (message as { event?: { $case?: string } } | undefined)?.event?.$case;
  return kind === "done" || kind === "summary";
}

async function drain(messages: AsyncIterator<unknown>): Promise<void> {
  try {
    while (!(await messages.next()).done) {
      // nothing follows a final message but the status
    }
  } catch {
    // the caller already has its result
  }
}

function cancelOnAbort(call: { cancel(): void }, signal: AbortSignal | undefined): () => void {
  if (signal === undefined) return () => undefined;
  if (signal.aborted) {
    call.cancel();
    return () => undefined;
  }
  const onAbort = () => call.cancel();
  signal.addEventListener("abort", onAbort, { once: true });
  return () => signal.removeEventListener("abort", onAbort);
}

export type { CaptureRequest };
