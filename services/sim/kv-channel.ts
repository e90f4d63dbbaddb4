/**
 * The wire under the simulated KV transfers: a TCP server speaking one JSON line per request and
 * one JSON line back. vLLM prefill pods serve their "NIXL side channel" on it (a decode reads a
 * held request's KV), SGLang prefill pods their bootstrap server (a decode waits for a room's KV).
 * Fault modes make the server refuse connections, never answer, or answer late.
 */
import { createConnection, createServer, type Server, type Socket } from "node:net";
import type { Logger } from "../shared/log.js";

/** Longest request or answer line; anything longer is a protocol error. */
const MAX_LINE_BYTES = 16 * 1024;

export type ChannelFault = { kind: "ok" } | { kind: "refuse" } | { kind: "drop" } | { kind: "delay"; ms: number };

export interface KvChannelServerOptions {
  host: string;
  /** 0 picks a free port (kept across stop/start). */
  port: number;
  /** The answer to one request line; `signal` fires when the client hangs up first. */
  handle(request: Record<string, unknown>, signal: AbortSignal): Promise<Record<string, unknown>>;
  fault(): ChannelFault;
  logger?: Logger;
}

export class KvChannelServer {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  private boundPort: number;

  constructor(private readonly o: KvChannelServerOptions) {
    this.boundPort = o.port;
  }

  get port(): number {
    return this.boundPort;
  }

  get listening(): boolean {
    return this.server !== undefined;
  }

  async start(): Promise<void> {
    if (this.server) return;
    const server = createServer((socket) => this.accept(socket));
    server.maxConnections = 1024;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.boundPort, this.o.host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    const addr = server.address();
    if (addr && typeof addr === "object") this.boundPort = addr.port;
    this.server = server;
  }

  /** Closes the listener and every connection: clients get connection refused until `start()`. */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  private accept(socket: Socket): void {
    const fault = this.o.fault();
    if (fault.kind === "refuse") {
      socket.resetAndDestroy();
      return;
    }
    this.sockets.add(socket);
    const gone = new AbortController();
    socket.on("close", () => {
      this.sockets.delete(socket);
      gone.abort();
    });
    socket.on("error", () => socket.destroy());
    let buffer = "";
    let answered = false;
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      if (answered) return;
      buffer += chunk;
      const nl = buffer.indexOf("\n");
      if (nl < 0) {
        if (buffer.length > MAX_LINE_BYTES) socket.destroy();
        return;
      }
      answered = true;
      let request: Record<string, unknown>;
      try {
        const parsed: unknown = JSON.parse(buffer.slice(0, nl));
        if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("not an object");
        request = parsed as Record<string, unknown>;
      } catch {
        socket.end(`${JSON.stringify({ ok: false, error: "bad_request" })}\n`);
        return;
      }
      if (fault.kind === "drop") return;
      const run = (): void => {
        if (gone.signal.aborted) return;
        this.o.handle(request, gone.signal).then(
          (answer) => {
            if (!socket.destroyed) socket.end(`${JSON.stringify(answer)}\n`);
          },
          (err: unknown) => {
            this.o.logger?.debug({ err }, "kv channel request ended without an answer");
            socket.destroy();
          },
        );
      };
      if (fault.kind === "delay") {
        const timer = setTimeout(run, fault.ms);
        gone.signal.addEventListener("abort", () => clearTimeout(timer), { once: true });
      } else run();
    });
  }
}

export type ChannelFailure = "refused" | "timeout" | "bad_response";

export class KvChannelError extends Error {
  constructor(
    readonly reason: ChannelFailure,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Sends one request line to host:port and resolves with the answer line. Rejects with a
 * KvChannelError: "refused" (connect failed or the peer hung up without answering), "timeout"
 * (`signal` fired first) or "bad_response".
 */
export function kvChannelRequest(host: string, port: number, request: Record<string, unknown>, signal: AbortSignal): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    let settled = false;
    let buffer = "";
    const socket = createConnection({ host, port });
    const settle = (fn: () => void): void => {
      if (settled) return;
      settled = true;
      signal.removeEventListener("abort", onAbort);
      socket.destroy();
      fn();
    };
    const onAbort = (): void => settle(() => reject(new KvChannelError("timeout", `no answer from ${host}:${port} in time`)));
    if (signal.aborted) return onAbort();
    signal.addEventListener("abort", onAbort, { once: true });
    socket.setEncoding("utf8");
    socket.on("connect", () => socket.write(`${JSON.stringify(request)}\n`));
    socket.on("data", (chunk: string) => {
      buffer += chunk;
      const nl = buffer.indexOf("\n");
      if (nl < 0) {
        if (buffer.length > MAX_LINE_BYTES) settle(() => reject(new KvChannelError("bad_response", "answer line too long")));
        return;
      }
      settle(() => {
        try {
          const parsed: unknown = JSON.parse(buffer.slice(0, nl));
          if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("not an object");
          resolve(parsed as Record<string, unknown>);
        } catch {
          reject(new KvChannelError("bad_response", "answer is not a JSON object"));
        }
      });
    });
    socket.on("error", (err) => settle(() => reject(new KvChannelError("refused", `${host}:${port}: ${err.message}`))));
    socket.on("close", () => settle(() => reject(new KvChannelError("refused", `${host}:${port} closed the connection without answering`))));
  });
}
