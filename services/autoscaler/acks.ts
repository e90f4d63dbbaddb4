/**
 * The gateways' acknowledgements of PODS, for the drain handshake. Pure.
 *
 * Every gateway heartbeat says how far its builder had folded PODS (`podsSeq`). A pod's `draining`
 * event at sequence S is acknowledged once every live gateway has sent a beat with `podsSeq` >= S:
 * from then on none of them charges the pod, and the ledger (which folds those beats' outstanding
 * lists) holds everything still running there. A gateway too old to send `podsSeq` never
 * acknowledges: its pods drain until their grace deadline.
 */
import type { GatewayHeartbeat } from "../../schemas/events.js";

/** Bound on gateways remembered (the ledger's live set is far smaller). */
export const MAX_ACK_GATEWAYS = 4096;

export class GatewayAcks {
  private readonly seqs = new Map<string, number>();

  observe(hb: Pick<GatewayHeartbeat, "gateway" | "state" | "podsSeq">): void {
    if (hb.state === "down") {
      this.seqs.delete(hb.gateway);
      return;
    }
    if (hb.podsSeq === undefined) {
      this.seqs.set(hb.gateway, -1);
      return;
    }
    const prev = this.seqs.get(hb.gateway);
    if (prev === undefined && this.seqs.size >= MAX_ACK_GATEWAYS) this.seqs.delete(this.seqs.keys().next().value as string);
    // Parts of one beat and reordered beats never move it back.
    if (prev === undefined || hb.podsSeq > prev) this.seqs.set(hb.gateway, hb.podsSeq);
  }

  /** Whether every gateway in `live` has folded PODS up to `seq`. */
  acknowledged(seq: number, live: readonly string[]): boolean {
    for (const g of live) if ((this.seqs.get(g) ?? -1) < seq) return false;
    return true;
  }

  /** The live gateways that have not yet folded `seq` (for records and logs). */
  waitingFor(seq: number, live: readonly string[]): string[] {
    return live.filter((g) => (this.seqs.get(g) ?? -1) < seq);
  }
}
