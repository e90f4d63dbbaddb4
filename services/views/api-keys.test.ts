import { describe, expect, it } from "vitest";
import type { ApiKeyRecord } from "../../schemas/config.js";
import { ApiKeyView, type AuthOk, delegationOf, modelsVisibleTo } from "./api-keys.js";

describe("GET /v1/models as a key sees it", () => {
  it("a key restricted by models sees only those (adapters included by name); an unrestricted one everything", () => {
    const served = ["team-a/model", "team-a/lora", "team-b/private-model"];
    expect(modelsVisibleTo(served, ["team-a/model", "team-a/lora", "not-served"])).toEqual(["team-a/model", "team-a/lora"]);
    expect(modelsVisibleTo(served, undefined)).toEqual(served);
    expect(modelsVisibleTo(served, [])).toEqual([]);
  });
});

describe("x-jetroute-on-behalf-of: delegation decisions", () => {
  const OWNER = "a".repeat(64);
  const REVOKED = "b".repeat(64);
  const records = new Map<string, ApiKeyRecord>([
    [OWNER, { user: "tenant-a", createdAt: 1, objective: "batch", cacheSalt: "salt-of-tenant-a-0001", class: "gold", models: ["m1"], delegate: true }],
    [REVOKED, { user: "tenant-r", createdAt: 1, disabled: true, revokedAt: 2 }],
  ]);
  const lookup = (h: string) => records.get(h);
  const worker: AuthOk = { ok: true, user: "batch-worker", hash: "c".repeat(64), objective: "interactive", delegate: true };
  const plain: AuthOk = { ok: true, user: "client", hash: "d".repeat(64) };

  it("no header: the request runs under its own key", () => {
    expect(delegationOf(plain, undefined, lookup)).toEqual({ kind: "self" });
    expect(delegationOf(worker, undefined, lookup)).toEqual({ kind: "self" });
  });

  it("a delegate key naming a valid key gets that key's settings, without its delegate permission", () => {
    expect(delegationOf(worker, OWNER, lookup)).toEqual({ kind: "owner", owner: { ok: true, user: "tenant-a", hash: OWNER, objective: "batch", cacheSalt: "salt-of-tenant-a-0001", keyClass: "gold", models: ["m1"] } });
  });

  it("a key without the permission is refused before the named key is looked up (a plain key learns nothing)", () => {
    const seen: string[] = [];
    const spy = (h: string) => {
      seen.push(h);
      return records.get(h);
    };
    expect(delegationOf(plain, OWNER, spy)).toEqual({ kind: "refused", reason: "not-permitted" });
    expect(delegationOf(plain, "garbage", spy)).toEqual({ kind: "refused", reason: "not-permitted" });
    expect(delegationOf({ ...plain, delegate: false }, OWNER, spy)).toEqual({ kind: "refused", reason: "not-permitted" });
    expect(seen).toEqual([]);
  });

  it("an unknown, revoked or malformed owner is refused", () => {
    expect(delegationOf(worker, "e".repeat(64), lookup)).toEqual({ kind: "refused", reason: "owner-invalid" });
    expect(delegationOf(worker, REVOKED, lookup)).toEqual({ kind: "refused", reason: "owner-invalid" });
    expect(delegationOf(worker, OWNER.toUpperCase(), lookup)).toEqual({ kind: "refused", reason: "malformed" });
    expect(delegationOf(worker, "jr-the-plaintext-key", lookup)).toEqual({ kind: "refused", reason: "malformed" });
    expect(delegationOf(worker, "", lookup)).toEqual({ kind: "refused", reason: "malformed" });
    expect(delegationOf(worker, "a".repeat(10_000), lookup)).toEqual({ kind: "refused", reason: "malformed" });
  });

  it("ApiKeyView: authenticate carries the permission; delegation reads the view", () => {
    const v = new ApiKeyView();
    v.set(OWNER, records.get(OWNER));
    v.set(worker.hash, { user: "batch-worker", createdAt: 1, delegate: true });
    const me = { ...worker };
    expect(v.delegation(me, OWNER)).toMatchObject({ kind: "owner", owner: { user: "tenant-a" } });
    v.set(OWNER, { ...(records.get(OWNER) as ApiKeyRecord), disabled: true });
    expect(v.delegation(me, OWNER)).toEqual({ kind: "refused", reason: "owner-invalid" });
  });
});
