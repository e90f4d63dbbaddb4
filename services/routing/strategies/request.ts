/** The request as strategies see it, from the headers the gateway received. */
import type { PodInfo } from "../../views/pod-set.js";
import { sessionHintOf } from "./session-affinity.js";
import type { RoutingRequest } from "./types.js";
import { USER_HEADER } from "./vtc-basic.js";

/**
 * `sessionPods` are the pods an `x-session-id` may name (the model's ready pods): an opaque id is
 * resolved by matching it against theirs, and is asked for only then.
 */
export function routingRequestOf(
  model: string,
  requestId: string,
  headers: Readonly<Record<string, string>>,
  promptTokens: number,
  sessionPods: () => readonly PodInfo[],
): RoutingRequest {
  const user = headers[USER_HEADER] || undefined;
  const session = sessionHintOf(headers, () => sessionPods().map((p) => p.address));
  return { model, requestId, promptTokens, ...(user ? { user } : {}), ...(session ? { session } : {}) };
}
