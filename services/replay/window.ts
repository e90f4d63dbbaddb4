/**
 * `--from` / `--to` of `jetroute replay` and `jetroute export`: a time (ISO 8601, or epoch
 * milliseconds), a time relative to now (`now`, `-15m`, `-2h`, `-30s`, `-1d`), or a sequence of
 * the DECISIONS stream (`seq:12345`, resolved to that record's server time by the caller). Pure.
 */

export type WindowBound = { kind: "time"; ms: number } | { kind: "seq"; seq: number };

const RELATIVE = /^-(\d+(?:\.\d+)?)(ms|s|m|h|d)$/;
const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

export function parseWindowBound(text: string, now: number): WindowBound {
  const t = text.trim();
  if (t === "now") return { kind: "time", ms: now };
  const rel = RELATIVE.exec(t);
  if (rel) return { kind: "time", ms: now - Number(rel[1]) * (UNIT_MS[rel[2] as string] as number) };
  if (t.startsWith("seq:")) {
    const seq = Number(t.slice(4));
    if (!Number.isSafeInteger(seq) || seq < 1) throw new Error(`expected seq:<positive integer>, got ${JSON.stringify(text)}`);
    return { kind: "seq", seq };
  }
  if (/^\d+$/.test(t)) {
    const ms = Number(t);
    // Epoch milliseconds; a small number is almost certainly a sequence meant as `seq:N`.
    if (ms < 1e11) throw new Error(`${JSON.stringify(text)} looks like a sequence number: write seq:${t} (or give a time)`);
    return { kind: "time", ms };
  }
  const ms = Date.parse(t);
  if (Number.isNaN(ms)) throw new Error(`cannot read ${JSON.stringify(text)} as a time: use ISO 8601 (2026-12-01T10:00:00Z), epoch ms, now, -15m/-2h/-1d, or seq:<n>`);
  return { kind: "time", ms };
}
