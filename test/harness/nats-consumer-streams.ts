/**
 * Which streams each jetroute process opens consumers on, and the JetStream API subjects that
 * takes: the rule deploy/nats/values.yaml follows and test/nats-permissions.test.ts holds it to.
 *
 * Why per stream: a user that may create a consumer on a stream may make it a push consumer
 * delivering to any subject, which nats-server does not check against the creator's publish
 * permissions (nats-io/nats-server#8274). So a process may open consumers only on the streams it
 * follows (services/shared/follower.ts, the gateway's config watch and snapshot store, the
 * pod-watcher's pool assignments); message gets stay open on every stream (they copy nothing).
 *
 * What the client sends: nats.js v3 names every consumer it creates on nats-server >= 2.9
 * (ordered consumers `oc_<nuid>_<n>`, KV and object-store watches and key listings), so a
 * creation is `$JS.API.CONSUMER.CREATE.<stream>.<name>` or, with one subject filter,
 * `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`; heartbeat probes, pulls and the delete on
 * close are `$JS.API.CONSUMER.INFO|MSG.NEXT|DELETE.<stream>.<name>`.
 */
import { configBucketName, filesBucketName, snapshotBucketName, streamName } from "../../streams/definitions.js";
import { namespaceOf } from "../../streams/pools.js";

/** The allowances that let a user read `stream` through consumers, and nothing else of it. */
export function consumerAllowances(stream: string): string[] {
  if (!/^[A-Za-z0-9_-]+$/.test(stream)) throw new Error(`not a stream name: ${JSON.stringify(stream)}`);
  return [`$JS.API.CONSUMER.CREATE.${stream}.>`, `$JS.API.CONSUMER.INFO.${stream}.*`, `$JS.API.CONSUMER.MSG.NEXT.${stream}.*`, `$JS.API.CONSUMER.DELETE.${stream}.*`];
}

/** What the analyst (replay, export) keeps: consumers on every stream of the account. */
export const EVERY_STREAM = ["$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.INFO.>", "$JS.API.CONSUMER.MSG.NEXT.>", "$JS.API.CONSUMER.DELETE.>"];

/**
 * The streams the process behind `user` opens consumers on, under base prefix `base`, unpooled and
 * in each of `pools`; "every" for the analyst, undefined for a user this rule does not cover (the
 * admin may do anything).
 */
export function streamsFollowed(user: string, base: string, pools: readonly string[]): string[] | "every" | undefined {
  const prefixes = [base, ...pools.map((p) => namespaceOf(base, p).prefix)];
  const config = `KV_${configBucketName(base)}`;
  switch (user) {
    case "jr-gateway":
      // services/gateway/followers.ts (PODS, LOAD, CHARGES, KV, ADAPTERS; the base prefix's USAGE and RESPONSES), the
      // config watch (config-watch.ts) and the snapshot store (snapshots.ts: list and load).
      return [
        ...prefixes.flatMap((p) => [streamName(p, "PODS"), streamName(p, "LOAD"), streamName(p, "CHARGES"), streamName(p, "KV"), streamName(p, "ADAPTERS"), `OBJ_${snapshotBucketName(p)}`]),
        config,
        streamName(base, "USAGE"),
        streamName(base, "RESPONSES"),
      ];
    case "jr-pod-watcher":
      // Its own pods read back (source-publisher.ts), the pool assignments (pool-models.ts).
      return [...prefixes.map((p) => streamName(p, "PODS")), config];
    case "jr-metrics-scraper":
    case "jr-kv-bridge":
      return prefixes.map((p) => streamName(p, "PODS"));
    case "jr-autoscaler":
      // services/autoscaler/service.ts: PODS, LOAD, CHARGES, KV and DECISIONS of its namespace (and
      // each pool's, for a pool's autoscaler), and the config bucket (policies, pool assignments).
      return [...prefixes.flatMap((p) => [streamName(p, "PODS"), streamName(p, "LOAD"), streamName(p, "CHARGES"), streamName(p, "KV"), streamName(p, "DECISIONS")]), config];
    case "jr-batch-api":
      // services/batch/store.ts (base prefix only): the job-event and results folds, output
      // assembly, reading files; the API key watch (api.ts, --auth required).
      return [streamName(base, "BATCH"), streamName(base, "BATCH_RESULTS"), `OBJ_${filesBucketName(base)}`, config];
    case "jr-batch-worker":
      // The shared work consumer, and the same job-event and results folds.
      return [streamName(base, "BATCH_WORK"), streamName(base, "BATCH"), streamName(base, "BATCH_RESULTS")];
    case "jr-analyst":
      return "every";
    default:
      return undefined;
  }
}

/** `user`'s consumer allowances as the rule above has them (sorted), or undefined (not covered). */
export function expectedConsumerAllowances(user: string, base: string, pools: readonly string[]): string[] | undefined {
  const s = streamsFollowed(user, base, pools);
  if (s === undefined) return undefined;
  return (s === "every" ? [...EVERY_STREAM] : s.flatMap(consumerAllowances)).sort();
}
