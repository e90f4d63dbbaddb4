/**
 * Envoy's official ext_proc protos, loaded from the copies `@grpc/grpc-js-xds` ships.
 *
 * Why not a hand-written subset: several public subsets carry wrong field numbers. Why loaded at
 * run time: ~50 ms once per process, and the wire stays byte-identical to Envoy's.
 */
import { createRequire } from "node:module";
import path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const require = createRequire(import.meta.url);

/** Where grpc-js-xds keeps Envoy's API and its imports. */
export function envoyProtoIncludeDirs(): string[] {
  const pkgDir = path.dirname(require.resolve("@grpc/grpc-js-xds/package.json"));
  return ["envoy-api", "xds", "googleapis", "protoc-gen-validate"].map((d) => path.join(pkgDir, "deps", d));
}

export const EXT_PROC_SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor";
export const EXT_PROC_METHOD_PATH = `/${EXT_PROC_SERVICE_NAME}/Process`;

/**
 * Loader options. `keepCase` keeps Envoy's snake_case field names on our side. Note the one
 * exception protobufjs forces on us: `google.protobuf.Struct`/`Value` use protobufjs' built-in
 * wrappers, whose fields are camelCase (`fields`, `stringValue`, `structValue`, `listValue`).
 * See `struct.ts` for the helpers that build them correctly.
 */
const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: false,
  oneofs: true,
};

let cached: { service: grpc.ServiceDefinition; client: grpc.ServiceClientConstructor } | undefined;

/** Where a reply built once keeps its wire bytes (see `preEncoded`). */
const WIRE_BYTES = Symbol("jetroute.extproc.wireBytes");

/**
 * A reply that never changes (CONTINUE without a mutation, or with one fixed by configuration),
 * serialised once: the service's serialiser sends these bytes instead of encoding the object
 * again on every write. The object is frozen, since a later change would not reach the wire.
 */
export function preEncoded<T extends object>(reply: T): Readonly<T> {
  const bytes = (loadExtProc().service.Process as grpc.MethodDefinition<unknown, T>).responseSerialize(reply);
  Object.defineProperty(reply, WIRE_BYTES, { value: bytes, enumerable: false });
  return Object.freeze(reply);
}

export interface ExtProcDefinitions {
  /** Service definition to pass to `server.addService`. */
  service: grpc.ServiceDefinition;
  /** Client constructor, for the dev front, tests and the load generator (Envoy's side). */
  client: grpc.ServiceClientConstructor;
}

export function loadExtProc(): ExtProcDefinitions {
  if (cached) return cached;
  const def = protoLoader.loadSync("envoy/service/ext_proc/v3/external_processor.proto", {
    ...LOADER_OPTIONS,
    includeDirs: envoyProtoIncludeDirs(),
  });
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    envoy: { service: { ext_proc: { v3: { ExternalProcessor: grpc.ServiceClientConstructor } } } };
  };
  const client = pkg.envoy.service.ext_proc.v3.ExternalProcessor;
  const process = client.service.Process as grpc.MethodDefinition<unknown, object>;
  const encode = process.responseSerialize;
  // A reply made by `preEncoded` goes out as the bytes it was serialised to once.
  const service: grpc.ServiceDefinition = { ...client.service, Process: { ...process, responseSerialize: (v: object) => (v as { [WIRE_BYTES]?: Buffer })[WIRE_BYTES] ?? encode(v) } };
  cached = { service, client };
  return cached;
}

/**
 * gRPC server options for every ext_proc server we run (the gateway and the no-op baseline alike,
 * so benchmark ratios compare like with like). Envoy sends a buffered body (up to its 4 MiB buffer
 * limit) as one message, above grpc-js' 4 MiB default; channelz bookkeeping costs ~4% of a busy
 * server's CPU and nothing here reads it.
 */
export const EXT_PROC_SERVER_OPTIONS: grpc.ServerOptions = {
  "grpc.max_receive_message_length": 16 * 1024 * 1024,
  "grpc.enable_channelz": 0,
};
