import assert from 'node:assert/strict';
import { test } from 'node:test';

import { difference, histogram, parse, quantile, total } from './prometheus.js';

const TEXT = `# HELP portal_dns_queries DNS queries answered
# TYPE portal_dns_queries counter
portal_dns_queries_total{type="A",rcode="NOERROR"} 10
portal_dns_queries_total{type="AAAA",rcode="NXDOMAIN"} 4
portal_dns_queries_total{type="A",rcode="NXDOMAIN"} 1
# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_sum 1.5
kubeproxy_network_programming_duration_seconds_count 10
kubeproxy_network_programming_duration_seconds_bucket{le="0.001"} 0
kubeproxy_network_programming_duration_seconds_bucket{le="0.1"} 5
kubeproxy_network_programming_duration_seconds_bucket{le="1.0"} 10
kubeproxy_network_programming_duration_seconds_bucket{le="+Inf"} 10
odd{path="a\\"b"} 2
`;

test('parses samples with their labels', () => {
  const samples = parse(TEXT);
  assert.equal(total(samples, 'portal_dns_queries_total'), 15);
  assert.equal(total(samples, 'portal_dns_queries_total', (l) => l.rcode === 'NXDOMAIN'), 5);
  assert.deepEqual(samples.get('odd')[0].labels, { path: 'a"b' });
  assert.equal(total(samples, 'missing'), 0);
});

test('quantiles interpolate inside the bucket, as histogram_quantile', () => {
  const h = histogram(parse(TEXT), 'kubeproxy_network_programming_duration_seconds');
  assert.equal(h.count, 10);
  assert.equal(quantile(0.5, h), 0.1);
  // Rank 9 of 10: four fifths of the way through the (0.1, 1] bucket.
  assert.ok(Math.abs(quantile(0.9, h) - 0.82) < 1e-9);
  // Rank 2 of 10, in the (0.001, 0.1] bucket that holds ranks 1 to 5.
  assert.ok(Math.abs(quantile(0.2, h) - (0.001 + (0.099 * 2) / 5)) < 1e-12);
});

test('the series of a labelled histogram add up, bound by bound', () => {
  const text = ['h_bucket{le="1",path="a"} 1', 'h_bucket{le="1",path="b"} 2', 'h_bucket{le="+Inf",path="a"} 3', 'h_bucket{le="+Inf",path="b"} 3', 'h_count{path="a"} 3', 'h_count{path="b"} 3'].join('\n');
  const h = histogram(parse(text), 'h');
  assert.deepEqual(h.buckets, [{ le: 1, count: 3 }, { le: Infinity, count: 6 }]);
  assert.equal(h.count, 6);
});

test('a quantile beyond the last finite bucket is that bound', () => {
  const h = { buckets: [{ le: 1, count: 1 }, { le: Infinity, count: 4 }] };
  assert.equal(quantile(0.99, h), 1);
});

test('no observations, no quantile', () => {
  assert.equal(quantile(0.5, { buckets: [] }), null);
  assert.equal(quantile(0.5, { buckets: [{ le: 1, count: 0 }, { le: Infinity, count: 0 }] }), null);
});

test('the difference of two readings is what happened between them', () => {
  const before = { buckets: [{ le: 1, count: 2 }, { le: Infinity, count: 3 }], sum: 2, count: 3 };
  const after = { buckets: [{ le: 1, count: 5 }, { le: Infinity, count: 7 }], sum: 6, count: 7 };
  assert.deepEqual(difference(before, after), {
    buckets: [{ le: 1, count: 3 }, { le: Infinity, count: 4 }],
    sum: 4,
    count: 4,
  });
  // A restarted server starts again from zero: the new reading is all there is.
  assert.deepEqual(difference(after, before), before);
});
