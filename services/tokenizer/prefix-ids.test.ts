import { describe, expect, it } from "vitest";
import { PrefixIdsCache } from "./prefix-ids.js";
import { SplitPoints } from "./split-points.js";

/** A toy encoder whose cuts after `<e>` are exact by construction: `<e>` is id 1, any other character its code + 1000. */
function toyEncode(text: string): number[] {
  const out: number[] = [];
  for (let i = 0; i < text.length; i++) {
    if (text.startsWith("<e>", i)) {
      out.push(1);
      i += 2;
    } else out.push(text.charCodeAt(i) + 1000);
  }
  return out;
}

function cache(): { c: PrefixIdsCache; encoded: string[] } {
  const encoded: string[] = [];
  const c = new PrefixIdsCache({
    splits: new SplitPoints({ boundaryTokens: ["<e>"] }),
    boundaryIds: new Map([["<e>", 1]]),
    maxBytes: 1 << 20,
    encode: async (t) => {
      encoded.push(t);
      return toyEncode(t);
    },
  });
  return { c, encoded };
}

const turn = (n: number) => `sys prompt<e>first task<e>${Array.from({ length: n }, (_, i) => `step ${i} of the agent loop<e>`).join("")}`;

describe("prefix ids as typed arrays", () => {
  it("a prompt's ids are one Uint32Array equal to the whole text's encode, on the first turn, an anchored later turn and the digest path", async () => {
    const { c, encoded } = cache();
    const anchorAt = "sys prompt<e>first task".length;
    const first = await c.encodeWithReuse("", turn(3), [10], anchorAt);
    expect(first.ids).toBeInstanceOf(Uint32Array);
    expect(Array.from(first.ids)).toEqual(toyEncode(turn(3)));
    expect(first.reused).toBeUndefined();
    // A later turn: the tail found by its anchor; only the text past it is encoded.
    const later = await c.encodeWithReuse("", turn(6), [10], anchorAt);
    expect(later.ids).toBeInstanceOf(Uint32Array);
    expect(Array.from(later.ids)).toEqual(toyEncode(turn(6)));
    expect(later.reused?.ids.length).toBe(toyEncode(turn(3)).length);
    expect(encoded.at(-1)).toBe(turn(6).slice(turn(3).length));
    expect(c.stats.anchoredHits).toBe(1);
    // An edited history under another anchor: the system prompt's entry (digest path), the rest encoded.
    const other = `sys prompt<e>another task<e>step 0 of the agent loop<e>`;
    const edited = await c.encodeWithReuse("", other, [10], "sys prompt<e>another task".length);
    expect(Array.from(edited.ids)).toEqual(toyEncode(other));
    expect(edited.reused?.ids.length).toBe(toyEncode("sys prompt<e>").length);
  });

  it("a stored entry owns a copy of its ids: it does not keep the prompt's array alive, nor change with it", async () => {
    const { c } = cache();
    const anchorAt = "sys prompt<e>first task".length;
    const r = await c.encodeWithReuse("", turn(4), [10], anchorAt);
    expect(r.stored.length).toBeGreaterThan(0);
    for (const e of r.stored) {
      expect(e.ids.buffer).not.toBe(r.ids.buffer);
      expect(e.ids.buffer.byteLength).toBe(e.ids.length * Uint32Array.BYTES_PER_ELEMENT);
      expect(Array.from(e.ids)).toEqual(Array.from(r.ids.subarray(0, e.ids.length)));
    }
    const tail = r.stored.find((e) => e.tail);
    const kept = Array.from(tail?.ids ?? []);
    r.ids.fill(0);
    expect(Array.from(tail?.ids ?? [])).toEqual(kept);
    // The next turn still gets the right ids from that entry.
    const next = await c.encodeWithReuse("", turn(5), [10], anchorAt);
    expect(next.reused).toBe(tail);
    expect(Array.from(next.ids)).toEqual(toyEncode(turn(5)));
    for (const e of next.stored) expect(e.ids.buffer).not.toBe(next.ids.buffer);
  });
});
