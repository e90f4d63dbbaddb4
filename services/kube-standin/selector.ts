/**
 * Kubernetes label selectors (the string form of `?labelSelector=`): `k`, `!k`, `k=v`, `k==v`,
 * `k!=v`, `k in (a,b)`, `k notin (a,b)`, joined by commas. Pure.
 */
export type Requirement =
  | { key: string; op: "exists" | "!exists" }
  | { key: string; op: "in" | "notin"; values: string[] };

export class SelectorError extends Error {
  override name = "SelectorError";
}

/** Splits on commas outside parentheses. */
function terms(s: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let cur = "";
  for (const ch of s) {
    if (ch === "(") depth++;
    if (ch === ")") depth--;
    if (ch === "," && depth === 0) {
      out.push(cur);
      cur = "";
    } else cur += ch;
  }
  out.push(cur);
  return out.map((t) => t.trim()).filter((t) => t.length > 0);
}

const KEY = /^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$/;

export function parseSelector(s: string | undefined): Requirement[] {
  if (!s) return [];
  if (s.length > 4096) throw new SelectorError("label selector longer than 4096 characters");
  return terms(s).map((t): Requirement => {
    let m = /^(\S+)\s+(in|notin)\s+\(([^)]*)\)$/.exec(t);
    if (m) return { key: key(m[1] as string), op: m[2] as "in" | "notin", values: (m[3] as string).split(",").map((v) => v.trim()).filter((v) => v.length > 0) };
    m = /^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$/.exec(t);
    if (m) return { key: key(m[1] as string), op: m[2] === "!=" ? "notin" : "in", values: [m[3] as string] };
    if (t.startsWith("!")) return { key: key(t.slice(1).trim()), op: "!exists" };
    return { key: key(t), op: "exists" };
  });
}

function key(k: string): string {
  if (!KEY.test(k)) throw new SelectorError(`invalid label key ${JSON.stringify(k.slice(0, 100))}`);
  return k;
}

export function matches(req: readonly Requirement[], labels: Readonly<Record<string, string>> | undefined): boolean {
  const l = labels ?? {};
  for (const r of req) {
    const has = Object.hasOwn(l, r.key);
    switch (r.op) {
      case "exists":
        if (!has) return false;
        break;
      case "!exists":
        if (has) return false;
        break;
      case "in":
        if (!has || !r.values.includes(l[r.key] as string)) return false;
        break;
      case "notin":
        if (has && r.values.includes(l[r.key] as string)) return false;
        break;
    }
  }
  return true;
}
