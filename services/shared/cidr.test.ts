import { describe, expect, it } from "vitest";
import { hostOf, PodCidrError, podAddressFilter } from "./cidr.js";

describe("podAddressFilter", () => {
  it("admits pod addresses inside the ranges, IPv4 and IPv6, and nothing else", () => {
    const ok = podAddressFilter(["10.0.0.0/8", " 192.168.1.0/24", "fd00::/8"]);
    expect(ok("10.2.3.4:8000")).toBe(true);
    expect(ok("192.168.1.77:8000")).toBe(true);
    expect(ok("[fd12::1]:8000")).toBe(true);
    expect(ok("192.168.2.1:8000")).toBe(false);
    expect(ok("127.0.0.1:8000")).toBe(false);
    expect(ok("169.254.169.254:80")).toBe(false);
    expect(ok("[::1]:8000")).toBe(false);
    // A host name is no IP literal: outside every range.
    expect(ok("metadata.internal:80")).toBe(false);
  });

  it("refuses a malformed range, naming it", () => {
    for (const bad of ["10.0.0.0", "10.0.0.0/33", "fd00::/129", "example.com/8", "10.0.0/8"]) expect(() => podAddressFilter([bad]), bad).toThrow(PodCidrError);
  });

  it("hostOf reads ip:port, [v6]:port and bare IPs", () => {
    expect(hostOf("10.0.0.1:8000")).toBe("10.0.0.1");
    expect(hostOf("[fd00::1]:9")).toBe("fd00::1");
    expect(hostOf("fd00::1")).toBe("fd00::1");
    expect(hostOf("pod.local:80")).toBeUndefined();
  });
});
