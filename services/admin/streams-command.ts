import type { Command } from "commander";
import { namespaceOf } from "../../streams/pools.js";
import { natsOption, poolOption } from "../shared/cli-options.js";
import { connectNats } from "../shared/nats.js";
import { applyStreams } from "../../streams/apply.js";

export function registerStreamsCommand(program: Command): void {
  const streams = program.command("streams").description("manage jetroute's JetStream streams and buckets");
  streams
    .command("apply")
    .description("create or update every stream and the config bucket (idempotent)")
    .addOption(natsOption())
    .option("--prefix <prefix>", "subject prefix", "jr")
    .addOption(poolOption("gateway pool: apply this pool's streams (<PREFIX>_POOL_<NAME>_*) and buckets; the config bucket is the base prefix's"))
    .option("--replicas <n>", "replicas per stream", (v) => Number.parseInt(v, 10), 1)
    .action(async (o: { nats: string[]; prefix: string; pool?: string; replicas: number }) => {
      const { nc, jsm } = await connectNats(o.nats, "jetroute-streams");
      const ns = namespaceOf(o.prefix, o.pool);
      try {
        for (const c of await applyStreams(nc, jsm, { prefix: ns.prefix, configPrefix: ns.configPrefix, replicas: o.replicas })) {
          console.log(`${c.action.padEnd(9)} ${c.name}${c.diff.length ? `\n  ${c.diff.join("\n  ")}` : ""}`);
        }
      } finally {
        await nc.close();
      }
    });
}
