/**
 * One simulated engine pod: an engine model behind its own HTTP server speaking vLLM's API, and
 * (vLLM pods, when enabled) a KV-events publisher fed by the engine's prefix cache.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Logger } from "../shared/log.js";
import type { Static } from "@sinclair/typebox";
import type { KvEventsEndpoint } from "../../schemas/events.js";
import { detokenize } from "../tokenizer/sim-tokenizer.js";
import { scaledClock } from "./clock.js";
import { type EngineConfig, type EngineSnapshot, SimEngine } from "./engine.js";
import { ApiError, badRequest } from "./errors.js";
import { serveGeneration } from "./generate.js";
import { type CacheListing, engineHashSeed } from "./kv-cache.js";
import { KvEventPublisher, type KvEventPublisherOptions, type KvEventWire, type ReplayLayout } from "./kv-events.js";
import { createPodMetrics, type EngineKind, type PodMetrics } from "./metrics.js";
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
  logger?: Logger;
}

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
  state(): SimPodState;
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
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new ApiError(413, "BadRequestError", `Request body exceeds ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk as Buffer);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch (err) {
    throw badRequest(`Invalid JSON body: ${(err as Error).message}`);
  }
}

export async function startSimPod(opts: SimPodOptions): Promise<SimPod> {
  const real = opts.tokenizer;
  const served: ServedModel = { name: opts.model, maxModelLen: opts.maxModelLen, ...(real ? { vocabSize: real.tokenizer.vocabSize } : {}) };
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

  // A restart swaps both for fresh ones; handlers always read the current pair.
  let metrics: PodMetrics;
  let engine: SimEngine;
  const boot = (): void => {
    metrics = createPodMetrics(opts.engine, {
      model: opts.model,
      maxModelLen: opts.maxModelLen,
      blockSize: opts.engineConfig.blockSize,
      numGpuBlocks: Math.floor(opts.engineConfig.kvCapacityTokens / opts.engineConfig.blockSize),
      prefixCaching: true,
    });
    engine = new SimEngine(opts.engineConfig, scaledClock(opts.timeScale), metrics.observer, {
      hashSeed,
      onEvents: publisher ? (events) => publisher.publish(events) : undefined,
    });
  };
  boot();

  const state = (): SimPodState => ({
    pod: opts.name,
    engine: opts.engine,
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
    boot();
    old.abortAll();
    publisher?.reset();
    log?.info("simulated engine restarted");
  };

  const generation =
    (kind: "chat" | "completion"): Handler =>
    async (req, res) => {
      const body = await readJson(req);
      // With a real tokenizer: the model is checked first (404 before any tokenizing), as vLLM does.
      let ids: number[] | undefined;
      if (real) {
        checkModel(asObject(body), served);
        ids = await realPromptTokens(kind, body, real.tokenizer);
      }
      const gen = kind === "chat" ? parseChatRequest(body, served, ids) : parseCompletionRequest(body, served, ids);
      const header = req.headers["x-request-id"];
      const requestId = typeof header === "string" && header !== "" ? header : randomUUID().replaceAll("-", "");
      serveGeneration(res, engine, gen, kind, requestId, real?.vocab);
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
          ],
        }),
    },
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
        void res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" }).end(metrics.render(engine.snapshot())),
    },
    // vLLM serves this in dev mode; 200 even when refused, as vLLM does.
    "/reset_prefix_cache": {
      POST: (_req, res) => {
        engine.resetPrefixCache();
        res.writeHead(200).end();
      },
    },
    "/debug/state": { GET: (_req, res) => sendJson(res, 200, state()) },
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
        if (res.headersSent) {
          res.destroy();
          return;
        }
        if (err instanceof ApiError) return sendJson(res, err.status, err.body());
        log?.error({ err, path }, "simulated pod handler failed");
        sendJson(res, 500, new ApiError(500, "InternalServerError", String((err as Error)?.message ?? err)).body());
      });
  });

  try {
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(opts.port, opts.host, () => {
        server.off("error", reject);
        resolve();
      });
    });
  } catch (err) {
    await publisher?.close();
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  // A wildcard bind is reachable on loopback; advertising the wildcard itself would be useless to clients.
  const advertised = opts.host === "0.0.0.0" || opts.host === "::" ? "127.0.0.1" : opts.host;
  const address = `${advertised}:${port}`;
  log?.info({ address, engine: opts.engine, model: opts.model, kvEvents }, "simulated pod listening");

  return {
    name: opts.name,
    engine: opts.engine,
    port,
    address,
    kvEvents,
    state,
    cacheListing,
    resetPrefixCache: () => engine.resetPrefixCache(),
    restart,
    async close() {
      engine.close();
      await Promise.all([
        new Promise<void>((resolve) => {
          server.close(() => resolve());
          server.closeAllConnections();
        }),
        publisher?.close(),
      ]);
    },
  };
}
