/**
 * Which bridge replica owns which pod: rendezvous (highest random weight) hashing of the pod name
 * over `n` replicas. Every replica computes the same owner from the same inputs, with no
 * coordination; when the operator changes `n`, only about 1/n of the pods move.
 *
 * There is no failure detection: a pod whose owner dies is bridged again when the operator (or the
 * orchestrator restarting the replica with the same index) brings an owner back. Two replicas that
 * briefly both own a pod (during a rollout with different `n`) publish the same batches under the
 * same `Nats-Msg-Id`, which the KV stream's duplicate window drops.
 */
import { xxh64 } from "@node-rs/xxhash";

const SEED = 0x6b762d6272696467n; // "kv-bridg"

export interface Shard {
  index: number;
  count: number;
}

export function parseShard(text: string): Shard {
  const m = /^(\d+)\/(\d+)$/.exec(text.trim());
  const index = Number(m?.[1]);
  const count = Number(m?.[2]);
  if (!m || !Number.isSafeInteger(index) || !Number.isSafeInteger(count) || count < 1 || index >= count) {
    throw new Error(`invalid shard ${JSON.stringify(text)}: expected i/n with 0 <= i < n`);
  }
  return { index, count };
}

export function formatShard(s: Shard): string {
  return `${s.index}/${s.count}`;
}

/** The replica index in [0, count) that owns `pod`. */
export function shardOwner(pod: string, count: number): number {
  let best = 0;
  let bestScore = -1n;
  for (let i = 0; i < count; i++) {
    const score = xxh64(`${pod}\u0000${i}`, SEED);
    if (score > bestScore) {
      bestScore = score;
      best = i;
    }
  }
  return best;
}

export function ownsPod(shard: Shard, pod: string): boolean {
  return shard.count === 1 || shardOwner(pod, shard.count) === shard.index;
}
