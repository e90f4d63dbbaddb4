/**
 * The Responses API routes answered from the response store, as pure functions
 * (docs/stateful-apis.md): `GET /v1/responses/{id}/input_items` (a list page), `DELETE
 * /v1/responses/{id}`, and `GET /v1/responses/{id}` when the pod that holds the response is gone.
 * Pure: the stored record comes in, the JSON body goes out.
 */
import type { ResponseItem, StoredResponse } from "../../../schemas/responses.js";

/** The routes under `/v1/responses/{id}` and what the gateway does with each. */
export type ResponseRoute =
  | { kind: "retrieve"; id: string }
  | { kind: "cancel"; id: string }
  | { kind: "delete"; id: string }
  | { kind: "input-items"; id: string; query: URLSearchParams };

/**
 * The route of a `/v1/responses/{id}...` request, undefined for another path or method. The id is
 * returned as the client sent it (the caller checks it against `RESPONSE_ID` before any lookup).
 */
export function responseRouteOf(method: string, pathWithQuery: string): ResponseRoute | undefined {
  const q = pathWithQuery.indexOf("?");
  const path = q >= 0 ? pathWithQuery.slice(0, q) : pathWithQuery;
  const m = /^\/v1\/responses\/([^/]+)(\/cancel|\/input_items)?$/.exec(path);
  if (!m) return undefined;
  let id: string;
  try {
    id = decodeURIComponent(m[1] as string);
  } catch {
    return undefined;
  }
  const sub = m[2];
  const M = method.toUpperCase();
  if (sub === undefined && M === "GET") return { kind: "retrieve", id };
  if (sub === undefined && M === "DELETE") return { kind: "delete", id };
  if (sub === "/cancel" && M === "POST") return { kind: "cancel", id };
  if (sub === "/input_items" && M === "GET") return { kind: "input-items", id, query: new URLSearchParams(q >= 0 ? pathWithQuery.slice(q + 1) : "") };
  return undefined;
}

export class ListingError extends Error {
  constructor(
    message: string,
    readonly param: string,
  ) {
    super(message);
  }
}

/** An input item as listed: with an id (a stored item without one gets `<response id>-in-<index>`). */
function listedItem(responseId: string, item: ResponseItem, index: number): ResponseItem {
  return typeof item.id === "string" && item.id.length > 0 ? item : { id: `${responseId}-in-${index}`, ...item };
}

/**
 * One page of a stored response's input items: OpenAI's list envelope (`data`, `first_id`,
 * `last_id`, `has_more`), `limit` 1-100 (default 20), `order` `desc` (default) or `asc`, `after`
 * an item id of the previous page. A bad parameter throws a `ListingError` naming it (400).
 */
export function inputItemsPage(rec: Pick<StoredResponse, "id" | "input">, query: URLSearchParams): Record<string, unknown> {
  const limitText = query.get("limit");
  const limit = limitText === null ? 20 : Number(limitText);
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw new ListingError("`limit` must be an integer between 1 and 100", "limit");
  const order = query.get("order") ?? "desc";
  if (order !== "asc" && order !== "desc") throw new ListingError("`order` must be `asc` or `desc`", "order");
  const items = rec.input.map((it, i) => listedItem(rec.id, it, i));
  if (order === "desc") items.reverse();
  let start = 0;
  const after = query.get("after");
  if (after !== null) {
    const at = items.findIndex((it) => it.id === after);
    if (at < 0) throw new ListingError("`after` names no input item of this response", "after");
    start = at + 1;
  }
  const data = items.slice(start, start + limit);
  return { object: "list", data, first_id: data[0]?.id ?? null, last_id: data[data.length - 1]?.id ?? null, has_more: start + limit < items.length };
}

/** A response object rebuilt from the store, for `GET /v1/responses/{id}` when its pod is gone. */
export function storedResponseObject(rec: StoredResponse): Record<string, unknown> {
  return {
    id: rec.id,
    object: "response",
    created_at: Math.floor(rec.createdAt / 1000),
    model: rec.model,
    status: "completed",
    error: null,
    incomplete_details: null,
    instructions: rec.instructions ?? null,
    output: rec.output,
    previous_response_id: rec.previousResponseId ?? null,
    store: true,
    metadata: {},
  };
}

/** DELETE's answer. */
export function deletedResponseObject(id: string): Record<string, unknown> {
  return { id, object: "response", deleted: true };
}
