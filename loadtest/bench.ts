/**
 * `npm run bench -- <name> [options]`: runs one benchmark and prints its result as the final
 * JSON line (progress and tables go to stderr).
 */
import { loadavg } from "node:os";
import { Command, InvalidArgumentError, Option } from "commander";
import { emitResult, takeBaseline } from "./baseline.js";
import { strategiesOption } from "../services/replay/command.js";
import { intOption } from "../services/shared/cli-options.js";
import { runExtProcBench } from "./benches/extproc.js";
import { runIndexBench } from "./benches/index.js";
import { runBootstrapBench } from "./benches/bootstrap.js";
import { runChargeLagBench } from "./benches/charge-lag.js";
import { type HerdingMode, runHerdingBench } from "./benches/herding.js";
import { runRateLimitBench } from "./benches/rate-limit.js";
import { PREFIX_QUALITY_CASES, type PrefixQualityCaseName, runPrefixQualityBench } from "./benches/prefix-quality.js";
import { DEFAULT_RECORDED_STRATEGIES, DEFAULT_REPLAY_STRATEGIES, runReplayBench } from "./benches/replay.js";
import { FAULT_CASES, type FaultCaseName, runFaultsBench } from "./benches/faults.js";
import { runDiscoveryBench } from "./benches/discovery.js";
import { runPdBench } from "./benches/pd.js";
import { runResponsesBench } from "./benches/responses.js";
import { runFoldBench } from "./benches/fold.js";
import { runFoldLiveBench } from "./benches/fold-live.js";
import { FLOW_RUNS, type FlowRunName, runFlowBench } from "./benches/flow.js";
import { runFlowHeldBench } from "./benches/flow-held.js";
import { runScaleBench } from "./benches/scale.js";
import { registerTokenizerBench } from "./benches/tokenizer.js";
import { runSemanticBench } from "./benches/semantic.js";
import { runPredictedBench } from "./benches/predicted.js";
import { registerTokenizeBench } from "./benches/tokenize.js";
import { runLongContextBench } from "./benches/long-context.js";
import { runAutoscaleBench } from "./benches/autoscale.js";
import { runAdaptersBench } from "./benches/adapters.js";
import { BATCH_BENCH_DEFAULTS, runBatchBench } from "./benches/batch.js";

const ints = (v: string) =>
  v.split(",").map((x) => {
    const n = Number(x);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`expected positive integers, got ${JSON.stringify(v)}`);
    return n;
  });
const int = (v: string) => ints(v)[0] as number;
const nonNegative = intOption(0);
const HERDING_MODES: readonly HerdingMode[] = ["off", "eventual", "strict"];
const herdingModes = (v: string) =>
  v.split(",").map((m) => {
    if (!(HERDING_MODES as readonly string[]).includes(m)) throw new InvalidArgumentError(`modes are off, eventual, strict; got ${JSON.stringify(m)}`);
    return m as HerdingMode;
  });

const program = new Command("bench").description("jetroute benchmarks; each prints one final JSON line").showHelpAfterError();
// The machine baseline is taken before any benchmark starts its load (see loadtest/baseline.ts).
program.hook("preAction", () => void takeBaseline(loadavg()[0] ?? 0));

program
  .command("extproc")
  .description("gateway (least-request, 4 pods, charges on) vs a no-op ext_proc server under the same gRPC load")
  .option("--duration-ms <ms>", "measured window per run", int, 5_000)
  .option("--warmup-ms <ms>", "unmeasured warm-up per run", int, 1_000)
  .option("--concurrency <list>", "concurrent streams, comma separated; the last is the headline", ints, [1, 64])
  .option("--rounds <n>", "runs per server and concurrency (median reported)", int, 1)
  .option("--mode <mode>", "charge consistency mode: eventual | strict", "eventual")
  .option("--paced-rate <n>", "then each server paced at this many requests/s: CPU and wake-ups per request, idle subtracted (0 = skip)", nonNegative, 200)
  .option("--no-pinned", "skip the rounds with each server alone on one CPU (loadtest/pinning.ts)")
  .option("--profile-dir <dir>", "write a V8 CPU profile of the gateway (node --cpu-prof) into this directory")
  .action(async (o) => {
    if (o.mode !== "eventual" && o.mode !== "strict") throw new InvalidArgumentError("--mode must be eventual or strict");
    const result = await runExtProcBench({ durationMs: o.durationMs, warmupMs: o.warmupMs, concurrencies: o.concurrency, rounds: o.rounds, mode: o.mode, pacedRate: o.pacedRate, profileDir: o.profileDir, pinned: o.pinned });
    emitResult(result);
  });

