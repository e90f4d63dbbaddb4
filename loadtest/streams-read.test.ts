import { describe, expect, it } from "vitest";
import { chunkContent, drainSseData } from "./streams-read.js";

describe("SSE reading for the benchmarks", () => {
  it("takes whole events only, keeps a partial one for the next chunk, and passes [DONE] on", () => {
    const seen: string[] = [];
    let buf = drainSseData('data: {"choices":[{"delta":{"content":"he"}}]}\n\ndata: {"choi', (d) => seen.push(d));
    expect(seen).toEqual(['{"choices":[{"delta":{"content":"he"}}]}']);
    buf = drainSseData(`${buf}ces":[{"delta":{"content":"llo"}}]}\n\n: comment\n\ndata: [DONE]\n\n`, (d) => seen.push(d));
    expect(buf).toBe("");
    expect(seen.slice(1)).toEqual(['{"choices":[{"delta":{"content":"llo"}}]}', "[DONE]"]);
  });

  it("a chunk's content: non-empty strings only", () => {
    expect(chunkContent('{"choices":[{"delta":{"content":"x"}}]}')).toBe("x");
    expect(chunkContent('{"choices":[{"delta":{"role":"assistant","content":""}}]}')).toBeUndefined();
    expect(chunkContent('{"choices":[]}')).toBeUndefined();
    expect(chunkContent("not json")).toBeUndefined();
  });
});
