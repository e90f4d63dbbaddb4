import type { Command } from "commander";
import { addNamespaceOptions, type NamespaceOptionValues, namespaceFlags } from "../shared/cli-options.js";
import { connectNats } from "../shared/nats.js";
import { applyStreams } from "../../streams/apply.js";

export function registerStreamsCommand(program: Command): void {
  const streams = program.command("streams").description("manage jetroute's JetStream streams and buckets");
  addNamespaceOptions(streams.command("apply").description("create or update every stream and the config bucket (idempotent)"), {
    pool: "gateway pool: apply this pool's streams (<PREFIX>_POOL_<NAME>_*) and buckets; the config bucket is the base prefix's",
  })
    .option("--replicas <n>", "replicas per stream", (v) => Number.parseInt(v, 10), 1)
    .action(async (o: NamespaceOptionValues & { replicas: number }) => {
      const { nats, namespace } = namespaceFlags(o);
      const { nc, jsm } = await connectNats(nats, "jetroute-streams");
      try {
        for (const c of await applyStreams(nc, jsm, { prefix: namespace.prefix, configPrefix: namespace.configPrefix, replicas: o.replicas })) {
          console.log(`${c.action.padEnd(9)} ${c.name}${c.diff.length ? `\n  ${c.diff.join("\n  ")}` : ""}`);
        }
      } finally {
        await nc.close();
      }
    });
}