program
  .command("fold")
  .description("CPU per folded event, per family (charge, release, heartbeat, load, kv, pod): NATS delivery, JSON parse, schema check, view update")
  .option("--events <n>", "messages per family and round", int, 20_000)
  .option("--rounds <n>", "rounds (median reported)", int, 3)
  .option("--in-flight <n>", "requests a heartbeat lists (the router's concurrency)", int, 32)
  .option("--foreign-rate <n>", "the router's requests per second (the heartbeats' share per request)", int, 1_000)
  .option("--release-batch <n>", "releases per `releases` batch (family releases)", int, 8)
  .action(async (o) => {
    emitResult(await runFoldBench({ events: o.events, rounds: o.rounds, inFlight: o.inFlight, foreignRate: o.foreignRate, releaseBatch: o.releaseBatch }));
  });

program
  .command("fold-live")
  .description("live fold cost: 2 gateways on one nats-server, load on A only; CPU of B (and nats-server, and A) per request A routed, idle subtracted")
  .option("--concurrency <n>", "ext_proc streams driven at A", int, 32)
  .option("--duration-ms <ms>", "each loaded and each idle window", int, 5_000)
  .option("--rounds <n>", "idle/loaded window pairs (median reported)", int, 3)
  .option("--heartbeat-ms <ms>", "the replicas' heartbeat interval", int, 1_000)
  .option("--release-batch-ms <list>", "the gateways' release batch windows to compare, comma separated (0 = none)", (v: string) => v.split(",").map((x) => nonNegative(x)), [0, 5])
  .option("--profile-dir <dir>", "write V8 CPU profiles of B (node --cpu-prof, first round) into this directory")
  .action(async (o) => {
    emitResult(await runFoldLiveBench({ concurrency: o.concurrency, durationMs: o.durationMs, rounds: o.rounds, heartbeatMs: o.heartbeatMs, releaseBatchMs: o.releaseBatchMs, profileDir: o.profileDir }));
  });

program
  .command("scale")
  .description("R = 1, 2, 4 replicas of pool a (each paced by its own generator) + an observer of a + one replica of pool b, one nats-server: CPU per own and per foreign request, the fitted fold constant, pool b's CPU per pool-a request")
  .option("--replicas <list>", "replica counts of pool a, comma separated (must include 1)", ints, [1, 2, 4])
  .option("--rate <n>", "requests per second offered to each replica of pool a (paced)", int, 300)
  .option("--concurrency <n>", "streams in flight per generator, at most (room for latency on a busy host, so the rate is met)", int, 32)
  .option("--duration-ms <ms>", "each loaded and each idle window", int, 5_000)
  .option("--rounds <n>", "rounds over the replica counts (median reported)", int, 3)
  .option("--heartbeat-ms <ms>", "the replicas' heartbeat interval", int, 1_000)
  .option("--release-batch-ms <ms>", "the gateways' release batch window (0 = none, the gateway's default)", nonNegative, 0)
  .option("--fold-pace-ms <ms>", "the gateways' --fold-pace-ms (default: the gateway's)", nonNegative)
  .option("--profile-dir <dir>", "write V8 CPU profiles of the observer (node --cpu-prof, first round, one directory per R) into this directory")
  .option("--no-pinned", "skip the R = 1 cell with the gateways pinned to their own CPU (loadtest/pinning.ts)")
  .action(async (o) => {
    emitResult(await runScaleBench({
      replicas: o.replicas, rate: o.rate, concurrency: o.concurrency, durationMs: o.durationMs, rounds: o.rounds, heartbeatMs: o.heartbeatMs, releaseBatchMs: o.releaseBatchMs, pinned: o.pinned,
      ...(o.foldPaceMs !== undefined ? { foldPaceMs: o.foldPaceMs } : {}), ...(o.profileDir !== undefined ? { profileDir: o.profileDir } : {}),
    }));
  });

