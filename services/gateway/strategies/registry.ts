/**
 * Strategies by name. A strategy is a small plugin: add it to this list and it becomes
 * selectable by the `routing-strategy` header and the `--strategy` flag.
 */
import { leastRequestStrategy } from "./least-request.js";
import { randomStrategy } from "./random.js";
import type { Strategy } from "./types.js";

const STRATEGIES: readonly Strategy[] = [randomStrategy, leastRequestStrategy];

const byName = new Map(STRATEGIES.map((s) => [s.name, s]));

export function strategyNames(): string[] {
  return [...byName.keys()];
}

export function findStrategy(name: string): Strategy | undefined {
  return byName.get(name);
}
