/**
 * The lease rule, apart from where the lease lives (a coordination.k8s.io Lease, or a key of the
 * `<prefix>-leases` KV bucket) and who contends (a pod-watcher pair, the gateways' snapshot
 * writer). Pure: every clock is the caller's.
 *
 * Expiry is judged on the candidate's own clock, never on the holder's: a lease is expired when
 * its version (resourceVersion / KV revision) has not changed for `durationMs` since this
 * candidate first saw that version — the rule client-go's leader election follows, immune to
 * clock skew between hosts (nothing compares one host's timestamp with another's). The holder
 * renews every `durationMs / 3` and believes itself leader only until half a lease after its last
 * successful renewal started, so it stops acting well before anyone else may take over. A standby
 * sees a renewal up to one of its rounds late and acts at a round, so a dead holder is replaced
 * within `durationMs` plus up to two renewal intervals (the shell counts `since` from the start of
 * the round that read the version, not its end).
 */

export interface LeaseRecord {
  /** Empty or absent: released. */
  holder?: string;
  /** The holder's lease duration: others may take over once the record stood still this long. */
  durationMs: number;
  /** Optimistic-concurrency token: resourceVersion or KV revision. */
  version: string;
  transitions: number;
}

export interface LeaseObservation {
  version: string;
  /** Candidate's clock when it first saw this version. */
  since: number;
}

export type LeaseAction =
  /** Write ourselves as holder (lease absent, released or expired); `transitions` for the new record. */
  | { kind: "acquire"; transitions: number }
  /** We hold it: write a renewal against its version. */
  | { kind: "renew" }
  /** Someone else holds a live lease. */
  | { kind: "follow"; holder: string; expiresIn: number };

/** May `me` take or keep the lease read as `lease`, having first seen its version as `seen`, at `now`? */
export function decideLease(me: string, lease: LeaseRecord | undefined, seen: LeaseObservation | undefined, now: number): LeaseAction {
  if (lease === undefined) return { kind: "acquire", transitions: 0 };
  if (lease.holder === me) return { kind: "renew" };
  if (!lease.holder) return { kind: "acquire", transitions: lease.transitions + 1 };
  const since = seen && seen.version === lease.version ? seen.since : now;
  const expiresIn = since + lease.durationMs - now;
  if (expiresIn <= 0) return { kind: "acquire", transitions: lease.transitions + 1 };
  return { kind: "follow", holder: lease.holder, expiresIn };
}

/** The observation to keep after reading `lease` at `now`. */
export function observe(lease: LeaseRecord | undefined, seen: LeaseObservation | undefined, now: number): LeaseObservation | undefined {
  if (lease === undefined) return undefined;
  return seen && seen.version === lease.version ? seen : { version: lease.version, since: now };
}

/** Until when (candidate's clock) a holder whose renewal started at `renewStartedAt` may act as leader. */
export function leaderUntil(renewStartedAt: number, durationMs: number): number {
  return renewStartedAt + durationMs / 2;
}

export const renewIntervalMs = (durationMs: number): number => Math.max(10, Math.floor(durationMs / 3));
