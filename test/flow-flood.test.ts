/**
 * Flow control under a flood (docs/flow-control.md "Memory"): one user sends large bodies as fast
 * as it is answered to a saturated model, through two gateway processes (real nats-server, real
 * gRPC ext_proc streams, simulated engines scraped by the metrics scraper). What an operator needs
 * to hold: the excess is answered 429 `queue_full` (the user's share of the band is capped), never
 * 503 `no_ready_pod` while the pods are up (the replicas keep folding the streams), another tenant
 * is served within a second, and what the replicas hold stays under their bound. A prompt longer
 * than the model's context (the engines' `max_model_len`) is refused with a 400 before it is held.
 */
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MODEL_CONFIG_KEY_PREFIX } from "../schemas/config.js";
import { configBucketName } from "../streams/definitions.js";
import { encodeToken } from "../streams/tokens.js";
import { ExtProcClient, type ExtProcExchange, type PhaseResult } from "../services/extproc/envoy-client.js";
import { startScraper, type ScraperHandle } from "../services/metrics-scraper/scraper.js";
import { type ServiceProcess, spawnJetroute } from "../services/shared/processes.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const FLOOD = "flood/model";
const SMALL = "flood/short-context";
const MiB = 1024 * 1024;
/** The replicas' bound on held bytes (--flow-max-held-bytes) and a user's share of a band. */
const MAX_HELD_BYTES = 24 * MiB;
/** A 1 MiB ASCII body counts 2 MiB + 2 KiB (held-bytes.ts): two of the flooder's fit per replica. */
const MAX_BYTES_PER_USER = 6 * MiB;

