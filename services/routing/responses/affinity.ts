/**
 * Response affinity: where a Responses API request that names `previous_response_id` goes
 * (docs/stateful-apis.md, "The affinity rule"). Pure.
 *
 * The rule, in order:
 * 1. The id is not held for the caller's tenant — unknown, evicted, expired, or held under another
 *    tenant — and the response store does not hold it for the tenant either: **not-found** (the
 *    gateway answers 404 itself: forwarding could let the pod that holds another tenant's response
 *    continue it, and a 403 would confirm the id exists).
 * 2. The id is held for the tenant and its pod is a candidate of this request (ready, vouched for,
 *    not draining, serving the request's model) and not saturated: **pin** to that pod —
 *    affinity outranks load, the pod holds the conversation's KV cache and, if its engine stores
 *    responses, the response itself.
 * 3. Otherwise — the pod is gone, draining, saturated, or serves another model than this turn
 *    asks for — and the store holds the chain: **expand**: the gateway rebuilds the full `input`
 *    from the store and the request goes to any pod by the model's strategy.
 *    Without a stored chain (the response was made with `store: false`, or was too large to keep)
 *    a gone or draining pod leaves **not-found**; a saturated pod is still pinned (it holds the
 *    only copy: a wait beats a failure).
 *
 * The verdict's `reason` is recorded in the decision record; replay re-decides from it and the
 * recorded candidates.
 */

export type AffinityReason =
  /** Pinned: the pod that holds the response. */
  | "owner"
  /** Pinned though saturated: no stored chain to expand instead. */
  | "owner-saturated-unstored"
  /** Expanded or not found: the id is not known for the caller's tenant. */
  | "unknown-id"
  | "owner-gone"
  | "owner-draining"
  | "owner-saturated"
  | "other-model";

export type AffinityVerdict =
  | { action: "pin"; pod: string; reason: "owner" | "owner-saturated-unstored" }
  | { action: "expand"; reason: Exclude<AffinityReason, "owner" | "owner-saturated-unstored">; owner?: string }
  | { action: "not-found"; reason: Exclude<AffinityReason, "owner" | "owner-saturated-unstored">; owner?: string };

export interface AffinityInput {
  /** The response's location as the view holds it for any tenant, or undefined. */
  location?: { readonly pod: string; readonly model: string; readonly tenant: string; readonly stored: boolean };
  /** The caller's tenant digest. */
  tenant: string;
  /** The model this request is for (after rewrites). */
  model: string;
  /** The request's candidate pods (ready, vouched, not draining, serving `model`). */
  candidates: ReadonlyArray<{ readonly pod: string }>;
  /** The owner pod as the pod set knows it (any model), undefined when gone. */
  ownerState?: { readonly ready: boolean; readonly draining: boolean };
  /** Whether the owner pod has no room (flow control's saturation test, or the caller's). */
  ownerSaturated: boolean;
  /**
   * Whether the response store holds the chain for this tenant; asked only when the verdict
   * depends on it (the location's `stored` answers it otherwise), so the shell can read the store
   * lazily: undefined = not read (the location's flag is used).
   */
  storeHolds?: boolean;
}

export function responseAffinity(i: AffinityInput): AffinityVerdict {
  const loc = i.location && i.location.tenant === i.tenant ? i.location : undefined;
  if (!loc) return i.storeHolds ? { action: "expand", reason: "unknown-id" } : { action: "not-found", reason: "unknown-id" };
  const stored = i.storeHolds ?? loc.stored;
  let reason: Exclude<AffinityReason, "owner" | "owner-saturated-unstored">;
  if (loc.model !== i.model) reason = "other-model";
  else if (i.candidates.some((c) => c.pod === loc.pod)) {
    if (!i.ownerSaturated) return { action: "pin", pod: loc.pod, reason: "owner" };
    if (!stored) return { action: "pin", pod: loc.pod, reason: "owner-saturated-unstored" };
    reason = "owner-saturated";
  } else if (i.ownerState?.ready && i.ownerState.draining) reason = "owner-draining";
  else reason = "owner-gone";
  return stored ? { action: "expand", reason, owner: loc.pod } : { action: "not-found", reason, owner: loc.pod };
}