program
  .command("predicted")
  .description("2 fast + 2 slow (2.5x) simulated pods, shared-prefix chat at ~70% of capacity: least-request, prefix-cache, predicted-latency, predicted-latency+prefix-cache; replay fidelity, TTFT MAPE, calibrated what-if")
  .option("--duration-ms <ms>", "arrivals per case, warm-up included (wall ms)", int, 40_000)
  .option("--warmup-ms <ms>", "requests before this are not measured (the model learns, caches fill)", int, 12_000)
  .option("--rate <n>", "arrivals per second (default: 0.7 of the timing model's capacity)", Number)
  .option("--slow-factor <x>", "how much slower the slow pods prefill and decode", Number, 2.5)
  .option("--cases <list>", "cases to run, comma separated (default all four)", (v: string) => v.split(","))
  .option("--log-dir <dir>", "keep the services' logs here")
  .action(async (o) => {
    emitResult(await runPredictedBench({ durationMs: o.durationMs, warmupMs: o.warmupMs, rate: o.rate, slowFactor: o.slowFactor, cases: o.cases, logDir: o.logDir }));
  });

program
  .command("autoscale")
  .description("a ramp to 4x and back on simulated engines of a stand-in Deployment: static fleet vs autoscaler --apply with the drain handshake vs without it; scale from zero")
  .option("--base-rps <n>", "requests per second at the start and end", Number, 2)
  .option("--peak-factor <n>", "the peak's rate over the base rate", Number, 4)
  .option("--phase-ms <ms>", "each of the five phases (base, up, peak, down, base)", int, 24_000)
  .option("--max-tokens <n>", "tokens generated per request", int, 40)
  .option("--peak-pods <n>", "the static fleet's size (for the peak) and the autoscaler's maximum", int, 4)
  .option("--ttft-slo-ms <ms>", "the TTFT target attainment is counted against", int, 1_000)
  .option("--startup-ms <ms>", "a new pod's time from creation to Ready", int, 2_000)
  .option("--seed <n>", "arrival process seed", int, 1)
  .action(async (o) => {
    emitResult(await runAutoscaleBench({ baseRps: o.baseRps, peakFactor: o.peakFactor, phaseMs: o.phaseMs, maxTokens: o.maxTokens, peakPods: o.peakPods, ttftSloMs: o.ttftSloMs, startupMs: o.startupMs, seed: o.seed }));
  });

program
  .command("adapters")
  .description("200 LoRA adapters with Zipf demand over 8 simulated vLLM pods with max_loras 4, placed by adapter-controller, one pod killed half way: 404s, hit rate on loaded pods, cold-start time to first token")
  .option("--adapters <n>", "declared adapters", int, 200)
  .option("--pods <n>", "simulated vLLM pods", int, 8)
  .option("--max-loras <n>", "the engines' max_loras", int, 4)
  .option("--rps <n>", "requests per second (open loop)", Number, 40)
  .option("--duration-ms <ms>", "traffic duration (a pod is killed half way)", int, 60_000)
  .option("--zipf-s <s>", "Zipf exponent of the adapters' popularity", Number, 1.2)
  .option("--load-ms <ms>", "how long a simulated adapter load takes", nonNegative, 200)
  .option("--seed <n>", "arrival process seed", int, 1)
  .action(async (o) => emitResult(await runAdaptersBench({ adapters: o.adapters, pods: o.pods, maxLoras: o.maxLoras, rps: o.rps, durationMs: o.durationMs, zipfS: o.zipfS, loadMs: o.loadMs, seed: o.seed }), loadavg()[0]));

