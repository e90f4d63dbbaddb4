/**
 * Test file order: the longest files first (their wall seconds in test/file-durations.json, written
 * by scripts/test-durations.mjs from a run's JSON report), then files not listed there in vitest's
 * own order (largest first). A fresh clone has no vitest cache, so vitest alone would start files
 * by size, and a small file that drives a long benchmark (the fault suite) started late and ran
 * alone at the end. Longest-first keeps both workers busy to the end.
 */
import { readFileSync } from "node:fs";
import path from "node:path";
import { BaseSequencer, type TestSpecification } from "vitest/node";

const DURATIONS: Readonly<Record<string, number>> = (() => {
  try {
    return JSON.parse(readFileSync(new URL("./file-durations.json", import.meta.url), "utf8")) as Record<string, number>;
  } catch {
    return {};
  }
})();

export class LongestFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const base = await super.sort(files);
    const rank = new Map(base.map((f, i) => [f, i]));
    const seconds = (f: TestSpecification) => DURATIONS[path.relative(f.project.config.root, f.moduleId).split(path.sep).join("/")];
    return [...base].sort((a, b) => {
      // Group order stays as vitest sorted it. Within a group, the unit project's files come last,
      // as one block: vitest keeps a non-isolated worker only while the next file is of the same
      // project, so interleaving them with other files would start a process per file again.
      const group = a.project.config.sequence.groupOrder - b.project.config.sequence.groupOrder;
      if (group !== 0) return (rank.get(a) as number) - (rank.get(b) as number);
      const unit = Number(a.project.name === "unit") - Number(b.project.name === "unit");
      if (unit !== 0) return unit;
      const sa = seconds(a);
      const sb = seconds(b);
      if (sa !== undefined && sb !== undefined && sa !== sb) return sb - sa;
      if (sa !== undefined && sb === undefined) return -1;
      if (sa === undefined && sb !== undefined) return 1;
      return (rank.get(a) as number) - (rank.get(b) as number);
    });
  }
}
