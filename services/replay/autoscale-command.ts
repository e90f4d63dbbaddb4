/**
 * The shell of `jetroute replay --autoscale <policy>`: finds the policy (a JSON file, else a
 * policy name in the config bucket), checks it as `config set-autoscale` does, reads the window's
 * requests through the replay engine, and runs the pure what-if (autoscale-whatif.ts) with a
 * progress bar on stderr.
 */
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { AUTOSCALE_KEY_PREFIX, autoscalePolicyError, type ResolvedPolicy, resolvePolicy } from "../../schemas/autoscale.js";
import { encodeToken } from "../../streams/tokens.js";
import { openConfigBucket } from "../admin/config-bucket.js";
import type { NatsHandles } from "../shared/nats.js";
import { DEFAULT_POD_SOURCE_TIMEOUT_MS } from "../views/pod-set.js";
import { type AutoscaleWhatIfReport, runAutoscaleWhatIf } from "./autoscale-whatif.js";
import { calibratedClasses } from "./calibration.js";
import { ReplayEngine } from "./engine.js";
import type { MessageSource } from "./sources.js";

const POLICY_NAME = /^[A-Za-z0-9._-]{1,128}$/;

/** A policy the what-if cannot take: the CLI prints the message and exits 2. */
export class PolicyInputError extends Error {}

/**
 * `arg` as an operator means it: a file that exists is a policy file (JSON, as `config
 * set-autoscale --file` takes); anything else is a policy name in the config bucket. Either way it
 * is checked as `config set-autoscale` checks it, and a refusal names the field.
 */
export async function loadPolicy(arg: string, bucket: () => Promise<{ get(key: string): Promise<unknown> } | undefined>): Promise<{ name: string; policy: ResolvedPolicy; from: string }> {
  let name: string;
  let value: unknown;
  let from: string;
  if (existsSync(arg)) {
    from = `file ${arg}`;
    name = path.basename(arg).replace(/\.json$/i, "").replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 128) || "policy";
    try {
      value = JSON.parse(readFileSync(arg, "utf8"));
    } catch (err) {
      throw new PolicyInputError(`policy file ${arg} is not valid JSON: ${(err as Error).message}`);
    }
  } else {
    if (!POLICY_NAME.test(arg)) throw new PolicyInputError(`--autoscale ${JSON.stringify(arg.slice(0, 64))}: no such file, and not a policy name (1-128 characters of A-Z a-z 0-9 . _ -)`);
    name = arg;
    from = `the config bucket (autoscale.${arg})`;
    const kv = await bucket();
    if (!kv) throw new PolicyInputError(`no config bucket to read policy ${arg} from: run \`jetroute streams apply\` first, or give a policy file`);
    const e = (await kv.get(`${AUTOSCALE_KEY_PREFIX}${encodeToken(arg)}`)) as { operation?: string; json(): unknown } | null | undefined;
    if (e?.operation !== "PUT") throw new PolicyInputError(`no autoscaling policy ${arg} in the config bucket (and no file of that name)`);
    try {
      value = e.json();
    } catch {
      throw new PolicyInputError(`autoscaling policy ${arg} in the config bucket is not JSON`);
    }
  }
  const err = autoscalePolicyError(value);
  if (err) throw new PolicyInputError(`invalid autoscaling policy ${name}: ${err}`);
  return { name, policy: resolvePolicy(value as Parameters<typeof resolvePolicy>[0]), from };
}

/** The config bucket of a connection, for loadPolicy. */
export function bucketOf(nats: NatsHandles | undefined, configPrefix: string): () => Promise<{ get(key: string): Promise<unknown> } | undefined> {
  return async () => (nats ? openConfigBucket(nats, configPrefix) : undefined);
}

export interface AutoscaleReplayOptions {
  source: MessageSource;
  fromMs: number;
  toMs: number;
  name: string;
  policy: ResolvedPolicy;
  /** Routing strategy of the simulated fleets; default the window's most recorded one. */
  strategy?: string;
  /** The static side's pods; default the recorded fleet's largest size. */
  staticPods?: number;
  initialPods?: number;
  startupMs: number;
  drain: boolean;
  ttftTargetMs: number;
  reorderMs?: number;
  podSourceTimeoutMs?: number;
  maxRequests?: number;
  progress?: (label: string, total: number | undefined) => { tick(n?: number): void; stop(): void };
}

/** Reads the window through the replay engine, then runs the policy on it beside the static fleet. */
export async function runAutoscaleReplay(o: AutoscaleReplayOptions): Promise<AutoscaleWhatIfReport> {
  const engine = new ReplayEngine({
    fromMs: o.fromMs,
    toMs: o.toMs,
    strategies: [],
    ...(o.reorderMs !== undefined ? { reorderMs: o.reorderMs } : {}),
    state: { podSourceTimeoutMs: o.podSourceTimeoutMs ?? DEFAULT_POD_SOURCE_TIMEOUT_MS },
    source: o.source.describe,
    traceLimit: o.maxRequests ?? 200_000,
  });
  const bar = o.progress?.("replay", o.source.total);
  for await (const batch of o.source.batches) {
    for (const m of batch) engine.offer(m);
    bar?.tick(batch.length);
  }
  bar?.stop();
  const report = engine.finish(new Date().toISOString());
  const model = o.policy.model;
  const staticPods = o.staticPods ?? engine.fleet[model];
  if (staticPods === undefined) throw new PolicyInputError(`no routed request of model ${JSON.stringify(model)} (the policy's /model) in the window`);
  // Every simulated pod: the recorded pods' KV cache, and the calibrated engine of the model's most common pod class when releases carried latency samples.
  const kv = engine.kvCapacityTokens[model];
  const fits = engine.calibration.coefficients(o.toMs);
  const calibrated = fits.some((f) => f.model === model && f.samples > 0) ? calibratedClasses(fits, { [model]: engine.fleetClasses[model] ?? {} }).classes[model] : undefined;
  const template = calibrated ? [...calibrated].sort((a, b) => b.pods - a.pods)[0] : undefined;
  const strategy = o.strategy ?? ([...engine.recordedStrategies].sort((a, b) => b[1] - a[1])[0]?.[0] ?? "least-request");
  let sim: ReturnType<NonNullable<AutoscaleReplayOptions["progress"]>> | undefined;
  let side = "";
  let prev = 0;
  const out = runAutoscaleWhatIf(engine.trace, {
    name: o.name,
    policy: o.policy,
    strategy,
    staticPods,
    ...(o.initialPods !== undefined ? { initialPods: o.initialPods } : {}),
    startupMs: o.startupMs,
    drain: o.drain,
    ttftTargetMs: o.ttftTargetMs,
    fromMs: o.fromMs,
    toMs: o.toMs,
    engine: { ...(kv ? { kvCapacityTokens: kv } : {}), ...(template?.engine ?? {}) },
    ttftOffsetMs: template?.ttftOffsetMs ?? 0,
    onProgress: (s, done, total) => {
      if (!o.progress) return;
      if (s !== side) {
        sim?.stop();
        side = s;
        prev = 0;
        sim = o.progress(`what-if ${s}`, total);
      }
      sim?.tick(done - prev);
      prev = done;
    },
  });
  sim?.stop();
  out.warnings.unshift(...report.warnings.filter((w) => !/strateg/i.test(w)));
  out.warnings.push(`simulated with ${strategy} routing; engines ${template ? `calibrated on the window's outcomes (class ${template.podClass || "default"})` : "at the simulator's defaults (no latency samples in the window)"}`);
  return out;
}
