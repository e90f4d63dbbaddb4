/** Small HTTP and Prometheus-text helpers for tests that talk to simulated pods over real sockets, and the engine tests' fixture. */
import type { EngineConfig } from "./engine.js";

/** A small engine for the scheduler's unit tests: 4 sequences, 16-token blocks, 1 ms a prompt token, 10 ms a decode step. */
export const testEngineConfig: Readonly<EngineConfig> = {
  maxBatch: 4,
  maxNumBatchedTokens: 2048,
  prefillMsPerToken: 1,
  decodeMsPerStep: 10,
  decodeBatchSlope: 0.1,
  kvCapacityTokens: 16_384,
  blockSize: 16,
};

export async function postJson(address: string, path: string, body: unknown, init: RequestInit = {}): Promise<Response> {
  return fetch(`http://${address}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
    ...init,
  });
}

/** Splits an SSE body into its `data:` payloads ("[DONE]" kept as a string). */
export function sseData(text: string): string[] {
  return text
    .split("\n\n")
    .filter((e) => e.startsWith("data: "))
    .map((e) => e.slice("data: ".length));
}

/** The value of the first sample named `name` whose labels include every pair in `labels`. */
export function metricValue(exposition: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of exposition.split("\n")) {
    if (line.startsWith("#")) continue;
    const m = /^([^\s{]+)(\{[^}]*\})?\s+(\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const labelText = m[2] ?? "";
    if (Object.entries(labels).every(([k, v]) => labelText.includes(`${k}="${v}"`))) return Number(m[3]);
  }
  return undefined;
}

export async function scrape(address: string): Promise<string> {
  const res = await fetch(`http://${address}/metrics`);
  return res.text();
}

/** Response bodies are asserted on field by field, so tests read them untyped. */
// biome-ignore lint/suspicious/noExplicitAny: see above
export async function json(res: Response | Promise<Response>): Promise<any> {
  return (await res).json();
}
