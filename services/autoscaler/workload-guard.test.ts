import { describe, expect, it } from "vitest";
import { checkWorkload, parseWorkloadRef, workloadRef } from "./workload-guard.js";

const target = { kind: "Deployment" as const, namespace: "llm", name: "vllm-llama" };
const pods: Record<string, string[]> = { "llama-0.llm": ["llama"], "llama-1.llm": ["llama"], "qwen-0.llm": ["qwen"], "both-0.llm": ["qwen", "llama"] };
const base = { target, model: "llama", modelsOf: (p: string) => pods[p] ?? [], allowed: new Set<string>(), verifiedBefore: false };

describe("whether --apply may scale a policy's workload", () => {
  it("its pods are the model's pods in PODS: allowed", () => {
    expect(checkWorkload({ ...base, pods: ["llama-0.llm", "llama-1.llm", "starting.llm"] })).toEqual({ ok: true, by: "pods" });
    expect(checkWorkload({ ...base, pods: ["both-0.llm"] })).toEqual({ ok: true, by: "pods" });
  });

  it("another model's workload is refused, naming the pod and its model, even beside the model's pods", () => {
    const v = checkWorkload({ ...base, pods: ["llama-0.llm", "qwen-0.llm"] });
    expect(v.ok).toBe(false);
    expect(!v.ok && v.reason).toMatch(/Deployment\/llm\/vllm-llama is not llama's workload: its pod qwen-0\.llm serves qwen/);
  });

  it("a workload none of whose pods PODS knows is refused unless verified before or allow-listed", () => {
    expect(checkWorkload({ ...base, pods: [] }).ok).toBe(false);
    expect(checkWorkload({ ...base, pods: ["unknown.llm"] }).ok).toBe(false);
    expect(checkWorkload({ ...base, pods: [], verifiedBefore: true })).toEqual({ ok: true, by: "earlier" });
    expect(checkWorkload({ ...base, pods: ["qwen-0.llm"], allowed: new Set([workloadRef(target)]) })).toEqual({ ok: true, by: "allow-list" });
    // Verified before does not excuse pods that now serve another model.
    expect(checkWorkload({ ...base, pods: ["qwen-0.llm"], verifiedBefore: true }).ok).toBe(false);
  });

  it("parses --allow-workload values", () => {
    expect(parseWorkloadRef("Deployment/llm/vllm-llama")).toEqual({ ok: true, ref: "Deployment/llm/vllm-llama" });
    expect(parseWorkloadRef("StatefulSet/a/b")).toEqual({ ok: true, ref: "StatefulSet/a/b" });
    for (const bad of ["llm/vllm", "Pod/llm/x", "Deployment/LLM/x", "Deployment//x", "Deployment/llm/a/b"]) expect(parseWorkloadRef(bad).ok, bad).toBe(false);
  });
});
