import { describe, expect, it } from "vitest";
import type { Logger } from "../shared/log.js";
import type { ApplyResult } from "../views/gateway-state.js";
import { RefusedRecordLog } from "./refused-records.js";

function fakeLog() {
  const lines: Array<{ level: string; msg: string; fields: Record<string, unknown> }> = [];
  const at = (level: string) => (fields: Record<string, unknown>, msg: string) => lines.push({ level, msg, fields });
  return { lines, log: { info: at("info"), warn: at("warn"), error: at("error") } as unknown as Logger };
}

const refused: ApplyResult = { applied: false, ignored: "signature", note: { level: "warn", message: "refused", fields: { reason: "unsigned" }, rejected: true } };
const invalid: ApplyResult = { applied: false, ignored: "invalid", note: { level: "error", message: "invalid", fields: {}, rejected: true } };

describe("refused records - log rate", () => {
  it("logs the first refusals of an interval, sums the rest in one line when the next one comes; other notes always", () => {
    let now = 0;
    const { lines, log } = fakeLog();
    const r = new RefusedRecordLog(log, { linesPerInterval: 2, intervalMs: 1_000, now: () => now });
    for (let i = 0; i < 50; i++) r.note(refused);
    r.note(invalid);
    r.note({ applied: true, note: { level: "info", message: "applied", fields: {} } });
    r.note({ applied: true });
    expect(lines.map((l) => l.msg)).toEqual(["refused", "refused", "invalid", "applied"]);
    now = 1_000;
    r.note(refused);
    r.stop();
    expect(lines.slice(4).map((l) => [l.msg, l.fields.notLogged])).toEqual([
      [expect.stringMatching(/^records refused for their signature beyond the log rate/), 48],
      ["refused", undefined],
    ]);
  });
});
