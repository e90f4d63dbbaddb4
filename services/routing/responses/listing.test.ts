import { describe, expect, it } from "vitest";
import { deletedResponseObject, inputItemsPage, ListingError, responseRouteOf, storedResponseObject } from "./listing.js";

const rec = { id: "resp_1", input: [{ type: "message", role: "user", content: "a" }, { id: "msg_b", type: "message", role: "user", content: "b" }, { type: "message", role: "user", content: "c" }] };
const q = (s: string) => new URLSearchParams(s);

describe("responses routes answered from the store", () => {
  it("tells the routes under /v1/responses/{id} apart", () => {
    expect(responseRouteOf("GET", "/v1/responses/resp_1")).toEqual({ kind: "retrieve", id: "resp_1" });
    expect(responseRouteOf("DELETE", "/v1/responses/resp_1")).toEqual({ kind: "delete", id: "resp_1" });
    expect(responseRouteOf("POST", "/v1/responses/resp_1/cancel")).toEqual({ kind: "cancel", id: "resp_1" });
    expect(responseRouteOf("GET", "/v1/responses/resp_1/input_items?limit=2")).toMatchObject({ kind: "input-items", id: "resp_1" });
    expect(responseRouteOf("POST", "/v1/responses/resp_1")).toBeUndefined();
    expect(responseRouteOf("GET", "/v1/responses")).toBeUndefined();
    expect(responseRouteOf("GET", "/v1/responses/a/b")).toBeUndefined();
    expect(responseRouteOf("GET", "/v1/responses/%E0%A4%A")).toBeUndefined();
  });

  it("lists input items newest first by default, paged by limit and after", () => {
    const p1 = inputItemsPage(rec, q("limit=2"));
    expect(p1).toEqual({ object: "list", data: [{ id: "resp_1-in-2", ...rec.input[2] }, rec.input[1]], first_id: "resp_1-in-2", last_id: "msg_b", has_more: true });
    const p2 = inputItemsPage(rec, q("limit=2&after=msg_b"));
    expect(p2).toMatchObject({ data: [{ id: "resp_1-in-0" }], has_more: false });
    expect(inputItemsPage(rec, q("order=asc"))).toMatchObject({ first_id: "resp_1-in-0", last_id: "resp_1-in-2", has_more: false });
    expect(inputItemsPage({ id: "resp_e", input: [] }, q(""))).toEqual({ object: "list", data: [], first_id: null, last_id: null, has_more: false });
  });

  it("refuses a bad limit, order or after, naming the parameter", () => {
    for (const [s, param] of [["limit=0", "limit"], ["limit=101", "limit"], ["limit=x", "limit"], ["order=up", "order"], ["after=nope", "after"]] as const) {
      let err: unknown;
      try {
        inputItemsPage(rec, q(s));
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ListingError);
      expect((err as ListingError).param).toBe(param);
    }
  });

  it("rebuilds a response object from the store, and answers a deletion", () => {
    const r = storedResponseObject({ type: "stored-response", id: "resp_1", tenant: "a".repeat(32), model: "m", createdAt: 1_700_000_000_123, expiresAt: 2e12, previousResponseId: "resp_0", input: [], output: [{ type: "message" }] });
    expect(r).toMatchObject({ id: "resp_1", object: "response", created_at: 1_700_000_000, model: "m", status: "completed", output: [{ type: "message" }], previous_response_id: "resp_0" });
    expect(deletedResponseObject("resp_1")).toEqual({ id: "resp_1", object: "response", deleted: true });
  });
});
