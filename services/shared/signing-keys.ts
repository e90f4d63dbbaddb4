/**
 * Key files for signed records (streams/signatures.ts): read once at start, so a missing or wrong
 * file stops the process before it connects anywhere, naming the file.
 */
import { readFileSync } from "node:fs";
import { RecordSigner, RecordVerifier, SigningKeyError } from "../../streams/signatures.js";

/** The environment variable a signing key may come from instead of `--signing-key`: a PEM, or a file holding one. */
export const SIGNING_KEY_ENV = "JETROUTE_SIGNING_KEY";

function readKeyFile(file: string, what: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (err) {
    throw new SigningKeyError(`${what} ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
}

/** The verifier of the public key(s) in `file`; a SigningKeyError naming the file when it holds none. */
export function readVerifier(file: string, what = "public key file"): RecordVerifier {
  const text = readKeyFile(file, what);
  try {
    return new RecordVerifier(text);
  } catch (err) {
    throw new SigningKeyError(`${what} ${file}: ${(err as Error).message}`);
  }
}

/**
 * The signer of `--signing-key <file>`, else of JETROUTE_SIGNING_KEY (a PEM, or a path to one);
 * undefined when neither is set (records are written unsigned).
 */
export function readSigner(file: string | undefined, env: NodeJS.ProcessEnv = process.env): RecordSigner | undefined {
  const fromEnv = env[SIGNING_KEY_ENV];
  let pem: string;
  let origin: string;
  if (file !== undefined) {
    pem = readKeyFile(file, "signing key file");
    origin = `signing key file ${file}`;
  } else if (fromEnv) {
    const inline = fromEnv.includes("-----BEGIN");
    pem = inline ? fromEnv : readKeyFile(fromEnv, `${SIGNING_KEY_ENV}: signing key file`);
    origin = inline ? SIGNING_KEY_ENV : `${SIGNING_KEY_ENV}: signing key file ${fromEnv}`;
  } else return undefined;
  try {
    return new RecordSigner(pem);
  } catch (err) {
    throw new SigningKeyError(`${origin}: ${(err as Error).message}`);
  }
}
