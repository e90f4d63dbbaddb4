/**
 * Header maps as Envoy holds them (lower-cased names, repeated values kept apart) and the rules
 * Envoy's ext_proc filter applies to a processor's header mutations with its default
 * `mutation_rules`.
 */
import type { HeaderMutationResult } from "../extproc/envoy-client.js";

export type HeaderList = Map<string, string[]>;

/** Connection-scoped headers a proxy never forwards (RFC 9110 §7.6.1, plus the legacy ones). */
const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"]);

export function isHopByHop(name: string): boolean {
  return HOP_BY_HOP.has(name);
}

/**
 * Headers the default mutation rules never let a processor set: routing headers (unless
 * `allow_all_routing`) and Envoy's own `x-envoy-*` (unless `allow_envoy`).
 */
function settable(name: string): boolean {
  if (name === "host" || name === ":authority" || name === ":method" || name === ":scheme") return false;
  return !name.startsWith("x-envoy-");
}

/** Removing a pseudo header or `host` is ignored (ext_proc API: HeaderMutation.remove_headers). */
function removable(name: string): boolean {
  return !name.startsWith(":") && name !== "host" && !name.startsWith("x-envoy-");
}

/** Applies a mutation in Envoy's order: every removal, then every set entry in sequence. */
export function applyMutation(headers: HeaderList, m: HeaderMutationResult): void {
  for (const name of m.remove) if (removable(name)) headers.delete(name);
  for (const e of m.entries) {
    if (!settable(e.key)) continue;
    const present = headers.get(e.key);
    switch (e.action) {
      case "append":
        if (present) present.push(e.value);
        else headers.set(e.key, [e.value]);
        break;
      case "add-if-absent":
        if (!present) headers.set(e.key, [e.value]);
        break;
      case "overwrite-or-add":
        headers.set(e.key, [e.value]);
        break;
      case "overwrite-if-exists":
        if (present) headers.set(e.key, [e.value]);
        break;
    }
  }
}

export function first(headers: HeaderList, name: string): string | undefined {
  return headers.get(name)?.[0];
}

/** The list as the ext_proc client takes it. */
export function toHeaderInput(headers: HeaderList): Record<string, string[]> {
  return Object.fromEntries(headers);
}

/** Regular (non-pseudo) headers for `node:http`; repeated values stay arrays. */
export function toNodeHeaders(headers: HeaderList): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of headers) {
    if (k.startsWith(":") || v.length === 0) continue;
    out[k] = v.length === 1 ? (v[0] as string) : v;
  }
  return out;
}

/** From `node:http`'s `headersDistinct`, dropping hop-by-hop headers. */
export function fromNodeHeaders(distinct: Record<string, string[] | undefined>, skip: readonly string[] = []): HeaderList {
  const out: HeaderList = new Map();
  for (const [k, v] of Object.entries(distinct)) {
    if (!v || isHopByHop(k) || skip.includes(k)) continue;
    out.set(k, [...v]);
  }
  return out;
}

/** `ip:port` (or `[ipv6]:port`) -> host and port; undefined when it is not one. */
export function parseEndpoint(raw: string): { host: string; port: number } | undefined {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(raw) ?? /^([^:]+):(\d+)$/.exec(raw);
  if (!m?.[1] || !m[2]) return undefined;
  const port = Number(m[2]);
  if (port < 1 || port > 65_535) return undefined;
  return { host: m[1], port };
}

/**
 * The endpoints the gateway named, in order: `x-gateway-destination-endpoint`'s list (the first is
 * the chosen one, the rest fallbacks to try in order; invalid entries skipped, at most 16), else
 * AIBrix's `target-pod`.
 */
export function destinationEndpoints(headers: HeaderList): { host: string; port: number }[] {
  const list = first(headers, "x-gateway-destination-endpoint")?.split(",").map((s) => s.trim()).filter(Boolean) ?? [];
  const raw = list.length > 0 ? list.slice(0, 16) : [first(headers, "target-pod")?.trim() ?? ""];
  return raw.map(parseEndpoint).filter((e): e is { host: string; port: number } => e !== undefined);
}

/** The endpoint the gateway chose: the first of `destinationEndpoints`. */
export function chosenEndpoint(headers: HeaderList): { host: string; port: number } | undefined {
  return destinationEndpoints(headers)[0];
}
