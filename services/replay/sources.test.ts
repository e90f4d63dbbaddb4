import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { afterAll, describe, expect, it } from "vitest";
import type { ReplayMessage } from "./engine.js";
import { EXPORT_FORMAT, EXPORT_VERSION, type ExportHeader, fileSource, writeExport } from "./sources.js";

const dir = mkdtempSync(path.join(tmpdir(), "jr-sources-test-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const header: ExportHeader = { format: EXPORT_FORMAT, version: EXPORT_VERSION, prefix: "jr", window: { fromMs: 0, toMs: 1 }, createdAt: "2026-12-02T00:00:00.000Z" };

async function* once(ms: readonly ReplayMessage[]): AsyncGenerator<readonly ReplayMessage[]> {
  yield ms;
}

async function readAll(file: string): Promise<ReplayMessage[]> {
  const src = await fileSource(file);
  const out: ReplayMessage[] = [];
  for await (const b of src.batches) out.push(...b);
  return out;
}

describe("export files", () => {
  it("reads back every message written, across many read chunks, with multi-byte text split anywhere", async () => {
    // ~4 MB of lines with 2-, 3- and 4-byte characters: chunk boundaries fall inside characters and lines.
    const text = "é€😀 ".repeat(40);
    const msgs: ReplayMessage[] = Array.from({ length: 20_000 }, (_, i) => ({ stream: "charges", seq: i + 1, serverTs: 1_000 + i, subject: `jr.charges.m.p${i % 7}`, data: { i, text } }));
    const file = path.join(dir, "big.jsonl.gz");
    await writeExport(file, header, once(msgs));
    expect(await readAll(file)).toEqual(msgs);
  });

  it("accepts CRLF line ends and a last line without a line end, uncompressed", async () => {
    const m = { s: "pods", q: 1, t: 5, j: "jr.pods.m.p", d: { a: 1 } };
    const file = path.join(dir, "crlf.jsonl");
    writeFileSync(file, `${JSON.stringify(header)}\r\n${JSON.stringify(m)}\r\n${JSON.stringify({ ...m, q: 2 })}`);
    expect((await readAll(file)).map((x) => [x.stream, x.seq, x.data])).toEqual([
      ["pods", 1, { a: 1 }],
      ["pods", 2, { a: 1 }],
    ]);
  });

  it("stops at the end record and counts unreadable lines as skipped", async () => {
    const m = { s: "pods", q: 1, t: 5, j: "jr.pods.m.p", d: {} };
    const file = path.join(dir, "end.jsonl.gz");
    writeFileSync(file, gzipSync(`${JSON.stringify(header)}\nnot json\n${JSON.stringify(m)}\n${JSON.stringify({ end: true })}\n${JSON.stringify({ ...m, q: 2 })}\n`));
    const src = await fileSource(file);
    const out: ReplayMessage[] = [];
    for await (const b of src.batches) out.push(...b);
    expect(out.map((x) => x.seq)).toEqual([1]);
    expect(src.skipped()).toBe(1);
  });

  it("refuses a file that is not an export", async () => {
    const file = path.join(dir, "empty.jsonl");
    writeFileSync(file, "");
    await expect(fileSource(file)).rejects.toThrow(/not a jetroute export/);
  });
});
