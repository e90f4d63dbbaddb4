/**
 * One case of the faults bench in a process of its own (`runFaultsBench` starts it under the
 * case's time limit): `node faults-case.js <case> <options as JSON>`. Prints the case's result as
 * one JSON line on stdout and exits, whatever handles the case left open; an error, thrown or
 * stray, is printed as `{case, error}` instead.
 */
import { FAULT_CASES, type FaultCaseName, type FaultsOptions, faultsDefaults, runFaultCase } from "./faults.js";

const [name, json] = process.argv.slice(2);
let printed = false;
const done = (line: unknown, code: number) => {
  if (printed) return;
  printed = true;
  process.stdout.write(`${JSON.stringify(line)}\n`, () => process.exit(code));
};
const fail = (err: unknown) => {
  console.error(err);
  done({ case: name, error: err instanceof Error ? err.message : String(err) }, 1);
};

if (!FAULT_CASES.includes(name as FaultCaseName)) {
  console.error(`usage: faults-case.js <${FAULT_CASES.join("|")}> <options JSON>`);
  process.exit(2);
}
process.on("uncaughtException", fail);
process.on("unhandledRejection", fail);
try {
  done(await runFaultCase(name as FaultCaseName, faultsDefaults(JSON.parse(json ?? "{}") as FaultsOptions)), 0);
} catch (err) {
  fail(err);
}
