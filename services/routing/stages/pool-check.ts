/**
 * Gateway pools (streams/pools.ts): is a request's model this gateway's to route? Pure.
 *
 * A pool's gateways see only their pool's pods, so a model they know is theirs, whatever the
 * config says (LoRA adapters their pods serve included). A model they do not know that the config
 * assigns to another pool gets 421 Misdirected Request naming that pool, in the message and in the
 * `x-jetroute-pool` header, so that a client or an operator finds the route to fix; an unpooled
 * gateway does the same for every pooled model. A model no pool lists gets 404 at a pooled
 * gateway, naming its pool; at an unpooled one the usual answers follow (404 if no pod serves it).
 */
import { parsedOf } from "../context.js";
import { RouteError } from "../errors.js";
import type { PrepareStage } from "../pipeline.js";
import type { PoolIdentity } from "../ports.js";

export interface PoolCheckViews {
  pods: { knows(model: string): boolean };
  pools: { poolOf(model: string): string | undefined };
}

export type { PoolIdentity } from "../ports.js";

/** The pool a name is shown as: the unpooled gateways answer as `(unpooled)`. */
const shown = (pool: string | undefined) => (pool === undefined ? "(unpooled)" : pool);

export function misdirected(model: string, self: PoolIdentity, views: PoolCheckViews): RouteError | undefined {
  if (views.pods.knows(model) || self.models?.has(model)) return undefined;
  const owner = views.pools.poolOf(model);
  if (owner === self.pool) return undefined;
  if (owner === undefined) {
    // Unpooled: the usual 404 comes later. Pooled: say which pool was asked (the model may be served unpooled).
    if (self.pool === undefined) return undefined;
    return new RouteError("unknownModel", `The model \`${model}\` does not exist in gateway pool \`${self.pool}\` (and no pool lists it).`, "model");
  }
  return new RouteError(
    "wrongPool",
    `The model \`${model}\` is served by gateway pool \`${owner}\`, not by this gateway (pool ${shown(self.pool)}): send it to pool \`${owner}\`'s route.`,
    "model",
    { "x-jetroute-pool": owner },
  );
}

/** The pool-check stage: the (chosen) model is this gateway's pool's to route (421/404 otherwise). */
export const poolCheckStage: PrepareStage = {
  name: "pool-check",
  phase: "prepare",
  run(ctx, env): void {
    const wrongPool = misdirected(parsedOf(ctx).model, env.pool ?? {}, env.state);
    if (wrongPool) throw wrongPool;
  },
};
