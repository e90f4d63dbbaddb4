import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";
import { unitTestFiles } from "./test/isolation.js";
import { LongestFirstSequencer } from "./test/sequencer.js";

/**
 * Benchmark tests that saturate both cores on purpose (many gateway processes and load
 * generators): they run after the integration files, so their load cannot starve those
 * timing-sensitive tests, nor theirs skew these figures. The unit files run beside them: they
 * assert no timing, and they fill the core the bench leaves idle between its measured windows
 * (before, the unit files ran with the integration files and the bench ran alone at the end).
 */
const SATURATING = ["loadtest/benches/scale.test.ts"];

const DIRS = ["services", "streams", "schemas", "test", "loadtest", "deploy"];
/** Unit files share worker processes (test/isolation.ts says which and why). */
const UNIT = unitTestFiles(fileURLToPath(new URL(".", import.meta.url)), DIRS).filter((f) => !SATURATING.includes(f));

export default defineConfig({
  test: {
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    // The longest files first (test/file-durations.json): see test/sequencer.ts.
    sequence: { sequencer: LongestFirstSequencer },
    // Two cores: integration files each start their own nats-server and processes.
    maxWorkers: 2,
    reporters: ["default"],
    // The tests start their own plain nats-servers: a developer's NATS_* settings for the nats
    // CLI (read by every jetroute process) must not leak into them. Empty counts as unset.
    env: Object.fromEntries(["NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_CREDS", "NATS_NKEY", "NATS_CA", "NATS_CERT", "NATS_KEY"].map((k) => [k, ""])),
    projects: [
      {
        extends: true,
        test: {
          name: "main",
          include: DIRS.map((d) => `${d}/**/*.test.ts`),
          exclude: [...SATURATING, ...UNIT],
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: { name: "unit", include: UNIT, isolate: false, sequence: { groupOrder: 1 } },
      },
      {
        extends: true,
        test: { name: "saturating", include: SATURATING, sequence: { groupOrder: 1 } },
      },
    ],
  },
});
