/**
 * The simulator on a real model's tokenizer (`jetroute sim --tokenizer hf:<dir>`): `/tokenize`,
 * `/detokenize`, the prompt ids of generation requests — and so the token ids in its KV events —
 * come from the same Hugging Face tokenizer files the gateway loads with
 * `--tokenizer-model <model>=hf:<dir>`, through the same code (services/tokenizer/hf-tokenizer.ts),
 * so the two agree the way a real vLLM and a gateway on its tokenizer must.
 *
 * Generated text stays the simulator's word list, re-expressed in the real vocabulary: every word
 * that is one token of the model is kept, so a reply sent back in the next turn re-tokenizes to
 * the ids the engine generated (as with the built-in tokenizer).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ChatTemplateError } from "../tokenizer/chat-template.js";
import { HfTokenizer } from "../tokenizer/hf-tokenizer.js";
import { plainIds } from "../tokenizer/prompt-tokens.js";
import { GENERATION_WORDS } from "../tokenizer/sim-tokenizer.js";
import { badRequest } from "./errors.js";

/** What a pod generates from: token ids and the text of each. */
export interface GenerationVocab {
  ids: readonly number[];
  text(id: number): string;
}

export interface SimRealTokenizer {
  tokenizer: HfTokenizer;
  vocab: GenerationVocab;
}

/** Loads `hf:<dir>` (or a bare directory); a missing or corrupt file throws naming it. */
export async function loadSimTokenizer(setting: string): Promise<SimRealTokenizer> {
  const dir = setting.startsWith("hf:") ? setting.slice(3) : setting;
  const tokenizer = HfTokenizer.fromDir(
    dir,
    (name) => {
      try {
        return readFileSync(join(dir, name), "utf8");
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
        throw err;
      }
    },
    // An engine queues what it is sent; the bound only guards against a runaway client.
    { maxQueued: 100_000 },
  );
  const byId = new Map<number, string>();
  for (const word of GENERATION_WORDS) {
    const ids = await tokenizer.promptIds(word, false);
    if (ids.length === 1 && !byId.has(ids[0] as number)) byId.set(ids[0] as number, word);
  }
  if (byId.size === 0) throw new Error(`${dir}: none of the simulator's generation words is a single token of this tokenizer`);
  return { tokenizer, vocab: { ids: [...byId.keys()], text: (id) => byId.get(id) ?? "" } };
}

type Body = Record<string, unknown>;

function bool(body: Body, key: string, fallback: boolean): boolean {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "boolean") throw badRequest(`${key}: Input should be a valid boolean`, key);
  return v;
}

async function chatIds(t: HfTokenizer, body: Body): Promise<number[]> {
  const kw = body.chat_template_kwargs;
  try {
    // The engine stand-in works on plain arrays (its KV events and answers carry the ids as JSON).
    return plainIds(await t.chatIds(body.messages as never, {
      addGenerationPrompt: bool(body, "add_generation_prompt", true),
      addSpecialTokens: bool(body, "add_special_tokens", false),
      // The engine stand-in renders what it can; only the gateway must refuse inexact tool JSON.
      exactJson: false,
      continueFinalMessage: bool(body, "continue_final_message", false),
      ...(Array.isArray(body.tools) ? { tools: body.tools } : {}),
      ...(kw && typeof kw === "object" && !Array.isArray(kw) ? { templateKwargs: kw as Record<string, unknown> } : {}),
    }));
  } catch (err) {
    // vLLM answers a template that cannot render the conversation with a 400.
    if (err instanceof ChatTemplateError) throw badRequest(err.message, "messages");
    throw err;
  }
}

/**
 * Prompt ids of a generation request on the real tokenizer, or undefined when the body has no
 * prompt to tokenize here (ids given, or malformed: the request parser reports that).
 */
export async function realPromptTokens(kind: "chat" | "completion", raw: unknown, t: HfTokenizer): Promise<number[] | undefined> {
  if (!raw || typeof raw !== "object" || Array.isArray(raw)) return undefined;
  const body = raw as Body;
  if (kind === "chat") return Array.isArray(body.messages) ? chatIds(t, body) : undefined;
  let prompt = body.prompt;
  if (Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] === "string") prompt = prompt[0];
  return typeof prompt === "string" ? plainIds(await t.promptIds(prompt, bool(body, "add_special_tokens", true))) : undefined;
}

/** `/tokenize` on the real tokenizer, both of vLLM's forms; undefined = let the parser report the error. */
export async function realTokenize(raw: unknown, t: HfTokenizer): Promise<number[] | undefined> {
  if (!raw || typeof raw !== "object" || Array.isArray(raw)) return undefined;
  const body = raw as Body;
  if (body.messages !== undefined) return Array.isArray(body.messages) ? chatIds(t, body) : undefined;
  return typeof body.prompt === "string" ? plainIds(await t.promptIds(body.prompt, bool(body, "add_special_tokens", true))) : undefined;
}
