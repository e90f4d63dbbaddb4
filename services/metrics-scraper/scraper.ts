/**
 * metrics-scraper: follows PODS, scrapes every ready pod's Prometheus `/metrics` at a short
 * interval and publishes one load sample per scrape to LOAD. A pod whose scrapes keep failing is
 * published as stale, so gateways stop trusting its last good numbers. At most one scrape per pod
 * is in flight: a slow engine is skipped, never queued up (scraping must never stall an engine).
 * A `/metrics` body is read up to `maxBodyBytes` (streamed: a runaway exposition — label
 * cardinality gone wrong — never sits in memory whole); past it the scrape fails like any other.
 */
import { readBodyCapped } from "../shared/http-body.js";
import type { LoadSample } from "../../schemas/events.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { StreamFollower } from "../shared/follower.js";
import type { Logger } from "../shared/log.js";
import { connectNats } from "../shared/nats.js";
import { fire } from "../shared/publish.js";
import { podAddressFilter } from "../shared/cidr.js";
import { type PodInfo, PodSet } from "../views/pod-set.js";
import { adaptersFromModels, engineAdapters, maxModelLenFromModels } from "./adapters.js";
import { extractEngineLoad } from "./engine-load.js";
import { parsePrometheusText } from "./prom-text.js";

export interface ScraperOptions {
  nats: string | string[];
  prefix?: string;
  intervalMs?: number;
  timeoutMs?: number;
  /** Failing this long (or this many scrapes in a row, whichever first) makes a pod stale. */
  staleAfterMs?: number;
  staleAfterFailures?: number;
  /** Bound on a `/metrics` body; a longer one fails the scrape. Default 16 MiB. */
  maxBodyBytes?: number;
  /** Also read `/v1/models` on every scrape for the engine's loaded LoRA adapters (default true). */
  readModels?: boolean;
  /** Pod networks allowed (`--pod-cidrs`): a pod outside them is never scraped. Default: any. */
  podCidrs?: readonly string[];
  log: Logger;
}

/** Bound on a `/v1/models` body (256 adapters fit many times over). */
const MODELS_BODY_BYTES = 1024 * 1024;

/** The engine's `/v1/models` adapters and context length; undefined when the list cannot be read (not a scrape failure). */
async function readModels(pod: PodInfo, signal: AbortSignal): Promise<{ adapters: string[] | undefined; maxModelLen: number | undefined } | undefined> {
  try {
    const res = await fetch(`http://${pod.address}/v1/models`, { signal, redirect: "error" });
    if (!res.ok) {
      await res.body?.cancel().catch(() => undefined);
      return undefined;
    }
    const body: unknown = JSON.parse(await readBodyCapped(res, MODELS_BODY_BYTES, "/v1/models body"));
    return { adapters: adaptersFromModels(body, pod.model), maxModelLen: maxModelLenFromModels(body, pod.model) };
  } catch {
    return undefined;
  }
}

export const DEFAULT_METRICS_BODY_BYTES = 16 * 1024 * 1024;

export interface ScraperHandle {
  stats: { scrapes: number; failures: number; published: number };
  pods: PodSet;
  close(): Promise<void>;
}

interface PodScrapeState {
  inFlight: boolean;
  failures: number;
  lastOk: number;
}


/** Scrapes one pod once. */
export async function scrapeOnce(pod: PodInfo, timeoutMs: number, maxBodyBytes = DEFAULT_METRICS_BODY_BYTES, stop?: AbortSignal, readModelList = false): Promise<LoadSample> {
  const started = performance.now();
  const timeout = AbortSignal.timeout(timeoutMs);
  const signal = stop ? AbortSignal.any([timeout, stop]) : timeout;
  const models = readModelList ? readModels(pod, signal) : Promise.resolve(undefined);
  const res = await fetch(`http://${pod.metricsAddress ?? pod.address}/metrics`, { signal, redirect: "error" });
  if (!res.ok) {
    await res.body?.cancel().catch(() => undefined);
    throw new Error(`/metrics answered ${res.status}`);
  }
  const text = await readBodyCapped(res, maxBodyBytes, "/metrics body");
  const families = parsePrometheusText(text);
  const load = extractEngineLoad(families, pod.engine, pod.model);
  const listed = await models;
  const adapters = engineAdapters(listed?.adapters, load.runningLoras, load.waitingLoras, pod.model);
  return {
    type: "load",
    model: pod.model,
    pod: pod.pod,
    ts: Date.now(),
    stale: false,
    scrapeMs: Math.round((performance.now() - started) * 100) / 100,
    load,
    ...(adapters !== undefined ? { adapters } : {}),
    ...(listed?.maxModelLen !== undefined ? { maxModelLen: listed.maxModelLen } : {}),
  };
}

