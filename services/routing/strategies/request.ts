/** The request as strategies see it, from the headers the gateway received. */
import { sessionHintOf } from "./session-affinity.js";
import type { RoutingRequest } from "./types.js";
import { USER_HEADER } from "./vtc-basic.js";

export function routingRequestOf(model: string, requestId: string, headers: Readonly<Record<string, string>>, promptTokens: number): RoutingRequest {
  const user = headers[USER_HEADER] || undefined;
  const session = sessionHintOf(headers);
  return { model, requestId, promptTokens, ...(user ? { user } : {}), ...(session ? { session } : {}) };
}
