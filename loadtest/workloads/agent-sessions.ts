/**
 * Agent-like chat sessions whose context grows turn by turn: a shared system prompt, a user task,
 * then an agent loop of tool calls (assistant `tool_calls`, a `tool` message with a large result)
 * ending in an answer, then the next user task, and so on. Each request resends the whole history
 * plus what the last step added, as agent clients do. Pure and seeded: the same options give the
 * same conversation, so the incremental tokenizer path is compared with the full path on
 * identical text, and the long-context bench offers identical traffic on every run.
 *
 * Assistant turns may carry a reasoning part (`<think>…</think>` before the answer, as a client
 * that sends the reasoning back writes it): Qwen3's template keeps it for the assistant turns after
 * the last user query and strips it from earlier ones, so the rendering of earlier messages changes
 * when a new user task arrives (the case the prefix cache must notice and fall back on).
 */
import type { HfChatMessage } from "../../services/tokenizer/chat-template.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";

export interface AgentSessionOptions {
  seed: number;
  /** The system prompt's text (shared by every session of a bench); default: generated from `systemChars`. */
  system?: string;
  systemChars: number;
  userChars: number;
  /** Tool results' length, uniform in [min, max] characters. */
  toolResultChars: readonly [number, number];
  answerChars: number;
  /** Characters of reasoning in each assistant turn (0: none). */
  thinkingChars: number;
  /** Tool calls per user task, uniform in [min, max]. */
  toolCallsPerTask: readonly [number, number];
}

export const AGENT_SESSION_DEFAULTS: AgentSessionOptions = {
  seed: 1,
  systemChars: 6_000,
  userChars: 400,
  toolResultChars: [2_000, 8_000],
  answerChars: 600,
  thinkingChars: 0,
  toolCallsPerTask: [2, 4],
};

const WORDS = (
  "the gateway routes each request to a pod whose cache already holds its prefix while engines publish block " +
  "events over zmq and the bridge keeps a map of hashes latency stays under 12 ms at 4096 rps function return " +
  "const let value error config file path line index token model tensor batch queue worker thread buffer " +
  "Kubernetes restart cold notice within seconds; fix(): {} [] => == != ok"
).split(" ");

export function seededText(rnd: () => number, chars: number): string {
  let s = "";
  while (s.length < chars) s += WORDS[Math.floor(rnd() * WORDS.length)] + (rnd() < 0.07 ? "\n" : " ");
  return s.slice(0, chars).trimEnd() || "ok";
}

const TOOLS = ["read_file", "run_tests", "grep", "list_dir"] as const;

/** OpenAI `tools` offered by every request of a session. */
export const AGENT_TOOLS: readonly unknown[] = TOOLS.map((name) => ({
  type: "function",
  function: { name, description: `${name.replace("_", " ")} in the workspace`, parameters: { type: "object", properties: { path: { type: "string" }, limit: { type: "integer" } }, required: ["path"] } },
}));

/**
 * One session: `next()` extends the history by one step and returns the messages of the request
 * that step sends (the same array, grown; copy it to keep a snapshot).
 */
export class AgentSession {
  readonly messages: HfChatMessage[];
  private readonly rnd: () => number;
  private callsLeft = 0;
  private calls = 0;
  private started = false;

  constructor(private readonly o: AgentSessionOptions = AGENT_SESSION_DEFAULTS) {
    this.rnd = mulberry32(o.seed);
    this.messages = [{ role: "system", content: o.system ?? seededText(mulberry32(7), o.systemChars) }];
  }

  private uniform(r: readonly [number, number]): number {
    return r[0] + Math.floor(this.rnd() * (r[1] - r[0] + 1));
  }

  private thinking(): string {
    return this.o.thinkingChars > 0 ? `<think>\n${seededText(this.rnd, this.o.thinkingChars)}\n</think>\n\n` : "";
  }

  private userTask(): void {
    this.messages.push({ role: "user", content: seededText(this.rnd, this.o.userChars) });
    this.callsLeft = this.uniform(this.o.toolCallsPerTask);
  }

  /** Characters of content in the history (a size measure independent of any template). */
  get chars(): number {
    let n = 0;
    for (const m of this.messages) n += typeof m.content === "string" ? m.content.length : 0;
    return n;
  }

  /** Appends the next step (a user task, or an assistant tool call and its result, or an answer and a new task). */
  next(): HfChatMessage[] {
    if (!this.started) {
      this.started = true;
      this.userTask();
      return this.messages;
    }
    if (this.callsLeft > 0) {
      this.callsLeft--;
      const id = `call_${++this.calls}`;
      const name = TOOLS[Math.floor(this.rnd() * TOOLS.length)] as string;
      const args = JSON.stringify({ path: `src/${seededText(this.rnd, 12).replace(/\W+/g, "_")}.ts`, limit: 1 + Math.floor(this.rnd() * 400) });
      this.messages.push({ role: "assistant", content: this.thinking(), tool_calls: [{ id, type: "function", function: { name, arguments: args } }] });
      this.messages.push({ role: "tool", tool_call_id: id, content: seededText(this.rnd, this.uniform(this.o.toolResultChars)) });
      return this.messages;
    }
    this.messages.push({ role: "assistant", content: this.thinking() + seededText(this.rnd, this.o.answerChars) });
    this.userTask();
    return this.messages;
  }
}