program
  .command("discovery")
  .description("Kubernetes discovery: pod Ready in the API -> a gateway routes to it (1,000 pods, 10 changes/s), and the PODS apply cost per event")
  .option("--pods <n>", "pods of the one model", int, 1_000)
  .option("--rate <n>", "pod changes per second (half are measured Ready transitions)", int, 10)
  .option("--duration-ms <ms>", "measured window", int, 20_000)
  .action(async (o) => emitResult(await runDiscoveryBench({ pods: o.pods, rate: o.rate, durationMs: o.durationMs })));

program
  .command("pd")
  .description("prefill/decode disaggregation (2 prefill + 2 decode pods) vs aggregated (4 combined), long shared-prefix prompts; and the gateway's overhead on the prefill leg")
  .option("--rate <n>", "request arrivals per second (Poisson)", Number, 1.5)
  .option("--duration-ms <ms>", "arrivals are generated over this long, per mode", int, 30_000)
  .option("--system-words <n>", "words (about tokens) of each shared system prompt", int, 3_600)
  .option("--user-words <n>", "words of each user message", int, 600)
  .option("--max-tokens <n>", "tokens generated per request", int, 64)
  .option("--overhead-iterations <n>", "prefill-leg overhead samples (gateway-issued and direct each)", int, 200)
  .action(async (o) => {
    const result = await runPdBench({ rate: o.rate, durationMs: o.durationMs, systemWords: o.systemWords, userWords: o.userWords, maxTokens: o.maxTokens, overheadIterations: o.overheadIterations });
    emitResult(result);
  });

program
  .command("responses")
  .description("Responses API agent sessions by previous_response_id over 3 gateway replicas and 8 pods, one pod killed half-way: affinity, store expansions, errors, TTFT against the same sessions as chat with full history, store bytes per response, gateway CPU")
  .option("--sessions <n>", "agent sessions", int, 24)
  .option("--turns <n>", "turns per session", int, 12)
  .option("--concurrency <n>", "sessions at once", int, 8)
  .option("--max-tokens <n>", "output tokens per turn", int, 16)
  .option("--user-words <n>", "words of each turn's input", int, 120)
  .action(async (o) => emitResult(await runResponsesBench({ sessions: o.sessions, turns: o.turns, concurrency: o.concurrency, maxTokens: o.maxTokens, userWords: o.userWords })));

program
  .command("index")
  .description("prefix index: ingest rate, longest-match latency for a 512-block prompt over 32 pods, bytes per entry")
  .option("--lookups <n>", "lookups per case and round", int, 20_000)
  .option("--rounds <n>", "rounds per lookup case (median reported)", int, 3)
  .action(async (o) => {
    emitResult(await runIndexBench({ lookups: o.lookups, rounds: o.rounds }));
  });

program
  .command("herding")
  .description("a burst of simultaneous requests over R gateway replicas, per consistency mode: busiest pod / even share")
  .option("--replicas <list>", "replica counts, comma separated", ints, [1, 2, 4, 8])
  .option("--modes <list>", "consistency modes, comma separated (off, eventual, strict)", herdingModes, [...HERDING_MODES])
  .option("--bursts <n>", "bursts per cell (mean and worst reported)", int, 5)
  .option("--requests <n>", "requests per burst", int, 64)
  .option("--pods <n>", "pods of the model", int, 8)
  .option("--spread <how>", "requests to replicas: round-robin | random", "random")
  .option("--stagger-ms <ms>", "gap between the bodies of a burst (0 = all at once)", nonNegative, 0)
  .option("--in-process", "replicas as in-process gateways (one event loop) instead of processes", false)
  .option("--seed <n>", "seed of the random spread", int, 1)
  .action(async (o) => {
    if (o.spread !== "round-robin" && o.spread !== "random") throw new InvalidArgumentError("--spread must be round-robin or random");
    const result = await runHerdingBench({
      replicas: o.replicas, modes: o.modes, bursts: o.bursts, requests: o.requests, pods: o.pods, spread: o.spread, staggerMs: o.staggerMs, inProcess: o.inProcess, seed: o.seed,
    });
    emitResult(result);
  });

