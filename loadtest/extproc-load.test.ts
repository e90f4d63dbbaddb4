import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNoopExtProc, type NoopExtProcServer } from "../services/extproc/noop-server.js";
import { loadExtProc } from "../services/extproc/protos.js";
import type { ProcessingRequest, ProcessingResponse } from "../services/extproc/types.js";
import { type ExtProcLoadResult, chatCompletionsBody, runExtProcLoad } from "./extproc-load.js";

describe("extproc-load - closed-loop ext_proc load", () => {
  let noop: NoopExtProcServer;
  beforeAll(async () => {
    noop = await startNoopExtProc();
  });
  afterAll(async () => {
    await noop.close();
  });

  it("builds a chat-completions body of about the requested size", () => {
    const body = chatCompletionsBody("org/Model-8B", 2048);
    expect(Math.abs(body.length - 2048)).toBeLessThanOrEqual(2);
    expect(JSON.parse(body.toString())).toMatchObject({ model: "org/Model-8B", messages: [{ role: "user" }] });
  });

  it.each(["http2", "grpc-js"] as const)("produces sane numbers against the no-op server and stops by itself (%s)", async (transport) => {
    const t0 = Date.now();
    const r = await runExtProcLoad({
      target: `127.0.0.1:${noop.port}`,
      concurrency: 8,
      durationMs: 1_000,
      warmupMs: 200,
      model: "m",
      responseChunks: 3,
      transport,
    });
    const elapsed = Date.now() - t0;
    expect(elapsed).toBeGreaterThanOrEqual(1_150);
    // It stops by itself: the bound is generous, for a loaded host (how much it does in the window
    // is the bench's figure, `npm run bench -- extproc`, not a property).
    expect(elapsed).toBeLessThan(10_000);
    expect(r.errors).toBe(0);
    expect(r.immediate).toBe(0);
    expect(r.completed).toBeGreaterThan(0);
    expect(r.rps).toBeCloseTo(r.completed, 0);
    expect(r.p50Ms).toBeGreaterThan(0);
    expect(r.p50Ms).toBeLessThanOrEqual(r.p99Ms);
    expect(r.p99Ms).toBeLessThanOrEqual(r.maxMs);
    expect(r.meanMs).toBeGreaterThan(0);
    expect(r.generatorCpuPct).toBeGreaterThan(0);
  });

  it("paced: starts no more streams than the rate allows in the window, and keeps near it", async () => {
    const r = await runExtProcLoad({ target: `127.0.0.1:${noop.port}`, concurrency: 4, durationMs: 1_000, warmupMs: 100, rate: 200, model: "m" });
    expect(r.errors).toBe(0);
    expect(r.rate).toBe(200);
    // Slots are 5 ms apart: 201 fall inside the 1 s window, plus at most one late slot per stream
    // from before it (closed loop does thousands here).
    expect(r.completed).toBeLessThanOrEqual(201 + 4);
    // It ran (how many of the slots a late timer let run in the window depends on the host's load).
    expect(r.completed).toBeGreaterThan(0);
  });

  it("with startAt, waits for that wall-clock time before its window and reports how late it began", async () => {
    const startAt = Date.now() + 400;
    const r = await runExtProcLoad({ target: `127.0.0.1:${noop.port}`, concurrency: 2, durationMs: 300, warmupMs: 0, startAt, rate: 100, model: "m" });
    // Had it ignored startAt, its 300 ms window would have ended ~100 ms before startAt + 300.
    // (290: Node timers may fire a millisecond early against Date.now.)
    expect(Date.now() - startAt).toBeGreaterThanOrEqual(290);
    expect(r.startLateMs).toBeGreaterThanOrEqual(0);
    expect(r.completed).toBeGreaterThan(0);
    // Paced from its start: 100/s over a 300 ms window starts at most 31 streams (+ one late slot per stream).
    expect(r.completed).toBeLessThanOrEqual(31 + 2);
  });

  it.each(["http2", "grpc-js"] as const)("counts errors, not completions, against a target that refuses connections (%s)", async (transport) => {
    const dead = await startNoopExtProc();
    const port = dead.port;
    await dead.close();
    const r = await runExtProcLoad({ target: `127.0.0.1:${port}`, concurrency: 2, durationMs: 300, model: "m", transport });
    expect(r.completed).toBe(0);
    expect(r.errors).toBeGreaterThan(0);
    expect(r.firstError).toMatch(/UNAVAILABLE/);
  });

  it.each(["http2", "grpc-js"] as const)("counts immediate responses as completed streams that ended early (%s)", async (transport) => {
    const server = new grpc.Server();
    const seen: string[] = [];
    server.addService(loadExtProc().service, {
      Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => {
        call.on("data", (req: ProcessingRequest) => {
          seen.push(req.request ?? "");
          call.write({ immediate_response: { status: { code: 429 } } });
        });
        call.on("end", () => call.end());
      },
    });
    const port = await new Promise<number>((res, rej) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))),
    );
    try {
      const r = await runExtProcLoad({ target: `127.0.0.1:${port}`, concurrency: 2, durationMs: 300, model: "m", transport });
      expect(r.errors).toBe(0);
      expect(r.completed).toBeGreaterThan(0);
      expect(r.immediate).toBe(r.completed);
      expect(new Set(seen)).toEqual(new Set(["request_headers"]));
    } finally {
      server.forceShutdown();
    }
  });

  it.each(["http2", "grpc-js"] as const)("reports a server's error status and a reply for the wrong phase (%s)", async (transport) => {
    const server = new grpc.Server();
    server.addService(loadExtProc().service, {
      Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => {
        call.on("data", (req: ProcessingRequest) => {
          if (req.request === "request_headers") call.write({ request_headers: { response: {} } });
          else if (req.request === "request_body") call.write({ response_body: { response: {} } });
        });
        call.on("end", () => call.end());
      },
    });
    const failing = new grpc.Server();
    failing.addService(loadExtProc().service, {
      Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) =>
        call.on("data", () => call.emit("error", { code: grpc.status.RESOURCE_EXHAUSTED, details: "no capacity" })),
    });
    const bind = (s: grpc.Server) =>
      new Promise<number>((res, rej) => s.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))));
    try {
      const wrongPhase = await runExtProcLoad({ target: `127.0.0.1:${await bind(server)}`, concurrency: 1, durationMs: 200, model: "m", transport });
      expect(wrongPhase.completed).toBe(0);
      expect(wrongPhase.firstError).toMatch(/expected a request_body reply, got response_body/);
      const exhausted = await runExtProcLoad({ target: `127.0.0.1:${await bind(failing)}`, concurrency: 1, durationMs: 200, model: "m", transport });
      expect(exhausted.completed).toBe(0);
      expect(exhausted.firstError).toMatch(/RESOURCE_EXHAUSTED/);
    } finally {
      server.forceShutdown();
      failing.forceShutdown();
    }
  });

  it("runs as a child process and prints one JSON line", async () => {
    const script = fileURLToPath(new URL("./extproc-load.ts", import.meta.url));
    const { stdout } = await promisify(execFile)(
      process.execPath,
      ["--import", "tsx", script, "--target", `127.0.0.1:${noop.port}`, "--concurrency", "4", "--duration-ms", "300", "--warmup-ms", "0", "--header", "routing-strategy: prefix-cache"],
      { timeout: 20_000 },
    );
    const lines = stdout.trim().split("\n");
    expect(lines).toHaveLength(1);
    const r = JSON.parse(lines[0] ?? "") as ExtProcLoadResult;
    expect(r.completed).toBeGreaterThan(0);
    expect(r.errors).toBe(0);
    expect(r.concurrency).toBe(4);
  });
});
