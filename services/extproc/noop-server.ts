/**
 * A no-op ext_proc server: the baseline of the `extproc` benchmark ("gateway overhead vs a no-op
 * ext_proc server"). It does the least a correct server for jetroute's processing mode must do:
 * answer every phase with CONTINUE and name an endpoint the way the Inference Extension protocol
 * asks (header + `envoy.lb` metadata + route cache clear). It uses the same gRPC and protobuf
 * plumbing as the gateway, so the difference between the two is the gateway's own work.
 */
import * as grpc from "@grpc/grpc-js";
import { EXT_PROC_SERVER_OPTIONS, loadExtProc } from "./protos.js";
import { guardResetBudget } from "./reset-budget.js";
import type { ProcessingRequest, ProcessingResponse } from "./types.js";
import { Headers, LB_METADATA_NAMESPACE, setHeader, toProtoStruct } from "./wire.js";

export interface NoopExtProcOptions {
  /** 0 (default) picks a free port. */
  port?: number;
  host?: string;
  /** The endpoint named on every request. */
  endpoint?: string;
}

export interface NoopExtProcServer {
  port: number;
  close(): Promise<void>;
}

/** Replies are constant, built once: the baseline should not pay for building them per request. */
function buildReplies(endpoint: string) {
  const routed = {
    header_mutation: { set_headers: [setHeader(Headers.destinationEndpoint, endpoint)] },
    clear_route_cache: true,
  };
  const metadata = toProtoStruct({ [LB_METADATA_NAMESPACE]: { [Headers.destinationEndpoint]: endpoint } });
  return {
    requestHeaders: { request_headers: { response: { status: "CONTINUE" } } },
    // Without a body Envoy sends no request_body message, so the endpoint must be named here.
    requestHeadersNoBody: { request_headers: { response: { status: "CONTINUE", ...routed } }, dynamic_metadata: metadata },
    requestBody: { request_body: { response: { status: "CONTINUE", ...routed } }, dynamic_metadata: metadata },
    responseHeaders: { response_headers: { response: { status: "CONTINUE" } } },
    responseBody: { response_body: { response: { status: "CONTINUE" } } },
  } satisfies Record<string, ProcessingResponse>;
}

export async function startNoopExtProc(opts: NoopExtProcOptions = {}): Promise<NoopExtProcServer> {
  const replies = buildReplies(opts.endpoint ?? "127.0.0.1:8000");
  const server = new grpc.Server(EXT_PROC_SERVER_OPTIONS);
  server.addService(loadExtProc().service, {
    Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => {
      call.on("data", (req: ProcessingRequest) => {
        switch (req.request) {
          case "request_headers":
            call.write(req.request_headers?.end_of_stream ? replies.requestHeadersNoBody : replies.requestHeaders);
            break;
          case "request_body":
            call.write(replies.requestBody);
            break;
          case "response_headers":
            call.write(replies.responseHeaders);
            break;
          case "response_body":
            call.write(replies.responseBody);
            break;
          default:
            // Trailers are SKIPped in this processing mode; anything else is a protocol error.
            call.emit("error", { code: grpc.status.INVALID_ARGUMENT, details: `unexpected ${req.request ?? "empty"} message` });
        }
      });
      call.on("end", () => call.end());
    },
  });
  const host = opts.host ?? "127.0.0.1";
  const port = await new Promise<number>((resolve, reject) => {
    server.bindAsync(`${host}:${opts.port ?? 0}`, grpc.ServerCredentials.createInsecure(), (err, p) =>
      err ? reject(err) : resolve(p),
    );
  });
  // Same connection handling as the gateway, so benchmarks with Envoy-style resets compare alike.
  guardResetBudget(server);
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.tryShutdown(() => resolve());
        // Streams a client never ends would keep tryShutdown waiting forever; and with channelz
        // off, grpc-js never calls tryShutdown's callback once forceShutdown ran: resolve here too.
        setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, 250).unref();
      }),
  };
}