program
  .command("rate-limit")
  .description("a per-user limit shared by R replicas: requests admitted from one user's burst, and the overshoot")
  .option("--replicas <list>", "replica counts, comma separated", ints, [1, 2, 4])
  .option("--gaps-ms <list>", "gaps between a burst's bodies, comma separated (0 = all at once)", (v: string) => v.split(",").map((x) => nonNegative(x)), [0, 2])
  .option("--limit <n>", "requests per minute per user", int, 20)
  .option("--requests <n>", "requests per burst", int, 60)
  .option("--bursts <n>", "bursts per cell (one new user each)", int, 5)
  .option("--mode <mode>", "consistency mode of the replicas: eventual | strict | off", "eventual")
  .option("--in-process", "replicas as in-process gateways (one event loop) instead of processes", false)
  .action(async (o) => {
    if (!(HERDING_MODES as readonly string[]).includes(o.mode)) throw new InvalidArgumentError("--mode must be eventual, strict or off");
    emitResult(await runRateLimitBench({ replicas: o.replicas, gapsMs: o.gapsMs, limit: o.limit, requests: o.requests, bursts: o.bursts, mode: o.mode, inProcess: o.inProcess }));
  });

program
  .command("charge-lag")
  .description("time from gateway A's routing decision to gateway B's ledger holding the charge (in-process A and B)")
  .option("--rate <n>", "requests per second to A, one at a time", int, 200)
  .option("--duration-ms <ms>", "measured window", int, 10_000)
  .option("--warmup-ms <ms>", "unmeasured warm-up at the same rate", nonNegative, 1_000)
  .option("--mode <mode>", "consistency mode of both gateways: eventual | strict", "eventual")
  .option("--fold-pace-ms <ms>", "both gateways' --fold-pace-ms (default: the gateway's)", nonNegative)
  .action(async (o) => {
    if (o.mode !== "eventual" && o.mode !== "strict") throw new InvalidArgumentError("--mode must be eventual or strict");
    emitResult(await runChargeLagBench({ rate: o.rate, durationMs: o.durationMs, warmupMs: o.warmupMs, mode: o.mode, ...(o.foldPaceMs !== undefined ? { foldPaceMs: o.foldPaceMs } : {}) }));
  });

const caseNames = Object.keys(PREFIX_QUALITY_CASES) as PrefixQualityCaseName[];
const caseList = (v: string) =>
  v.split(",").map((x) => {
    const name = x.trim() as PrefixQualityCaseName;
    if (!caseNames.includes(name)) throw new InvalidArgumentError(`expected a comma list of ${caseNames.join(", ")}, got ${JSON.stringify(x)}`);
    return name;
  });
const positive = (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError(`expected a number > 0, got ${JSON.stringify(v)}`);
  return n;
};

program
  .command("prefix-quality")
  .description("shared-prefix chat load on 8 simulated pods at ~80% load: engine prefix-cache hit rate and client TTFT for random, least-request, prefix-cache approximate / precise, 1 vs 4 gateways")
  .option("--cases <list>", `cases to run, comma separated (${caseNames.join(", ")})`, caseList, caseNames)
  .option("--duration-ms <ms>", "arrivals per case, warm-up included", int, 36_000)
  .option("--warmup-ms <ms>", "unmeasured start of each case", int, 10_000)
  .option("--rate <rps>", "request rate per wall second (default: calibrated with least-request)", positive)
  .option("--target-util <x>", "calibration target: fraction of time the engines are busy", positive, 0.8)
  .option("--time-scale <x>", "simulated time runs x times faster than wall time", positive, 10)
  .option("--seed <n>", "workload seed", int, 42)
  .option("--log-dir <dir>", "keep the services' logs here")
  .action(async (o) => {
    const result = await runPrefixQualityBench({
      cases: o.cases, durationMs: o.durationMs, warmupMs: o.warmupMs, rate: o.rate, targetUtil: o.targetUtil,
      engine: { timeScale: o.timeScale }, workload: { seed: o.seed }, logDir: o.logDir,
    });
    emitResult(result);
  });

