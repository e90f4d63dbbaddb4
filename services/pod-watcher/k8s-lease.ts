/**
 * Kubernetes mode's lease: a `coordination.k8s.io/v1` Lease, created or replaced against its
 * resourceVersion (409 Conflict = another candidate won the round).
 */
import { CoordinationV1Api, type KubeConfig, type V1Lease } from "@kubernetes/client-node";
import type { LeaseStore } from "../shared/leader.js";
import type { LeaseRecord } from "../shared/lease.js";

const statusOf = (err: unknown): number | undefined => (err as { code?: number; statusCode?: number })?.code ?? (err as { statusCode?: number })?.statusCode;

export function kubeLeaseStore(kc: KubeConfig, namespace: string, name: string): LeaseStore {
  const api = kc.makeApiClient(CoordinationV1Api);
  let acquiredAt: Date | undefined;
  let current: V1Lease | undefined;
  return {
    describe: `lease ${namespace}/${name}`,
    async read(): Promise<LeaseRecord | undefined> {
      try {
        current = await api.readNamespacedLease({ name, namespace });
      } catch (err) {
        if (statusOf(err) === 404) {
          current = undefined;
          return undefined;
        }
        throw err;
      }
      const spec = current.spec ?? {};
      return {
        holder: spec.holderIdentity ?? "",
        durationMs: (spec.leaseDurationSeconds ?? 0) * 1_000,
        version: current.metadata?.resourceVersion ?? "",
        transitions: spec.leaseTransitions ?? 0,
      };
    },
    async write(me, durationMs, transitions, acquire, expected): Promise<boolean> {
      const now = new Date();
      if (acquire || !acquiredAt) acquiredAt = now;
      const spec = { holderIdentity: me, leaseDurationSeconds: Math.max(1, Math.ceil(durationMs / 1_000)), acquireTime: acquiredAt, renewTime: now, leaseTransitions: transitions };
      try {
        if (expected === undefined) await api.createNamespacedLease({ namespace, body: { apiVersion: "coordination.k8s.io/v1", kind: "Lease", metadata: { name, namespace }, spec } });
        else await api.replaceNamespacedLease({ name, namespace, body: { apiVersion: "coordination.k8s.io/v1", kind: "Lease", metadata: { name, namespace, resourceVersion: expected.version }, spec } });
        return true;
      } catch (err) {
        if (statusOf(err) === 409) return false;
        throw err;
      }
    },
    async release(me, expected): Promise<void> {
      if (expected.holder !== me) return;
      const spec = { ...(current?.spec ?? {}), holderIdentity: "", renewTime: new Date() };
      await api
        .replaceNamespacedLease({ name, namespace, body: { apiVersion: "coordination.k8s.io/v1", kind: "Lease", metadata: { name, namespace, resourceVersion: expected.version }, spec } })
        .catch((err: unknown) => {
          if (statusOf(err) !== 409) throw err;
        });
    },
  };
}
