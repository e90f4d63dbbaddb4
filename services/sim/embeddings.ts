/**
 * The simulator's OpenAI `/v1/embeddings`: deterministic vectors in which texts sharing words are
 * close. Each text is a normalised sum of hashed features — its lower-case words, and their
 * character trigrams at half weight (so `integral` and `integrals` are near too) — in
 * EMBEDDING_DIMENSIONS dimensions, each feature adding ±1 to one dimension chosen by its hash.
 * Two texts without a shared word or trigram are nearly orthogonal; the same text always gets the
 * same vector on every pod.
 */
import { createHash } from "node:crypto";
import { badRequest } from "./errors.js";
import type { Handler } from "./pod-http.js";
import { readJson, sendJson } from "./pod-http.js";
import { asObject, checkModel, type ServedModel } from "./requests.js";

export const EMBEDDING_DIMENSIONS = 256;
/** Most inputs one request may embed. */
const MAX_INPUTS = 2048;

function feature(v: Float64Array, f: string, weight: number): void {
  const h = createHash("md5").update(f).digest();
  const i = h.readUInt16LE(0) % v.length;
  v[i] = (v[i] as number) + ((h[2] as number) & 1 ? weight : -weight);
}

/** The vector of a text (unit length; all zeros for a text without words). */
export function simEmbedding(text: string, dims = EMBEDDING_DIMENSIONS): number[] {
  const v = new Float64Array(dims);
  for (const w of text.toLowerCase().split(/[^\p{L}\p{N}]+/u)) {
    if (w.length === 0) continue;
    feature(v, `w:${w}`, 1);
    const padded = ` ${w} `;
    for (let i = 0; i + 3 <= padded.length; i++) feature(v, `t:${padded.slice(i, i + 3)}`, 0.5);
  }
  let n = 0;
  for (const x of v) n += x * x;
  const norm = Math.sqrt(n) || 1;
  return Array.from(v, (x) => Math.round((x / norm) * 1e6) / 1e6);
}

function inputsOf(input: unknown): string[] {
  if (typeof input === "string") return [input];
  if (Array.isArray(input) && input.length > 0 && input.length <= MAX_INPUTS && input.every((x) => typeof x === "string")) return input as string[];
  throw badRequest(`input: a string or a list of 1 to ${MAX_INPUTS} strings is required`, "input");
}

/** POST /v1/embeddings for the pod's served model. */
export function embeddingsRoute(served: ServedModel): Handler {
  return async (req, res) => {
    const body = asObject(await readJson(req));
    const model = checkModel(body, served);
    const texts = inputsOf(body.input);
    const tokens = texts.reduce((a, t) => a + Math.ceil(t.length / 4), 0);
    sendJson(res, 200, {
      object: "list",
      model,
      data: texts.map((t, index) => ({ object: "embedding", index, embedding: simEmbedding(t) })),
      usage: { prompt_tokens: tokens, total_tokens: tokens },
    });
  };
}
