/**
 * What a simulated request "generates": a deterministic function of the prompt (and the OpenAI
 * `seed`, when given), so repeated requests give repeatable text and tests can pin outputs.
 */
import { detokenize, fnv1a32, GENERATION_WORD_IDS } from "../tokenizer/sim-tokenizer.js";

/** Only the tail of a long prompt feeds the seed: it already differs between prompts and keeps this O(1). */
const SEED_TAIL_TOKENS = 64;

export function outputTokensFor(promptTokens: readonly number[], count: number, seed?: number, words: readonly number[] = GENERATION_WORD_IDS): number[] {
  let h = fnv1a32(`${promptTokens.length}:${seed ?? ""}`);
  for (const id of promptTokens.slice(-SEED_TAIL_TOKENS)) h = Math.imul(h ^ id, 0x01000193) >>> 0;
  const out = new Array<number>(count);
  for (let i = 0; i < count; i++) {
    h = Math.imul(h ^ (i + 0x9e37), 0x01000193) >>> 0;
    // FNV's low bits mix poorly; take the high half.
    out[i] = words[(h >>> 16) % words.length] ?? 0;
  }
  return out;
}

export function tokenText(tokenId: number): string {
  return detokenize([tokenId]);
}
