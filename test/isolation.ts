/**
 * Which test files may share a worker process (vitest `isolate: false`).
 *
 * Most of the suite's files are unit tests: they start no nats-server, spawn no process and stub
 * nothing global. Giving each of them a fresh process costs ~1 s of start-up and module loading per
 * file, which on two cores was a fifth of the suite's wall time. Those files run in the `unit`
 * project, whose workers run one file after another with the module cache kept.
 *
 * A file is a unit file unless
 * - its source stubs a module, a timer, the clock, a global or the environment, listens on
 *   `process`, registers a routing strategy (once per process), or says `// test: own process`;
 * - or it, or any module it imports (relative imports, followed transitively), can start a process
 *   or open ZMQ sockets: `node:child_process`, `zeromq`.
 * Servers a unit file starts in its own process (HTTP, gRPC on a free port) are fine: it closes them.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";

const TEST_FILE_MARKERS = [
  /vi\.(mock|doMock|useFakeTimers|setSystemTime|stubEnv|stubGlobal)\b/,
  /process\.env\b/,
  /process\.on\(/,
  /globalThis\.\w+\s*=[^=]/,
  /Object\.defineProperty\(globalThis/,
  // A strategy registered once per process: a second file would register it again.
  /registerStrategy\(/,
  /\/\/ test: own process/,
];
const MODULE_MARKERS = [/["']node:child_process["']/, /["']child_process["']/, /["']zeromq["']/];
const IMPORT = /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)["'](\.{1,2}\/[^"']+)["']/g;

/** Relative specifiers a source imports (static, dynamic and side-effect imports). */
export function relativeImports(source: string): string[] {
  return [...source.matchAll(IMPORT)].map((m) => m[1] as string);
}

function resolve(from: string, spec: string): string | undefined {
  const base = path.resolve(path.dirname(from), spec);
  for (const c of [base.replace(/\.js$/, ".ts"), base, `${base}.ts`, path.join(base, "index.ts")]) {
    if (c.endsWith(".ts") && existsSync(c)) return c;
  }
  return undefined;
}

interface Module {
  marked: boolean;
  deps: string[];
}

function load(file: string, cache: Map<string, Module>): Module {
  let m = cache.get(file);
  if (!m) {
    const src = readFileSync(file, "utf8");
    const deps = relativeImports(src).flatMap((spec) => resolve(file, spec) ?? []);
    m = { marked: MODULE_MARKERS.some((re) => re.test(src)), deps };
    cache.set(file, m);
  }
  return m;
}

/** True when `file`, or a module it imports transitively, names a module marker. */
function reachesProcess(file: string, cache: Map<string, Module>): boolean {
  const seen = new Set<string>([file]);
  const todo = [file];
  for (let f = todo.pop(); f !== undefined; f = todo.pop()) {
    const m = load(f, cache);
    if (m.marked) return true;
    for (const d of m.deps) {
      if (!seen.has(d)) {
        seen.add(d);
        todo.push(d);
      }
    }
  }
  return false;
}

function walk(dir: string, out: string[]): void {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.name === "node_modules" || e.name === "dist" || e.name.startsWith(".")) continue;
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, out);
    else if (e.name.endsWith(".test.ts")) out.push(p);
  }
}

/** The unit files under `dirs` (relative to `root`), as root-relative paths with `/`. */
export function unitTestFiles(root: string, dirs: readonly string[]): string[] {
  const files: string[] = [];
  for (const d of dirs) walk(path.join(root, d), files);
  const cache = new Map<string, Module>();
  return files
    .filter((f) => !TEST_FILE_MARKERS.some((re) => re.test(readFileSync(f, "utf8"))) && !reachesProcess(f, cache))
    .map((f) => path.relative(root, f).split(path.sep).join("/"))
    .sort();
}
