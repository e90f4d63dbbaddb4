/** JetStream API errors every caller tells apart the same way. */
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";

/** The stream (or the bucket behind it) does not exist: never created, not a failed call. */
export function isStreamNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamNotFound;
}
