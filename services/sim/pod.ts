/**
 * One simulated engine pod: an engine model behind its own HTTP server speaking vLLM's API, and
 * (vLLM pods, when enabled) a KV-events publisher fed by the engine's prefix cache. Prefill-capable
 * pods also serve a KV channel (vLLM side channel or SGLang bootstrap server, see pd-legs.ts).
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Logger } from "../shared/log.js";
import type { Static } from "@sinclair/typebox";
import type { KvEventsEndpoint, PodRole } from "../../schemas/events.js";
import { detokenize } from "../tokenizer/sim-tokenizer.js";
import { type SimClock, scaledClock } from "./clock.js";
import { type EngineConfig, type EngineSnapshot, SimEngine } from "./engine.js";
import { ApiError, badRequest } from "./errors.js";
import { FaultState, type PodFaults, parseFaults } from "./faults.js";
import { type GenerationSession, serveGeneration } from "./generate.js";
import { HeldKvRegistry } from "./held-kv.js";
import { KvChannelServer } from "./kv-channel.js";
import { type CacheListing, engineHashSeed } from "./kv-cache.js";
import { KvEventPublisher, type KvEventPublisherOptions, type KvEventWire, type ReplayLayout } from "./kv-events.js";
import { SimLora } from "./lora.js";
import { createPodMetrics, type EngineKind, type PodMetrics } from "./metrics.js";
import { FLEET_DEFAULTS } from "./options.js";
import { answerKvChannel, channelFault, type PdPod, type PdTimings, pdHooks } from "./pd-legs.js";
import { type PdSnapshot, PdStats, renderPdMetrics } from "./pd-stats.js";
import { realPromptTokens, realTokenize, type SimRealTokenizer } from "./real-tokenizer.js";
import {
  asObject,
  checkModel,
  parseChatRequest,
  parseCompletionRequest,
  parseDetokenizeRequest,
  parseTokenizeRequest,
  type ServedModel,
} from "./requests.js";

export interface SimPodOptions {
  name: string;
  host: string;
  /** 0 picks a free port. */
  port: number;
  model: string;
  engine: EngineKind;
  timeScale: number;
  maxModelLen: number;
  engineConfig: EngineConfig;
  /** A real model's tokenizer (sim --tokenizer hf:<dir>) instead of the built-in one. */
  tokenizer?: SimRealTokenizer;
  /** KV events publisher settings; absent = no publisher. */
  kvEvents?: SimPodKvEventsOptions;
  /** Prefill/decode role (default combined). */
  role?: PodRole;
  /** The P/D group the pod belongs to; only reported. */
  roleset?: string;
  /** P/D timeouts and transfer cost; defaults in DEFAULT_PD_TIMINGS. */
  pd?: Partial<PdTimings>;
  /** SGLang prefill pods: the bootstrap server's port (0 = free port). */
  bootstrapPort?: number;
  /** LoRA: adapters loaded at start and `--max-loras` (services/sim/lora.ts). */
  lora?: { initial?: readonly string[]; maxLoras?: number };
  logger?: Logger;
}

export const DEFAULT_PD_TIMINGS: PdTimings = {
  kvAbortTimeoutMs: FLEET_DEFAULTS.kvAbortTimeoutMs,
  disaggTimeoutMs: FLEET_DEFAULTS.disaggTimeoutMs,
  kvReadTimeoutMs: FLEET_DEFAULTS.kvReadTimeoutMs,
  kvTransferMsPerBlock: FLEET_DEFAULTS.kvTransferMsPerBlock,
};

/** The KV-events publisher's options; the pod supplies the host and the logger. */
export type SimPodKvEventsOptions = Omit<KvEventPublisherOptions, "host" | "logger">;

/** The pod event schema's `kvEvents` field, so a pod list can carry it unchanged. */
export type KvEventsInfo = Static<typeof KvEventsEndpoint>;

export interface SimPodCacheListing extends CacheListing {
  pod: string;
  /** Sequence number of the next KV event batch; null without a publisher. */
  nextSeq: number | null;
}

export interface SimPodState extends EngineSnapshot {
  pod: string;
  engine: EngineKind;
  role: PodRole;
  roleset?: string;
  bootstrapPort?: number;
  /** vLLM prefill-capable pods: the KV side channel's address. */
  sideChannel?: { host: string; port: number };
  pd: PdSnapshot;
  faults: PodFaults;
  /** Completion requests held by a `hang` fault right now. */
  hungRequests: number;
  model: string;
  config: EngineConfig & { maxModelLen: number; timeScale: number };
  kvEvents: (KvEventsInfo & { encoding: KvEventWire; replayLayout: ReplayLayout; nextSeq: number }) | null;
}