program
  .command("bootstrap")
  .description("new replica ready from the newest prefix-index snapshot + KV tail vs replaying the KV stream (1 M blocks)")
  .option("--blocks <n>", "distinct blocks in the index at snapshot time", int, 1_000_000)
  .option("--rounds <n>", "bootstraps of each kind (median reported)", int, 5)
  .option("--kv-filter", "give the KV followers the redundant `<prefix>.kv.>` filter (the gateway before the change)", false)
  .action(async (o) => {
    emitResult(await runBootstrapBench({ blocks: o.blocks, rounds: o.rounds, kvFilter: o.kvFilter }));
  });


program
  .command("replay")
  .description("record a window (R gateway processes under ext_proc load), export it, and replay it with counterfactual strategies: decisions/s, fidelity, memory")
  .option("--duration-ms <ms>", "recording length", int, 10_000)
  .option("--concurrency <n>", "streams in flight per load generator (one generator per replica)", int, 16)
  .option("--replicas <n>", "gateway replicas (processes)", int, 3)
  .option("--strategies <list>", "counterfactual strategies, comma separated (';' when a combination has commas)", strategiesOption, [...DEFAULT_REPLAY_STRATEGIES])
  .option("--recorded <list>", "strategies the generators ask for (routing-strategy header), one per generator, round-robin", strategiesOption, [...DEFAULT_RECORDED_STRATEGIES])
  .option("--pods <n>", "pods of the model", int, 8)
  .option("--heartbeat-ms <ms>", "heartbeat interval of the replicas", int, 500)
  .option("--keep-export <path>", "keep the exported window here (e.g. to profile a replay of it)")
  .action(async (o) => {
    const result = await runReplayBench({
      durationMs: o.durationMs, concurrency: o.concurrency, replicas: o.replicas, strategies: o.strategies, recorded: o.recorded, pods: o.pods, heartbeatMs: o.heartbeatMs, keepExport: o.keepExport,
    });
    emitResult(result);
  });

const faultCases = (v: string) =>
  v.split(",").map((x) => {
    const name = x.trim() as FaultCaseName;
    if (!FAULT_CASES.includes(name)) throw new InvalidArgumentError(`expected a comma list of ${FAULT_CASES.join(", ")}, got ${JSON.stringify(x)}`);
    return name;
  });

program
  .command("faults")
  .description("faults under load: kill a gateway, a NATS node (eventual, strict, during a batch), NATS down, kill the kv-bridge, clock skew: failed requests, acked events lost, heal time")
  .option("--cases <list>", `cases to run, comma separated (${FAULT_CASES.join(", ")})`, faultCases, [...FAULT_CASES])
  .option("--rate <rps>", "requests per second over the gateway processes", int, 500)
  .option("--in-process-rate <rps>", "requests per second in the cases with in-process gateways (NATS node, clock skew)", int, 200)
  .option("--hold-ms <ms>", "how long each request stays in flight after its routing", nonNegative, 200)
  .option("--phase-ms <ms>", "load before and after each fault", int, 5_000)
  .option("--outage-ms <ms>", "nats-down-30s: how long NATS is down", int, 30_000)
  .option("--heartbeat-ms <ms>", "gateways' heartbeat interval (timeout 3x)", int, 200)
  .option("--kv-requests <n>", "kill-kv-bridge: chat requests around the kill", int, 60)
  .option("--batch-items <n>", "kill-nats-node-batch: items of the batch", int, 400)
  .option("--case-timeout-ms <ms>", "time limit of every case: past it the case is stopped with all it started and reported as timed out (0 = each case's own: its load and outage plus room, 620 s in all by default)", nonNegative, 0)
  .action(async (o) => {
    const result = await runFaultsBench({
      cases: o.cases, rate: o.rate, inProcessRate: o.inProcessRate, holdMs: o.holdMs, phaseMs: o.phaseMs, outageMs: o.outageMs, heartbeatMs: o.heartbeatMs, kvRequests: o.kvRequests, batchItems: o.batchItems, caseTimeoutMs: o.caseTimeoutMs,
    });
    emitResult(result);
  });

