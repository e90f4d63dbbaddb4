import { describe, expect, it } from "vitest";
import { RouteError } from "../errors.js";
import { bootstrapRoom, prefillFailureError, refuseControlledFields, retryPrefill, sglangBody, vllmDecodeBody, vllmPrefillBody, vllmTransferParams } from "./pd-bodies.js";

const chat = { model: "m", messages: [{ role: "user", content: "hi" }], stream: true, stream_options: { include_usage: true }, max_tokens: 64, min_tokens: 4 };

describe("pd bodies - vLLM", () => {
  it("the prefill leg asks for one token, no stream, and remote decode", () => {
    const b = JSON.parse(vllmPrefillBody({ ...chat, max_completion_tokens: 64, min_completion_tokens: 2 }).toString());
    expect(b).toEqual({
      model: "m",
      messages: chat.messages,
      stream: false,
      max_tokens: 1,
      max_completion_tokens: 1,
      kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
    });
    // max_completion_tokens only when the client sent it.
    expect(JSON.parse(vllmPrefillBody(chat).toString())).not.toHaveProperty("max_completion_tokens");
  });

  it("reads the prefill's transfer params, refusing incomplete ones", () => {
    const full = { kv_transfer_params: { do_remote_prefill: true, do_remote_decode: false, remote_block_ids: [1, 2], remote_engine_id: "e", remote_request_id: "r", remote_host: "0.0.0.0", remote_port: 5600, tp_size: 1 } };
    expect(vllmTransferParams(Buffer.from(JSON.stringify(full)))).toEqual({ ok: true, params: full.kv_transfer_params });
    expect(vllmTransferParams(Buffer.from("{"))).toEqual({ ok: false, reason: "not-json" });
    expect(vllmTransferParams(Buffer.from("{}"))).toEqual({ ok: false, reason: "no-params" });
    expect(vllmTransferParams(Buffer.from(JSON.stringify({ kv_transfer_params: { ...full.kv_transfer_params, remote_engine_id: null } })))).toEqual({ ok: false, reason: "incomplete-params" });
  });

  it("the decode leg is the client's body plus the params, pointed at the prefill pod", () => {
    const b = JSON.parse(vllmDecodeBody(chat, { remote_engine_id: "e", remote_request_id: "r", remote_host: "0.0.0.0", remote_port: 5600 }, "10.0.0.7").toString());
    expect(b).toEqual({ ...chat, kv_transfer_params: { remote_engine_id: "e", remote_request_id: "r", remote_host: "10.0.0.7", remote_port: 5600 } });
  });
});

describe("pd bodies - SGLang", () => {
  it("bootstrap rooms are 63-bit and written as bare JSON integers", () => {
    expect(bootstrapRoom(Buffer.from("ffffffffffffffff", "hex"))).toBe("9223372036854775807");
    expect(bootstrapRoom(Buffer.from("0000000000000001", "hex"))).toBe("1");
    const text = sglangBody(chat, { host: "10.0.0.1", port: 8998, room: "9223372036854775807", rid: "req-1" }).toString();
    expect(text).toContain('"bootstrap_room":9223372036854775807');
    const b = JSON.parse(text);
    expect(b).toMatchObject({ bootstrap_host: "10.0.0.1", bootstrap_port: 8998, rid: "req-1", stream: true });
    expect(() => sglangBody(chat, { host: "h", port: 1, room: "1e9", rid: "r" })).toThrow();
  });
});

describe("pd bodies - client input", () => {
  it.each(["kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"])("a client body with %s is refused with a 400 naming it", (field) => {
    try {
      refuseControlledFields({ ...chat, [field]: 1 });
      expect.unreachable();
    } catch (err) {
      expect(err).toBeInstanceOf(RouteError);
      expect((err as RouteError).status).toBe(400);
      expect((err as RouteError).param).toBe(field);
    }
  });
});

describe("pd bodies - retries and errors", () => {
  it("retries 502/503/504 and connection failures, within the bound", () => {
    for (const s of [502, 503, 504]) expect(retryPrefill({ kind: "status", status: s }, 0, 2)).toBe(true);
    expect(retryPrefill({ kind: "connect", code: "ECONNREFUSED" }, 1, 2)).toBe(true);
    expect(retryPrefill({ kind: "connect", code: "ECONNREFUSED" }, 2, 2)).toBe(false);
    for (const s of [400, 500, 429]) expect(retryPrefill({ kind: "status", status: s }, 0, 2)).toBe(false);
    expect(retryPrefill({ kind: "timeout" }, 0, 2)).toBe(false);
    expect(retryPrefill({ kind: "cancelled" }, 0, 2)).toBe(false);
  });

  it("maps a final failure to the client's status: engine 4xx passed on, 5xx 502, timeout 504", () => {
    const body = Buffer.from(JSON.stringify({ error: { message: "prompt too long", type: "BadRequestError", code: 400 } }));
    const e = prefillFailureError({ kind: "status", status: 400, body }, "p1");
    expect([e.status, e.code, e.message]).toEqual([400, "prefill_rejected", "prefill leg on p1 answered 400: prompt too long"]);
    expect(prefillFailureError({ kind: "status", status: 503 }, "p1").status).toBe(502);
    expect(prefillFailureError({ kind: "timeout" }, "p1").status).toBe(504);
    expect(prefillFailureError({ kind: "connect", code: "ECONNREFUSED" }, "p1").code).toBe("prefill_failed");
  });
});
