/**
 * A seeded shared-prefix chat workload: many users, a few long system prompts, multi-turn
 * conversations. Pure: the same options always give the same prompts and the same schedule, so
 * every routing strategy is measured on identical traffic.
 *
 * Arrivals are open-loop: request times are a Poisson process of `rate` per second, fixed up front,
 * whatever the system under test does. Each arrival goes to the conversation whose next turn has
 * been due the longest; when none is due, a new conversation (a new user) starts. A conversation's
 * next turn becomes due a think time after its previous turn was sent. The request arrival process
 * therefore stays exactly Poisson while the number of live conversations finds its own level
 * (about rate x mean gap between turns), as with real chat traffic.
 *
 * What a turn sends depends on earlier answers (each turn resends the whole history plus the
 * previous answer, as chat clients do), so the schedule holds only the user's new message; the
 * runner appends the answers it received. The simulated engines' answers are a deterministic
 * function of the prompt, so the content stays identical across runs too.
 *
 * Text is made of pseudo-words of at most 12 letters: with the simulator's tokenizer each word
 * (with its leading space) is one token and each full stop another, so sizes given in words are
 * close to sizes in tokens.
 */
import { mulberry32 } from "../../services/shared/seeded-random.js";

export interface SharedPrefixWorkloadOptions {
  seed: number;
  /** Request arrivals per second (Poisson). */
  rate: number;
  /** Arrivals are generated in [0, durationMs). */
  durationMs: number;
  /** Distinct system prompts shared by all users. */
  systemPrompts: number;
  /** Length of each system prompt in words, uniform in [min, max]. */
  systemPromptWords: readonly [number, number];
  /** Popularity skew of the system prompts: weight of prompt i is 1 / (i + 1)^skew (0 = uniform). */
  promptSkew: number;
  /** Turns per conversation, uniform in [min, max]. */
  turns: readonly [number, number];
  /** Words per user message, uniform in [min, max]. */
  userWords: readonly [number, number];
  /** `max_tokens` per turn, uniform in [min, max] (the simulator always generates exactly that many). */
  maxTokens: readonly [number, number];
  /** Gap between a conversation's turns (send to send): min + exponential with mean `meanMs - minMs`. */
  think: { minMs: number; meanMs: number };
}

export const SHARED_PREFIX_DEFAULTS: Omit<SharedPrefixWorkloadOptions, "rate" | "durationMs"> = {
  seed: 42,
  systemPrompts: 16,
  systemPromptWords: [1_800, 3_000],
  promptSkew: 0.5,
  turns: [2, 8],
  userWords: [40, 160],
  maxTokens: [16, 48],
  think: { minMs: 1_500, meanMs: 3_000 },
};

export interface WorkloadConversation {
  id: number;
  user: string;
  systemPrompt: number;
  turns: number;
}

export interface ScheduledTurn {
  /** Send time, ms from the start of the run. */
  atMs: number;
  conversation: number;
  /** 0-based turn index within the conversation. */
  turn: number;
  userText: string;
  maxTokens: number;
}

export interface SharedPrefixWorkload {
  options: SharedPrefixWorkloadOptions;
  systemPrompts: string[];
  conversations: WorkloadConversation[];
  /** Sorted by `atMs`. */
  schedule: ScheduledTurn[];
}

/** The workload's seeded PRNG (mulberry32). */
export const seededRandom = mulberry32;

const uniformInt = (rand: () => number, [lo, hi]: readonly [number, number]): number => lo + Math.floor(rand() * (hi - lo + 1));

/** Exponential with the given mean; 1 - u keeps the log argument in (0, 1]. */
const exponential = (rand: () => number, mean: number): number => (mean <= 0 ? 0 : -Math.log(1 - rand()) * mean);

const LETTERS = "abcdefghijklmnopqrstuvwxyz";

export function vocabulary(rand: () => number, size: number): string[] {
  const words = new Set<string>();
  while (words.size < size) {
    const len = 3 + Math.floor(rand() * 7);
    let w = "";
    for (let i = 0; i < len; i++) w += LETTERS[Math.floor(rand() * LETTERS.length)];
    words.add(w);
  }
  return [...words];
}

