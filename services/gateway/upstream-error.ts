/**
 * Upstream error bodies, normalised to the OpenAI shape `{"error":{"message","type","code","param"}}`.
 * Engines differ (vLLM: integer `code` and its own `type` names; SGLang and proxies: plain text or
 * `{"detail": ...}`), and clients parse one shape. Pure.
 */
import { errorType, type OpenAIErrorBody } from "../routing/mod.js";

const MAX_MESSAGE = 4_000;

export function normaliseUpstreamError(status: number, body: Buffer): OpenAIErrorBody {
  const text = body.toString("utf8").trim();
  let message = text || `upstream returned ${status}`;
  let param: string | null = null;
  try {
    const v = JSON.parse(text) as { error?: unknown; detail?: unknown; message?: unknown };
    const e = v.error;
    if (e && typeof e === "object") {
      const o = e as { message?: unknown; param?: unknown };
      if (typeof o.message === "string") message = o.message;
      if (typeof o.param === "string") param = o.param;
    } else if (typeof e === "string") message = e;
    else if (typeof v.detail === "string") message = v.detail;
    else if (typeof v.message === "string") message = v.message;
  } catch {
    /* plain text: the message as is */
  }
  return { error: { message: message.slice(0, MAX_MESSAGE), type: errorType(status), code: `upstream_${status}`, param } };
}