export async function startScraper(o: ScraperOptions): Promise<ScraperHandle> {
  const log = o.log;
  const prefix = o.prefix ?? "jr";
  const subjects = new Subjects(prefix);
  const interval = o.intervalMs ?? 100;
  const timeoutMs = o.timeoutMs ?? Math.max(500, interval * 5);
  const staleAfterMs = o.staleAfterMs ?? 1_000;
  const staleAfterFailures = o.staleAfterFailures ?? 3;
  const maxBodyBytes = o.maxBodyBytes ?? DEFAULT_METRICS_BODY_BYTES;
  const nats = await connectNats(o.nats, "jetroute-metrics-scraper");
  const pods = new PodSet(o.podCidrs ? { addressAllowed: podAddressFilter(o.podCidrs) } : {});
  const state = new Map<string, PodScrapeState>();
  const stats = { scrapes: 0, failures: 0, published: 0 };
  // Closing aborts the scrapes in flight (a large body can take a while) and nothing is published
  // after it: the connection is draining, and a publish there throws.
  const stopping = new AbortController();

  const follower = new StreamFollower({
    nats, subjects, log, name: "metrics-scraper", family: "pods", types: ["pod"] as const,
    stream: streamName(prefix, "PODS"), filter: subjects.all("pods"), startAt: { kind: "last-per-subject" },
    onEvent: (ev, m) => {
      pods.apply(ev, m.seq);
      // Removed, or refused for its address (--pod-cidrs): no longer scraped.
      if (!pods.get(ev.model, ev.pod)) state.delete(`${ev.model}\u0000${ev.pod}`);
    },
  });
  await follower.start();

  const scrape = async (pod: PodInfo, st: PodScrapeState) => {
    st.inFlight = true;
    stats.scrapes++;
    try {
      const sample = await scrapeOnce(pod, timeoutMs, maxBodyBytes, stopping.signal, o.readModels ?? true);
      if (stopping.signal.aborted) return;
      st.failures = 0;
      st.lastOk = Date.now();
      fire(nats.nc, subjects.load(pod.model, pod.pod), sample);
      stats.published++;
    } catch (err) {
      if (stopping.signal.aborted) return;
      stats.failures++;
      st.failures++;
      const now = Date.now();
      if (st.failures >= staleAfterFailures || now - st.lastOk > staleAfterMs) {
        const stale: LoadSample = { type: "load", model: pod.model, pod: pod.pod, ts: now, stale: true, error: (err as Error).message, load: null };
        fire(nats.nc, subjects.load(pod.model, pod.pod), stale);
        stats.published++;
        if (st.failures === staleAfterFailures) log.warn({ pod: pod.pod, err: (err as Error).message }, "pod scrapes failing; published stale");
      }
    } finally {
      st.inFlight = false;
    }
  };

  const timer = setInterval(() => {
    for (const pod of pods.all()) {
      if (!pod.ready) continue;
      const k = `${pod.model}\u0000${pod.pod}`;
      let st = state.get(k);
      if (!st) state.set(k, (st = { inFlight: false, failures: 0, lastOk: Date.now() }));
      if (!st.inFlight) void scrape(pod, st);
    }
  }, interval);

  return {
    stats,
    pods,
    async close() {
      clearInterval(timer);
      stopping.abort();
      await follower.stop();
      await nats.nc.drain();
    },
  };
}
