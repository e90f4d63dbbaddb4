/**
 * The one reversible escape for names used as subject tokens and KV keys.
 *
 * Model names (`org/Llama-3.1-8B`) and pod names (`vllm-0.ns`) contain characters a NATS subject
 * token cannot hold (`.`, `*`, `>`, whitespace). Every byte outside `[A-Za-z0-9_/-]` becomes `=XX`
 * (upper-case hex of its UTF-8 bytes), `=` included — so `=` is both legal in subjects and in KV
 * keys, and decoding is unambiguous. The original name always travels in the payload as well.
 */

const SAFE = /^[A-Za-z0-9_/-]$/;
const encoder = new TextEncoder();

export class TokenError extends Error {
  override name = "TokenError";
}

export function encodeToken(name: string): string {
  if (name.length === 0) throw new TokenError("a name used in a subject must not be empty");
  let out = "";
  for (const ch of name) {
    if (SAFE.test(ch)) {
      out += ch;
      continue;
    }
    for (const b of encoder.encode(ch)) out += `=${b.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

export function decodeToken(token: string): string {
  if (token.length === 0) throw new TokenError("empty subject token");
  const bytes: number[] = [];
  for (let i = 0; i < token.length; i++) {
    const c = token.charCodeAt(i);
    if (c === 0x3d /* = */) {
      const hex = token.slice(i + 1, i + 3);
      if (!/^[0-9A-F]{2}$/.test(hex)) throw new TokenError(`bad escape at ${i} in subject token ${JSON.stringify(token)}`);
      bytes.push(Number.parseInt(hex, 16));
      i += 2;
    } else if (SAFE.test(token[i] as string)) {
      bytes.push(c);
    } else {
      throw new TokenError(`unescaped character ${JSON.stringify(token[i])} in subject token ${JSON.stringify(token)}`);
    }
  }
  return new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(bytes));
}
