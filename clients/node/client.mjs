// A small client of the checkpointd daemon for Node.js (@grpc/grpc-js + @grpc/proto-loader).
//
// The service definition is loaded at run time from proto/checkpointd/v1/ (no code
// generation). Errors are rejected with the gRPC error, plus `reason` and
// `metadata` taken from the google.rpc.ErrorInfo in grpc-status-details-bin.
import { fileURLToPath } from "node:url";
import path from "node:path";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const here = path.dirname(fileURLToPath(import.meta.url));
export const PROTO_ROOT = path.resolve(here, "..", "..", "proto");

const definition = protoLoader.loadSync("checkpointd/v1/checkpointd.proto", {
  includeDirs: [PROTO_ROOT],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const checkpointd = grpc.loadPackageDefinition(definition).checkpointd.v1;

// google.rpc.Status / ErrorInfo, decoded by hand: two tiny messages are not worth
// another dependency. Field numbers from google/rpc/status.proto and error_details.proto.
function readVarint(buf, pos) {
  let value = 0, shift = 0, byte;
  do {
    byte = buf[pos++];
    value += (byte & 0x7f) * 2 ** shift;
    shift += 7;
  } while (byte & 0x80);
  return [value, pos];
}

function fields(buf) {
  const out = [];
  let pos = 0;
  while (pos < buf.length) {
    let key;
    [key, pos] = readVarint(buf, pos);
    const field = Math.floor(key / 8), wire = key & 7;
    if (wire === 0) {
      let v;
      [v, pos] = readVarint(buf, pos);
      out.push([field, v]);
    } else if (wire === 2) {
      let len;
      [len, pos] = readVarint(buf, pos);
      out.push([field, buf.subarray(pos, pos + len)]);
      pos += len;
    } else {
      throw new Error(`unexpected wire type ${wire}`);
    }
  }
  return out;
}

export function errorInfo(error) {
  const raw = error?.metadata?.get?.("grpc-status-details-bin")?.[0];
  if (!raw) return null;
  for (const [field, any] of fields(Buffer.from(raw))) {
    if (field !== 3) continue; // Status.details
    const parts = Object.fromEntries(fields(any).map(([f, v]) => [f, v]));
    if (String(parts[1]) !== "type.googleapis.com/google.rpc.ErrorInfo") continue;
    const info = { reason: "", domain: "", metadata: {} };
    for (const [f, v] of fields(parts[2] ?? Buffer.alloc(0))) {
      if (f === 1) info.reason = v.toString();
      else if (f === 2) info.domain = v.toString();
      else if (f === 3) {
        const entry = Object.fromEntries(fields(v).map(([k, x]) => [k, x.toString()]));
        info.metadata[entry[1]] = entry[2] ?? "";
      }
    }
    return info;
  }
  return null;
}

function withErrorInfo(error) {
  const info = errorInfo(error);
  if (info) {
    error.reason = info.reason;
    error.errorMetadata = info.metadata;
  }
  return error;
}

export class CheckpointdClient {
  // address: "unix:/abs/path.sock" or "host:port"; token: bearer token for TCP.
  constructor(address, { token } = {}) {
    this.stub = new checkpointd.Checkpointd(address, grpc.credentials.createInsecure());
    this.metadata = new grpc.Metadata();
    if (token) this.metadata.set("authorization", `Bearer ${token}`);
  }

  close() {
    this.stub.close();
  }

  unary(method, request) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, this.metadata, (error, reply) =>
        error ? reject(withErrorInfo(error)) : resolve(reply),
      );
    });
  }

  // Resolves with { events, done } once the stream ends.
  stream(method, request, onEvent) {
    return new Promise((resolve, reject) => {
      const events = [];
      let done = null;
      const call = this.stub[method](request, this.metadata);
      call.on("data", (event) => {
        events.push(event);
        if (onEvent) onEvent(event);
        if (event.event === "done") done = event.done;
      });
      call.on("error", (error) => reject(withErrorInfo(error)));
      call.on("end", () => resolve({ events, done }));
    });
  }

  serverInfo() {
    return this.unary("GetServerInfo", {});
  }

  capture(request, onEvent) {
    return this.stream("Capture", request, onEvent);
  }

  restore(request, onEvent) {
    return this.stream("Restore", request, onEvent);
  }

  getHead(thread_id) {
    return this.unary("GetHead", { thread_id });
  }
}