const headers = (user: string) => ({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", user });
const chat = (model: string, content: string) => Buffer.from(JSON.stringify({ model, messages: [{ role: "user", content }], max_tokens: 4 }));

async function open(client: ExtProcClient, user: string, body: Buffer): Promise<{ ex: ExtProcExchange; result: PhaseResult }> {
  const ex = client.open();
  await ex.requestHeaders(headers(user));
  return { ex, result: await ex.requestBody(body) };
}

/** Ends a routed request as Envoy does after the engine answered (releases its charge). */
async function complete(ex: ExtProcExchange): Promise<void> {
  await ex.responseHeaders(200, { "content-type": "application/json" });
  await ex.responseBodyChunk(Buffer.from(JSON.stringify({ choices: [{ message: { content: "ok" } }], usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 } })), true);
  await ex.end();
}

function errorOf(r: PhaseResult): { status: number; code: string } | undefined {
  if (r.kind !== "immediate") return undefined;
  return { status: r.status, code: (JSON.parse(r.body.toString()) as { error: { code: string } }).error.code };
}

/** One gauge (no labels) from a Prometheus text page. */
function gauge(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
  return line === undefined ? Number.NaN : Number(line.slice(line.lastIndexOf(" ") + 1));
}

describe("flow control under a flood of large bodies from one user", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let small: SimFleet;
  let scraper: ScraperHandle;
  const procs: ServiceProcess[] = [];
  const clients: ExtProcClient[] = [];
  const aliceClients: ExtProcClient[] = [];
  const admin: string[] = [];

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 2, model: FLOOD, kvCapacityTokens: 1_048_576, maxModelLen: 1_048_576, timeScale: 100, logger: quietLog, namePrefix: "flood-" });
    small = await startSimFleet({ pods: 1, model: SMALL, maxModelLen: 4_096, timeScale: 100, logger: quietLog, namePrefix: "short-" });
    for (const p of fleet.pods) await env.publishPod({ model: FLOOD, pod: p.name, address: p.address });
    for (const p of small.pods) await env.publishPod({ model: SMALL, pod: p.name, address: p.address });
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    const flowControl = { saturation: { maxInFlightPerPod: 1 }, ttlMs: 30_000, maxBytesPerUser: MAX_BYTES_PER_USER };
    for (const m of [FLOOD, SMALL]) await kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(m)}`, JSON.stringify({ flowControl }));
    scraper = await startScraper({ nats: env.server.url, intervalMs: 100, log: quietLog });
    for (let i = 0; i < 2; i++) {
      const proc = spawnJetroute(`flood-gw-${i}`, [
        "gateway", "--nats", env.server.url, "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--id", `flood-gw-${i}`, "--heartbeat-ms", "200",
        "--flow-max-held-bytes", String(MAX_HELD_BYTES),
      ]);
      procs.push(proc);
      const started = await proc.waitForLine<{ port: number; adminPort: number }>((l) => typeof (l as { port?: unknown }).port === "number", 30_000);
      clients.push(new ExtProcClient(`127.0.0.1:${started.port}`, { messageTimeoutMs: 60_000 }));
      aliceClients.push(new ExtProcClient(`127.0.0.1:${started.port}`, { messageTimeoutMs: 60_000 }));
      admin.push(`http://127.0.0.1:${started.adminPort}`);
    }
    // Both replicas route the flood model (its pods folded, the config applied: a probe is routed).
    for (const c of clients) {
      await waitFor(
        async () => {
          const { ex, result } = await open(c, "probe", chat(FLOOD, "hi"));
          if (result.kind === "continue") await complete(ex);
          else await ex.end().catch(() => undefined);
          return result.kind === "continue";
        },
        30_000,
        "a replica routing the flood model",
        100,
      );
    }
  }, 90_000);

  afterAll(async () => {
    for (const c of [...clients, ...aliceClients]) c.close();
    await Promise.all(procs.map((p) => p.stop(2_000)));
    await scraper?.close();
    await fleet?.close();
    await small?.close();
    await env?.stop();
  });

  it("a prompt longer than every pod's max_model_len is refused 400 context_length_exceeded before it is held or routed", async () => {
    // ~100k characters: at least 12,500 tokens against a 4,096-token context. Until the replica has
    // the engine's context from the scraper the request is routed (and completed here).
    const long = chat(SMALL, "word ".repeat(20_000));
    let refusal: { status: number; code: string } | undefined;
    await waitFor(
      async () => {
        const { ex, result } = await open(clients[0]!, "carol", long);
        if (result.kind === "continue") await complete(ex);
        else await ex.end().catch(() => undefined);
        refusal = errorOf(result);
        return refusal !== undefined;
      },
      15_000,
      "the long prompt refused",
      200,
    );
    expect(refusal).toEqual({ status: 400, code: "context_length_exceeded" });
    // A prompt that fits goes through.
    const { ex, result } = await open(clients[0]!, "carol", chat(SMALL, "short question"));
    expect(result.kind).toBe("continue");
    await complete(ex);
  });

  it("the excess is 429 queue_full, never no_ready_pod; another tenant is served within a second; held bytes stay under the bound", async () => {
    const codes = new Map<string, number>();
    let routedFlood = 0;
    let stop = false;
    const completions: Promise<void>[] = [];
    // The "engine": every routed request finishes 100 ms later, so the pods stay saturated and free up in turn.
    const finishLater = (ex: ExtProcExchange) => void completions.push(new Promise((r) => setTimeout(r, 100)).then(() => complete(ex)));
    const body = chat(FLOOD, "x".repeat(MiB));
    // The flooder: 4 streams per replica, each sending again 100 ms after its answer.
    const flooder = async (c: ExtProcClient) => {
      while (!stop) {
        const { ex, result } = await open(c, "mallory", body);
        if (result.kind === "continue") {
          routedFlood++;
          finishLater(ex);
        } else {
          const e = errorOf(result);
          const k = e ? `${e.status} ${e.code}` : result.kind;
          codes.set(k, (codes.get(k) ?? 0) + 1);
          await ex.end().catch(() => undefined);
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    // The replicas' own figures, every 100 ms: held bytes and heap.
    const peaks = admin.map(() => ({ held: 0, heap: 0 }));
    const heapAtStart = await Promise.all(admin.map(async (a) => gauge(await (await fetch(`${a}/metrics`)).text(), "jetroute_gateway_nodejs_heap_size_used_bytes")));
    const sampler = (async () => {
      while (!stop) {
        await Promise.all(
          admin.map(async (a, i) => {
            const text = await (await fetch(`${a}/metrics`)).text();
            const p = peaks[i]!;
            p.held = Math.max(p.held, gauge(text, "jetroute_gateway_flow_held_bytes"));
            p.heap = Math.max(p.heap, gauge(text, "jetroute_gateway_nodejs_heap_size_used_bytes"));
          }),
        );
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    const flood = clients.flatMap((c) => Array.from({ length: 4 }, () => flooder(c)));
    const waits: number[] = [];
    const alice: PhaseResult["kind"][] = [];
    try {
      // Once the flood is on (the replicas refusing its excess), another tenant's small request, on each replica.
      await waitFor(() => (codes.get("429 queue_full") ?? 0) >= 4, 30_000, "the flood refused in part", 50);
      // Alice comes through Envoy's other connection to the replica (the flood's fills its own).
      for (const c of aliceClients) {
        const t0 = performance.now();
        const { ex, result } = await open(c, "alice", chat(FLOOD, "2 tokens"));
        waits.push(performance.now() - t0);
        alice.push(result.kind);
        if (result.kind === "continue") finishLater(ex);
      }
      await new Promise((r) => setTimeout(r, 1_000));
    } finally {
      stop = true;
      await Promise.all([...flood, sampler]);
      await Promise.all(completions);
    }
    expect(alice).toEqual(["continue", "continue"]);

    expect(routedFlood).toBeGreaterThan(0);
    expect(codes.get("429 queue_full") ?? 0).toBeGreaterThan(0);
    // Nothing else: no no_ready_pod (the pods stayed ready in the replicas' views), no other error.
    expect([...codes.keys()]).toEqual(["429 queue_full"]);
    console.log(JSON.stringify({ codes: Object.fromEntries(codes), routedFlood, waits: waits.map(Math.round), peaks, heapAtStart }));
    for (const w of waits) expect(w).toBeLessThan(1_000);
    for (const [i, p] of peaks.entries()) {
      // One user's share of the band, and the replica's bound, as counted.
      expect(p.held).toBeGreaterThan(0);
      expect(p.held).toBeLessThanOrEqual(MAX_BYTES_PER_USER);
      // The heap grew by what is held plus the bodies being parsed, far from the 3-6x of old.
      expect(p.heap - heapAtStart[i]!).toBeLessThan(MAX_HELD_BYTES + 64 * MiB);
    }
  }, 90_000);
});
