/**
 * `least-request`: fewest requests in flight across every gateway replica (see in-flight.ts for
 * the score). Remaining ties are broken at random.
 */
import { scorerStrategy } from "./combine.js";
import { inFlightScorer } from "./in-flight.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

export const leastRequestScorer = inFlightScorer;
export const leastRequestStrategy = scorerStrategy(leastRequestScorer);

export const leastRequestPlugin: StrategyPlugin = fixedPlugin(leastRequestStrategy);
