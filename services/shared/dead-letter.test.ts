/**
 * What a dead letter keeps of a payload (a pure policy), and the `--dlq-payloads` flag that opts a
 * process into keeping payloads. The entries on a real nats-server: test/dead-letters.test.ts and
 * services/kv-bridge/bridge.test.ts.
 */
import { Command } from "commander";
import { describe, expect, it } from "vitest";
import { applyDlqPayloads, dlqPayloadsOption } from "./cli-options.js";
import { DEAD_LETTER_DEFAULTS, deadLetterBody, deadLetterPolicy, setDeadLetterPolicy } from "./dead-letter.js";

describe("deadLetterBody", () => {
  const data = Buffer.from("secret prompt token ids 1 2 3");
  it("keeps no payload byte by default, only its size and digest", () => {
    const b = deadLetterBody([data], { keepPayloads: false, maxPayloadBytes: 1_000 });
    expect(b).toMatchObject({ size: data.length, kept: "omitted" });
    expect(b.body).toHaveLength(0);
    expect(b.digest).toMatch(/^[0-9a-f]{16}$/);
    expect(deadLetterBody([data.subarray(0, 6), data.subarray(6)], { keepPayloads: false, maxPayloadBytes: 1 }).digest).toBe(b.digest);
    expect(deadLetterBody([Buffer.from("other")], { keepPayloads: false, maxPayloadBytes: 1 }).digest).not.toBe(b.digest);
  });

  it("opted in: the whole payload, or its prefix within the bound and the room a message has", () => {
    expect(Buffer.from(deadLetterBody([data], { keepPayloads: true, maxPayloadBytes: 1_000 }).body).equals(data)).toBe(true);
    const p = deadLetterBody([data.subarray(0, 4), data.subarray(4)], { keepPayloads: true, maxPayloadBytes: 10 });
    expect(p.kept).toBe("prefix");
    expect(Buffer.from(p.body).equals(data.subarray(0, 10))).toBe(true);
    expect(deadLetterBody([data], { keepPayloads: true, maxPayloadBytes: 1_000 }, 5).body).toHaveLength(5);
  });
});

describe("--dlq-payloads", () => {
  const parse = (...args: string[]) => {
    const cmd = new Command().exitOverride().configureOutput({ writeErr: () => undefined }).addOption(dlqPayloadsOption());
    return cmd.parse(args, { from: "user" }).opts().dlqPayloads as number | undefined;
  };

  it("off by default; alone keeps up to the default bound; with a value, up to that many bytes", () => {
    expect(parse()).toBeUndefined();
    expect(parse("--dlq-payloads")).toBe(DEAD_LETTER_DEFAULTS.maxPayloadBytes);
    expect(parse("--dlq-payloads", "4096")).toBe(4096);
    expect(() => parse("--dlq-payloads", "0")).toThrow(/integer in \[1, 8388608\]/);
    expect(() => parse("--dlq-payloads", "lots")).toThrow(/integer/);
  });

  it("sets the process's policy", () => {
    const saved = deadLetterPolicy();
    try {
      applyDlqPayloads(undefined);
      expect(deadLetterPolicy()).toEqual({ keepPayloads: false, maxPayloadBytes: DEAD_LETTER_DEFAULTS.maxPayloadBytes });
      applyDlqPayloads(4096);
      expect(deadLetterPolicy()).toEqual({ keepPayloads: true, maxPayloadBytes: 4096 });
      expect(() => setDeadLetterPolicy({ keepPayloads: true, maxPayloadBytes: 0 })).toThrow(/payload bound/);
    } finally {
      setDeadLetterPolicy(saved);
    }
  });
});
