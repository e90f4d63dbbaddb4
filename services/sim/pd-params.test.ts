import { describe, expect, it } from "vitest";
import { ApiError } from "./errors.js";
import { parseBootstrap, parseKvTransferParams, topLevelRawValue } from "./pd-params.js";

const complete = {
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_block_ids: [3, 4],
  remote_engine_id: "eng-1",
  remote_request_id: "req-1",
  remote_host: "10.0.0.7",
  remote_port: 5600,
  tp_size: 1,
};

describe("parseKvTransferParams", () => {
  it("reads the prefill leg, a complete decode leg and no params", () => {
    expect(parseKvTransferParams(undefined)).toEqual({ kind: "none" });
    expect(parseKvTransferParams(null)).toEqual({ kind: "none" });
    expect(parseKvTransferParams({ do_remote_decode: true, do_remote_prefill: false, remote_host: null })).toEqual({ kind: "prefill" });
    expect(parseKvTransferParams(complete)).toEqual({
      kind: "decode",
      engineId: "eng-1",
      requestId: "req-1",
      host: "10.0.0.7",
      port: 5600,
      blockIds: [3, 4],
    });
  });

  it("calls params incomplete when any of the four remote fields is null or absent", () => {
    for (const field of ["remote_engine_id", "remote_request_id", "remote_host", "remote_port"]) {
      expect(parseKvTransferParams({ ...complete, [field]: null })).toEqual({ kind: "incomplete", missing: [field] });
      const { [field as keyof typeof complete]: _gone, ...rest } = complete;
      expect(parseKvTransferParams(rest)).toEqual({ kind: "incomplete", missing: [field] });
    }
    // remote_block_ids is not one of them: vLLM does not check it.
    expect(parseKvTransferParams({ ...complete, remote_block_ids: null })).toMatchObject({ kind: "decode", blockIds: [] });
  });

  it("rejects params of the wrong type with a 400", () => {
    for (const bad of ["x", [1], { ...complete, remote_port: "5600" }, { ...complete, remote_port: 70_000 }, { ...complete, remote_host: 7 }]) {
      expect(() => parseKvTransferParams(bad)).toThrow(ApiError);
    }
  });
});

describe("parseBootstrap", () => {
  const parse = (raw: string) => parseBootstrap(JSON.parse(raw), raw);

  it("reads the room exactly from the text, as a number or a string", () => {
    const max = "9223372036854775807";
    expect(parse(`{"bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":${max}}`)).toEqual({ host: "h", port: 8998, room: max });
    expect(parse(`{"bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":"${max}"}`)?.room).toBe(max);
    // 2^63-2 is the same JS number as 2^63-1, but a different room.
    expect(parse(`{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":9223372036854775806}`)?.room).toBe("9223372036854775806");
    expect(parse(`{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":0}`)?.room).toBe("0");
    expect(parse(`{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":"007"}`)?.room).toBe("7");
  });

  it("is undefined without bootstrap fields and a 400 for partial or out-of-range ones", () => {
    expect(parse(`{"prompt":"x"}`)).toBeUndefined();
    expect(parse(`{"bootstrap_host":null,"bootstrap_port":null,"bootstrap_room":null}`)).toBeUndefined();
    for (const bad of [
      `{"bootstrap_host":"h","bootstrap_port":1}`,
      `{"bootstrap_port":1,"bootstrap_room":5}`,
      `{"bootstrap_host":"h","bootstrap_port":0,"bootstrap_room":5}`,
      `{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":-1}`,
      `{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":1.5}`,
      `{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":9223372036854775808}`,
      `{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":"12a"}`,
      `{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":1e3}`,
    ]) {
      expect(() => parse(bad), bad).toThrow(ApiError);
    }
  });
});

describe("topLevelRawValue", () => {
  it("finds the top-level key, not one nested or inside a string", () => {
    const text = `{"messages":[{"content":"\\"bootstrap_room\\": 1","bootstrap_room":2}],"x":{"bootstrap_room":3}, "bootstrap_room" : 12345678901234567890 }`;
    expect(topLevelRawValue(text, "bootstrap_room")).toBe("12345678901234567890");
    expect(topLevelRawValue(`{"a":"bootstrap_room","bootstrap_room":"9"}`, "bootstrap_room")).toBe(`"9"`);
    expect(topLevelRawValue(`{"a":{"bootstrap_room":1}}`, "bootstrap_room")).toBeUndefined();
    expect(topLevelRawValue(`{"a\\u0062":4}`, "ab")).toBe("4");
  });
});
