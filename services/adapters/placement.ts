/**
 * Where each LoRA adapter should be loaded: a pure function of the fleet's state (docs/adapters.md,
 * "The placement rule"). No I/O, no clock: the controller (controller.ts) gathers the inputs —
 * the base model's ready pods, what each engine has loaded and its `max_loras`, its load, each
 * adapter's demand from DECISIONS and flow control's queues — and carries out the moves.
 *
 * The rule, per round:
 * 1. An adapter's candidates are the ready, non-draining pods of its base model its podSelector
 *    selects. Desired replicas: a fixed `replicas`; else, with `minReplicas`/`maxReplicas`,
 *    ceil(demand rps / targetRps) within the bounds, at least 1 while requests wait for it
 *    (scale from zero); else every candidate (AIBrix's default). Never more than the candidates.
 * 2. Unloads first: a deleted adapter everywhere; a pod its selector no longer selects; a fixed
 *    count exceeded. Replicas above a demand-following desired count stay loaded (warm) until
 *    their slot is needed: they are the first evicted.
 * 3. Loads, hottest adapter first (waiting requests, then rps): onto the candidate with a free
 *    slot (loaded < max_loras) and the least load. A pod at max_loras frees a slot by unloading
 *    its coldest evictable adapter: a surplus replica, else a strictly colder adapter that keeps
 *    its minReplicas. The load follows once the unload is done (next round).
 * At most one move per pod per round (the engine's calls on one pod are sequential); a pod with a
 * call in flight (`busy`) gets none. Adapters the controller does not manage keep their slots.
 */
import { type AdapterSpec, selectorMatches } from "../../schemas/adapters.js";

export type SlotState = "loading" | "loaded" | "unloading";

export interface PlacementPod {
  readonly pod: string;
  readonly model: string;
  readonly labels: Readonly<Record<string, string>>;
  /** Ready, vouched for and not draining. */
  readonly ready: boolean;
  readonly maxLoras: number;
  /** Requests running + waiting on the engine (or in flight by the ledger). */
  readonly load: number;
  /** Every adapter on the engine (managed or not), with what the controller is doing to it. */
  readonly adapters: ReadonlyMap<string, SlotState>;
  /** An engine call is in flight on this pod: no move this round. */
  readonly busy: boolean;
}

export interface PlacementAdapter {
  readonly name: string;
  readonly spec: AdapterSpec;
  readonly demand: { readonly rps: number; readonly queued: number };
  /** The declaration is gone: unload everywhere. */
  readonly deleted?: boolean;
  /** Pods where loading failed `maxAttempts` times and the back-off has not ended. */
  readonly blocked?: ReadonlySet<string>;
}

export interface Move {
  readonly action: "load" | "unload";
  readonly adapter: string;
  readonly pod: string;
  readonly reason: string;
}

export interface AdapterPlan {
  readonly adapter: string;
  /** The base model (declared, or the selected pods'). */
  readonly base?: string;
  readonly candidates: number;
  /** The candidate pods' names. */
  readonly candidatePods: readonly string[];
  readonly desired: number;
  /** Pods hosting it (loaded or loading) once this round's moves are done. */
  readonly hosts: readonly string[];
  readonly reason: string;
}

export interface Placement {
  readonly moves: readonly Move[];
  readonly plans: ReadonlyMap<string, AdapterPlan>;
}

export const DEFAULT_TARGET_RPS = 5;

const hosting = (s: SlotState | undefined) => s === "loading" || s === "loaded";
const score = (a: PlacementAdapter) => a.demand.queued * 1e6 + a.demand.rps;
const byName = (a: { pod: string }, b: { pod: string }) => (a.pod < b.pod ? -1 : a.pod > b.pod ? 1 : 0);

