/**
 * The request path, written once: every stage a request visits, in order. Adding a stage is its
 * file under stages/, its test, and one line here (the stage table in this directory's README.md is
 * held to this list by test/stage-table.test.ts).
 */
import type { RequestPath } from "./pipeline.js";
import { admitStage } from "./stages/admit.js";
import { chargeStage } from "./stages/charge.js";
import { contextLengthStage } from "./stages/context-length.js";
import { embedStage } from "./stages/embed.js";
import { engineFieldsStage } from "./stages/engine-fields.js";
import { flowGateStage } from "./stages/flow-gate.js";
import { keyModelsStage } from "./stages/key-models.js";
import { modelRewriteStage } from "./stages/model-rewrite.js";
import { parseStage } from "./stages/parse.js";
import { planStage } from "./stages/plan.js";
import { poolCheckStage } from "./stages/pool-check.js";
import { prefillLegStage } from "./stages/prefill-leg.js";
import { rateCheckStage } from "./stages/rate-check.js";
import { responseAffinityStage } from "./stages/response-affinity.js";
import { selectStage } from "./stages/select.js";
import { semanticStage } from "./stages/semantic-choice.js";
import { tokenizeStage } from "./stages/tokenize.js";

export const REQUEST_PATH: RequestPath = {
  prepare: [parseStage, modelRewriteStage, embedStage, semanticStage, planStage, poolCheckStage, keyModelsStage, responseAffinityStage, rateCheckStage, tokenizeStage, contextLengthStage],
  gate: flowGateStage,
  admit: admitStage,
  section: [selectStage, engineFieldsStage, chargeStage],
  after: [prefillLegStage],
};