export interface SimPod {
  readonly name: string;
  readonly engine: EngineKind;
  readonly port: number;
  readonly address: string;
  readonly kvEvents: KvEventsInfo | undefined;
  readonly role: PodRole;
  readonly roleset: string | undefined;
  /** SGLang prefill pods only. */
  readonly bootstrapPort: number | undefined;
  state(): SimPodState;
  /** Replaces the pod's injected faults; `{}` clears them. */
  setFaults(faults: PodFaults): void;
  /** Closes the pod's listeners (HTTP, side channel, bootstrap) and drops its connections: clients get connection refused. */
  stop(): Promise<void>;
  /** Listens again on the same ports after `stop()`. */
  start(): Promise<void>;
  cacheListing(): SimPodCacheListing;
  /** vLLM's reset_prefix_cache (AllBlocksCleared); false while requests hold blocks. */
  resetPrefixCache(): boolean;
  /**
   * A simulated engine restart: in-flight requests are dropped, the prefix cache, counters and
   * histograms start empty and KV event batches are numbered from 0 again. Nothing is announced:
   * subscribers must notice the sequence going backwards.
   */
  restart(): void;
  close(): Promise<void>;
}

const MAX_BODY_BYTES = 32 * 1024 * 1024;

type Handler = (req: IncomingMessage, res: ServerResponse) => Promise<void> | void;

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  return (await readJsonText(req)).body;
}

