/**
 * `npm run bench -- responses`: agent sessions on the Responses API, each turn continuing the
 * previous by `previous_response_id`, through the dev front and 3 gateway replicas (child
 * processes, their CPU measured from /proc) over 8 simulated pods (in this process, so one can be
 * stopped); one pod killed half-way (stopped and removed from PODS). Then the same sessions sent
 * as chat with the full history each turn (what a client without the Responses API state sends),
 * for the TTFT comparison.
 *
 * Figures (one JSON line): `affinity_hit_rate` = continuations whose holding pod was live that were
 * pinned to it (decision records' `responseAffinity`); `store_expansions` = continuations
 * expanded from the store (decisions) plus recoveries of a pinned turn its pod did not know;
 * `errors` = turns the client did not get a completed answer for; TTFT = client-side, send ->
 * first `response.output_text.delta` (chat: first content chunk); `store_bytes_per_response` =
 * RESPONSE_STORE bytes / stored responses; `gateway_cpu_us_per_request` = the 3 gateways' CPU
 * during the Responses run / its requests.
 */
import { Agent } from "undici";
import type { DecisionRecord } from "../../schemas/events.js";
import { startFront } from "../../services/front/front.js";
import { createLogger } from "../../services/shared/log.js";
import { connectNats } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../../services/shared/processes.js";
import { acked } from "../../services/shared/publish.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";
import { quantile, randomWords } from "../assembly.js";
import { startSimFleet } from "../../services/sim/fleet.js";
import { applyStreams } from "../../streams/apply.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { processCpuUs } from "../proc-cpu.js";

export interface ResponsesBenchOptions {
  sessions?: number;
  turns?: number;
  /** Sessions run at once. */
  concurrency?: number;
  maxTokens?: number;
  /** Words of each turn's user input. */
  userWords?: number;
  seed?: number;
}

export interface ResponsesBenchResult {
  bench: "responses";
  affinity_hit_rate: number;
  store_expansions: number;
  errors: number;
  turns: number;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
  ttft_p99_ms_chat_equivalent: number;
  store_bytes_per_response: number;
  gateway_cpu_us_per_request: number;
  killed_pod: string;
  /** Sessions whose first turn landed on the busiest pod (pinned sessions then share it for every turn). */
  max_sessions_per_pod: number;
  chat_errors: number;
  options: Required<ResponsesBenchOptions>;
}

const MODEL = "bench/responses-model";
const PODS = 8;
const quiet = createLogger("bench-responses", "silent");
const progress = (line: string) => process.stderr.write(`[responses] ${line}\n`);
const round = (x: number, d = 2) => Number(x.toFixed(d));
const pct = quantile;

/** Reads an SSE body: the time of the first token event, the completed response (Responses) or the text (chat). */
async function readStream(body: AsyncIterable<Buffer>, sent: number, isToken: (ev: Record<string, unknown>) => boolean, onEvent: (ev: Record<string, unknown>) => void): Promise<number | undefined> {
  let first: number | undefined;
  let buf = "";
  for await (const chunk of body) {
    buf += chunk.toString("utf8");
    let i = buf.indexOf("\n\n");
    while (i >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      i = buf.indexOf("\n\n");
      const data = block.split("\n").find((l) => l.startsWith("data: "));
      if (!data || data === "data: [DONE]") continue;
      const ev = JSON.parse(data.slice(6)) as Record<string, unknown>;
      if (first === undefined && isToken(ev)) first = performance.now() - sent;
      onEvent(ev);
    }
  }
  return first;
}

