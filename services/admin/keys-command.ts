/**
 * `jetroute keys generate <name>`: an Ed25519 key pair for signed records (streams/signatures.ts):
 * `<name>.key` (private, PKCS#8 PEM, mode 0600) for `config --signing-key` or `pod-watcher
 * --signing-key`, `<name>.pub` (SPKI PEM) for the gateways' `--config-public-key` /
 * `--pod-public-key`. Existing files are never overwritten.
 */
import { writeFileSync } from "node:fs";
import type { Command } from "commander";
import { generateSigningKeyPair } from "../../streams/signatures.js";

export function registerKeysCommand(program: Command): void {
  const keys = program.command("keys").description("signing keys for signed records (docs/security.md)");
  keys
    .command("generate <name>")
    .description("write an Ed25519 key pair: <name>.key (private, mode 0600) and <name>.pub (public); prints the key id")
    .action((name: string) => {
      const pair = generateSigningKeyPair();
      // `wx`: fail rather than replace a key someone may still sign with.
      writeFileSync(`${name}.key`, pair.privateKeyPem, { mode: 0o600, flag: "wx" });
      writeFileSync(`${name}.pub`, pair.publicKeyPem, { mode: 0o644, flag: "wx" });
      console.log(JSON.stringify({ keyId: pair.keyId, privateKey: `${name}.key`, publicKey: `${name}.pub` }));
    });
}
