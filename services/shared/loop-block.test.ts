import { describe, expect, it } from "vitest";
import { startLoopBlockProbe, threadCpuMs } from "./loop-block.js";

describe("loop-block - the event loop's longest block as own CPU", () => {
  it("reports a synchronous run of the thread's own CPU, and starts a new window after take()", async () => {
    const probe = startLoopBlockProbe();
    try {
      // Spin for 30 ms of this thread's CPU (not wall time: a loaded host may deschedule us).
      const start = threadCpuMs();
      while (threadCpuMs() - start < 30) {
        /* busy */
      }
      // The probe records the block at its next tick.
      let block = probe.take();
      for (let i = 0; i < 200 && block.cpuMs < 25; i++) {
        await new Promise((r) => setTimeout(r, 2));
        block = { ...block, cpuMs: Math.max(block.cpuMs, probe.take().cpuMs) };
      }
      expect(block.cpuMs).toBeGreaterThanOrEqual(25);
      expect(block.wallMs).toBeGreaterThanOrEqual(0);
      // A quiet window after it holds no such block.
      await new Promise((r) => setTimeout(r, 20));
      probe.take();
      await new Promise((r) => setTimeout(r, 20));
      expect(probe.take().cpuMs).toBeLessThan(25);
    } finally {
      probe.stop();
    }
  });
});
