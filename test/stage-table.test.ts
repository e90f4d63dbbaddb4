/** The routing core's stage table (services/routing/README.md) is the stage list in request-path.ts. */
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { REQUEST_PATH, stagesOf } from "../services/routing/mod.js";

const routing = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "services", "routing");

/** The rows of the stage table in the routing core's README. */
function documentedStages(): Array<{ name: string; phase: string; files: string[] }> {
  const text = readFileSync(path.join(routing, "README.md"), "utf8");
  const section = text.slice(text.indexOf("## The request path"), text.indexOf("## Around the stages"));
  return section
    .split("\n")
    .filter((l) => /^\| \d+ \|/.test(l))
    .map((l) => {
      const cells = l.split("|").map((c) => c.trim());
      return { name: (cells[2] ?? "").replaceAll("`", ""), phase: cells[3] ?? "", files: [...(cells[4] ?? "").matchAll(/`([^`]+)`/g)].map((m) => m[1] as string) };
    });
}

describe("docs - the request path's stage table", () => {
  it("is the stage list: same stages, same order, same phases, files that exist", () => {
    const documented = documentedStages();
    expect(documented.map((d) => [d.name, d.phase])).toEqual(stagesOf(REQUEST_PATH).map((s) => [s.name, s.phase]));
    for (const d of documented) {
      expect(d.files.length).toBeGreaterThan(0);
      for (const f of d.files) expect(existsSync(path.join(routing, f)), `${d.name}: ${f}`).toBe(true);
    }
  });
});
