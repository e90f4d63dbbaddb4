import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { RouteError, type RoutedRequest } from "../routing/mod.js";
import { DecodeGuard, type DecodeGuardHost } from "./pd-decode-guard.js";

const watchdog = { firstChunkMs: 1_000, idleMs: 2_000, graceMs: 500 };

function setup(o: { started?: boolean; stream?: boolean } = {}) {
  const r = { pod: { pod: "d0" }, stream: o.stream ?? true, finished: false } as unknown as RoutedRequest;
  const seen = { immediate: [] as string[], failed: [] as string[], aborted: 0 };
  let started = o.started ?? false;
  const host: DecodeGuardHost = {
    watchdog,
    over: () => false,
    responseStarted: () => started,
    immediate: (err) => void seen.immediate.push(err.code),
    fail: (req, err) => {
      (req as { finished: boolean }).finished = true;
      seen.failed.push(err.code);
    },
    abortDecode: () => void seen.aborted++,
  };
  return { guard: new DecodeGuard(r, host), seen, start: () => (started = true) };
}

describe("P/D decode guard - watchdog and the gateway's error in the stream", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("no first chunk in time: the engine is told to stop and the client gets a 504 decode_timeout at once", () => {
    const { guard, seen } = setup();
    guard.routed();
    vi.advanceTimersByTime(999);
    expect(seen.immediate).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(seen).toEqual({ immediate: ["decode_timeout"], failed: ["decode_timeout"], aborted: 1 });
  });

  it("each chunk re-arms the idle watchdog; a non-streamed answer is never watched", () => {
    const { guard, seen } = setup({ started: true });
    guard.routed();
    vi.advanceTimersByTime(900);
    for (let i = 0; i < 5; i++) {
      guard.chunk(false, 10);
      vi.advanceTimersByTime(1_500);
    }
    expect(seen.aborted).toBe(0);
    vi.advanceTimersByTime(500);
    expect(seen.aborted).toBe(1);
    expect(guard.error?.code).toBe("decode_timeout");
    const whole = setup({ stream: false });
    whole.guard.routed();
    vi.advanceTimersByTime(60_000);
    expect(whole.seen.aborted).toBe(0);
  });

  it("after the response started, the error is spliced in as the last SSE event before [DONE], the engine's own [DONE] dropped", () => {
    const { guard, seen } = setup({ started: true });
    guard.end(new RouteError("prefillFailed", "prefill failed on p0"));
    expect(seen.immediate).toEqual([]);
    const mid = guard.splice(Buffer.from('data: {"x":1}\n\n'), false);
    expect(mid?.response_body?.response?.body_mutation?.body?.toString()).toBe('data: {"x":1}\n\n');
    const last = guard.splice(Buffer.from("data: [DONE]\n\n"), true)?.response_body?.response?.body_mutation?.body?.toString() ?? "";
    expect(last.endsWith("data: [DONE]\n\n")).toBe(true);
    expect(JSON.parse(last.slice("data: ".length, last.indexOf("\n\n")))).toMatchObject({ error: { code: "prefill_failed" } });
    expect(last.match(/\[DONE\]/g)).toHaveLength(1);
    // The stream ended: the grace reset does not fire.
    vi.advanceTimersByTime(10_000);
    expect(seen.failed).toEqual([]);
  });

  it("an engine stream that does not end after the gateway's error is reset after the grace period", () => {
    const { guard, seen } = setup({ started: true });
    guard.end(new RouteError("decodeTimeout", "no next chunk"));
    vi.advanceTimersByTime(499);
    expect(seen.failed).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(seen).toMatchObject({ immediate: ["decode_timeout"], failed: ["decode_timeout"] });
  });
});
