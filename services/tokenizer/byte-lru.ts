/**
 * A least-recently-used map bounded by an estimated byte weight rather than an entry count: a few
 * long prompts weigh as much as thousands of short ones, so a count bound alone bounds nothing.
 * Pure: the caller says what each entry weighs.
 */
export class ByteLru<V> {
  /** Map iteration order is insertion order: re-inserting on a hit keeps the least recently used first. */
  private readonly map = new Map<string, { value: V; bytes: number }>();
  private used = 0;
  evicted = 0;

  constructor(readonly maxBytes: number) {}

  get size(): number {
    return this.map.size;
  }

  get bytes(): number {
    return this.used;
  }

  get(key: string): V | undefined {
    const hit = this.map.get(key);
    if (!hit) return undefined;
    this.map.delete(key);
    this.map.set(key, hit);
    return hit.value;
  }

  /** Removes an entry; false if there was none. */
  delete(key: string): boolean {
    const hit = this.map.get(key);
    if (!hit) return false;
    this.map.delete(key);
    this.used -= hit.bytes;
    return true;
  }

  has(key: string): boolean {
    return this.map.has(key);
  }

  /** Stores `value`, evicting the least recently used until the bound holds; false if it alone is over the bound. */
  set(key: string, value: V, bytes: number): boolean {
    // One entry larger than the whole bound would evict everything and still not fit.
    if (bytes > this.maxBytes) return false;
    const old = this.map.get(key);
    if (old) {
      this.map.delete(key);
      this.used -= old.bytes;
    }
    while (this.used + bytes > this.maxBytes) {
      const first = this.map.entries().next();
      if (first.done) break;
      this.map.delete(first.value[0]);
      this.used -= first.value[1].bytes;
      this.evicted++;
    }
    this.map.set(key, { value, bytes });
    this.used += bytes;
    return true;
  }
}