/** Desired replicas and why, before the cap by candidates. */
export function desiredReplicas(spec: AdapterSpec, demand: { rps: number; queued: number }, candidates: number): { desired: number; why: string } {
  if (spec.replicas !== undefined) return { desired: Math.min(spec.replicas, candidates), why: `fixed replicas ${spec.replicas}` };
  if (spec.minReplicas === undefined && spec.maxReplicas === undefined) return { desired: candidates, why: "every selected pod (no replicas given)" };
  const target = spec.targetRps ?? DEFAULT_TARGET_RPS;
  let n = Math.ceil(demand.rps / target - 1e-9);
  if (demand.queued > 0) n = Math.max(n, 1);
  const min = spec.minReplicas ?? 0;
  const max = spec.maxReplicas ?? candidates;
  const d = Math.min(Math.max(n, min), max, candidates);
  const waiting = demand.queued > 0 ? `, ${demand.queued} waiting` : "";
  return { desired: d, why: `demand ${round(demand.rps)} rps / target ${target}${waiting} -> ${n}, bounds ${min}..${max}, ${candidates} candidates` };
}

/** Replicas an adapter keeps when a hotter one needs a slot: a fixed count and minReplicas are kept; "every pod" too. */
function floorOf(spec: AdapterSpec, hosts: number): number {
  if (spec.replicas !== undefined) return spec.replicas;
  if (spec.minReplicas !== undefined) return spec.minReplicas;
  return spec.maxReplicas !== undefined ? 0 : hosts;
}

const round = (x: number) => Math.round(x * 100) / 100;

/** Why an adapter named like a served model is placed nowhere. */
export function shadowingReason(name: string): string {
  return `refused: adapter name ${name} is a base model some pod serves (it would take that model's traffic); rename the adapter`;
}

