import { describe, expect, it } from "vitest";
import { type AffinityInput, responseAffinity } from "./affinity.js";

const ALICE = "a".repeat(32);
const BOB = "b".repeat(32);
const base = (o: Partial<AffinityInput> = {}): AffinityInput => ({
  location: { pod: "pod-1", model: "m", tenant: ALICE, stored: true },
  tenant: ALICE,
  model: "m",
  candidates: [{ pod: "pod-0" }, { pod: "pod-1" }, { pod: "pod-2" }],
  ownerState: { ready: true, draining: false },
  ownerSaturated: false,
  ...o,
});

describe("response affinity", () => {
  it("pins the request to the pod holding the previous response, whatever the load elsewhere", () => {
    expect(responseAffinity(base())).toEqual({ action: "pin", pod: "pod-1", reason: "owner" });
  });

  it("expands from the store when the owner is gone, draining, saturated or serves another model", () => {
    expect(responseAffinity(base({ candidates: [{ pod: "pod-0" }], ownerState: undefined }))).toEqual({ action: "expand", reason: "owner-gone", owner: "pod-1" });
    expect(responseAffinity(base({ candidates: [{ pod: "pod-0" }], ownerState: { ready: false, draining: false } }))).toEqual({ action: "expand", reason: "owner-gone", owner: "pod-1" });
    expect(responseAffinity(base({ candidates: [{ pod: "pod-0" }], ownerState: { ready: true, draining: true } }))).toEqual({ action: "expand", reason: "owner-draining", owner: "pod-1" });
    expect(responseAffinity(base({ ownerSaturated: true }))).toEqual({ action: "expand", reason: "owner-saturated", owner: "pod-1" });
    expect(responseAffinity(base({ model: "other" }))).toEqual({ action: "expand", reason: "other-model", owner: "pod-1" });
  });

  it("without a stored chain: a saturated owner is still pinned, a gone one is not found", () => {
    const unstored = { location: { pod: "pod-1", model: "m", tenant: ALICE, stored: false } };
    expect(responseAffinity(base({ ...unstored, ownerSaturated: true }))).toEqual({ action: "pin", pod: "pod-1", reason: "owner-saturated-unstored" });
    expect(responseAffinity(base({ ...unstored, candidates: [] }))).toEqual({ action: "not-found", reason: "owner-gone", owner: "pod-1" });
    // The store's own answer outranks the location's flag (a record written after the location).
    expect(responseAffinity(base({ ...unstored, candidates: [], storeHolds: true })).action).toBe("expand");
  });

  it("another tenant's response is not found, even when its pod is live and the store holds it for its owner", () => {
    expect(responseAffinity(base({ tenant: BOB }))).toEqual({ action: "not-found", reason: "unknown-id" });
    expect(responseAffinity(base({ tenant: BOB, storeHolds: false }))).toEqual({ action: "not-found", reason: "unknown-id" });
  });

  it("an id the view does not hold (evicted, expired) is expanded when the store holds it for the tenant", () => {
    expect(responseAffinity(base({ location: undefined, storeHolds: true }))).toEqual({ action: "expand", reason: "unknown-id" });
    expect(responseAffinity(base({ location: undefined }))).toEqual({ action: "not-found", reason: "unknown-id" });
  });
});
