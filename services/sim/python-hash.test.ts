import { execFileSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { mulberry32 } from "../shared/seeded-random.js";
import { pythonTupleHash } from "./python-hash.js";

describe("CPython tuple hash (SGLang's block hash)", () => {
  it("equals python3's hash(tuple(ids)) on random pages, the empty tuple included", () => {
    const rnd = mulberry32(7);
    const pages = [[], [0], [1, 2, 3], ...Array.from({ length: 200 }, (_, i) => Array.from({ length: 1 + (i % 32) }, () => Math.floor(rnd() * 2 ** 32)))];
    const out = execFileSync("python3", ["-c", "import json,sys\nfor p in json.load(sys.stdin): print(hash(tuple(p)))"], { input: JSON.stringify(pages) });
    const py = out.toString().trim().split("\n").map((l) => BigInt(l));
    expect(pages.map((p) => pythonTupleHash(p))).toEqual(py);
  });
});
