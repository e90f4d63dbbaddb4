/**
 * Charge ids: how a gateway names its charges, and how replay reads them back. The ledger keys a
 * charge by (gateway id, charge id), so an id is unique within one gateway process; it is the
 * process's routing sequence number in base 36, so it also orders that gateway's own events.
 * A P/D prefill leg's charge is `<request's charge id>.p<attempt>`: it belongs to its request's
 * number (made right after that request's decode charge) and has no decision record of its own.
 */

const CHARGE_ID = /^([0-9a-z]{1,11})(?:\.p(\d{1,3}))?$/;

/** The charge id of the `seq`-th charge a gateway process makes (1-based). */
export function chargeIdOf(seq: number): string {
  return seq.toString(36);
}

/** The charge id of attempt `attempt` (1-based) of a request's P/D prefill leg. */
export function prefillChargeIdOf(requestChargeId: string, attempt: number): string {
  return `${requestChargeId}.p${attempt}`;
}

/** The routing-order number of a charge id (a prefill leg's: its request's), or undefined for an id no gateway makes. */
export function chargeSeqOf(id: string | undefined): number | undefined {
  const m = id === undefined ? null : CHARGE_ID.exec(id);
  return m ? Number.parseInt(m[1] as string, 36) : undefined;
}

/** A P/D prefill leg's charge (it has no decision record of its own to wait for). */
export function isPrefillLegCharge(id: string): boolean {
  return CHARGE_ID.exec(id)?.[2] !== undefined;
}