export async function runResponsesBench(opts: ResponsesBenchOptions = {}): Promise<ResponsesBenchResult> {
  const o: Required<ResponsesBenchOptions> = {
    sessions: opts.sessions ?? 24,
    turns: opts.turns ?? 12,
    concurrency: opts.concurrency ?? 8,
    maxTokens: opts.maxTokens ?? 16,
    userWords: opts.userWords ?? 120,
    seed: opts.seed ?? 11,
  };
  const random = mulberry32(o.seed);
  const inputs = Array.from({ length: o.sessions }, () => Array.from({ length: o.turns }, () => randomWords(random, o.userWords)));
  const instructions = Array.from({ length: o.sessions }, (_, i) => `You are agent ${i}. ${randomWords(random, 200)}`);
  const server = await startNatsServer();
  const nc = await connectNats(server.url, "jetroute-bench-responses");
  await applyStreams(nc.nc, nc.jsm);
  const subjects = new Subjects();
  const fleet = await startSimFleet({ pods: PODS, model: MODEL, timeScale: 20, maxModelLen: 65_536, kvEvents: false, logger: quiet });
  const gateways: ServiceProcess[] = [];
  const decisions = new Map<string, DecisionRecord>();
  nc.nc.subscribe(subjects.all("decisions"), {
    callback: (_e, m) => {
      const d = m.json<DecisionRecord>();
      decisions.set(d.id, d);
    },
  });
  try {
    for (const p of fleet.pods) await acked(nc.js, subjects.pod(MODEL, p.name), { type: "pod", action: "upsert", model: MODEL, pod: p.name, address: p.address, ready: true, engine: "vllm", ts: Date.now() });
    const ports: number[] = [];
    const adminPorts: number[] = [];
    for (let i = 0; i < 3; i++) {
      const gw = spawnJetroute(`responses-gw-${i}`, ["gateway", "--nats", server.url, "--port", "0", "--admin-port", "0", "--host", "127.0.0.1", "--id", `responses-gw-${i}`, "--strategy", "least-request", "--no-snapshots"], { env: { JETROUTE_LOG_LEVEL: "warn" } });
      gateways.push(gw);
      const line = await gw.waitForLine<{ port: number; adminPort: number }>((v) => typeof v.port === "number" && typeof v.adminPort === "number", 30_000);
      ports.push(line.port);
      adminPorts.push(line.adminPort);
    }
    /** A figure of jetroute_gateway_responses summed over the gateways. */
    const responsesFigure = async (figure: string) => {
      let n = 0;
      for (const p of adminPorts) {
        const text = await (await fetch(`http://127.0.0.1:${p}/metrics`)).text();
        const m = new RegExp(`jetroute_gateway_responses\\{[^}]*figure="${figure}"[^}]*\\} (\\S+)`).exec(text);
        n += m ? Number(m[1]) : 0;
      }
      return n;
    };
    const front = await startFront({ port: 0, host: "127.0.0.1", gateways: ports.map((p) => `127.0.0.1:${p}`), logger: quiet });
    const base = `http://127.0.0.1:${front.port}`;
    const agent = new Agent({ connections: 256 });
    const post = (path: string, body: unknown, id: string) => agent.request({ origin: base, path, method: "POST", headers: { "content-type": "application/json", "x-request-id": id }, body: JSON.stringify(body) });
    // Wait until every gateway routes (its views caught up): a probe per gateway through the front.
    for (let tries = 0; ; tries++) {
      const r = await post("/v1/responses", { model: MODEL, input: "probe", max_output_tokens: 1 }, `probe-${tries}`);
      await r.body.text();
      if (r.statusCode === 200 && tries >= 5) break;
      if (tries > 300) throw new Error(`the gateways never routed a probe (status ${r.statusCode})`);
      await new Promise((res) => setTimeout(res, 100));
    }

    // ---- Responses sessions ----
    const ttfts: number[] = [];
    let errors = 0;
    let turnsDone = 0;
    let killed = "";
    const killAt = Math.floor((o.sessions * o.turns) / 2);
    const cpu0 = gateways.reduce((n, g) => n + processCpuUs(g.proc.pid as number), 0);
    let requests = 0;
    const killPod = async () => {
      // The pod that served the most recent turn: sessions pinned to it lose their holder.
      const latest = [...decisions.values()].filter((d) => d.id.startsWith("s") && d.pick).at(-1);
      killed = latest?.pick ?? (fleet.pods[0]?.name as string);
      const pod = fleet.pods.find((p) => p.name === killed);
      progress(`killing ${killed} after ${turnsDone} turns`);
      await fleet.stop(killed);
      await acked(nc.js, subjects.pod(MODEL, killed), { type: "pod", action: "remove", model: MODEL, pod: killed, address: pod?.address ?? "0.0.0.0:1", ready: false, engine: "vllm", ts: Date.now() });
    };
    let killing: Promise<void> | undefined;
    const session = async (s: number) => {
      let prev: string | undefined;
      for (let t = 0; t < o.turns; t++) {
        if (turnsDone >= killAt && !killing) killing = killPod();
        if (killing) await killing;
        const id = `s${s}-t${t}`;
        const sent = performance.now();
        requests++;
        try {
          const res = await post("/v1/responses", { model: MODEL, input: inputs[s]?.[t], instructions: instructions[s], max_output_tokens: o.maxTokens, stream: true, ...(prev ? { previous_response_id: prev } : {}) }, id);
          if (res.statusCode !== 200) {
            errors++;
            progress(`${id}: ${res.statusCode} ${(await res.body.text()).slice(0, 200)}`);
            return;
          }
          let completed: string | undefined;
          const first = await readStream(res.body as AsyncIterable<Buffer>, sent, (ev) => ev.type === "response.output_text.delta", (ev) => {
            if (ev.type === "response.completed") completed = (ev.response as { id: string }).id;
          });
          if (!completed) {
            errors++;
            return;
          }
          if (first !== undefined) ttfts.push(first);
          prev = completed;
          turnsDone++;
        } catch (err) {
          errors++;
          progress(`${id}: ${(err as Error).message}`);
          return;
        }
      }
    };
    const queue = Array.from({ length: o.sessions }, (_, i) => i);
    await Promise.all(
      Array.from({ length: o.concurrency }, async () => {
        for (let s = queue.shift(); s !== undefined; s = queue.shift()) await session(s);
      }),
    );
    const cpuUs = gateways.reduce((n, g) => n + processCpuUs(g.proc.pid as number), 0) - cpu0;
    progress(`responses: ${turnsDone} turns, ${errors} errors`);
    await new Promise((r) => setTimeout(r, 500));

    // Affinity: continuations whose holder was live when routed.
    let live = 0;
    let pinned = 0;
    let expansions = 0;
    for (const d of decisions.values()) {
      const a = d.responseAffinity;
      if (!d.id.startsWith("s") || !a) continue;
      if (a.action === "expand") expansions++;
      if (a.reason === "owner-gone") continue;
      live++;
      if (a.action === "pin" && d.pick === a.owner) pinned++;
    }
    const firstPods = new Map<string, number>();
    for (const d of decisions.values()) if (/^s\d+-t0$/.test(d.id) && d.pick) firstPods.set(d.pick, (firstPods.get(d.pick) ?? 0) + 1);
    const recoveries = await responsesFigure("recoveries");
    const info = await nc.jsm.streams.info(streamName("jr", "RESPONSE_STORE"));
    const storeBytesPer = info.state.messages > 0 ? info.state.bytes / info.state.messages : Number.NaN;

    // ---- the same sessions as chat with the full history ----
    const chatTtfts: number[] = [];
    let chatErrors = 0;
    const chatSession = async (s: number) => {
      const messages: Array<{ role: string; content: string }> = [{ role: "system", content: instructions[s] as string }];
      for (let t = 0; t < o.turns; t++) {
        messages.push({ role: "user", content: inputs[s]?.[t] as string });
        const sent = performance.now();
        try {
          const res = await post("/v1/chat/completions", { model: MODEL, messages, max_tokens: o.maxTokens, stream: true }, `chat-s${s}-t${t}`);
          if (res.statusCode !== 200) {
            chatErrors++;
            await res.body.text();
            return;
          }
          let text = "";
          const first = await readStream(res.body as AsyncIterable<Buffer>, sent, (ev) => Boolean((ev.choices as Array<{ delta?: { content?: string } }> | undefined)?.[0]?.delta?.content), (ev) => {
            text += (ev.choices as Array<{ delta?: { content?: string } }> | undefined)?.[0]?.delta?.content ?? "";
          });
          if (first !== undefined) chatTtfts.push(first);
          messages.push({ role: "assistant", content: text });
        } catch {
          chatErrors++;
          return;
        }
      }
    };
    const chatQueue = Array.from({ length: o.sessions }, (_, i) => i);
    await Promise.all(
      Array.from({ length: o.concurrency }, async () => {
        for (let s = chatQueue.shift(); s !== undefined; s = chatQueue.shift()) await chatSession(s);
      }),
    );
    await agent.close();
    await front.close();
    return {
      bench: "responses",
      affinity_hit_rate: round(live > 0 ? pinned / live : Number.NaN, 4),
      store_expansions: expansions + recoveries,
      errors,
      turns: turnsDone,
      ttft_p50_ms: round(pct(ttfts, 0.5), 1),
      ttft_p99_ms: round(pct(ttfts, 0.99), 1),
      ttft_p99_ms_chat_equivalent: round(pct(chatTtfts, 0.99), 1),
      store_bytes_per_response: round(storeBytesPer, 0),
      gateway_cpu_us_per_request: round(cpuUs / Math.max(1, requests), 0),
      killed_pod: killed,
      max_sessions_per_pod: Math.max(0, ...firstPods.values()),
      chat_errors: chatErrors,
      options: o,
    };
  } finally {
    await Promise.all(gateways.map((g) => g.stop(1_000)));
    await fleet.close();
    await nc.nc.close();
    await server.stop();
  }
}
