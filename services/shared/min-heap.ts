/**
 * A binary min-heap over an ordering the caller gives (`less(a, b)`: a comes out first). Pure;
 * used wherever events must come out in time order (replay's counterfactual releases, the virtual
 * clock's timers, the what-if simulator's action queue).
 */
export class MinHeap<T> {
  private h: T[] = [];

  constructor(private readonly less: (a: T, b: T) => boolean) {}

  get size(): number {
    return this.h.length;
  }

  peek(): T | undefined {
    return this.h[0];
  }

  push(x: T): void {
    const h = this.h;
    let i = h.length;
    h.push(x);
    while (i > 0) {
      const p = (i - 1) >> 1;
      const parent = h[p] as T;
      if (!this.less(x, parent)) break;
      h[i] = parent;
      i = p;
    }
    h[i] = x;
  }

  pop(): T | undefined {
    const h = this.h;
    const top = h[0];
    const last = h.pop();
    const n = h.length;
    if (n === 0 || last === undefined) return top;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && this.less(h[r] as T, h[l] as T) ? r : l;
      const child = h[c] as T;
      if (!this.less(child, last)) break;
      h[i] = child;
      i = c;
    }
    h[i] = last;
    return top;
  }

  /** Keeps only the items `keep` accepts (a sorted array is a valid heap: O(n log n), for rare use). */
  retain(keep: (x: T) => boolean): void {
    this.h = this.h.filter(keep).sort((a, b) => (this.less(a, b) ? -1 : this.less(b, a) ? 1 : 0));
  }
}
