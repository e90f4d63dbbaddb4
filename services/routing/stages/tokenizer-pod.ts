/**
 * Which ready pod tokenizes a prompt in `remote` mode: rendezvous hashing (the one session-affinity
 * uses) keyed on the request body, so the model's pods share the work (one pod per distinct prompt,
 * the same one on every replica, so a repeated prompt finds the engine's own tokenizer cache warm),
 * and a pod leaving moves only its own share. Pure.
 */
import { xxh64 } from "@node-rs/xxhash";
import type { PodInfo } from "../../views/pod-set.js";
import { rendezvous } from "../strategies/session-affinity.js";

/** The pod that tokenizes `body`; undefined when there is none. */
export function tokenizerPodFor(pods: readonly PodInfo[], body: Uint8Array): PodInfo | undefined {
  return pods[rendezvous(xxh64(body).toString(16), pods)];
}
