/**
 * Helpers the benchmarks share for reading what a run left behind: the settled size of the
 * DECISIONS stream, and the `data:` payloads of an OpenAI server-sent event stream.
 */
import type { JetStreamManager } from "@nats-io/jetstream";

/**
 * Polls a stream's message count until it holds at least `atLeast` and has not grown for 5 polls
 * (100 ms apart), or `timeoutMs` passes. Returns the last count and whether it settled.
 */
export async function settledMessageCount(jsm: JetStreamManager, stream: string, atLeast: number, timeoutMs: number): Promise<{ count: number; settled: boolean }> {
  const deadline = performance.now() + timeoutMs;
  let last = -1;
  let stable = 0;
  for (;;) {
    const n = (await jsm.streams.info(stream)).state.messages;
    stable = n === last ? stable + 1 : 0;
    last = n;
    if (n >= atLeast && stable >= 5) return { count: n, settled: true };
    if (performance.now() > deadline) return { count: n, settled: false };
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Takes the complete events off an SSE buffer, calls `onData` with each `data:` payload (`[DONE]` included), returns the rest. */
export function drainSseData(buf: string, onData: (data: string) => void): string {
  let rest = buf;
  for (let sep = rest.indexOf("\n\n"); sep >= 0; sep = rest.indexOf("\n\n")) {
    const event = rest.slice(0, sep);
    rest = rest.slice(sep + 2);
    for (const line of event.split("\n")) if (line.startsWith("data: ")) onData(line.slice(6));
  }
  return rest;
}

/** The content of a chat completion chunk's first choice, if the payload is one and carries any. */
export function chunkContent(data: string): string | undefined {
  try {
    const piece = (JSON.parse(data) as { choices?: Array<{ delta?: { content?: unknown } }> }).choices?.[0]?.delta?.content;
    return typeof piece === "string" && piece.length > 0 ? piece : undefined;
  } catch {
    return undefined;
  }
}