const flowRuns = (v: string) =>
  v.split(",").map((x) => {
    const name = x.trim() as FlowRunName;
    if (!FLOW_RUNS.includes(name)) throw new InvalidArgumentError(`expected a comma list of ${FLOW_RUNS.join(", ")}, got ${JSON.stringify(x)}`);
    return name;
  });
const jsonObject = (v: string) => {
  let o: unknown;
  try {
    o = JSON.parse(v);
  } catch (err) {
    throw new InvalidArgumentError(`not JSON: ${(err as Error).message}`);
  }
  if (typeof o !== "object" || o === null || Array.isArray(o)) throw new InvalidArgumentError("expected a JSON object");
  return o as Record<string, unknown>;
};

program
  .command("flow")
  .description("flow control at ~2x capacity (20% interactive, 80% batch from two tenants 10:1): off vs on through 3 gateway replicas (on: pods scheduling by priority), on with FCFS pods (engine priority off), on through 1, and the interactive requests alone on the idle fleet; interactive TTFT p99, batch completions, Jain fairness, priority inversions, expired/dropped, gateway CPU per request unsaturated")
  .option("--duration-ms <ms>", "arrival window per run (wall)", int, 40_000)
  .option("--replicas <n>", "gateway replicas of the off and on runs", int, 3)
  .option("--pods <n>", "simulated pods", int, 4)
  .option("--load <x>", "offered load, x the timing model's capacity", positive, 2)
  .option("--seed <n>", "workload seed", int, 19)
  .option("--time-scale <x>", "simulated time runs x times faster than wall time", positive, 2)
  .option("--runs <list>", `runs, comma separated (${FLOW_RUNS.join(", ")})`, flowRuns, [...FLOW_RUNS])
  .option("--cpu-phase-ms <ms>", "measured part of each off/on phase of the unsaturated CPU comparison (0 = skip it)", nonNegative, 8_000)
  .option("--cpu-settle-ms <ms>", "unmeasured start of each CPU phase, after the config changed", nonNegative, 1_500)
  .option("--cpu-rounds <n>", "off/on phase pairs of the CPU comparison", int, 2)
  .option("--cpu-load <x>", "load of the CPU comparison, x capacity", positive, 0.5)
  .option("--flow-config <json>", "keys merged over the on runs' flowControl (e.g. '{\"saturation\":{\"queueDepth\":2}}')", jsonObject)
  .option("--log-dir <dir>", "keep the services' logs here")
  .action(async (o) => {
    const result = await runFlowBench({
      durationMs: o.durationMs, replicas: o.replicas, load: o.load, seed: o.seed, runs: o.runs, cpuPhaseMs: o.cpuPhaseMs, cpuSettleMs: o.cpuSettleMs, cpuRounds: o.cpuRounds, cpuLoad: o.cpuLoad,
      engine: { pods: o.pods, timeScale: o.timeScale }, ...(o.flowConfig ? { flowConfig: o.flowConfig } : {}), logDir: o.logDir,
    });
    emitResult(result);
  });

program
  .command("flow-held")
  .description("flow control: bytes a held request keeps in memory (heap + buffers, measured after GC) against the bytes the queue counts for it; ASCII, two-byte and salted bodies")
  .option("--count <n>", "requests held per case", int, 20)
  .option("--body-bytes <n>", "body size of each held request", int, 4 * 1024 * 1024)
  .action(async (o) => emitResult(await runFlowHeldBench({ count: o.count, bodyBytes: o.bodyBytes })));

