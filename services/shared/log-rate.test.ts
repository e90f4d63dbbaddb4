/**
 * The dead-letter log rate: a pure rule on an injected clock (LogRate), and the per-process shell
 * that writes the lines (DeadLetterLog), both on a fake clock.
 */
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { DEAD_LETTER_DEFAULTS, DeadLetterLog } from "./dead-letter.js";
import { LogRate } from "./log-rate.js";

describe("LogRate", () => {
  it("logs the first N of an interval, holds the rest and reports them once when the interval is over", () => {
    const r = new LogRate(3, 1_000);
    const at = (t: number, n: number) => Array.from({ length: n }, () => r.admit(t));
    expect(at(0, 3).map((d) => d.log)).toEqual([true, true, true]);
    expect(at(10, 997).every((d) => !d.log && d.summary === 0)).toBe(true);
    expect(r.dueAt).toBe(1_000);
    expect(r.flush(999)).toBe(0); // not yet
    expect(r.flush(1_000)).toBe(997);
    expect(r.flush(1_001)).toBe(0); // reported once
    expect(r.dueAt).toBeUndefined();
    // The next interval starts with the next event, logged at once.
    expect(r.admit(5_000)).toEqual({ log: true, summary: 0 });
  });

  it("an event after an unflushed interval carries its count (the summary comes first)", () => {
    const r = new LogRate(1, 100);
    expect(r.admit(0)).toEqual({ log: true, summary: 0 });
    expect(r.admit(50)).toEqual({ log: false, summary: 0 });
    expect(r.admit(60)).toEqual({ log: false, summary: 0 });
    expect(r.admit(100)).toEqual({ log: true, summary: 2 });
    expect(r.dueAt).toBeUndefined();
  });

  it("a steady flood writes at most N + 1 lines per interval", () => {
    const r = new LogRate(5, 1_000);
    let lines = 0;
    const perInterval = new Map<number, number>();
    for (let t = 0; t < 60_000; t += 3) {
      const d = r.admit(t);
      const n = (d.log ? 1 : 0) + (d.summary > 0 ? 1 : 0);
      lines += n;
      perInterval.set(Math.floor(t / 1_000), (perInterval.get(Math.floor(t / 1_000)) ?? 0) + n);
    }
    expect(Math.max(...perInterval.values())).toBeLessThanOrEqual(6);
    expect(lines).toBeLessThanOrEqual(60 * 6);
  });

  it("0 lines per interval: summaries only; bad bounds are refused", () => {
    const r = new LogRate(0, 10);
    expect(r.admit(0).log).toBe(false);
    expect(r.flush(10)).toBe(1);
    expect(() => new LogRate(-1, 10)).toThrow(/integer >= 0/);
    expect(() => new LogRate(1.5, 10)).toThrow(/integer >= 0/);
    expect(() => new LogRate(1, 0)).toThrow(/> 0 ms/);
  });
});

describe("DeadLetterLog", () => {
  const capture = () => {
    const lines: Array<Record<string, unknown>> = [];
    return { lines, log: pino({ level: "info" }, { write: (s: string) => void lines.push(JSON.parse(s)) }) };
  };

  it("a burst of 1,000 dead letters writes the first few lines and one summary with the exact count", () => {
    let now = 0;
    const l = new DeadLetterLog({ now: () => now });
    const { lines, log } = capture();
    for (let i = 0; i < 1_000; i++) l.warn(log, { i }, "dead-lettered");
    const n = DEAD_LETTER_DEFAULTS.logLinesPerInterval;
    expect(lines).toHaveLength(n);
    expect(l).toMatchObject({ seen: 1_000, logged: n, held: 1_000 - n });
    l.flush(); // the interval is not over: nothing yet
    expect(lines).toHaveLength(n);
    now = DEAD_LETTER_DEFAULTS.logIntervalMs;
    l.flush();
    expect(lines).toHaveLength(n + 1);
    expect(lines[n]).toMatchObject({ notLogged: 1_000 - n, deadLetters: 1_000, intervalMs: DEAD_LETTER_DEFAULTS.logIntervalMs });
    l.flush();
    expect(lines).toHaveLength(n + 1);
  });
});
