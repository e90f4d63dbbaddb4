/**
 * A machine-speed baseline printed in every benchmark's final JSON line, so that figures taken on
 * boxes 2-3x apart can be compared: divide a figure by the run's baseline before comparing runs.
 *
 * The baseline is a fixed, allocation-free hashing loop (FNV-1a over 32-bit words, the shape of the
 * index's block hashing), timed a few times before the benchmark starts; the fastest round is kept
 * (the least disturbed by other work on the machine).
 */

export interface MachineBaseline {
  /** Nanoseconds per hashed 32-bit word of the fixed loop (lower is a faster machine). */
  hash_ns_per_op: number;
  /** Load average (1 min) when the baseline was taken: a busy machine makes every figure slower. */
  load_avg_1m: number;
}

const WORDS = 1 << 16;
const ROUNDS = 7;
const PASSES = 16;

/** Times the fixed hashing loop; pure CPU, ~50-150 ms on this machine class. */
export function measureBaseline(loadAvg1m = 0): MachineBaseline {
  const data = new Uint32Array(WORDS);
  for (let i = 0; i < WORDS; i++) data[i] = Math.imul(i, 2654435761) >>> 0;
  let best = Number.POSITIVE_INFINITY;
  let sink = 0;
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.hrtime.bigint();
    for (let p = 0; p < PASSES; p++) sink ^= fnv1aWords(data, p);
    const ns = Number(process.hrtime.bigint() - t0);
    best = Math.min(best, ns / (WORDS * PASSES));
  }
  if (sink === 0x7fffffff) best += 0; // keeps the loop's result observable
  return { hash_ns_per_op: Math.round(best * 1000) / 1000, load_avg_1m: Math.round(loadAvg1m * 100) / 100 };
}

function fnv1aWords(data: Uint32Array, seed: number): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < data.length; i++) {
    h ^= data[i] as number;
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

let taken: MachineBaseline | undefined;

/** Takes the baseline once per process (call before the benchmark starts its load). */
export function takeBaseline(loadAvg1m: number): MachineBaseline {
  taken ??= measureBaseline(loadAvg1m);
  return taken;
}

/** Prints a benchmark's final JSON line with the machine baseline beside its figures. */
export function emitResult(result: object, loadAvg1m = 0): void {
  const baseline = takeBaseline(loadAvg1m);
  console.log(JSON.stringify({ ...result, baseline }));
}
