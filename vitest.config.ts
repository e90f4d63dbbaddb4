import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["services/**/*.test.ts", "streams/**/*.test.ts", "schemas/**/*.test.ts", "test/**/*.test.ts", "loadtest/**/*.test.ts", "deploy/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    // Two cores: integration files each start their own nats-server and processes.
    maxWorkers: 2,
    reporters: ["default"],
  },
});
