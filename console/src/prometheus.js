// Reads Prometheus' text format (what /metrics serves) and turns two
// readings of a counter or a histogram into what happened between them:
// a rate, or quantiles estimated as PromQL's histogram_quantile does.

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

function unescape(value) {
  return value.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
}

/** `name → [{labels, value}]` for every sample in `text`. */
export function parse(text) {
  const samples = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const match = SAMPLE.exec(line);
    if (!match) continue;
    const [, name, labelText = '', raw] = match;
    const labels = {};
    for (const [, key, value] of labelText.matchAll(LABEL)) labels[key] = unescape(value);
    const value = raw === '+Inf' ? Infinity : raw === '-Inf' ? -Infinity : Number(raw);
    if (!samples.has(name)) samples.set(name, []);
    samples.get(name).push({ labels, value });
  }
  return samples;
}

/** The sum of a metric's samples whose labels match `where` (all of them by default). */
export function total(samples, name, where = () => true) {
  return (samples.get(name) ?? []).filter((s) => where(s.labels)).reduce((sum, s) => sum + s.value, 0);
}

/**
 * A histogram's cumulative buckets `[{le, count}]` (sorted), its sum and
 * count, over every series of it (PromQL's `sum by (le)`).
 */
export function histogram(samples, name) {
  const byBound = new Map();
  for (const s of samples.get(`${name}_bucket`) ?? []) {
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    byBound.set(le, (byBound.get(le) ?? 0) + s.value);
  }
  const buckets = [...byBound].map(([le, count]) => ({ le, count })).sort((a, b) => a.le - b.le);
  return { buckets, sum: total(samples, `${name}_sum`), count: total(samples, `${name}_count`) };
}

/** What a histogram gained between two readings (counts only go up; a restart resets them). */
export function difference(before, after) {
  if (!before || after.count < before.count) return after;
  const earlier = new Map(before.buckets.map((b) => [b.le, b.count]));
  return {
    buckets: after.buckets.map((b) => ({ le: b.le, count: b.count - (earlier.get(b.le) ?? 0) })),
    sum: after.sum - before.sum,
    count: after.count - before.count,
  };
}

/**
 * The q-quantile of a histogram's observations, by linear interpolation in
 * the bucket it falls in; null with no observations. As PromQL does, a
 * quantile in the +Inf bucket is the highest finite bound.
 */
export function quantile(q, { buckets }) {
  if (buckets.length === 0) return null;
  const observations = buckets[buckets.length - 1].count;
  if (observations <= 0) return null;
  const rank = q * observations;
  let lowerBound = 0;
  let lowerCount = 0;
  for (const { le, count } of buckets) {
    if (count >= rank) {
      if (le === Infinity) return lowerBound;
      const inBucket = count - lowerCount;
      return inBucket <= 0 ? le : lowerBound + ((le - lowerBound) * (rank - lowerCount)) / inBucket;
    }
    lowerBound = le;
    lowerCount = count;
  }
  return lowerBound;
}
