/**
 * Chain expansion: a request naming `previous_response_id` made self-contained, for a pod that
 * does not hold the previous response (docs/stateful-apis.md, "Chain expansion"). Pure: the store
 * is reached through an injected lookup.
 *
 * The rule (what an engine does with its own store, vLLM's `_make_request`: the previous turn's
 * input messages, then its output, then the new input):
 * - walk `previous_response_id` links back from the named response, up to `maxDepth` turns;
 *   every link must be found (a missing one: the chain is broken, the request is answered 404 as
 *   an engine answers an unknown id), and a cycle is refused the same way;
 * - `input` = for each turn, oldest first: its input items, then its output items; then the new
 *   request's input (a string input becomes one user message);
 * - `instructions`: the new request's only. The API does not carry a previous turn's
 *   instructions into the next ("instructions from a previous response will not be carried over"),
 *   so the stored ones are never prepended;
 * - items another deployment cannot read are dropped and counted: reasoning items carrying
 *   `encrypted_content` (only the deployment that produced them can decrypt them; a pod of
 *   another deployment answers 400 `invalid_encrypted_content`). Reasoning items in clear text
 *   are kept. An item's own `id` is kept (engines accept output items back as input).
 * The result replaces `input` and removes `previous_response_id` from the body; everything else
 * (tools, model, sampling fields, `store`) is the client's.
 */
import type { ResponseItem } from "../../../schemas/responses.js";

/** Deepest chain expanded (turns); a longer one is refused as broken. */
export const MAX_CHAIN_DEPTH = 1024;
/** Most items an expanded input may hold. */
export const MAX_EXPANDED_ITEMS = 65_536;

/** One stored turn as the walk needs it. */
export interface ChainTurn {
  readonly id: string;
  readonly previousResponseId?: string;
  readonly input: readonly ResponseItem[];
  readonly output: readonly ResponseItem[];
}

export type ChainWalk =
  | { ok: true; turns: ChainTurn[] }
  | { ok: false; reason: "missing" | "cycle" | "too-deep"; id: string };

/**
 * The chain ending at `id`, oldest turn first. `lookup` answers the stored turn for the caller's
 * tenant (undefined when the store does not hold it, deleted or another tenant's).
 */
export async function walkChain(id: string, lookup: (id: string) => Promise<ChainTurn | undefined>, maxDepth = MAX_CHAIN_DEPTH): Promise<ChainWalk> {
  const turns: ChainTurn[] = [];
  const seen = new Set<string>();
  let next: string | undefined = id;
  while (next !== undefined) {
    if (seen.has(next)) return { ok: false, reason: "cycle", id: next };
    if (turns.length >= maxDepth) return { ok: false, reason: "too-deep", id: next };
    seen.add(next);
    const turn = await lookup(next);
    if (!turn) return { ok: false, reason: "missing", id: next };
    turns.push(turn);
    next = turn.previousResponseId;
  }
  return { ok: true, turns: turns.reverse() };
}

/** A request's `input` as a list of items (a string is one user message). */
export function inputItems(input: unknown): ResponseItem[] | undefined {
  if (typeof input === "string") return [{ type: "message", role: "user", content: input }];
  if (Array.isArray(input) && input.every((x) => x !== null && typeof x === "object" && !Array.isArray(x))) return input as ResponseItem[];
  return undefined;
}

/** Whether an item is one only its producing deployment can read. */
export function unreadableElsewhere(item: ResponseItem): boolean {
  return item.type === "reasoning" && typeof item.encrypted_content === "string" && item.encrypted_content.length > 0;
}

export interface Expansion {
  /** The full input: every turn's input and output, then the new input. */
  input: ResponseItem[];
  /** Items dropped by the rule above (encrypted reasoning). */
  dropped: number;
  /** Turns prepended. */
  turns: number;
}

/** The full input of a request continuing `turns` (oldest first) with `newInput`; undefined if the result would pass `maxItems`. */
export function expandInput(turns: readonly ChainTurn[], newInput: readonly ResponseItem[], maxItems = MAX_EXPANDED_ITEMS): Expansion | undefined {
  const input: ResponseItem[] = [];
  let dropped = 0;
  const add = (items: readonly ResponseItem[]) => {
    for (const it of items) {
      if (unreadableElsewhere(it)) dropped++;
      else input.push(it);
    }
  };
  for (const t of turns) {
    add(t.input);
    add(t.output);
    if (input.length > maxItems) return undefined;
  }
  add(newInput);
  if (input.length > maxItems) return undefined;
  return { input, dropped, turns: turns.length };
}

/**
 * The request body a pod without the previous response can serve: `input` replaced by the
 * expansion, `previous_response_id` removed; `instructions` stay the request's own.
 */
export function expandedBody(body: Readonly<Record<string, unknown>>, expansion: Expansion): Record<string, unknown> {
  const { previous_response_id: _dropped, ...rest } = body;
  return { ...rest, input: expansion.input };
}