program
  .command("batch")
  .description("the Batch API: a batch on the simulated fleet beside interactive load at ~60% of capacity, one worker SIGKILLed half-way; lost, duplicated, batch throughput vs idle capacity, interactive TTFT p99 with and without the batch")
  .option("--items <n>", "items of the measured batch", int, BATCH_BENCH_DEFAULTS.items)
  .option("--probe-items <n>", "items of the capacity probe (a batch alone)", int, BATCH_BENCH_DEFAULTS.probeItems)
  .option("--workers <n>", "batch-worker processes (the first is killed half-way)", int, BATCH_BENCH_DEFAULTS.workers)
  .option("--worker-concurrency <n>", "items in flight per worker", int, BATCH_BENCH_DEFAULTS.workerConcurrency)
  .option("--interactive-load <x>", "interactive arrival rate, x the measured capacity", positive, BATCH_BENCH_DEFAULTS.interactiveLoad)
  .option("--interactive-ms <ms>", "length of the interactive-alone phase", int, BATCH_BENCH_DEFAULTS.interactiveMs)
  .option("--pods <n>", "simulated pods", int, BATCH_BENCH_DEFAULTS.pods)
  .option("--time-scale <x>", "simulated time runs x times faster than wall time", positive, BATCH_BENCH_DEFAULTS.timeScale)
  .option("--max-tokens <n>", "max_tokens of every request", int, BATCH_BENCH_DEFAULTS.maxTokens)
  .addOption(new Option("--engine <kind>", "the pods: sglang-priority (SGLang scheduling by priority, preempting batch items for interactive ones) or vllm-fcfs").choices(["sglang-priority", "vllm-fcfs"]).default(BATCH_BENCH_DEFAULTS.engine))
  .option("--max-batch <n>", "concurrent requests per simulated pod", int, BATCH_BENCH_DEFAULTS.maxBatch)
  .option("--log-dir <dir>", "keep the services' logs here")
  .action(async (o) => {
    emitResult(await runBatchBench({ maxBatch: o.maxBatch, items: o.items, probeItems: o.probeItems, workers: o.workers, workerConcurrency: o.workerConcurrency, interactiveLoad: o.interactiveLoad, interactiveMs: o.interactiveMs, pods: o.pods, timeScale: o.timeScale, maxTokens: o.maxTokens, engine: o.engine, ...(o.logDir ? { logDir: o.logDir } : {}) }));
  });

program
  .command("semantic")
  .description("semantic model selection: classification µs per request (keyword rules, cached and uncached embeddings), virtual vs plain ext_proc p50, accuracy on the labelled prompts")
  .option("--requests <n>", "requests of mixed size per measurement", int, 1_000)
  .action(async (o) => {
    emitResult(await runSemanticBench({ requests: o.requests }));
  });

registerTokenizerBench(program);
registerTokenizeBench(program);

program
  .command("long-context")
  .description("agent sessions growing to ~100k tokens over 100 simulated pods (KV events, hf: tokenizer, precise prefix routing): gateway CPU per request, route added p50/p99, loop block, RSS, engine hit rate")
  .option("--pods <n>", "simulated pods of the one model", int, 100)
  .option("--sessions <n>", "agent sessions in flight (closed loop)", int, 8)
  .option("--duration-ms <ms>", "measured window", int, 60_000)
  .option("--warmup-ms <ms>", "unmeasured start (sessions' cold first requests)", int, 30_000)
  .option("--start-tokens <min,max>", "context of a session's first request, tokens", ints, [60_000, 90_000])
  .option("--end-tokens <n>", "a session past this is replaced by a fresh one", int, 190_000)
  .option("--tokenizer <name>", "llama3 | qwen3", "llama3")
  .option("--no-pinned", "skip the second run with the gateway pinned to its own CPU (loadtest/pinning.ts)")
  .option("--profile-dir <dir>", "run the gateway under node --cpu-prof, profiles here")
  .option("--log-dir <dir>", "keep the services' logs here")
  .action(async (o) => {
    if (o.tokenizer !== "llama3" && o.tokenizer !== "qwen3") throw new InvalidArgumentError("--tokenizer must be llama3 or qwen3");
    const result = await runLongContextBench({
      pods: o.pods, sessions: o.sessions, durationMs: o.durationMs, warmupMs: o.warmupMs, startTokens: [o.startTokens[0], o.startTokens[1] ?? o.startTokens[0]], endTokens: o.endTokens,
      tokenizer: o.tokenizer, pinned: o.pinned, profileDir: o.profileDir, logDir: o.logDir,
    });
    emitResult(result);
  });

await program.parseAsync(process.argv);
