/**
 * Short versions of the faults bench (seconds, small load), and its runner's time limit. The
 * kill-gateway case drives gateway processes and the runner runs each case as a process: both need
 * the build (`npm run build --silent`; npm test builds first).
 */
import { describe, expect, it } from "vitest";
import { processGroupMembers } from "../case-process.js";
import { clockSkewCase, type FaultCaseName, faultsDefaults, killGatewayCase, killNatsNodeBatchCase, killNatsNodeCase, runFaultsBench } from "./faults.js";

const short = faultsDefaults({ rate: 150, inProcessRate: 80, holdMs: 150, phaseMs: 1_500, heartbeatMs: 200 });

describe("faults bench (short)", () => {
  it("kill -9 of one of 3 gateways: only its in-flight requests fail, its charges leave the survivors within the heartbeat timeout", async () => {
    const r = await killGatewayCase(short);
    expect(r.case).toBe("kill-gateway");
    expect(r.requests).toBeGreaterThan(200);
    expect(r.failed_before_kill).toBe(0);
    expect(r.failed).toBeLessThanOrEqual(r.in_flight_at_victim as number);
    // Timeout (3 x 200 ms) + a sweep + slack for a loaded 2-core machine.
    expect(r.heal_ms).toBeLessThan(600 + 250 + 1_000);
    expect(r.heal_ms).toBeGreaterThan(200);
  }, 60_000);

  it("kill of the CHARGES leader of a 3-node cluster, strict mode: no acked charge lost, routing goes on, a key revoked afterwards is refused", async () => {
    const r = await killNatsNodeCase("strict", short);
    expect(r.case).toBe("kill-nats-node-strict");
    expect(r.strict_acks as number).toBeGreaterThan(0);
    expect(r.acked_events_lost).toBe(0);
    expect(r.failed, JSON.stringify(r)).toBe(0);
    expect(r.revoked_key_refused).toBe(true);
    // Routing went on: every gateway routed its probes after the kill (the case fails past its own
    // 60 s deadline). How long the cluster took to elect a new leader is a load figure the bench
    // reports, not a property: on a saturated 2-core host it ranged 17-45 s.
    expect(r.heal_ms).toBeGreaterThan(0);
  }, 150_000);

  it("kill of the batch work queue's leader of a 3-node cluster mid-batch: the batch completes, 0 items lost, 0 output lines duplicated", async () => {
    const r = await killNatsNodeBatchCase({ ...short, batchItems: 300 });
    expect(r.case).toBe("kill-nats-node-batch");
    expect(r.done_at_kill as number).toBeLessThan(300);
    expect(r, JSON.stringify(r)).toMatchObject({ status: "completed", lost: 0, duplicated: 0, failed: 0, completed: 300 });
  }, 90_000);

  it("a gateway with its clock off by +/-5 s drops no peer charge, and its own charges are released everywhere", async () => {
    const r = await clockSkewCase({ ...short, phaseMs: 1_200 });
    expect(r.case).toBe("clock-skew");
    expect(r.failed).toBe(0);
    expect(r.peer_charges_dropped).toBe(0);
    for (const row of r.skews as Array<Record<string, unknown>>) {
      expect(row, JSON.stringify(row)).toMatchObject({ peer_dead_at_skewed_samples: 0, skewed_dead_at_peer_samples: 0, expired_at_skewed: 0, expired_at_peer: 0, left_after_ms: { skewed_ledger: 0, peer_ledger: 0 } });
      expect(row.peer_charges_at_skewed_mid_load as number).toBeGreaterThan(0);
      expect(row.skewed_charges_at_peer_mid_load as number).toBeGreaterThan(0);
    }
    expect(r.heal_ms).toBeLessThan(3_000);
  }, 30_000);

  it("a case past its time limit is stopped with every process it started and reported as timed out; the next case still runs", async () => {
    const groups = new Map<FaultCaseName, number>();
    // The most processes each case's group held at once (the case's own process included).
    const most = new Map<FaultCaseName, number>();
    const pollers: NodeJS.Timeout[] = [];
    const r = await runFaultsBench(
      // NATS stays down for 10 minutes: the case cannot end before its 8 s limit.
      { ...short, cases: ["nats-down-30s", "kill-kv-bridge"], outageMs: 600_000, kvRequests: 10, caseTimeoutMs: { "nats-down-30s": 8_000 } },
      {
        onCaseStart: (c, pgid) => {
          groups.set(c, pgid);
          pollers.push(setInterval(() => most.set(c, Math.max(most.get(c) ?? 0, processGroupMembers(pgid).length)), 100));
        },
      },
    ).finally(() => {
      for (const p of pollers) clearInterval(p);
    });
    expect(r.cases[0]).toEqual({ case: "nats-down-30s", timed_out: true, elapsed_ms: expect.any(Number) });
    expect(r.cases[0]?.elapsed_ms).toBeGreaterThanOrEqual(8_000);
    // It had started a nats-server (and gateway processes) besides itself; none of them is left.
    expect(most.get("nats-down-30s")).toBeGreaterThanOrEqual(2);
    expect(processGroupMembers(groups.get("nats-down-30s") as number)).toEqual([]);
    expect(r.cases[1]).toMatchObject({ case: "kill-kv-bridge", failed: 0, acked_events_lost: 0 });
    expect(r.cases[1]).not.toHaveProperty("timed_out");
    expect(processGroupMembers(groups.get("kill-kv-bridge") as number)).toEqual([]);
    expect(r.total_ms).toBeGreaterThanOrEqual((r.cases[0]?.elapsed_ms ?? 0) + (r.cases[1]?.elapsed_ms ?? 0));
  }, 90_000);
});
