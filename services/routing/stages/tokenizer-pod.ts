/**
 * Which ready pod tokenizes a prompt in `remote` mode: rendezvous hashing on the request body, so
 * the model's pods share the work (one pod per distinct prompt, the same one on every replica, so a
 * repeated prompt finds the engine's own tokenizer cache warm), and a pod leaving moves only its
 * own share. Pure.
 */

/** FNV-1a over bytes: the body's 32-bit key. */
export function bodyKey(body: Uint8Array): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < body.length; i++) h = Math.imul(h ^ (body[i] as number), 0x01000193);
  return h >>> 0;
}

/** A 32-bit finaliser (avalanche): neighbouring inputs give unrelated scores. */
function mix(x: number): number {
  let h = x >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

function nameKey(name: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** The pod with the highest rendezvous score for `key`; undefined when there is none. */
export function tokenizerPodFor<P extends { readonly pod: string }>(pods: readonly P[], key: number): P | undefined {
  let best: P | undefined;
  let bestScore = -1;
  for (const p of pods) {
    const score = mix(key ^ nameKey(p.pod));
    if (score > bestScore || (score === bestScore && best !== undefined && p.pod < best.pod)) {
      best = p;
      bestScore = score;
    }
  }
  return best;
}