/** The body parsed, and its text (SGLang's bootstrap_room needs digits a JSON number loses). */
async function readJsonText(req: IncomingMessage): Promise<{ body: unknown; raw: string }> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new ApiError(413, "BadRequestError", `Request body exceeds ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk as Buffer);
  }
  const raw = Buffer.concat(chunks).toString("utf8");
  try {
    return { body: JSON.parse(raw), raw };
  } catch (err) {
    throw badRequest(`Invalid JSON body: ${(err as Error).message}`);
  }
}

export async function startSimPod(opts: SimPodOptions): Promise<SimPod> {
  const real = opts.tokenizer;
  const served: ServedModel = { name: opts.model, maxModelLen: opts.maxModelLen, ...(real ? { vocabSize: real.tokenizer.vocabSize } : {}) };
  const lora = new SimLora({ base: opts.model, ...opts.lora });
  const log = opts.logger?.child({ pod: opts.name });
  const publisher = opts.kvEvents
    ? await KvEventPublisher.start({ host: opts.host, ...opts.kvEvents, logger: log })
    : undefined;
  const kvEvents: KvEventsInfo | undefined = publisher && {
    endpoint: publisher.endpoint,
    replayEndpoint: publisher.replayEndpoint,
    topic: publisher.topicName,
  };
  const hashSeed = engineHashSeed(opts.name);

  const role: PodRole = opts.role ?? "combined";
  const timings: PdTimings = { ...DEFAULT_PD_TIMINGS, ...opts.pd };
  const faults = new FaultState();
  // Advertised addresses use loopback for a wildcard bind, as the HTTP address does.
  const advertisedHost = opts.host === "0.0.0.0" || opts.host === "::" ? "127.0.0.1" : opts.host;

  // A restart swaps these for fresh ones; handlers always read the current set.
  let metrics: PodMetrics;
  let engine: SimEngine;
  let clock: SimClock;
  let held: HeldKvRegistry;
  let pdStats: PdStats;
  let engineId: string;
  const boot = (): void => {
    clock = scaledClock(opts.timeScale);
    held = new HeldKvRegistry(clock);
    pdStats = new PdStats();
    engineId = `${opts.name}-${randomUUID()}`;
    metrics = createPodMetrics(opts.engine, {
      model: opts.model,
      maxModelLen: opts.maxModelLen,
      blockSize: opts.engineConfig.blockSize,
      numGpuBlocks: Math.floor(opts.engineConfig.kvCapacityTokens / opts.engineConfig.blockSize),
      prefixCaching: true,
    });
    engine = new SimEngine(opts.engineConfig, clock, metrics.observer, {
      hashSeed,
      onEvents: publisher ? (events) => publisher.publish(events) : undefined,
    });
  };
  boot();

  // vLLM prefill-capable pods serve a KV side channel, SGLang prefill pods a bootstrap server.
  const pd: PdPod = {
    engine: opts.engine,
    role,
    engineId: () => engineId,
    clock: () => clock,
    held: () => held,
    stats: () => pdStats,
    faults,
    timings,
    sideChannel: undefined,
  };
  const wantsChannel = opts.engine === "vllm" ? role !== "decode" : role === "prefill";
  const channel = wantsChannel
    ? new KvChannelServer({
        host: opts.host,
        port: opts.engine === "sglang" ? (opts.bootstrapPort ?? 0) : 0,
        handle: (request, signal) => answerKvChannel(pd, request, signal),
        fault: () => channelFault(pd),
        logger: log,
      })
    : undefined;
  try {
    await channel?.start();
  } catch (err) {
    await publisher?.close();
    throw err;
  }
  if (channel && opts.engine === "vllm") pd.sideChannel = { host: advertisedHost, port: channel.port };
  const bootstrapPort = channel && opts.engine === "sglang" ? channel.port : undefined;

  /** Live generation sessions by request id and SGLang rid, for /abort_request. */
  const sessions = new Map<string, Set<GenerationSession>>();
  const track = (keys: string[], session: GenerationSession): void => {
    for (const k of new Set(keys)) {
      const set = sessions.get(k) ?? new Set();
      set.add(session);
      sessions.set(k, set);
    }
    void session.done.then(() => {
      for (const k of keys) {
        const set = sessions.get(k);
        set?.delete(session);
        if (set?.size === 0) sessions.delete(k);
      }
    });
  };

  const state = (): SimPodState => ({
    pod: opts.name,
    engine: opts.engine,
    role,
    ...(opts.roleset !== undefined ? { roleset: opts.roleset } : {}),
    ...(bootstrapPort !== undefined ? { bootstrapPort } : {}),
    ...(pd.sideChannel ? { sideChannel: pd.sideChannel } : {}),
    pd: pdStats.snapshot(engine.snapshot().heldRequests),
    faults: faults.current,
    hungRequests: faults.hungRequests,
    model: opts.model,
    ...engine.snapshot(),
    config: { ...opts.engineConfig, maxModelLen: opts.maxModelLen, timeScale: opts.timeScale },
    kvEvents:
      publisher && kvEvents
        ? { ...kvEvents, encoding: publisher.encoding, replayLayout: publisher.replayLayout, nextSeq: publisher.sequence }
        : null,
  });
  const cacheListing = (): SimPodCacheListing => ({
    pod: opts.name,
    nextSeq: publisher ? publisher.sequence : null,
    ...engine.cacheListing(),
  });
  const restart = (): void => {
    const old = engine;
    const oldHeld = held;
    boot();
    // Requests outside the engine (a decode waiting for its KV, a prefill waiting for its decode)
    // lose their connection too; then the old engine drops what it still runs or holds.
    for (const set of [...sessions.values()]) for (const s of [...set]) s.drop();
    oldHeld.clear();
    old.abortAll();
    publisher?.reset();
    log?.info("simulated engine restarted");
  };

  const generation =
    (kind: "chat" | "completion"): Handler =>
    async (req, res) => {
      const { body, raw } = await readJsonText(req);
      const fault = faults.next();
      if (fault.kind === "status") {
        const type = fault.status === 400 ? "BadRequestError" : fault.status === 404 ? "NotFoundError" : "InternalServerError";
        throw new ApiError(fault.status, type, `Injected fault: HTTP ${fault.status}`);
      }
      if (fault.kind === "hang") {
        const left = new AbortController();
        res.on("close", () => left.abort());
        try {
          await faults.waitUnhung(left.signal);
        } catch {
          return;
        }
      }
      // A request naming a loaded adapter runs on the base model with the adapter's blocks.
      const adapter = lora.adapterOf(body);
      const forBase = adapter ? { ...(body as object), model: opts.model } : body;
      // With a real tokenizer: the model is checked first (404 before any tokenizing), as vLLM does.
      let ids: number[] | undefined;
      if (real) {
        checkModel(asObject(forBase), served);
        ids = await realPromptTokens(kind, forBase, real.tokenizer);
      }
      const gen = kind === "chat" ? parseChatRequest(forBase, served, ids) : parseCompletionRequest(forBase, served, ids);
      if (adapter) {
        lora.track(adapter, res);
        gen.model = adapter;
        gen.loraName = adapter;
      }
      const obj = asObject(body);
      const rid = typeof obj.rid === "string" && obj.rid !== "" ? obj.rid : undefined;
      const header = req.headers["x-request-id"];
      const requestId = typeof header === "string" && header !== "" ? header : (rid ?? randomUUID().replaceAll("-", ""));
      const hooks = pdHooks(pd, obj, raw, gen, requestId);
      const session = serveGeneration(res, engine, gen, kind, requestId, hooks, real?.vocab);
      track(rid ? [requestId, rid] : [requestId], session);
    };

  const routes: Record<string, Record<string, Handler>> = {
    "/health": { GET: (_req, res) => void res.writeHead(200).end() },
    "/v1/models": {
      GET: (_req, res) =>
        sendJson(res, 200, {
          object: "list",
          data: [
            {
              id: opts.model,
              object: "model",
              created: Math.floor(Date.now() / 1000),
              owned_by: opts.engine,
              root: opts.model,
              parent: null,
              max_model_len: opts.maxModelLen,
              permission: [],
            },
            ...lora.modelEntries(opts.engine, opts.maxModelLen),
          ],
        }),
    },
    ...lora.routes(readJson),
    "/v1/chat/completions": { POST: generation("chat") },
    "/v1/completions": { POST: generation("completion") },
    "/tokenize": {
      POST: async (req, res) => {
        const body = await readJson(req);
        let tokens: number[] | undefined;
        if (real) {
          checkModel(asObject(body), served);
          tokens = await realTokenize(body, real.tokenizer);
        }
        tokens ??= parseTokenizeRequest(body, served);
        sendJson(res, 200, { count: tokens.length, max_model_len: opts.maxModelLen, tokens, token_strs: null });
      },
    },
    "/detokenize": {
      POST: async (req, res) => {
        const ids = parseDetokenizeRequest(await readJson(req), served);
        sendJson(res, 200, { prompt: real ? await real.tokenizer.decode(ids) : detokenize(ids) });
      },
    },
    "/metrics": {
      GET: (_req, res) =>
        void res
          .writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" })
          .end(metrics.render(engine.snapshot()) + renderPdMetrics(opts.engine, opts.model, pdStats.snapshot(engine.snapshot().heldRequests)) + lora.metricsText()),
    },
    // vLLM serves this in dev mode; 200 even when refused, as vLLM does.
    "/reset_prefix_cache": {
      POST: (_req, res) => {
        engine.resetPrefixCache();
        res.writeHead(200).end();
      },
    },
    // SGLang's abort endpoint; 200 whether or not the rid matched anything, as SGLang answers.
    "/abort_request": {
      POST: async (req, res) => {
        const body = asObject(await readJson(req));
        if (body.rid !== undefined && body.rid !== null && typeof body.rid !== "string") throw badRequest("rid must be a string", "rid");
        const targets = body.abort_all === true ? [...sessions.values()] : [sessions.get(String(body.rid ?? "")) ?? new Set()];
        for (const set of targets) for (const s of [...set]) s.cancel();
        res.writeHead(200).end();
      },
    },
    "/debug/state": { GET: (_req, res) => sendJson(res, 200, state()) },
    "/debug/faults": {
      GET: (_req, res) => sendJson(res, 200, faults.current),
      POST: async (req, res) => {
        faults.set(parseFaults(await readJson(req)));
        sendJson(res, 200, faults.current);
      },
    },
    "/debug/cache": { GET: (_req, res) => sendJson(res, 200, cacheListing()) },
    "/debug/restart": {
      POST: (_req, res) => {
        restart();
        sendJson(res, 200, { restarted: true, pod: opts.name });
      },
    },
  };

  const server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    const route = routes[path];
    // FastAPI's bodies for unknown routes and methods, which is what a vLLM client would see.
    if (!route) return sendJson(res, 404, { detail: "Not Found" });
    const handler = route[req.method ?? "GET"];
    if (!handler) return sendJson(res, 405, { detail: "Method Not Allowed" });
    Promise.resolve()
      .then(() => handler(req, res))
      .catch((err: unknown) => {
        if (res.destroyed) return;
        if (res.headersSent) {
          res.destroy();
          return;
        }
        if (err instanceof ApiError) return sendJson(res, err.status, err.body());
        log?.error({ err, path }, "simulated pod handler failed");
        sendJson(res, 500, new ApiError(500, "InternalServerError", String((err as Error)?.message ?? err)).body());
      });
  });

  const listen = (port: number): Promise<void> =>
    new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, opts.host, () => {
        server.off("error", reject);
        resolve();
      });
    });
  const closeServer = (): Promise<void> =>
    new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  try {
    await listen(opts.port);
  } catch (err) {
    await Promise.all([publisher?.close(), channel?.stop()]);
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  // A wildcard bind is reachable on loopback; advertising the wildcard itself would be useless to clients.
  const address = `${advertisedHost}:${port}`;
  let stopped = false;
  log?.info({ address, engine: opts.engine, model: opts.model, role, kvEvents, bootstrapPort, sideChannel: pd.sideChannel }, "simulated pod listening");

  return {
    name: opts.name,
    engine: opts.engine,
    port,
    address,
    kvEvents,
    role,
    roleset: opts.roleset,
    bootstrapPort,
    state,
    setFaults: (f) => faults.set(parseFaults(f)),
    async stop() {
      if (stopped) return;
      stopped = true;
      await Promise.all([closeServer(), channel?.stop()]);
    },
    async start() {
      if (!stopped) return;
      await Promise.all([listen(port), channel?.start()]);
      stopped = false;
    },
    cacheListing,
    resetPrefixCache: () => engine.resetPrefixCache(),
    restart,
    async close() {
      engine.close();
      held.clear();
      faults.set({});
      await Promise.all([stopped ? undefined : closeServer(), channel?.stop(), publisher?.close()]);
    },
  };
}
