/**
 * APA (AIBrix's application pod autoscaler): scale by the ratio of the per-pod metric to its
 * target, outside a tolerance band. Pure.
 *
 * With N ready pods, u = per-pod value / target:
 * - u > 1 + upTolerance: desired = min(ceil(N x u), ceil(maxScaleUpRate x N));
 * - u < 1 - downTolerance: desired = max(ceil(N x u), floor(N / maxScaleDownRate));
 * - otherwise N.
 * At N = 0 the ratio cannot move the count (N x u = 0); jetroute adds: any demand (a value > 0)
 * at zero pods asks for `activationScale` pods, so a model can scale from zero under APA too.
 */
import type { ResolvedPolicy } from "../../schemas/autoscale.js";

export type ApaSettings = Pick<ResolvedPolicy, "target" | "maxScaleUpRate" | "maxScaleDownRate" | "upTolerance" | "downTolerance" | "activationScale">;

export interface ApaArithmetic {
  readyPods: number;
  perPod: number;
  ratio: number;
  band: "up" | "down" | "hold" | "activate";
  desired: number;
}

export function apaDesired(s: ApaSettings, readyPods: number, perPod: number): ApaArithmetic {
  const target = s.target as number;
  const n = Math.max(0, readyPods);
  const v = Math.max(0, perPod);
  const ratio = v / target;
  if (n === 0) {
    const desired = v > 0 ? s.activationScale : 0;
    return { readyPods: n, perPod: v, ratio, band: v > 0 ? "activate" : "hold", desired };
  }
  if (ratio > 1 + s.upTolerance) {
    return { readyPods: n, perPod: v, ratio, band: "up", desired: Math.min(Math.ceil(n * ratio), Math.ceil(s.maxScaleUpRate * n)) };
  }
  if (ratio < 1 - s.downTolerance) {
    return { readyPods: n, perPod: v, ratio, band: "down", desired: Math.max(Math.ceil(n * ratio), Math.floor(n / s.maxScaleDownRate)) };
  }
  return { readyPods: n, perPod: v, ratio, band: "hold", desired: n };
}
