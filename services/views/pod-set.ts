/**
 * Pod set view: model -> pods, folded from PODS events. Pure: no I/O.
 * A request may name a base model or a LoRA adapter served by some of its pods.
 */
import type { EngineKind, PodEvent, PodRole } from "../../schemas/events.js";

export interface PodInfo {
  readonly model: string;
  readonly pod: string;
  readonly address: string;
  readonly engine: EngineKind;
  readonly role: PodRole;
  readonly roleset?: string;
  /** SGLang P/D prefill pods: the bootstrap port decode pods fetch the KV from. */
  readonly bootstrapPort?: number;
  readonly metricsAddress?: string;
  readonly kvEvents?: PodEvent["kvEvents"];
  readonly adapters: readonly string[];
  readonly labels: Readonly<Record<string, string>>;
  readonly ready: boolean;
  readonly updatedAt: number;
}

export interface PodSetReader {
  /** Ready pods serving `model` (a base model or an adapter). Stable array until the next change. */
  readyPods(model: string): readonly PodInfo[];
  /** True when any pod, ready or not, serves `model`: distinguishes 404 from 503. */
  knows(model: string): boolean;
  get(model: string, pod: string): PodInfo | undefined;
  byAddress(address: string): PodInfo | undefined;
  all(): readonly PodInfo[];
}

const key = (model: string, pod: string) => `${model}\u0000${pod}`;

export class PodSet implements PodSetReader {
  private readonly pods = new Map<string, PodInfo>();
  private readyCache = new Map<string, readonly PodInfo[]>();
  private served = new Set<string>();
  private addresses = new Map<string, PodInfo>();
  lastSeq = 0;
  version = 0;

  apply(ev: PodEvent, seq = 0): void {
    if (seq) this.lastSeq = seq;
    const k = key(ev.model, ev.pod);
    if (ev.action === "remove") {
      if (!this.pods.delete(k)) return;
    } else {
      this.pods.set(k, {
        model: ev.model,
        pod: ev.pod,
        address: ev.address,
        engine: ev.engine,
        role: ev.role ?? "combined",
        roleset: ev.roleset,
        ...(ev.bootstrapPort !== undefined ? { bootstrapPort: ev.bootstrapPort } : {}),
        metricsAddress: ev.metricsAddress,
        kvEvents: ev.kvEvents,
        adapters: ev.adapters ?? [],
        labels: ev.labels ?? {},
        ready: ev.ready,
        updatedAt: ev.ts,
      });
    }
    this.rebuild();
  }

  private rebuild(): void {
    this.version++;
    const ready = new Map<string, PodInfo[]>();
    const served = new Set<string>();
    const addresses = new Map<string, PodInfo>();
    const add = (m: string, p: PodInfo) => {
      served.add(m);
      if (!p.ready) return;
      let list = ready.get(m);
      if (!list) ready.set(m, (list = []));
      list.push(p);
    };
    for (const p of this.pods.values()) {
      add(p.model, p);
      for (const a of p.adapters) add(a, p);
      addresses.set(p.address, p);
    }
    for (const list of ready.values()) list.sort((a, b) => (a.pod < b.pod ? -1 : a.pod > b.pod ? 1 : 0));
    this.readyCache = ready;
    this.served = served;
    this.addresses = addresses;
  }

  readyPods(model: string): readonly PodInfo[] {
    return this.readyCache.get(model) ?? [];
  }

  knows(model: string): boolean {
    return this.served.has(model);
  }

  get(model: string, pod: string): PodInfo | undefined {
    return this.pods.get(key(model, pod));
  }

  byAddress(address: string): PodInfo | undefined {
    return this.addresses.get(address);
  }

  all(): readonly PodInfo[] {
    return [...this.pods.values()];
  }

  get size(): number {
    return this.pods.size;
  }
}