/** `words` pseudo-words in sentences of 8-20 words (with the simulator's tokenizer, about one token per word). */
export function prose(rand: () => number, vocab: readonly string[], words: number): string {
  const out: string[] = [];
  let sentence = 0;
  let sentenceLen = 8 + Math.floor(rand() * 13);
  for (let i = 0; i < words; i++) {
    let w = vocab[Math.floor(rand() * vocab.length)] as string;
    if (++sentence === sentenceLen || i === words - 1) {
      w += ".";
      sentence = 0;
      sentenceLen = 8 + Math.floor(rand() * 13);
    }
    out.push(w);
  }
  return out.join(" ");
}

function check(ok: boolean, what: string): void {
  if (!ok) throw new RangeError(`shared-prefix workload: ${what}`);
}

const validRange = ([lo, hi]: readonly [number, number], min: number) => Number.isInteger(lo) && Number.isInteger(hi) && lo >= min && hi >= lo;

export function buildSharedPrefixWorkload(options: SharedPrefixWorkloadOptions): SharedPrefixWorkload {
  const o = options;
  check(o.rate > 0 && Number.isFinite(o.rate), `rate must be > 0, got ${o.rate}`);
  check(o.durationMs > 0, `durationMs must be > 0, got ${o.durationMs}`);
  check(Number.isInteger(o.systemPrompts) && o.systemPrompts >= 1, "systemPrompts must be an integer >= 1");
  check(validRange(o.systemPromptWords, 1), "systemPromptWords must be an integer range [min, max], min >= 1");
  check(validRange(o.turns, 1), "turns must be an integer range [min, max], min >= 1");
  check(validRange(o.userWords, 1), "userWords must be an integer range [min, max], min >= 1");
  check(validRange(o.maxTokens, 1), "maxTokens must be an integer range [min, max], min >= 1");
  check(o.think.minMs >= 0 && o.think.meanMs >= o.think.minMs, "think needs 0 <= minMs <= meanMs");

  // Separate streams so that changing, say, the rate does not change the prompts' text.
  const textRand = seededRandom(o.seed);
  const arrivalRand = seededRandom(o.seed ^ 0x9e3779b9);
  const convRand = seededRandom(o.seed ^ 0x85ebca6b);
  const vocab = vocabulary(textRand, 4_096);

  const systemPrompts = Array.from(
    { length: o.systemPrompts },
    (_, i) => `You are assistant ${i} of the shared prefix benchmark. ${prose(textRand, vocab, uniformInt(textRand, o.systemPromptWords))}`,
  );
  const weights = systemPrompts.map((_, i) => 1 / (i + 1) ** o.promptSkew);
  const totalWeight = weights.reduce((a, b) => a + b, 0);
  const pickPrompt = (): number => {
    let x = convRand() * totalWeight;
    for (const [i, w] of weights.entries()) {
      x -= w;
      if (x < 0) return i;
    }
    return weights.length - 1;
  };

  const conversations: WorkloadConversation[] = [];
  const schedule: ScheduledTurn[] = [];
  // Conversations waiting for their next turn, with the time it becomes due; few enough live at
  // once (rate x gap) that a linear scan for the earliest is cheaper than a heap's bookkeeping.
  const pending: Array<{ conv: WorkloadConversation; next: number; dueMs: number }> = [];
  for (let t = exponential(arrivalRand, 1_000 / o.rate); t < o.durationMs; t += exponential(arrivalRand, 1_000 / o.rate)) {
    let chosen = -1;
    for (let i = 0; i < pending.length; i++) {
      const p = pending[i] as (typeof pending)[number];
      if (p.dueMs <= t && (chosen < 0 || p.dueMs < (pending[chosen] as (typeof pending)[number]).dueMs)) chosen = i;
    }
    let conv: WorkloadConversation;
    let turn: number;
    if (chosen >= 0) {
      const p = pending[chosen] as (typeof pending)[number];
      conv = p.conv;
      turn = p.next;
      pending.splice(chosen, 1);
    } else {
      conv = { id: conversations.length, user: `user-${conversations.length}`, systemPrompt: pickPrompt(), turns: uniformInt(convRand, o.turns) };
      conversations.push(conv);
      turn = 0;
    }
    const userText = `User ${conv.user}, message ${turn + 1}: ${prose(textRand, vocab, uniformInt(convRand, o.userWords))}`;
    schedule.push({ atMs: t, conversation: conv.id, turn, userText, maxTokens: uniformInt(convRand, o.maxTokens) });
    if (turn + 1 < conv.turns) {
      pending.push({ conv, next: turn + 1, dueMs: t + o.think.minMs + exponential(convRand, o.think.meanMs - o.think.minMs) });
    }
  }
  return { options: o, systemPrompts, conversations, schedule };
}
