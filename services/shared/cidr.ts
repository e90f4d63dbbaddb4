/**
 * An allow-list of pod networks (`--pod-cidrs 10.0.0.0/8,fd00::/8`): a pod whose address is outside
 * every range is never routed to, scraped or asked to tokenize, whoever published it. Defence in
 * depth for a PODS stream that someone other than the pod-watcher could write to.
 */
import { BlockList, isIP } from "node:net";

export class PodCidrError extends Error {
  override name = "PodCidrError";
}

/** The host of `ip:port`, `[v6]:port` or a bare IP; undefined when it is not an IP literal. */
export function hostOf(address: string): string | undefined {
  const bracket = /^\[([^\]]+)\](?::\d+)?$/.exec(address);
  if (bracket) return isIP(bracket[1] as string) === 6 ? bracket[1] : undefined;
  if (isIP(address) !== 0) return address;
  const colon = address.lastIndexOf(":");
  const host = colon < 0 ? address : address.slice(0, colon);
  return isIP(host) === 4 ? host : undefined;
}

/**
 * A predicate over pod addresses from CIDR strings; a malformed entry is a PodCidrError naming it.
 * An address that is not an IP literal (a host name) is outside every range.
 */
export function podAddressFilter(cidrs: readonly string[]): (address: string) => boolean {
  const list = new BlockList();
  for (const raw of cidrs) {
    const c = raw.trim();
    const m = /^([^/]+)\/(\d{1,3})$/.exec(c);
    const family = m ? isIP(m[1] as string) : 0;
    const prefix = m ? Number(m[2]) : -1;
    if (!m || family === 0 || prefix > (family === 4 ? 32 : 128)) throw new PodCidrError(`--pod-cidrs: ${JSON.stringify(c)} is not a CIDR range such as 10.0.0.0/8 or fd00::/8`);
    list.addSubnet(m[1] as string, prefix, family === 4 ? "ipv4" : "ipv6");
  }
  return (address) => {
    const host = hostOf(address);
    if (host === undefined) return false;
    return list.check(host, isIP(host) === 4 ? "ipv4" : "ipv6");
  };
}
