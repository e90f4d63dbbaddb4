/**
 * Whether two chat messages (as normalised for a template) are the same, for reusing a cached
 * render: string fields compared directly (a flat string compare is a memory compare), other
 * fields (tool calls) by a structural walk that is as strict as comparing their JSON texts (key
 * order included) without printing them — the history of an agent conversation holds hundreds of
 * tool calls, compared on every request. Pure.
 */
export function sameJson(x: unknown, y: unknown): boolean {
  if (x === y) return true;
  if (typeof x !== "object" || typeof y !== "object" || x === null || y === null) return false;
  if (Array.isArray(x)) {
    if (!Array.isArray(y) || x.length !== y.length) return false;
    for (let i = 0; i < x.length; i++) if (!sameJson(x[i], y[i])) return false;
    return true;
  }
  if (Array.isArray(y)) return false;
  const kx = Object.keys(x);
  const ky = Object.keys(y);
  if (kx.length !== ky.length) return false;
  for (let i = 0; i < kx.length; i++) {
    const k = kx[i] as string;
    if (k !== ky[i] || !sameJson((x as Record<string, unknown>)[k], (y as Record<string, unknown>)[k])) return false;
  }
  return true;
}

export function sameMessage(a: Record<string, unknown>, b: Record<string, unknown>): boolean {
  return sameJson(a, b);
}