export function place(input: { pods: readonly PlacementPod[]; adapters: readonly PlacementAdapter[] }): Placement {
  // A working copy of every pod's slots: moves decided this round apply to it at once.
  const slots = new Map<string, Map<string, SlotState>>();
  const podOf = new Map<string, PlacementPod>();
  for (const p of input.pods) {
    slots.set(p.pod, new Map(p.adapters));
    podOf.set(p.pod, p);
  }
  const moved = new Set<string>();
  const moves: Move[] = [];
  const canMove = (pod: string) => !moved.has(pod) && podOf.get(pod)?.busy !== true;
  const move = (m: Move) => {
    moves.push(m);
    moved.add(m.pod);
    slots.get(m.pod)?.set(m.adapter, m.action === "load" ? "loading" : "unloading");
  };
  const managed = new Map(input.adapters.map((a) => [a.name, a]));

  // 1. Candidates and desired counts.
  interface Work {
    a: PlacementAdapter;
    base?: string;
    candidates: PlacementPod[];
    desired: number;
    why: string;
  }
  const work: Work[] = [];
  const servedModels = new Set(input.pods.map((p) => p.model));
  for (const a of input.adapters) {
    const base = a.spec.baseModel;
    // Named like a model some pod serves: refused (gateways would route that model's traffic to it); unloaded where loaded.
    if (!a.deleted && servedModels.has(a.name)) {
      work.push({ a, ...(base !== undefined ? { base } : {}), candidates: [], desired: 0, why: shadowingReason(a.name) });
      continue;
    }
    const candidates = a.deleted ? [] : input.pods.filter((p) => p.ready && (base === undefined || p.model === base) && selectorMatches(a.spec.podSelector, p.labels)).sort(byName);
    const d = a.deleted ? { desired: 0, why: "deleted" } : desiredReplicas(a.spec, a.demand, candidates.length);
    work.push({ a, base: base ?? candidates[0]?.model, candidates, desired: d.desired, why: d.why });
  }
  const hostsOf = (w: Work) => w.candidates.filter((p) => hosting(slots.get(p.pod)?.get(w.a.name)));

  // 2. Unloads that do not wait for demand.
  for (const w of work) {
    const chosen = new Set(w.candidates.map((p) => p.pod));
    for (const p of input.pods) {
      if (slots.get(p.pod)?.get(w.a.name) !== "loaded" || !canMove(p.pod)) continue;
      if (w.a.deleted) move({ action: "unload", adapter: w.a.name, pod: p.pod, reason: "adapter deleted" });
      else if (p.ready && !chosen.has(p.pod)) move({ action: "unload", adapter: w.a.name, pod: p.pod, reason: servedModels.has(w.a.name) ? w.why : w.base !== undefined && p.model !== w.base ? `pod serves ${p.model}, not the base model ${w.base}` : "pod no longer selected by podSelector" });
    }
    if (w.a.spec.replicas === undefined || w.a.deleted) continue;
    // A fixed count is exact: the most loaded hosts give theirs up.
    const extra = hostsOf(w).length - w.desired;
    if (extra <= 0) continue;
    const loaded = hostsOf(w).filter((p) => slots.get(p.pod)?.get(w.a.name) === "loaded" && canMove(p.pod)).sort((x, y) => y.load - x.load || byName(x, y));
    for (const p of loaded.slice(0, extra)) move({ action: "unload", adapter: w.a.name, pod: p.pod, reason: `replicas ${hostsOf(w).length} above the fixed count ${w.desired}` });
  }

  // 3. Loads, hottest first.
  const desiredOf = new Map(work.map((w) => [w.a.name, w]));
  const order = work.filter((w) => !w.a.deleted).sort((x, y) => score(y.a) - score(x.a) || (x.a.name < y.a.name ? -1 : 1));
  for (const w of order) {
    let need = w.desired - hostsOf(w).length;
    while (need > 0) {
      const open = w.candidates.filter((p) => !hosting(slots.get(p.pod)?.get(w.a.name)) && slots.get(p.pod)?.get(w.a.name) !== "unloading" && !w.a.blocked?.has(p.pod));
      const free = open.filter((p) => canMove(p.pod) && (slots.get(p.pod)?.size ?? 0) < p.maxLoras).sort((x, y) => x.load - y.load || (slots.get(x.pod)?.size ?? 0) - (slots.get(y.pod)?.size ?? 0) || byName(x, y));
      const target = free[0];
      if (target) {
        const used = slots.get(target.pod)?.size ?? 0;
        move({ action: "load", adapter: w.a.name, pod: target.pod, reason: `${hostsOf(w).length} of ${w.desired} replicas (${w.why}); ${target.pod} has a free slot (${used}/${target.maxLoras}) and load ${round(target.load)}` });
        need--;
        continue;
      }
      // Every open candidate is full (or busy): free a slot on one by evicting its coldest evictable adapter.
      let best: { pod: PlacementPod; victim: string; cost: number; why: string } | undefined;
      for (const p of open) {
        if (!canMove(p.pod)) continue;
        for (const [name, st] of slots.get(p.pod) ?? []) {
          if (st !== "loaded" || name === w.a.name) continue;
          const v = desiredOf.get(name);
          if (!v || !managed.has(name)) continue; // not ours: an operator's adapter keeps its slot
          const hosts = hostsOf(v).length;
          const surplus = v.a.spec.replicas === undefined && hosts > v.desired;
          const colder = score(v.a) < score(w.a) && hosts - 1 >= floorOf(v.a.spec, hosts);
          if (!surplus && !colder) continue;
          const cost = (surplus ? 0 : 1e12) + score(v.a);
          if (!best || cost < best.cost || (cost === best.cost && (p.load < best.pod.load || (p.load === best.pod.load && p.pod < best.pod.pod)))) {
            best = { pod: p, victim: name, cost, why: surplus ? `a surplus replica (${hosts} loaded, ${v.desired} desired)` : `colder (${round(v.a.demand.rps)} rps, ${v.a.demand.queued} waiting)` };
          }
        }
      }
      if (!best) break;
      move({ action: "unload", adapter: best.victim, pod: best.pod.pod, reason: `${best.pod.pod} at max_loras (${slots.get(best.pod.pod)?.size}/${best.pod.maxLoras}): ${best.victim} is ${best.why} than ${w.a.name} (${round(w.a.demand.rps)} rps, ${w.a.demand.queued} waiting)` });
      // The load follows the unload in a later round; count it as coming so no second slot is freed for it now.
      need--;
    }
  }

  const plans = new Map<string, AdapterPlan>();
  for (const w of work) {
    const hosts = hostsOf(w).map((p) => p.pod);
    plans.set(w.a.name, { adapter: w.a.name, ...(w.base !== undefined ? { base: w.base } : {}), candidates: w.candidates.length, candidatePods: w.candidates.map((p) => p.pod), desired: w.desired, hosts, reason: w.why });
  }
  return { moves, plans };
}
